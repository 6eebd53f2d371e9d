"""bench/nvidia_last_stage.py: NVIDIA's pipelined plan with `estimate`'s lighter last stage (--loss-slots), the share
of the planner's claimed gain that recovers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import accuracy_nvidia_recipes as bench  # noqa: E402
import nvidia_last_stage as last  # noqa: E402


def _case(model: str, system: str, container: str):
    row = next(r for r in bench.load_rows() if r["model"] == model and r["container"] == container
               and r["system"] == system)
    case = bench.express(row)
    bench.estimate_case(case)
    return case


def test_a_lighter_last_stage_is_the_estimate_hint_and_its_gain_over_the_plan_as_run(capsys):
    case = _case("Qwen3_235B_a22B", "DGX-GB200", "26.08")
    assert case.result.plan.pp == 8 and case.result.plan.vpp == 3
    argv = [*case.argv, *case.flags.argv, "--recompute", case.result.plan.recompute]
    hint = last.hint_of(argv)
    with_k = bench.run_estimate([*argv, "--loss-slots", str(hint.loss_slots)])
    assert hint.gain == pytest.approx(with_k.time.tokens_per_s / case.result.time.tokens_per_s - 1, rel=1e-12)
    first = case.result.time.tokens_per_s * 1.2  # a first plan 20% ahead
    out = last.last_stage_table([(case, first)], bench.label, True)
    assert out["lifted"] == [hint.gain] and out["left"] == [pytest.approx(1.2 / (1 + hint.gain) - 1, rel=1e-12)]
    assert out["recovered"] == [pytest.approx(hint.gain / 0.2, rel=1e-12)]
    assert f"--loss-slots {hint.loss_slots}" in capsys.readouterr().out


def test_a_plan_whose_last_stage_is_not_the_slowest_gains_nothing():
    case = _case("DeepSeekV3", "DGX-B300", "26.04")  # pp16: a middle stage of MoE layers is the slowest
    stages = case.result.time.stage_times_s
    assert max(stages, key=lambda s: s[2])[0] != case.result.plan.pp - 1
    out = last.last_stage_table([(case, case.result.time.tokens_per_s * 1.1)], bench.label, False)
    assert out["lifted"] == [0.0] and out["recovered"] == [0.0]
