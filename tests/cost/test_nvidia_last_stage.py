"""bench/nvidia_last_stage.py: NVIDIA's pipelined plan re-estimated with a lighter last stage (--loss-slots), the
share of the planner's claimed gain that recovers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import accuracy_nvidia_recipes as bench  # noqa: E402
import nvidia_last_stage as last  # noqa: E402


def _qwen_case():
    row = next(r for r in bench.load_rows() if r["model"] == "Qwen3_235B_a22B" and r["container"] == "26.08"
               and r["system"] == "DGX-GB200")
    case = bench.express(row)
    bench.estimate_case(case)
    assert case.result is not None and case.result.plan.pp == 8 and case.result.plan.vpp == 3
    return case


def test_the_lightened_plan_is_the_fastest_valid_k_and_beats_the_plan_as_run(capsys):
    case = _qwen_case()
    argv = [*case.argv, *case.flags.argv, "--recompute", case.result.plan.recompute]
    k, light = last.lightened(argv, bench.run_estimate)
    assert k in last.LOSS_SLOTS and light.plan.loss_slots == k
    every = {}
    for j in last.LOSS_SLOTS:
        try:
            every[j] = bench.run_estimate([*argv, "--loss-slots", str(j)]).time.tokens_per_s
        except bench.InputError:
            pass
    assert light.time.tokens_per_s == max(every.values()) and len(every) < len(last.LOSS_SLOTS)  # 5, 6 empty a stage
    assert light.time.tokens_per_s > case.result.time.tokens_per_s  # the head's stage was the slowest
    first = case.result.time.tokens_per_s * 1.2  # a first plan 20% ahead
    out = last.last_stage_table([(case, first)], bench.run_estimate, bench.label, True)
    lift = light.time.tokens_per_s / case.result.time.tokens_per_s - 1
    assert out["lifted"] == [lift] and out["recovered"] == [pytest.approx(lift / 0.2, rel=1e-12)]
    assert "--loss-slots" in capsys.readouterr().out
