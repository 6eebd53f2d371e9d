"""Mixtures of experts on the DeepSpeed engines: the planner proposes only what their files build.

DeepSpeed on the user's model has no expert parallelism (its files do not split experts: autotune/engines/
deepspeed.py); Megatron-DeepSpeed's DeepSpeed-MoE takes experts as wide as the FFN, no shared experts, no dense layers
first, and no ZeRO-3 (autotune/emit/megatron.py ``deepspeed_moe_problems``, the refusals of its argument
writer). Before these rules `autotune plan` put a Megatron-DeepSpeed plan first for Qwen3-30B-A3B on 8 B200 that
`autotune emit` then refused."""

from __future__ import annotations

from autotune.rules import plan_problems
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset


def _ids(model, cluster, *, engine, zero_stage, ep=1, global_batch_size=64) -> set[str]:
    plan = ParallelPlan(engine=engine, tp=1, pp=1, cp=1, dp=8, ep=ep, micro_batch_size=1,
                        global_batch_size=global_batch_size, grad_accum_steps=global_batch_size // 8,
                        sequence_parallel=False, zero_stage=zero_stage)
    return {rule for rule, _ in plan_problems(model, cluster, plan)}


def test_deepspeed_refuses_expert_parallelism():
    model, cluster = load_model_preset("mixtral-8x7b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    assert "deepspeed:ep" in _ids(model, cluster, engine="deepspeed", ep=8, zero_stage=1, global_batch_size=64)
    assert "deepspeed:ep" not in _ids(model, cluster, engine="deepspeed", ep=1, zero_stage=3, global_batch_size=64)


def test_megatron_deepspeed_takes_only_what_deepspeed_moe_builds():
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    mixtral = load_model_preset("mixtral-8x7b")  # experts as wide as the FFN, no shared expert: DeepSpeed-MoE's form
    assert not {"megatron-deepspeed:moe_form", "megatron-deepspeed:moe_zero3"} & _ids(
        mixtral, cluster, engine="megatron-deepspeed", ep=8, zero_stage=1, global_batch_size=64)
    assert "megatron-deepspeed:moe_zero3" in _ids(mixtral, cluster, engine="megatron-deepspeed", ep=8, zero_stage=3,
                                                  global_batch_size=64)
    qwen = load_model_preset("qwen3-30b-a3b")  # experts of 768 against an FFN of 6144
    assert "megatron-deepspeed:moe_form" in _ids(qwen, cluster, engine="megatron-deepspeed", ep=8, zero_stage=1,
                                                 global_batch_size=64)
    llama = load_model_preset("llama3-8b")
    assert not {"megatron-deepspeed:moe_form", "megatron-deepspeed:moe_zero3"} & _ids(
        llama, cluster, engine="megatron-deepspeed", zero_stage=3, global_batch_size=64)
