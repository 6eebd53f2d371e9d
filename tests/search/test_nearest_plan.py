"""An invalid plan's error names the nearest plan that passes every rule (issue 17, bad input), and that plan
does pass: the suggested flags, put in place of the user's, give an estimate."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from autotune.rules import plan_problems
from autotune.search.nearest_plan import DIMS, nearest_valid_plan
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.plan import ParallelPlan

BASE = ["--model", "qwen3-235b-a22b", "--gpu", "h100-sxm-80gb", "--num-gpus", "256", "--seq-len", "4096",
        "--global-batch", "1024", "--engine", "megatron"]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", "estimate", *BASE, *args], capture_output=True,
                          text=True, timeout=120)


def _with(args: list[str], flags: str) -> list[str]:
    """``args`` with each ``--dim value`` of ``flags`` replacing the user's value (or added)."""
    out = list(args)
    for dim, value in re.findall(r"--(\w+) (\d+)", flags):
        if f"--{dim}" in out:
            out[out.index(f"--{dim}") + 1] = value
        else:
            out += [f"--{dim}", value]
    return out


@pytest.mark.parametrize("args", [
    ["--tp", "2", "--pp", "8", "--ep", "64", "--etp", "2"],  # expert groups that do not fold into tp x dp x cp
    ["--tp", "2", "--pp", "8", "--ep", "5"],                 # experts not divisible by ep
    ["--tp", "3"],                                           # heads and GPUs not divisible by tp
    ["--cp", "3", "--tp", "16"],
])
def test_the_suggested_plan_is_accepted(args):
    refused = _run(args)
    assert refused.returncode == 2, refused.stderr
    found = re.search(r"the nearest plan that passes every rule: ((?:--\w+ \d+ ?)+)", refused.stderr)
    assert found, refused.stderr
    accepted = _run(_with(args, found.group(1)))
    assert accepted.returncode == 0, accepted.stderr


def test_fewest_dimensions_changed():
    model = load_model("qwen3-235b-a22b")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=256)
    plan = ParallelPlan(tp=2, pp=8, dp=16, ep=64, etp=2, micro_batch_size=1, global_batch_size=1024,
                        grad_accum_steps=64, seq_len=4096, engine="megatron", sequence_parallel=True)
    assert plan_problems(model, cluster, plan)
    nearest = nearest_valid_plan(model, cluster, plan)
    assert nearest is not None and not plan_problems(model, cluster, nearest.plan)
    assert len(nearest.changes) == 1 and nearest.changes[0][0] in DIMS
    # ep 64 -> 16 keeps dp; pp 8 -> 2 would be as near in powers of two but moves dp 16 -> 64
    assert nearest.plan.dp == plan.dp and nearest.plan.world_size == 256


def test_the_nearest_plan_agrees_with_the_torchtitan_split_rule():
    """torchtitan's split takes up to layers + 2 virtual stages (the embedding and the output a chunk's layer each):
    Llama 3 405B's 126 layers on pp 16 hold vpp 8, which the layers_vpp rule names, so the nearest plan is vpp 8."""
    model = load_model("llama3-405b")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=2048)
    plan = ParallelPlan(tp=8, pp=16, vpp=9, dp=16, micro_batch_size=1, global_batch_size=2048, grad_accum_steps=128,
                        seq_len=8192, engine="fsdp", zero_stage=3, sequence_parallel=True)
    broken = dict(plan_problems(model, cluster, plan))
    assert "use vpp=8" in broken["layers_vpp"]
    nearest = nearest_valid_plan(model, cluster, plan)
    assert nearest is not None and nearest.changes == (("vpp", 9, 8),)


def test_an_engine_that_cannot_run_the_dimension_points_to_one_that_can():
    """Expert parallelism on plain DeepSpeed (which splits no experts): its own nearest plan drops ep to 1; the
    message also names the nearer plan Megatron-core runs, and that suggestion is accepted as written."""
    args = ["--model", "qwen3-30b-a3b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--ep", "32"]
    refused = subprocess.run([sys.executable, "-m", "autotune", "estimate", *args], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2, refused.stderr
    assert "the nearest plan that passes every rule: --ep 1 (ep 32 -> 1" in refused.stderr
    found = re.search(r"nearer, on another engine: --engine (\S+) ((?:--\w+ \d+ ?)+)", refused.stderr)
    assert found, refused.stderr
    engine, flags = found.group(1), found.group(2)
    assert engine == "megatron" and flags.strip() == "--ep 16"
    accepted = subprocess.run([sys.executable, "-m", "autotune", "estimate", *_with(args, flags), "--engine", engine],
                              capture_output=True, text=True, timeout=120)
    assert accepted.returncode == 0, accepted.stderr


def test_no_other_engine_is_suggested_when_one_runs_the_plan_as_it_is():
    model = load_model("qwen3-30b-a3b")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=16)
    plan = ParallelPlan(ep=8, dp=16, micro_batch_size=1, global_batch_size=16, grad_accum_steps=1, seq_len=4096,
                        engine="deepspeed", zero_stage=1)
    assert plan_problems(model, cluster, plan)
    from autotune.search.nearest_plan import nearest_on_other_engine

    # megatron runs ep 8 unchanged: make_plan's "engines that can run this plan" names it, no second suggestion
    assert nearest_on_other_engine(model, cluster, plan, ["megatron"], None) is None
    # an engine that needs a change is suggested only when it changes less than the plan's own engine's nearest
    own = nearest_valid_plan(model, cluster, plan)
    assert own is not None and own.changes == (("ep", 8, 1),)
    assert nearest_on_other_engine(model, cluster, plan, ["hf"], own) is None


def test_an_engine_without_pipelines_names_no_zero_stage_for_them():
    refused = subprocess.run([sys.executable, "-m", "autotune", "estimate", "--model", "llama3-8b", "--gpu",
                              "h100-sxm-80gb", "--num-gpus", "16", "--engine", "hf", "--pp", "2"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "no pipeline parallelism (pp=2)" in refused.stderr
    assert "use stage ," not in refused.stderr and "does not run with pipeline parallelism" not in refused.stderr


def test_a_tensor_parallel_group_past_the_node_weighs_more():
    """An interleaved Llama-3-70B plan whose batch the schedule cannot split: tp 8 -> 16 (one doubling, but past an
    8-GPU node: each layer's collectives on the network) was the suggestion; now a change that keeps TP in the
    node is. On NVL72 trays (72 GPUs a node) tp 16 stays inside NVLink and is still the nearest."""
    model = load_model("llama3-70b")
    plan = ParallelPlan(tp=8, pp=4, dp=2, vpp=4, micro_batch_size=1, global_batch_size=100, grad_accum_steps=50,
                        seq_len=8192, engine="megatron", sequence_parallel=True)
    h100 = load_cluster(gpu="h100-sxm-80gb", num_gpus=64)
    assert plan_problems(model, h100, plan)
    nearest = nearest_valid_plan(model, h100, plan)
    assert nearest is not None and not plan_problems(model, h100, nearest.plan)
    assert nearest.plan.tp <= h100.gpus_per_node, nearest.describe()
    gb200 = load_cluster(gpu="gb200", num_gpus=64)
    assert nearest_valid_plan(model, gb200, plan).changes == (("tp", 8, 16),)
