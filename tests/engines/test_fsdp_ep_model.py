"""fsdp plans with expert parallelism only for models torchtitan runs EP in (rule fsdp:ep_model, asking the TOML
writer's emit.torchtitan.expert_parallel_problem): Mixtral 8x7B on 16 H100 ranked tp2 pp2 dp4 ep4 fsdp-full first
under --engine fsdp, which no emitted file runs (torchtitan has no Mixtral, the built-in trainer runs no EP) and
whose plan.md told a user's own script nothing of EP."""
from pathlib import Path

import pytest

from autotune.api import make_plan
from autotune.errors import InputError
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster, load_model

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
CLUSTER = load_cluster(gpu="h100-sxm-80gb", num_gpus=16)


def test_no_ep_plans_for_a_model_torchtitan_cannot_build():
    model = load_model("mixtral-8x7b")
    with pytest.raises(InputError) as err:
        make_plan(model, CLUSTER, engine="fsdp", tp=2, pp=2, ep=4, zero_stage=3, global_batch_size=256, seq_len=4096)
    assert "torchtitan runs expert parallelism only in its own MoE models" in str(err.value)
    assert "--engine megatron" in str(err.value)
    result = search_plans(model, CLUSTER, global_batch_size=256, seq_len=4096,
                          constraints=SearchConstraints(engines=("fsdp",)))
    assert result.rejections.get("fsdp:ep_model")
    assert result.ranked and all(est.plan.ep == 1 for est in result.ranked)


@pytest.mark.parametrize("ref", ["qwen3-30b-a3b", str(HF / "qwen3-30b-a3b" / "config.json")])
def test_ep_plans_for_torchtitans_moe_models(ref):
    """Qwen3-30B-A3B, as the preset or as its config.json, keeps its EP plans."""
    model = load_model(ref)
    make_plan(model, CLUSTER, engine="fsdp", ep=8, zero_stage=3, global_batch_size=256, seq_len=4096)
    result = search_plans(model, CLUSTER, global_batch_size=256, seq_len=4096,
                          constraints=SearchConstraints(engines=("fsdp",)))
    assert "fsdp:ep_model" not in result.rejections
    assert any(est.plan.ep > 1 for est in result.ranked[:20])


def test_an_ep_bundle_points_at_torchtitans_file(tmp_path, capsys):
    """Qwen3-30B-A3B with ep 8: torchtitan's TOML runs it; accelerate's YAML (no expert parallelism in its
    ParallelismConfig) and the built-in trainer (no EP) cannot, and emit and plan.md say so."""
    from autotune.cli import main

    out = tmp_path / "job"
    assert main(["emit", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--global-batch",
                 "256", "--engine", "fsdp", "--engine-version", "0.2", "--ep", "8", "--zero", "3", "--recompute",
                 "full", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert (out / "torchtitan_job.toml").exists() and not (out / "accelerate_fsdp.yaml").exists()
    assert "cannot run this plan: expert parallelism" in err and "run it with torchtitan_job.toml" in err
    text = (out / "plan.md").read_text()
    assert "accelerate_fsdp.yaml is not written: ep=8" in text
    assert "- expert parallelism (ep 8): FSDP2 has none of its own" in text
