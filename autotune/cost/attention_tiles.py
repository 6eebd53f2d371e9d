"""The attention core a tiled flash kernel executes: whole tiles of queries x keys, not the exact band.

A flash kernel (FlashAttention-2/3, cuDNN's fused attention) walks the score matrix in tiles of ``ATTENTION_TILE``
queries x ``ATTENTION_TILE`` keys and runs every tile that holds one unmasked score in full (the mask applied
inside the tile). The attention rate (``autotune.cost.kernels``, ``attention_fraction``) is a causal figure that
counts the causal s^2 / 2 scores (the FlashAttention benchmarks' convention), so the diagonal tiles of a causal
layer are in that rate already; what a local layer adds is its own tile rounding relative to the causal layer's:

* causal, n = ceil(s / B) query tiles: query tile i runs i + 1 key tiles, n (n + 1) / 2 in all;
* sliding window of ``w`` keys (query ``q`` sees keys q - w + 1 .. q, Megatron's ``window_size = (w - 1, 0)``):
  query tile i runs min(i + 1, 1 + ceil((w - 1) / B)) key tiles (the band spans B + w - 1 keys);
* chunked (Llama 4, chunks of ``w`` aligned to the sequence start): s / w causal blocks of m = ceil(w / B) tiles,
  m (m + 1) / 2 each.

A window of 128 with 128-wide tiles runs two key tiles per query tile: 256 keys per query where the band holds
128, twice the exact count (:func:`autotune.cost.flops.causal_attention_share`, the model-FLOP convention).
"""

from __future__ import annotations

import math

from autotune.specs.model import ModelSpec

__all__ = ["ATTENTION_TILE", "executed_attention_share", "fp8_backward_share", "local_layer_tiles"]

ATTENTION_TILE = 128
"""Queries and keys per tile of the flash kernel: FlashAttention-2 runs head_dim 64 (and 32) forward in 128 x 128
tiles (Dao-AILab/flash-attention csrc/flash_attn/src/flash_fwd_launch_template.h ``run_mha_fwd_hdim64``:
``Flash_fwd_kernel_traits<64, 128, 128, 4, ...>``); FlashAttention-3 on Hopper 192 x 128 at head_dim 64
(hopper/flash_fwd_launch_template.h ``run_mha_fwd_hdim64``: kBlockM 192, kBlockN 128) and 128 x 128 for causal or
local head_dim 128. cuDNN's tile sizes are not published: 128 x 128 is taken for it too (the smaller of the
two, so the rounding counted is the least of them)."""


def _tiles_causal(n: int) -> int:
    return n * (n + 1) // 2


def _tiles_window(n: int, span: int) -> int:
    """Key tiles run over n query tiles when each runs at most ``span`` (sum of min(i + 1, span))."""
    if n <= span:
        return _tiles_causal(n)
    return _tiles_causal(span) + (n - span) * span


def local_layer_tiles(model: ModelSpec, seq_len: int, tile: int = ATTENTION_TILE) -> tuple[int, int]:
    """(tiles of a local layer, tiles of a causal layer) at ``seq_len``."""
    n = math.ceil(seq_len / tile)
    causal = _tiles_causal(n)
    w = model.sliding_window
    if w is None or w >= seq_len:
        return causal, causal
    if model.chunked_attention:
        m = math.ceil(w / tile)
        return math.ceil(seq_len / w) * _tiles_causal(m), causal
    return _tiles_window(n, 1 + math.ceil((w - 1) / tile)), causal


def executed_attention_share(model: ModelSpec, seq_len: int, tile: int = ATTENTION_TILE) -> float:
    """The attention core a tiled causal flash kernel runs, averaged over the layers, as a share of a causal layer
    (1.0 without local layers): local layers count their tiles against the causal layer's."""
    if model.sliding_window is None or seq_len <= 0:
        return 1.0
    local, causal = local_layer_tiles(model, seq_len, tile)
    n_local = sum(model.is_local_attention_layer(i) for i in range(model.num_layers))
    share = n_local / model.num_layers
    return 1.0 - share + share * min(1.0, local / causal)


def fp8_backward_share(model: ModelSpec, seq_len: int, tile: int = ATTENTION_TILE) -> float:
    """What :func:`executed_attention_share` is for cuDNN's FP8 backward: it skips no tile outside a sliding window
    (NVIDIA's GPT-OSS timings, ``autotune.cost.fp8_attention``), so a sliding-window layer runs every causal tile
    (1.0); chunked layers (not timed in FP8) as the forward."""
    if model.sliding_window is not None and not model.chunked_attention:
        return 1.0
    return executed_attention_share(model, seq_len, tile)
