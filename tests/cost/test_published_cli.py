"""The published-runs bench and `autotune estimate` give the same number for each run the command line can state
(bench/published_cli.py builds the command a user would type: the run's model as a model YAML, its GPUs, plan and
run-setting flags, through the CLI's own parser and ``estimate_from_flags``). The runs it cannot state are named
with the reason, and the reasons are only the ones the module knows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
from published_cli import compare_run, not_expressible  # noqa: E402

from autotune.cost.published_runs import predict_run, published_runs  # noqa: E402

RUNS = [r for r in published_runs() if not r.skipped and r.tokens_per_s_per_gpu]
STATED = [r for r in RUNS if not not_expressible(r, predict_run(r)[1])]


def test_most_modern_runs_are_stated_on_the_command_line():
    # Every run after 2022 (Megatron-core, NeMo / Bridge, torchtitan, MPT, FSDP paper, Llama 3) is stated but
    # torchtitan's context-parallel runs, whose code repeated K and V before attention, and MPT's, whose Triton
    # FlashAttention no engine the CLI models runs.
    modern = [r for r in RUNS if r.run_id.startswith(("megatron-core", "nemo", "bridge", "torchtitan", "mpt", "fsdp",
                                                      "llama3"))]
    unstated = {r.run_id: not_expressible(r, predict_run(r)[1]) for r in modern if r not in STATED}
    assert len(modern) - len(unstated) >= 20
    assert all((why.startswith("torchtitan before v0.2.2") and "-cp" in run_id)
               or (why.startswith("its attention kernel (fa-triton") and run_id.startswith("mpt-"))
               for run_id, why in unstated.items())


@pytest.mark.parametrize("run", STATED, ids=[r.run_id for r in STATED])
def test_the_cli_gives_the_benchs_number(run, tmp_path):
    case = compare_run(run, tmp_path)
    assert not case.reason
    assert case.cli_tokens_per_s_per_gpu == pytest.approx(case.bench_tokens_per_s_per_gpu, rel=1e-9)
    assert case.cli_memory_gib == pytest.approx(case.bench_memory_gib, rel=1e-9)
    assert "--model" in case.argv and case.argv[case.argv.index("--model") + 1].endswith(".model.yaml")
