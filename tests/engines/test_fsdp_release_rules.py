"""The fsdp engine's expert-parallel plans are those the named torchtitan release runs (Engine.release_problems, rule
fsdp:release, asking the writers' own emit.torchtitan_models): torchtitan alone runs their EP, and 0.2.2's Qwen3 and
GPT-OSS TrainSpecs have no pipelining, 0.3 has no expert tensor parallelism, 0.2 never compiles GPT-OSS (which FP8
turns on). With torchtitan 0.2.2 installed, `plan --model qwen3-30b-a3b --engine fsdp` on 16 H100 ranked tp1 pp2x4
dp8 ep8 first, whose torchtitan_job.toml emit then refused, and nothing else runs it. Plans without EP stay: the
built-in trainer or the user's script runs them with torch's own APIs."""
from __future__ import annotations

import pytest

from autotune.api import make_plan
from autotune.cli import main
from autotune.engines import engine_for
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster, load_model

CLUSTER = load_cluster(gpu="h100-sxm-80gb", num_gpus=16)


def _search(model: str, release: str | None, **kw):
    versions = {} if release is None else {"fsdp": release}
    return search_plans(load_model(model), CLUSTER, global_batch_size=512, seq_len=4096,
                        constraints=SearchConstraints(engines=("fsdp",), engine_versions=versions, **kw))


def test_torchtitan_02_runs_no_qwen3_pipeline():
    result = _search("qwen3-30b-a3b", "0.2")
    assert result.rejections.get("fsdp:release") and result.ranked
    assert not any(est.plan.pp > 1 and est.plan.ep > 1 for est in result.ranked)
    assert any(est.plan.pp > 1 and est.plan.ep == 1 for est in result.ranked)  # the built-in trainer's
    assert any(est.plan.pp > 1 and est.plan.ep > 1 for est in _search("qwen3-30b-a3b", "0.3").ranked[:50])


def test_torchtitan_03_runs_no_expert_tensor_parallelism():
    result = _search("qwen3-30b-a3b", "0.3")
    assert result.ranked and not any(est.plan.tp > 1 and est.plan.ep > 1 for est in result.ranked)
    assert any(est.plan.tp > 1 and est.plan.ep > 1 for est in _search("qwen3-30b-a3b", "0.2").ranked)


def test_no_release_named_no_release_rules():
    result = _search("qwen3-30b-a3b", None)
    assert "fsdp:release" not in result.rejections
    assert any(est.plan.pp > 1 and est.plan.ep > 1 for est in result.ranked[:50])


def test_torchtitan_02_never_compiles_gpt_oss():
    """A variant's run settings break it: FP8 compiles, which 0.2's parallelize_gptoss never does."""
    result = _search("gpt-oss-20b", "0.2", precisions=("fp8",))
    assert result.rejections.get("fsdp:release") and all(est.plan.ep == 1 for est in result.ranked)
    assert any(est.plan.ep > 1 for est in _search("gpt-oss-20b", "0.3", precisions=("fp8",)).ranked)


@pytest.mark.parametrize("version, rc", [("0.2", 2), ("0.3", 0)])
def test_estimate_refuses_what_its_release_cannot_run(version, rc, capsys):
    args = ["estimate", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--global-batch",
            "512", "--engine", "fsdp", "--pp", "2", "--ep", "8", "--zero", "3", "--engine-version", version]
    assert main(args) == rc
    err = capsys.readouterr().err
    assert ("does not support pipelining" in err) == (rc == 2)
    if rc == 2:  # and the nearest plan the release runs
        assert "the nearest plan that passes every rule: --pp 1 (pp 2 -> 1; dp 16)" in err


def test_the_nearest_plan_follows_the_release_rules():
    from autotune.search.nearest_plan import nearest_valid_plan

    model, cluster = load_model("qwen3-30b-a3b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=16)
    plan = make_plan(model, cluster, engine="fsdp", pp=2, ep=8, zero_stage=3, global_batch_size=512, seq_len=4096)
    engine = engine_for("fsdp")
    assert engine.release_problems("0.2", model, plan)
    # by the engine's rules alone the nearest change keeps the pipeline the release cannot run
    assert engine.release_problems("0.2", model, nearest_valid_plan(model, cluster, plan).plan)
    nearest = nearest_valid_plan(model, cluster, plan, accept=lambda p: not engine.release_problems("0.2", model, p))
    assert nearest.flags() == "--pp 1" and not engine.release_problems("0.2", model, nearest.plan)
