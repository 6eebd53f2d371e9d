"""bench/data/megatron_moe_recipes.csv (Megatron-core's MoE recipes with their measured TFLOP/s) is well formed, its
TFLOP/s convert to tokens/s by Megatron's own count, and bench/megatron_moe_recipes.py estimates every row."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import pytest

from autotune.specs.loading import load_model

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import megatron_moe_recipes as bench

with bench.DATA.open() as _f:
    RAW = list(csv.DictReader(_f))


@pytest.mark.parametrize("tflops,tokens", [(1083.660, 7320.274), (1300.440, 8784.492)])
def test_flops_per_token_is_megatrons_count(tflops, tokens):
    # Megatron-Bridge PR #5722 (Qwen3 235B verification card): GB200 1,083.660 model TFLOP/s per GPU at
    # 7,320.274 tokens/s per GPU, GB300 1,300.440 at 8,784.492, both counted by Megatron's training.py.
    per_token = bench.megatron_flops_per_token(load_model("qwen3-235b-a22b"), 4096)
    assert per_token == pytest.approx(tflops * 1e12 / tokens, rel=5e-4)


def test_the_count_grows_with_the_sequence_by_the_attention_core_alone():
    model = load_model("qwen3-235b-a22b")
    longer = bench.megatron_flops_per_token(model, 8192) - bench.megatron_flops_per_token(model, 4096)
    assert longer == pytest.approx(6 * 4096 * model.q_width * model.num_layers)


def test_rows_name_their_recipe_and_their_layout_divides_the_gpus_and_the_batch():
    assert RAW
    for r in RAW:
        assert r["recipe"].endswith(".yaml") and r["recipe"].split("/")[0] in ("qwen3_235b", "qwen3_30b"), r["recipe"]
        gpus, tp, pp, ep = (int(r[k]) for k in ("gpus", "tp", "pp", "ep"))
        assert gpus % (tp * pp) == 0 and (gpus // pp) % ep == 0, r["recipe"]
        dp = gpus // (tp * pp)
        assert int(r["gbs"]) % (dp * int(r["mbs"])) == 0, r["recipe"]
        assert float(r["median_tflops"]) > 0, r["recipe"]


def test_every_row_is_estimated_and_fits():
    rows = [bench.read_row(raw) for raw in RAW]
    for row in rows:
        bench.estimate(row)
        assert row.predicted is not None, (row.recipe, row.reason)
        assert row.fits, row.recipe
        assert math.isfinite(row.error) and row.measured > 0


def test_rows_that_overlap_their_all_to_alls_are_also_estimated_without_and_the_overlap_only_hides_time():
    rows = [bench.read_row(raw) for raw in RAW]
    overlapped = 0
    for row in rows:
        bench.estimate(row)
        if "--ep-overlap" in row.argv and row.argv[row.argv.index("--ep-overlap") + 1] != "none":
            overlapped += 1
            assert row.without_overlap is not None and row.without_overlap < row.predicted, row.recipe
        else:
            assert row.without_overlap is None, row.recipe
    assert overlapped >= 3
