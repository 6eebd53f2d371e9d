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


def test_every_training_step_is_stated_on_the_command_line():
    # Every published run that times a training step is a command line: the older engines' behaviours (2021-22
    # Megatron-LM's blocking TP and pipeline sends, DeepSpeed 0.3's list collectives, torchtitan's repeated K/V
    # under CP, MPT's Triton FlashAttention) through the run-code flags. Only Korthikanti's one-layer timings are not.
    unstated = {r.run_id: not_expressible(r, predict_run(r)[1]) for r in RUNS if r not in STATED}
    assert len(STATED) >= 60
    assert all(why.startswith("a one-layer timing") for why in unstated.values()), unstated


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


def _estimate(argv):
    from autotune.cli import build_parser
    from autotune.commands.estimate import estimate_from_flags

    return estimate_from_flags(build_parser().parse_args(argv))


GPT_175B = ["estimate", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--num-gpus", "256", "--engine", "megatron",
            "--tp", "8", "--pp", "8", "--vpp", "3", "--global-batch", "1024", "--micro-batch", "1", "--seq-len", "2048",
            "--recompute", "selective"]


@pytest.mark.parametrize("flag, slower", [("--tp-backward-comm", "blocking"), ("--pp-sends", "blocking")])
def test_the_older_schedules_cost_their_waits(flag, slower):
    # The 2021-22 Megatron-LM waits: the engine's own (overlapped) is what no flag gives; blocking exposes more
    # communication and a longer step.
    default, same, waited = (_estimate(GPT_175B + extra).time for extra in
                             ([], [flag, "overlapped"], [flag, slower]))
    assert same.step_time_s == default.step_time_s
    assert waited.step_time_s > default.step_time_s
    assert waited.exposed_comm_s > default.exposed_comm_s


def test_the_attention_kernel_flag_costs_the_kernel():
    base = ["estimate", "--model", "llama3-8b", "--gpu", "a100-80gb", "--num-gpus", "8", "--engine", "fsdp",
            "--zero", "3", "--global-batch", "32", "--seq-len", "8192"]
    fa2, triton = (_estimate(base + ["--attention-kernel", k]).time for k in ("fa2", "fa-triton"))
    assert triton.compute_s > fa2.compute_s  # Triton FlashAttention runs ~1.3x slower than FlashAttention-2


def test_repeated_kv_costs_memory_and_time_under_cp():
    # torchtitan-h100-l3-405b-512gpu-fsdp2-cp4's layout: the ring's K/V buffers at 128 heads, not 8, outgrow the
    # MLP's working set they reuse (with llama3-8b's 32 heads they do not: memory equal there).
    base = ["estimate", "--model", "llama3-405b", "--gpu", "h100-sxm-80gb", "--num-gpus", "512", "--engine", "fsdp",
            "--zero", "2", "--tp", "8", "--pp", "8", "--cp", "4", "--global-batch", "16", "--seq-len", "131072",
            "--recompute", "full"]
    gqa, repeated = (_estimate(base + ["--cp-kv", k]) for k in ("gqa", "repeated"))
    assert repeated.memory.total > gqa.memory.total
    assert repeated.time.step_time_s > gqa.time.step_time_s


def test_zero3_list_collectives_are_slower():
    base = ["estimate", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--num-gpus", "384", "--engine", "deepspeed",
            "--zero", "3", "--tp", "8", "--global-batch", "384", "--seq-len", "2048", "--recompute", "full"]
    coalesced, lists = (_estimate(base + ["--zero3-collectives", k]).time for k in ("coalesced", "lists"))
    assert lists.step_time_s > coalesced.step_time_s


def test_from_a_job_the_run_code_flags_are_costed_not_dropped(tmp_path, capsys):
    # `estimate --from files --pp-sends blocking` costs the job's plan with the flag, as the same plan stated by
    # flags does: the flag was silently ignored with --from before.
    import json

    from autotune.cli import main

    flags = ["--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "64", "--engine", "megatron",
             "--tp", "4", "--pp", "4", "--vpp", "5", "--global-batch", "128", "--seq-len", "4096"]
    assert main(["emit", *flags, "--out", str(tmp_path / "job")]) == 0
    job = [str(tmp_path / "job" / "megatron_args.sh"), str(tmp_path / "job" / "launch_torchrun.sh")]
    capsys.readouterr()
    out = {}
    for name, argv in [("flags", ["estimate", *flags]), ("from", ["estimate", "--from", *job, "--gpu", "h100-sxm-80gb"])]:
        for sends in ("overlapped", "blocking"):
            assert main([*argv, "--pp-sends", sends, "--json"]) == 0
            out[name, sends] = json.loads(capsys.readouterr().out)["time"]["step_time_s"]
    assert out["from", "blocking"] > out["from", "overlapped"]
    assert out["from", "blocking"] == pytest.approx(out["flags", "blocking"], rel=1e-9)
