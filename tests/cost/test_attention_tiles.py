"""The flash kernel's tile rounding of local attention (autotune.cost.attention_tiles), counted by hand."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.cost.attention_tiles import ATTENTION_TILE, executed_attention_share, local_layer_tiles
from autotune.cost.flops import causal_attention_share
from autotune.specs.model import ModelSpec

B = ATTENTION_TILE


def _model(**changes) -> ModelSpec:
    base = ModelSpec(name="tiny", num_layers=4, hidden_size=256, num_attention_heads=4, ffn_hidden_size=512,
                     vocab_size=256, activation="swiglu", norm="rmsnorm", position_embedding="rope")
    return dataclasses.replace(base, **changes)


def _tiles_by_walking(s: int, lo, hi) -> int:
    """Tiles holding an unmasked score, found by walking every query tile x key tile (lo(q) <= key <= hi(q))."""
    n = -(-s // B)
    count = 0
    for qi in range(n):
        queries = range(qi * B, min(s, (qi + 1) * B))
        keys = set()
        for q in queries:
            keys.update(k // B for k in (max(0, lo(q)), min(s - 1, hi(q))))
            keys.update(range(max(0, lo(q)) // B, min(s - 1, hi(q)) // B + 1))
        count += len(keys)
    return count


@pytest.mark.parametrize("w, s", [(128, 4096), (100, 1000), (4096, 8192), (300, 1024)])
def test_window_tiles_match_a_walk_over_the_tiles(w, s):
    m = _model(sliding_window=w)
    local, causal = local_layer_tiles(m, s)
    assert causal == _tiles_by_walking(s, lambda q: 0, lambda q: q)
    assert local == _tiles_by_walking(s, lambda q: q - w + 1, lambda q: q)


def test_chunked_tiles_match_a_walk():
    w, s = 512, 4096
    local, _ = local_layer_tiles(_model(sliding_window=w, chunked_attention=True), s)
    assert local == _tiles_by_walking(s, lambda q: q - q % w, lambda q: q)


def test_window_of_one_tile_runs_two_key_tiles():
    """GPT-OSS: window 128 (Megatron-Bridge window_size (127, 0)) on every other layer, s = 4096: each query tile
    but the first runs its own key tile and the one before, twice the exact band."""
    w, s = 128, 4096
    m = _model(sliding_window=w, sliding_window_layers=(0, 2))
    n = s // B
    local, causal = local_layer_tiles(m, s)
    assert local == 1 + 2 * (n - 1) and causal == n * (n + 1) // 2
    exact_local = (2 * w * s - w * w) / s ** 2
    assert local / causal == pytest.approx(2 * exact_local, rel=0.05)
    assert executed_attention_share(m, s) == pytest.approx(0.5 + 0.5 * local / causal, rel=1e-12)
    assert executed_attention_share(m, s) > causal_attention_share(m, s)


def test_global_models_unchanged():
    assert executed_attention_share(_model(), 4096) == 1.0
    assert executed_attention_share(_model(sliding_window=8192), 4096) == 1.0  # window past the sequence
