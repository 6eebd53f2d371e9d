"""What `autotune plan` ranks, `autotune emit` writes: the engines' rules refuse every plan their files cannot express.

Found by searching a dozen presets on every engine and writing each ranked plan's bundle: the planner put a
Megatron-DeepSpeed plan first for Qwen3-30B-A3B (DeepSpeed-MoE has no form for its narrow experts) and ranked
Megatron plans for Gemma 3 (its sandwich norms are not Megatron's pre-norm layer); both bundles were refused."""

from __future__ import annotations

import pytest

from autotune.bundle.writer import render_bundle
from autotune.rules import plan_problems
from autotune.search.planner import search_plans
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset


@pytest.mark.parametrize("preset, gpu, gpus, batch, seq", [
    ("qwen3-30b-a3b", "b200", 8, 512, 4096),
    ("mixtral-8x7b", "h100-sxm-80gb", 8, 64, 4096),
    ("gemma3-27b", "h100-sxm-80gb", 16, 256, 8192),
])
def test_the_planners_first_plans_emit(preset, gpu, gpus, batch, seq):
    model, cluster = load_model_preset(preset), load_cluster(gpu=gpu, num_gpus=gpus)
    result = search_plans(model, cluster, seq_len=seq, global_batch_size=batch, top_k=5)
    assert result.ranked
    for est in result.ranked:
        assert not (est.plan.engine == "deepspeed" and est.plan.ep > 1)
        bundle = render_bundle(est)  # raises where an engine's files cannot express the plan
        assert "plan.md" in bundle.files


@pytest.mark.parametrize("engine", ["megatron", "megatron-deepspeed"])
def test_megatron_layers_take_two_pre_norms(engine):
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    plan = ParallelPlan(engine=engine, tp=1, pp=1, cp=1, dp=8, micro_batch_size=1, global_batch_size=64,
                        grad_accum_steps=8, sequence_parallel=False, zero_stage=1)
    rules = {rule for rule, _ in plan_problems(load_model_preset("gemma3-27b"), cluster, plan)}
    assert f"{engine}:layer_norms" in rules
    assert f"{engine}:layer_norms" not in {r for r, _ in plan_problems(load_model_preset("llama3-8b"), cluster, plan)}
