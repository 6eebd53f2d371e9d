"""The fused attention kernel's rate by the key length of each kernel call: short calls reach less of it.

A tiled causal flash kernel gives each block of queries a fixed prologue and epilogue (load Q, the masked diagonal
tile, rescale and write O) beside its useful key tiles; that fixed part is worth a roughly constant number of keys
per query row, so the share of the kernel's time spent on useful scores is ``L / (L + a)`` for a causal call of
``L`` keys (per query row ``L / 2`` useful keys on average against ``a / 2`` of fixed work). The attention fractions
of ``autotune/presets/gpus.yaml`` (H100 / H200: fa2 0.35, fa3 0.61) are the curve's asymptotes, so the rate of a
call is ``peak x attention_fraction x gemm_peak_fraction x L / (L + a)`` (``autotune.cost.layer_time``).

``a`` per kernel family, measured: one NVIDIA H200, torch 2.11 (bench/data/h200_kernels.json, written by
bench/gpu_probe/kernels.py ``attention_rows``), causal ``scaled_dot_product_attention`` forward + backward, 32 heads,
head_dim 128, 16384 tokens a call (batch 16384 / seq), TFLOP/s counting the causal half of the forward's
4 b s^2 h d and the backward as 2.5 forwards:

* FLASH backend (FlashAttention-2, "fa2"): seq 2048 / 4096 / 8192: 221.0 / 260.3 / 289.8 TFLOP/s, ``a`` = 946 keys
  (asymptote 0.327 of the 989 TFLOP/s peak);
* CUDNN backend (the FA3 class Transformer Engine runs on Hopper, "fa3"): 376.3 / 464.2 / 532.1, ``a`` = 1313
  (asymptote 0.624).

(The 2048 and 8192 rows alone give 947 and 1311; a least-squares fit of the log error over the three, 942 and 1307;
each curve meets its three rows within 0.6%. The file's later sweep, head_dim 128 at 1024-16384, stays on it: the
isolated model over the measured rate 1.05-1.08 for fa2 and 0.96-0.98 for cuDNN at every length,
bench/kernels_vs_measured.py.) Kernels without a measurement take the nearest measured one (an
assumption): Triton FlashAttention (``kernels.TRITON_FLASH``) FlashAttention-2's (the same tiling, one query block a
program), Blackwell's attention the FA3 class's (the GPU's fraction is borrowed from fa3 too,
``KernelFacts.attention``), every GPU the H200's (the fixed part is the tiling's, counted in keys, not the chip's).
A GPU whose only attention is "unfused" runs no tiled kernel: factor 1.

The key length ``L`` each call sees (:func:`kernel_key_length`):

* no context parallelism: the sequence;
* ``"p2p"`` ring (Megatron / TE ``AttnFuncWithCPAndKVP2P``) and torch's ``"allgather"`` ring (``context_parallel``,
  which still runs one kernel per step on one rank's K/V): ``s / cp`` per step. With the head-tail split each step
  is the diagonal causal block of ``s / cp`` keys, or all ``s / cp`` queries against the first half chunk's
  ``s / 2cp`` keys (non-causal: ``s / 2cp`` useful keys a row, about the share of the causal ``s / cp``), or the
  second half's queries against all ``s / cp`` keys (faster); the last rank runs only the first two, and every step
  waits for the slowest rank, so ``s / cp`` is each step's pace;
* ``"ulysses"`` (DeepSpeed, Megatron ``a2a``): the whole sequence with ``heads / cp`` heads: ``s``;
* ``"te-allgather"`` (Megatron ``allgather``): each rank's two ``s / 2cp`` query chunks against the gathered keys up
  to their end: ``s / 2`` useful keys a row on average over the two, as a causal call of ``s``;
* ``"a2a+p2p"``: the ring over the all-to-all's gathered sequence: ``s / ring size``
  (:func:`autotune.specs.context_parallel.hierarchical_cp_sizes`).

Sliding-window and chunked layers (``autotune.cost.attention_tiles``): their rows hold fewer useful keys for the same
fixed work; the layers' average executed share ``e`` of a causal layer makes a row's useful keys ``e s / 2``, the
causal length ``e s`` (capped by the call's own length under context parallelism, an approximation).
"""

from __future__ import annotations

from autotune.specs.context_parallel import hierarchical_cp_sizes

__all__ = ["KEY_LENGTH_HALF", "key_length_factor", "kernel_key_length"]

KEY_LENGTH_HALF: dict[str, float] = {"fa2": 946.0, "fa3": 1313.0}
"""``a`` per kernel family: the causal key length at which the kernel reaches half its asymptotic rate (keys)."""

_NEAREST = {"fa-triton": "fa2"}
"""Kernels without a measured ``a`` and the measured one they take (module docstring); other names than these, fa2
and fa3 and "unfused" take fa2's."""


def key_length_factor(kernel: str, key_len: float) -> float:
    """The fused attention kernel's rate for causal calls of ``key_len`` keys over its asymptotic rate, in (0, 1);
    1 for "unfused" (no tiled kernel) and for ``key_len`` <= 0 (no attention to cost)."""
    if kernel == "unfused" or key_len <= 0:
        return 1.0
    a = KEY_LENGTH_HALF.get(kernel) or KEY_LENGTH_HALF[_NEAREST.get(kernel, "fa2")]
    return key_len / (key_len + a)


def kernel_key_length(seq_len: float, cp: int, cp_kind: str | None, tp: int = 1, gpus_per_node: int = 8,
                      executed_share: float = 1.0) -> float:
    """The causal key length each attention kernel call sees (module docstring): ``seq_len`` without context
    parallelism, ``seq_len / cp`` per ring step ("p2p", "allgather"), ``seq_len`` for "ulysses" and
    "te-allgather", ``seq_len / ring size`` for "a2a+p2p"; ``executed_share``: the layers' average executed share
    of a causal layer (``attention_tiles.executed_attention_share``), capping it at ``executed_share x seq_len``."""
    length = float(seq_len)
    if cp > 1 and cp_kind not in ("ulysses", "te-allgather"):
        ring = hierarchical_cp_sizes(cp, tp, gpus_per_node)[1] if cp_kind == "a2a+p2p" else cp
        length = seq_len / ring
    return min(length, executed_share * seq_len)
