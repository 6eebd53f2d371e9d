"""NVFP4 training (``--precision fp4``, Transformer Engine NVFP4BlockScaling): where it runs, what its GEMMs and
quantize kernels cost, what its weight copies and saved inputs take, and the files written for it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.api import estimate, make_plan
from autotune.cost.kernels import FP8_CAST_BYTES, rates
from autotune.cost.efficiency import DEFAULT_EFFICIENCY
from autotune.errors import InputError
from autotune.rules import plan_problems
from autotune.specs.hardware import GPUSpec
from autotune.specs.loading import load_cluster
from autotune.specs.nvfp4 import (FP4_ELEMENT_BYTES, NVFP4_CAST_BYTES, NVFP4_INPUT_BYTES, NVFP4_SCALE_BYTES,
                                  NVFP4_WEIGHT_BYTES)
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_gpu_preset, load_model_preset

MODEL = load_model_preset("llama3-8b")
BLACKWELL = ("b200", "b300", "gb200", "gb300")


def _plan(gpu: str = "b200", precision: str = "fp4", **kw):
    cluster = load_cluster(gpu=gpu, num_gpus=16)
    plan = ParallelPlan(engine=kw.pop("engine", "megatron"), tp=2, dp=8,
                        sequence_parallel=kw.pop("sequence_parallel", True), zero_stage=kw.pop("zero_stage", 1), global_batch_size=64, grad_accum_steps=8, seq_len=4096,
                        precision=precision, **kw)
    return cluster, plan


def test_the_format_facts_add_up():
    """E2M1 is half a byte; one E4M3 scale per 16 values (activations, gradients) or per 16 x 16 (weights)."""
    assert NVFP4_INPUT_BYTES == FP4_ELEMENT_BYTES + NVFP4_SCALE_BYTES[0] == pytest.approx(0.5625)
    assert NVFP4_WEIGHT_BYTES == pytest.approx(0.5 + 1 / 256)
    # an amax pass and a fused quantize pass over the 16-bit source, two FP4 copies out: more traffic than MXFP8's
    # one-pass cast, less than two separate casts of it
    assert FP8_CAST_BYTES["te-mxfp8"] < NVFP4_CAST_BYTES < 2 * FP8_CAST_BYTES["te-mxfp8"]


@pytest.mark.parametrize("gpu", BLACKWELL)
def test_every_blackwell_preset_has_a_dense_fp4_peak_above_its_fp8_one(gpu):
    spec = load_gpu_preset(gpu)
    assert spec.supports("fp4") and spec.peak_tflops["fp4"] >= 2 * spec.peak_tflops["fp8"]
    facts = spec.kernel_facts()
    assert 0 < facts.gemm("fp4") < facts.gemm("fp8")  # NVFP4's kernels reach less of their peak (TE's B300 guide)


@pytest.mark.parametrize(("gpu", "runs"), [("b200", True), ("gb300", True), ("h100-sxm-80gb", False),
                                           ("a100-80gb", False)])
def test_fp4_runs_on_blackwell_only(gpu, runs):
    cluster, plan = _plan(gpu)
    problems = dict(plan_problems(MODEL, cluster, plan))
    assert ("precision_gpu" not in problems) is runs, problems
    if not runs:
        assert "--precision" in problems["precision_gpu"]


def test_a_gpu_with_fp4_peaks_but_an_older_or_unknown_capability_is_refused_with_the_way_out():
    b200 = load_gpu_preset("b200")
    for capability, words in (("9.0", "use --precision fp8 or bf16"), (None, "compute_capability")):
        gpu = GPUSpec(name="mystery", memory_gib=80, peak_tflops=dict(b200.peak_tflops), hbm_bandwidth_gb_per_s=8000,
                      kernels=b200.kernels, compute_capability=capability)
        cluster, plan = _plan()
        problems = dict(plan_problems(MODEL, replace(cluster, gpu=gpu), plan))
        assert "NVFP4 needs compute capability 10.0" in problems["precision_gpu"] and words in problems["precision_gpu"]


@pytest.mark.parametrize("engine", ["fsdp", "deepspeed", "hf", "megatron-deepspeed"])
def test_engines_without_an_fp4_recipe_refuse_it_and_name_megatron(engine):
    cluster, plan = _plan(engine=engine, sequence_parallel=False)
    messages = " ".join(m for _, m in plan_problems(MODEL, cluster, plan))
    assert "no fp4 training" in messages and "--engine megatron" in messages


def test_cli_refuses_fp4_on_hopper_with_exit_2(capsys):
    from autotune.cli import main

    code = main(["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--global-batch",
                 "64", "--tp", "2", "--engine", "megatron", "--precision", "fp4"])
    err = capsys.readouterr().err
    assert code == 2 and "no fp4 tensor cores" in err and "Traceback" not in err


def test_linear_gemms_run_at_the_fp4_rate_and_quantize_at_nvfp4_traffic():
    cluster = load_cluster(gpu="b200", num_gpus=8)
    gpu, kf = cluster.gpu, cluster.gpu.kernel_facts()
    fp4 = rates(cluster, "fp4", DEFAULT_EFFICIENCY, "fa3", None)
    fp8 = rates(cluster, "fp8", DEFAULT_EFFICIENCY, "fa3", "te-mxfp8")
    assert fp4.linear_peak == pytest.approx(gpu.peak_flops_per_s("fp4") * kf.gemm("fp4")
                                            * DEFAULT_EFFICIENCY.gemm_peak_fraction)
    assert fp4.cast_bytes == NVFP4_CAST_BYTES
    assert fp4.bf16_peak == fp8.bf16_peak and fp4.attention == fp8.attention  # attention and the head stay 16-bit


def test_fp4_is_faster_than_mxfp8_and_bf16_on_blackwell_but_not_by_its_peak_ratio():
    cluster, plan = _plan()
    t = {p: estimate(MODEL, cluster, plan.with_(precision=p, fp8_recipe="te-mxfp8" if p == "fp8" else None))
         .time.step_time_s for p in ("bf16", "fp8", "fp4")}
    assert t["fp4"] < t["fp8"] < t["bf16"]
    assert t["fp8"] / t["fp4"] < 2  # casts, attention, norms, communication stay


def test_nvfp4_weights_and_saved_inputs_take_their_bytes():
    """With the distributed optimizer (--fp4-param-gather) the weights are NVFP4 copies (half a byte and their 16 x 16
    scales) plus the column-wise copy cached beside them; each linear saves its input as the column-wise NVFP4 copy."""
    cluster, plan = _plan()
    mxfp8 = estimate(MODEL, cluster, plan.with_(precision="fp8", fp8_recipe="te-mxfp8")).memory
    fp4 = estimate(MODEL, cluster, plan).memory
    bf16 = estimate(MODEL, cluster, plan.with_(precision="bf16")).memory
    # the GEMM weights (tp-sharded parameters) from the MXFP8 cache: 1 + 1/32 bytes each
    gemm_weights = mxfp8.buffer_parts["fp8_weight_cache"] / (1 + 1 / 32)
    assert fp4.buffer_parts["fp4_weight_cache"] == pytest.approx(gemm_weights * NVFP4_WEIGHT_BYTES, rel=1e-9)
    assert bf16.weights - fp4.weights == pytest.approx(gemm_weights * (2 - NVFP4_WEIGHT_BYTES), rel=1e-9)
    per_layer = 4096 * (MODEL.hidden_size / 2 * 3 + MODEL.ffn_hidden_size / 2)  # QKV, proj, fc1, fc2 inputs
    assert mxfp8.activations - fp4.activations == pytest.approx(  # the output layer's 16-bit input in both
        per_layer * MODEL.num_layers * (1 + 1 / 32 - NVFP4_INPUT_BYTES), rel=1e-9)
    # without the distributed optimizer: 16-bit weights, both NVFP4 copies cached
    ddp = estimate(MODEL, cluster, plan.with_(zero_stage=0)).memory
    assert ddp.buffer_parts["fp4_weight_cache"] == pytest.approx(2 * gemm_weights * NVFP4_WEIGHT_BYTES, rel=1e-9)


def test_megatron_and_bridge_files_write_nvfp4():
    from autotune.bundle.writer import render_bundle

    cluster = load_cluster(gpu="b200", num_gpus=16)
    for model, named in ((MODEL, True), (load_model_preset("llama3-70b"), False)):
        plan = make_plan(model, cluster, engine="megatron", tp=2, sequence_parallel=True, zero_stage=1,
                         global_batch_size=64, seq_len=4096, precision="fp4")
        files = render_bundle(estimate(model, cluster, plan)).files
        args = files["megatron_args.sh"]
        assert "--fp4-format e2m1" in args and "--fp4-recipe nvfp4" in args and "--fp4-param-gather" in args
        assert "--fp8-format" not in args
        bridge = files["bridge_overrides.args"]
        if named:  # llama3-8b's recipe holds a registered precision name
            assert "mixed_precision=bf16_with_nvfp4_mixed" in bridge
        else:
            assert "mixed_precision.fp4=e2m1" in bridge and "mixed_precision.fp4_recipe=nvfp4" in bridge
            assert "mixed_precision.fp4_param_gather=true" in bridge
        assert "NVFP4 GEMMs" in files["plan.md"]
    plan = make_plan(MODEL, cluster, engine="megatron", tp=2, sequence_parallel=True, zero_stage=0,
                     global_batch_size=64, seq_len=4096, precision="fp4")
    assert "--fp4-param-gather" not in render_bundle(estimate(MODEL, cluster, plan)).files["megatron_args.sh"]


def test_torchtitan_files_are_refused_for_fp4():
    cluster = load_cluster(gpu="b200", num_gpus=16)
    with pytest.raises(InputError, match="no fp4 training"):
        make_plan(MODEL, cluster, engine="fsdp", global_batch_size=64, seq_len=4096, precision="fp4")
