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


def test_the_pipeline_memory_flags_reach_the_ledger():
    # --grad-accumulation and --pipeline-buffers set MemorySettings' grad_accumulation_sharded and
    # pipeline_buffers_released (the Llama 3 run's stated settings): the FSDP2 pipeline stage's fp32 gradient
    # accumulator and its per-micro-batch stage buffers go, nothing else in the ledger moves.
    import argparse

    from autotune.cli import build_parser
    from autotune.commands.estimate import estimate_from_flags

    argv = ["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--engine", "fsdp",
            "--tp", "2", "--pp", "4", "--zero", "2", "--global-batch", "32", "--seq-len", "4096",
            "--recompute", "none", "--json"]
    parser = build_parser()
    with pytest.raises(SystemExit):  # only the named choices
        parser.parse_args([*argv, "--grad-accumulation", "fp32"])
    assert isinstance(parser.parse_args(argv), argparse.Namespace)
    default = estimate_from_flags(parser.parse_args(argv)).memory
    kept = estimate_from_flags(parser.parse_args([*argv, "--grad-accumulation", "unsharded",
                                                  "--pipeline-buffers", "kept"])).memory
    meta = estimate_from_flags(parser.parse_args([*argv, "--grad-accumulation", "sharded",
                                                  "--pipeline-buffers", "released"])).memory
    assert kept.buffer_parts == default.buffer_parts  # torch.distributed.pipelining's are the engine's own
    assert "unsharded_grads" in default.buffer_parts and "unsharded_grads" not in meta.buffer_parts
    assert meta.buffer_parts["pipeline_buffers"] < default.buffer_parts["pipeline_buffers"]
    assert meta.buffer_parts["unsharded_params"] == default.buffer_parts["unsharded_params"]
    assert meta.activations == default.activations and meta.gradients == default.gradients
    assert meta.total < default.total
