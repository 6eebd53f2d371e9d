"""Transformer Engine's block-scaled FP8 recipes (te-blockwise, te-mxfp8): the GPU generations they run on, and
what their scales cost in memory and in the cast kernels."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.api import estimate, make_plan
from autotune.cost.kernels import FP8_CAST_BYTES
from autotune.errors import InputError
from autotune.rules import plan_problems
from autotune.specs.hardware import GPUSpec
from autotune.specs.loading import load_cluster
from autotune.specs.plan import FP8_BLOCK_SCALE_BYTES, ParallelPlan
from autotune.specs.presets import load_gpu_preset, load_model_preset

MODEL = load_model_preset("llama3-8b")
# Transformer Engine's block-scaled recipes (torchao's MX linear: tests/cost/test_torchao_mxfp8.py)
TE_BLOCK = {r: scales for r, scales in FP8_BLOCK_SCALE_BYTES.items() if r.startswith("te-")}


def _plan(gpu: str, recipe: str | None, **kw):
    cluster = load_cluster(gpu=gpu, num_gpus=16)
    plan = ParallelPlan(engine="megatron", tp=2, dp=8, sequence_parallel=True, zero_stage=kw.pop("zero_stage", 1),
                        global_batch_size=64, grad_accum_steps=8, seq_len=4096, precision="fp8", fp8_recipe=recipe,
                        **kw)
    return cluster, plan


@pytest.mark.parametrize(("gpu", "recipe", "runs"), [
    ("h100-sxm-80gb", "te-mxfp8", False), ("h200", "te-mxfp8", False), ("b200", "te-mxfp8", True),
    ("gb300", "te-mxfp8", True), ("a100-80gb", "te-blockwise", False), ("l40s", "te-blockwise", False),
    ("h100-sxm-80gb", "te-blockwise", True), ("b200", "te-blockwise", True), ("h100-sxm-80gb", "te-current", True)])
def test_each_recipe_runs_on_the_generations_transformer_engine_allows(gpu, recipe, runs):
    cluster, plan = _plan(gpu, recipe)
    rules = [rule for rule, _ in plan_problems(MODEL, cluster, plan)]
    assert ("fp8_recipe_gpu" not in rules) is runs, rules


def test_a_gpu_without_a_compute_capability_is_refused_with_the_way_out():
    h100 = load_gpu_preset("h100-sxm-80gb")
    unknown = GPUSpec(name="mystery", memory_gib=80, peak_tflops=dict(h100.peak_tflops), hbm_bandwidth_gb_per_s=3350,
                      kernels=h100.kernels)
    cluster, plan = _plan("h100-sxm-80gb", "te-mxfp8")
    problems = dict(plan_problems(MODEL, replace(cluster, gpu=unknown), plan))
    assert "compute_capability" in problems["fp8_recipe_gpu"]
    with pytest.raises(InputError, match="compute_capability"):
        GPUSpec(name="x", memory_gib=80, peak_tflops={"bf16": 1}, hbm_bandwidth_gb_per_s=1, compute_capability="sm90")


def test_cli_refuses_mxfp8_on_hopper_with_exit_2(capsys):
    from autotune.cli import main

    code = main(["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--global-batch",
                 "64", "--tp", "2", "--engine", "megatron", "--precision", "fp8", "--fp8-recipe", "te-mxfp8"])
    err = capsys.readouterr().err
    assert code == 2 and "compute capability 10.x" in err and "Traceback" not in err


def test_block_scales_cost_their_bytes_in_the_ledger():
    """Per FP8 element: MXFP8 adds an E8M0 byte per 32 (inputs and weights), blockwise an fp32 per 128 (inputs) and
    per 128 x 128 (weights). With FP8 parameters (distributed optimizer) a block-scaled weight is one FP8 copy plus
    a column-wise one; a per-tensor-scaled one on Blackwell is its one copy (its FP8 GEMMs take either layout); the
    saved linear inputs are the column-wise copy."""
    cluster, delayed = _plan("b200", "te-delayed")
    mem = {r: estimate(MODEL, cluster, delayed.with_(fp8_recipe=r)).memory for r in ("te-delayed", "te-mxfp8",
                                                                                      "te-blockwise")}
    base = mem["te-delayed"]
    assert "fp8_weight_cache" not in base.buffer_parts
    # 1 B per tp-sharded parameter (the column-wise copy), less MXFP8's scales
    gemm_weights = mem["te-mxfp8"].buffer_parts["fp8_weight_cache"] / (1 + TE_BLOCK["te-mxfp8"][1])
    for recipe, (act, weight) in TE_BLOCK.items():
        m = mem[recipe]
        assert m.buffer_parts["fp8_weight_cache"] == pytest.approx(gemm_weights * (1 + weight), rel=1e-9)
        assert m.weights - base.weights == pytest.approx(gemm_weights * weight, rel=1e-9)  # the FP8 parameters
        assert m.activations > base.activations
    # The saved inputs' scales: 1/32 B per element either way (1 B per 32 with MXFP8, 4 B per 128 with blockwise);
    # each FP8-saved input (QKV, attention output, fc1, fc2 inputs of every layer) carries them.
    per_layer = 4096 * (MODEL.hidden_size / 2 + MODEL.hidden_size / 2 + MODEL.hidden_size / 2
                        + MODEL.ffn_hidden_size / 2)  # tokens x widths on one of 2 TP ranks (saved after the gather)
    # (the output layer saves its 16-bit input: Megatron's is not a Transformer Engine module, no scales)
    for recipe in TE_BLOCK:
        assert mem[recipe].activations - base.activations == pytest.approx(
            per_layer * MODEL.num_layers / 32, rel=1e-9)
    assert mem["te-mxfp8"].activations == pytest.approx(mem["te-blockwise"].activations, rel=1e-9)


def test_two_copy_quantisation_costs_more_than_delayed_scaling_and_less_than_two_passes():
    # one 16-bit read, a row-wise and a column-wise FP8 write with their scales
    for recipe in TE_BLOCK:
        assert FP8_CAST_BYTES["te-delayed"] < FP8_CAST_BYTES[recipe] < FP8_CAST_BYTES["torchao-rowwise"]
    cluster, plan = _plan("b200", "te-delayed")
    t = {r: estimate(MODEL, cluster, plan.with_(fp8_recipe=r)).time.step_time_s
         for r in ("te-delayed", "te-mxfp8", "te-current")}
    assert t["te-delayed"] < t["te-mxfp8"] < t["te-current"]


def test_megatron_files_say_the_recipe_and_bridge_names_it():
    from autotune.bundle.writer import render_bundle

    cluster = load_cluster(gpu="b200", num_gpus=16)
    plan = make_plan(MODEL, cluster, engine="megatron", tp=2, sequence_parallel=True, zero_stage=1,
                     global_batch_size=64, seq_len=4096, precision="fp8", fp8_recipe="te-mxfp8")
    files = render_bundle(estimate(MODEL, cluster, plan)).files
    args = files["megatron_args.sh"]
    assert "--fp8-recipe mxfp8" in args and "--fp8-format e4m3" in args
    assert "mixed_precision=bf16_with_mxfp8_mixed" in files["bridge_overrides.args"]
    assert "MXFP8 block scaling" in files["plan.md"]


def test_bridge_files_are_withheld_where_the_registered_name_gathers_16_bit_weights():
    from autotune.emit.megatron_bridge import bridge_plan_problems

    _, plan = _plan("h100-sxm-80gb", "te-blockwise")  # distributed optimizer: FP8 parameters estimated
    assert "fp8_param_gather false" in " ".join(bridge_plan_problems(MODEL, plan))  # llama3-8b: a named precision
    assert not bridge_plan_problems(MODEL, plan.with_(zero_stage=0))
    assert not bridge_plan_problems(load_model_preset("llama3-70b"), plan)  # field by field: fp8_param_gather true
