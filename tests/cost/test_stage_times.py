"""The pipeline stages that can be the slowest, each one's time per micro-batch (``StepTimeEstimate.stage_times_s``),
as the step is built from them, and the line `autotune estimate` prints about them."""

from __future__ import annotations

import itertools
import json

import pytest

from autotune.cli import build_parser, main
from autotune.commands.estimate import estimate_from_flags
from autotune.cost.ep_overlap import paired_share
from autotune.cost.step_time import TimeSettings, _critical_stage, estimate_step_time
from autotune.engines import engine_for
from autotune.rules import plan_problems
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.plan import ParallelPlan

QWEN = ["estimate", "--model", "qwen3-235b-a22b", "--gpu", "gb200", "--num-gpus", "256", "--gpus-per-node", "64",
        "--engine", "megatron", "--zero", "1", "--seq-len", "4096", "--global-batch", "8192", "--micro-batch", "1",
        "--ep", "32", "--precision", "fp8", "--fp8-recipe", "te-mxfp8", "--recompute", "none"]


def _time(argv):
    return estimate_from_flags(build_parser().parse_args(argv)).time


def test_the_slowest_stage_sets_the_steps_pace():
    # Qwen3-235B pp8 vp3 (94 layers: 11 | 12 x 6 | 11): the last stage's 16-bit output layer and loss outweigh its
    # missing layer, so it is the slowest; m micro-batches of it are the step's compute and per-micro-batch comm,
    # less the contention the step adds for hidden communication.
    time = _time([*QWEN, "--pp", "8", "--vpp", "3"])
    stages = {s: (n, t) for s, n, t in time.stage_times_s}
    assert set(stages) == {0, 1, 7} and stages[0][0] == stages[7][0] == 11 and stages[1][0] == 12
    assert stages[7][1] > stages[1][1] > stages[0][1]
    m = 8192 // (256 // 8)  # micro-batches of a pipeline (tp 1, mb 1)
    per_microbatch = time.compute_s + sum(time.comm_parts_s[k] for k in ("tp", "cp", "moe"))
    assert m * stages[7][1] == pytest.approx(per_microbatch, rel=0.1)
    assert m * stages[7][1] <= per_microbatch


def test_no_pipeline_has_one_stage_and_no_line(capsys):
    time = _time([*QWEN, "--pp", "1"])
    assert [(s, n) for s, n, _ in time.stage_times_s] == [(0, 94)]
    assert main([*QWEN, "--pp", "1"]) == 0
    assert "pipeline stages" not in capsys.readouterr().out


def test_the_estimate_names_the_slowest_stage(capsys):
    assert main([*QWEN, "--pp", "8", "--vpp", "3"]) == 0
    out = capsys.readouterr().out
    assert "stage 7 (11 layers + output layer and loss)" in out and "every stage waits for the slowest, stage 7" in out
    assert main([*QWEN, "--pp", "8", "--vpp", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["stage"] for s in doc["time"]["stage_times_s"]] == [0, 1, 7]


def test_unpaired_stage_times_are_the_paired_formula_at_share_zero():
    # estimate_step_time takes each stage's time from the critical-stage cache where no micro-batches pair
    # (paired_share 0): the same floats as c + k - share * (mc - mp) at that share; the paired plans keep the formula.
    model = load_model("qwen3-30b-a3b")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=32)
    settings = TimeSettings()
    shares = set()
    for pp, vpp, overlap, mb in itertools.product((1, 2, 4), (1, 2), (None, "a2a"), (1, 2)):
        if vpp > pp or (vpp > 1 and pp == 1):
            continue
        dp = 32 // pp
        plan = ParallelPlan(engine="megatron", pp=pp, vpp=vpp, dp=dp, ep=8, seq_len=4096, global_batch_size=256,
                            micro_batch_size=mb, grad_accum_steps=256 // (mb * dp), ep_overlap=overlap)
        if plan_problems(model, cluster, plan):
            continue
        share = paired_share(plan)
        shares.add(share > 0)
        stage_times = _critical_stage(model, cluster, plan, settings, engine_for(plan))[2]
        assert estimate_step_time(model, cluster, plan, settings).stage_times_s == tuple(
            (s, n, c + k - share * (mc - mp)) for s, n, c, k, mc, mp in stage_times)
    assert shares == {False, True}
