"""What each ``--recompute-modules`` set frees, against Megatron-Bridge's matched study on 8 H100 (Moonlight-16B-A3B;
bench/recompute_modules_ab.py, bench/data/megatron_bridge_recompute_ab.csv). The memory a set frees is compared, not
the absolute peak (the recipe's bf16 optimizer moments are not modelled); the step-time columns are printed by the
bench and not held here (the model's recompute costs are far below this host-bound run's: see the bench)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import recompute_modules_ab as bench  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    return {r.modules: r for r in map(bench.estimate, bench.read_rows())}


def test_the_data_file_holds_the_six_rows_of_the_study(rows):
    assert set(rows) == {(), ("core_attn",), ("mla_up_proj",), ("mla_up_proj", "mlp"), ("moe_act",),
                         ("layernorm", "moe_act")}
    assert rows[()].peak_gb == pytest.approx(36.618) and rows[()].step_ms == pytest.approx(457.18)


def test_attention_core_recompute_frees_almost_nothing_under_fused_attention(rows):
    # measured 0.004 GB: the fused kernel keeps only its log-sum-exp for backward
    freed = rows[()].activations_gb - rows[("core_attn",)].activations_gb
    assert freed < 0.05


@pytest.mark.parametrize("modules", [("mla_up_proj",), ("moe_act",)])
def test_the_narrow_sets_free_what_the_study_measured_within_a_third(rows, modules):
    measured = rows[()].peak_gb - rows[modules].peak_gb
    predicted = rows[()].activations_gb - rows[modules].activations_gb
    assert 0.67 * measured < predicted < 1.33 * measured, (modules, measured, predicted)


def test_the_bench_prints_every_set_and_the_control(capsys):
    # `python bench/recompute_modules_ab.py`, as the README shows it
    assert bench.main() == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("(none)", "core_attn", "mla_up_proj mlp", "layernorm moe_act"))
    assert "control: measured 457 ms a step" in out and "SKILL.md:105-126" in out
