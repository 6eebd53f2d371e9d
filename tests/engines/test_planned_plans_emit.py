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
    rule = "megatron:architecture" if engine == "megatron" else "megatron-deepspeed:layer_norms"
    assert rule in {r for r, _ in plan_problems(load_model_preset("gemma3-27b"), cluster, plan)}
    assert rule not in {r for r, _ in plan_problems(load_model_preset("llama3-8b"), cluster, plan)}


def test_megatron_refuses_what_its_gpt_model_cannot_build_and_megatron_deepspeed_keeps_bloom():
    """ALiBi and an embedding norm (BLOOM) are not Megatron-core's; the published BLOOM runs are Megatron-DeepSpeed's
    (the BigScience fork), whose estimates stay."""
    cluster = load_cluster(gpu="a100-80gb", num_gpus=8)
    bloom = load_model_preset("bloom-176b")
    plans = {e: ParallelPlan(engine=e, tp=8, pp=1, cp=1, dp=1, micro_batch_size=1, global_batch_size=8,
                             grad_accum_steps=8, sequence_parallel=True, zero_stage=1)
             for e in ("megatron", "megatron-deepspeed")}
    messages = [m for r, m in plan_problems(bloom, cluster, plans["megatron"]) if r == "megatron:architecture"]
    assert any("ALiBi" in m for m in messages) and any("embeddings" in m for m in messages)
    assert not [r for r, _ in plan_problems(bloom, cluster, plans["megatron-deepspeed"]) if "architecture" in r
                or "layer_norms" in r]


def test_plan_says_the_engine_cannot_build_the_model_not_that_it_does_not_fit(capsys):
    from autotune.cli import main
    argv = ["plan", "--model", "gemma3-27b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--global-batch", "256"]
    assert main([*argv, "--engine", "megatron"]) == 2
    err = capsys.readouterr().err
    assert "no engine searched can build" in err and "pre-norms" in err and "--engine" in err
    assert "does not fit on any number" not in err
    assert main([*argv, "--engine", "megatron,fsdp", "--top-k", "1"]) == 0  # fsdp builds it
    capsys.readouterr()
    assert main(["plan", "--model", "gemma3-27b", "--gpu", "h100-sxm-80gb", "--engine", "megatron", "--min-gpus"]) == 2
    err = capsys.readouterr().err
    assert "no engine searched can build" in err and "does not fit on any number" not in err
