"""A search estimates each engine's plans as its release's code runs them (``Engine.release_cost_settings``:
torchtitan 0.3's op-SAC save set keeps Float8 GEMM outputs), as ``estimate --engine-version`` does: the step time and
memory ``plan --engine-version fsdp=0.3 --json`` gives a plan are what ``estimate`` gives that plan with the same
flag, and differ from the 0.2-style estimate (so the release reached the search)."""

from __future__ import annotations

import json

import pytest

from autotune.cli import main
from autotune.cost.memory import estimate_memory
from autotune.cost.step_time import estimate_step_time
from autotune.engines import engine_for
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset
from autotune.specs.settings import MemorySettings

COMMON = ["--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--seq-len", "8192", "--global-batch",
          "16", "--engine", "fsdp", "--recompute", "selective", "--precision", "fp8", "--engine-version", "fsdp=0.3",
          "--json"]


def _json(argv, capsys) -> dict:
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def _estimate_argv(plan: dict) -> list[str]:
    """``estimate`` flags for a plan of the search (its release defaults come back from --engine-version)."""
    return ["estimate", *COMMON, "--tp", str(plan["tp"]), "--pp", str(plan["pp"]), "--cp", str(plan["cp"]),
            "--zero", str(plan["zero_stage"]), "--micro-batch", str(plan["micro_batch_size"]),
            "--dp-replicate", str(plan["dp_replicate"]), "--offload-optimizer", plan["offload_optimizer"],
            "--offload-param", plan["offload_param"]]


def test_plan_and_estimate_agree_under_a_release_with_cost_settings(capsys):
    cost = engine_for("fsdp").release_cost_settings("0.3")
    assert cost  # what this test is about: a release whose code the plan fields do not say
    found = _json(["plan", *COMMON, "--tp", "1", "--pp", "1", "--cp", "1", "--top-k", "3"], capsys)
    assert found["release_cost_settings"] == {"fsdp": {"release": "0.3", "settings": cost}}
    assert len(found["candidates"]) == 3
    model, cluster = load_model_preset("llama3-8b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    for candidate in found["candidates"]:
        plan = candidate["plan"]
        est = _json(_estimate_argv(plan), capsys)
        assert est["plan"] == plan
        assert candidate["time"]["step_time_s"] == pytest.approx(est["time"]["step_time_s"], rel=1e-12)
        assert candidate["memory"]["total"] == pytest.approx(est["memory"]["total"], rel=1e-12)
        # without the release's code (0.2's op-SAC recomputes the Float8 GEMM outputs) the numbers differ
        bare = ParallelPlan(**{k: v for k, v in plan.items()})
        assert estimate_step_time(model, cluster, bare).step_time_s > candidate["time"]["step_time_s"] * (1 + 1e-3)
        assert estimate_memory(model, cluster, bare).total != pytest.approx(candidate["memory"]["total"], rel=1e-3)


def test_a_cost_setting_the_caller_gives_wins_and_other_engines_keep_theirs():
    model, cluster = load_model_preset("llama3-8b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    space = dict(engines=("fsdp", "deepspeed"), tp=1, pp=1, cp=1, precisions=("fp8",), recompute=("selective",),
                 allow_offload=False)

    def search(versions, **kw):
        return search_plans(model, cluster, seq_len=8192, global_batch_size=16, top_k=50, ties=False,
                            constraints=SearchConstraints(**space, engine_versions=versions), **kw)

    def times(result, engine):
        return {e.plan: (e.time.step_time_s, e.memory.total) for e in result.ranked if e.plan.engine == engine}

    bare, released = search({}), search({"fsdp": "0.3"})
    told = search({"fsdp": "0.3"}, memory_settings=MemorySettings(selective_policy="op-sac"))
    assert released.release_cost_settings == {"fsdp": {"release": "0.3", "settings": {"selective_policy":
                                                                                       "op-sac-0.3"}}}
    assert bare.release_cost_settings == {}
    assert times(released, "deepspeed") == times(bare, "deepspeed")  # not an fsdp release: untouched
    fsdp, fsdp_told = times(released, "fsdp"), times(told, "fsdp")
    both = fsdp.keys() & fsdp_told.keys()
    assert both
    for plan in both:
        assert fsdp[plan][0] == fsdp_told[plan][0]  # the time settings were left None: the release's
        assert fsdp[plan][1] != pytest.approx(fsdp_told[plan][1], rel=1e-3)  # the memory's: the caller's op-sac
