"""The fsdp engine's plans with expert parallelism keep torchtitan's expert mesh (rule fsdp:ep_mesh, asked of
emit.torchtitan_models.expert_problems_02 like the TOML writer)."""

import pytest

from autotune.api import make_plan
from autotune.errors import InputError
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster, load_model


def test_fsdp_plans_with_ep_keep_torchtitans_expert_mesh():
    """torchtitan borrows the EP ranks from dp_shard x cp x tp and the built-in trainer runs no EP, so an fsdp plan
    with ep > 1 and nothing sharded (zero 0: dp_shard 1) runs under no file emit writes. GPT-OSS-120B on 64 H100
    ranked tp1 pp8 dp8 ep8 fsdp-noshard first before the rule fsdp:ep_mesh."""
    model = load_model("gpt-oss-120b")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=64)
    with pytest.raises(InputError) as err:
        make_plan(model, cluster, engine="fsdp", pp=8, ep=8, zero_stage=0, global_batch_size=1280, seq_len=4096)
    assert "does not divide dp_shard x cp x tp = 1" in str(err.value)
    make_plan(model, cluster, engine="fsdp", pp=8, ep=8, zero_stage=2, global_batch_size=1280, seq_len=4096)
    result = search_plans(model, cluster, global_batch_size=1280, seq_len=4096,
                          constraints=SearchConstraints(engines=("fsdp",)))
    assert result.rejections.get("fsdp:ep_mesh")
    for est in result.ranked[:20]:
        plan = est.plan
        shard = plan.dp // (plan.dp if plan.zero_stage == 0 else plan.dp_replicate)
        assert plan.ep == 1 or (shard * plan.cp * plan.tp) % (plan.ep * plan.expert_tp) == 0, plan
