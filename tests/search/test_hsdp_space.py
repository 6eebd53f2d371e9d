"""Hybrid sharding (FSDP2 HSDP, ``dp_replicate``) is a dimension the planner searches and the tuner records."""

import json
import subprocess
import sys

import pytest

from autotune.engines import engine_for
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster, load_model
from autotune.tune.sampler import DIMENSIONS, distributions, plan_params

MODEL = load_model("llama3-8b")
CLUSTER = load_cluster(gpu="h100-sxm-80gb", num_gpus=64)  # 8 nodes of 8


def _ranked(**constraints):
    c = SearchConstraints(tp=1, pp=1, cp=1, recompute=("full",), micro_batch_size=2, **constraints)
    return search_plans(MODEL, CLUSTER, seq_len=8192, global_batch_size=256, constraints=c, top_k=100).ranked


def test_hsdp_splits_whose_shard_group_fills_whole_nodes_are_ranked():
    plans = [e.plan for e in _ranked(engines=("fsdp",))]
    replicas = {p.dp_replicate for p in plans}
    # dp 64 on nodes of 8: shard groups of 32, 16 and 8 ranks (2, 4, 8 replicas); never a shard inside a node
    assert replicas == {1, 2, 4, 8}
    assert all(p.zero_stage >= 2 for p in plans if p.dp_replicate > 1)
    assert all(p.dp // p.dp_replicate >= CLUSTER.gpus_per_node for p in plans)


def test_hsdp_changes_the_estimate_it_is_ranked_by():
    by_key = {(e.plan.zero_stage, e.plan.dp_replicate, e.plan.offload_optimizer): e for e in _ranked(engines=("fsdp",))}
    full, hybrid = by_key[(3, 1, "none")], by_key[(3, 8, "none")]
    # a shard group of 8 holds 8x the model states of a shard over 64 ...
    assert hybrid.memory.total > full.memory.total
    # ... and its step has a replica all-reduce the full shard does not
    assert hybrid.time.step_time_s != full.time.step_time_s


def test_engines_without_hybrid_sharding_are_never_given_replicas():
    assert not engine_for("deepspeed").support.hybrid_shard
    plans = [e.plan for e in _ranked(engines=("deepspeed", "megatron"))]
    assert plans and {p.dp_replicate for p in plans} == {1}


def test_a_fixed_replica_count_is_the_only_one_searched():
    plans = [e.plan for e in _ranked(engines=("fsdp",), dp_replicate=4)]
    assert plans and {p.dp_replicate for p in plans} == {4}


def test_a_fixed_replica_count_skips_layouts_it_does_not_divide():
    c = SearchConstraints(tp=1, pp=1, recompute=("none",), engines=("fsdp",), dp_replicate=2, allow_offload=False)
    cluster = load_cluster(gpu="cpu", num_gpus=4)
    ranked = search_plans(load_model("tiny-llama"), cluster, seq_len=64, global_batch_size=8, constraints=c,
                          top_k=100).ranked
    # cp 1 (dp 4) plans only: with cp 2 or 4, dp (2 or 1) is not split into 2 replica groups of shards
    assert ranked and all(e.plan.dp_replicate == 2 and e.plan.dp == 4 for e in ranked)


def test_replicas_are_an_optuna_dimension_of_the_study():
    plans = [e.plan for e in _ranked(engines=("fsdp",))]
    assert "dp_replicate" in DIMENSIONS
    assert {plan_params(p)["dp_replicate"] for p in plans} == {1, 2, 4, 8}
    assert list(distributions(plans)["dp_replicate"].choices) == [1, 2, 4, 8]


@pytest.mark.slow
def test_plan_cli_fixes_the_replicas():
    out = subprocess.run([sys.executable, "-m", "autotune", "plan", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb",
                          "--num-gpus", "16", "--seq-len", "4096", "--global-batch", "64", "--engine", "fsdp",
                          "--tp", "1", "--pp", "1", "--cp", "1", "--dp-replicate", "2", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cands = json.loads(out.stdout)["candidates"]
    assert cands and all(c["plan"]["dp_replicate"] == 2 for c in cands)
