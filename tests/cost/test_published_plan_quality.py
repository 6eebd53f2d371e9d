"""NVIDIA's dense H100 Megatron recipes among the published runs rank in the planner's top 10 (issue 20's plan-quality
target; ``python bench/published_plan_quality.py`` prints every run's rank)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotune.cost.published_runs import published_runs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import published_plan_quality as bench  # noqa: E402

BY_ID = {r.run_id: r for r in published_runs()}


def test_the_bench_takes_every_nvidia_h100_megatron_run():
    ids = [r for r in BY_ID if r.startswith(bench.NVIDIA_RUNS)]
    assert {"nemo2407-h100-gpt3-175b-512gpu-fp8", "bridge2511-h100-llama3-70b-64gpu-fp8"} <= set(ids)
    assert len(ids) >= 7


@pytest.mark.parametrize("run_id", ["nemo2407-h100-gpt3-175b-512gpu-fp8", "megatron-core-h100-weak-177b"])
def test_nvidia_175b_recipes_rank_first_in_the_planners_order(run_id):
    rank, by_speed, feasible, gain, top = bench.rank_row(BY_ID[run_id])
    assert feasible > 1000 and top != "(none)"
    assert rank <= 10 and by_speed <= 10
    assert gain < 0.05  # no plan claimed far above NVIDIA's own recipe


@pytest.mark.slow
def test_the_bench_command_prints_every_run_and_the_count(capsys):
    assert bench.main() == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(bench.NVIDIA_RUNS)]
    assert len(rows) == len([r for r in BY_ID if r.startswith(bench.NVIDIA_RUNS)])
    summary = next(line for line in out.splitlines() if "in the planner's top 10:" in line)
    top10, total = (int(x) for x in summary.split("top 10: ")[1].split(";")[0].split("/"))
    assert total == len(rows) and top10 >= 5
