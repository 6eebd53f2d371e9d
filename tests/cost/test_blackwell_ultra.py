"""Blackwell (Ultra) facts the cost model reads: the softmax exponentials at the GPU's SFU rate, and FP8 weights
without a transposed copy where FP8 GEMMs take either layout."""

import dataclasses

import pytest

from autotune.cost.efficiency import DEFAULT_EFFICIENCY
from autotune.cost.kernels import rates
from autotune.cost.layer_time import attention_bwd_factor, attention_bwd_s, layer_time
from autotune.cost.memory import estimate_memory
from autotune.errors import InputError
from autotune.specs.hardware import GPUSpec, KernelFacts
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_gpu_preset, load_model_preset


def _cluster(gpu: str, num_gpus: int = 8):
    return load_cluster(gpu=gpu, num_gpus=num_gpus, gpus_per_node=None, cluster_path=None)


def _with_kernels(cluster, **changes):
    gpu = cluster.gpu
    kernels = dataclasses.replace(gpu.kernel_facts(), **changes)
    return dataclasses.replace(cluster, gpu=dataclasses.replace(gpu, kernels=kernels))


@pytest.mark.parametrize("capability,expected", [
    ("9.0", False), ("8.0", False), ("10.0", True), ("10.3", True), ("11.0", True), ("12.0", False),
    ("12.1", False), ("13.0", True), (None, False)])
def test_fp8_gemm_any_layout_follows_transformer_engines_rule(capability, expected):
    # TE d0067d0 pytorch/utils.py is_non_tn_fp8_gemm_supported: (10, 0) <= cc < (12, 0) or cc >= (13, 0).
    gpu = GPUSpec(name="g", memory_gib=80, peak_tflops={"bf16": 900}, hbm_bandwidth_gb_per_s=3000,
                  compute_capability=capability)
    assert gpu.fp8_gemm_any_layout is expected


def test_blackwell_presets_take_either_fp8_layout_and_hopper_does_not():
    assert all(load_gpu_preset(n).fp8_gemm_any_layout for n in ("b200", "gb200", "b300", "gb300"))
    assert not load_gpu_preset("h100-sxm-80gb").fp8_gemm_any_layout


def _fp8_plan(recipe: str, zero: int) -> ParallelPlan:
    return ParallelPlan(tp=2, pp=1, dp=4, micro_batch_size=1, grad_accum_steps=4, seq_len=4096, precision="fp8",
                        fp8_recipe=recipe, zero_stage=zero, sequence_parallel=True, engine="megatron",
                        recompute="none")


@pytest.mark.parametrize("zero", [0, 1])
def test_per_tensor_fp8_weights_keep_no_transposed_copy_on_blackwell(zero):
    model = load_model_preset("llama3-8b")
    cache = {gpu: estimate_memory(model, _cluster(gpu), _fp8_plan("te-current", zero)).buffer_parts.get(
        "fp8_weight_cache", 0.0) for gpu in ("h200", "b200")}
    # Hopper: the transpose beside the weight (and, without FP8 parameters, the row-wise copy too); Blackwell: the
    # weight's one FP8 copy serves both GEMMs, so with FP8 parameters (zero 1) nothing is cached, else one copy.
    assert cache["h200"] > 0
    assert cache["b200"] == (0.0 if zero == 1 else pytest.approx(cache["h200"] / 2))


def test_block_scaled_fp8_weights_keep_both_directions_on_blackwell():
    model = load_model_preset("llama3-8b")
    plan = _fp8_plan("te-mxfp8", 1)
    assert estimate_memory(model, _cluster("b200"), plan).buffer_parts["fp8_weight_cache"] > 0


def _attention(cluster, plan, model):
    r = rates(cluster, plan.precision, DEFAULT_EFFICIENCY, "fa3", None)
    return layer_time(model, cluster, plan, False, DEFAULT_EFFICIENCY, r)


def test_softmax_exponentials_move_the_attention_time_by_their_sfu_time():
    model = load_model_preset("llama3-8b")
    plan = ParallelPlan(tp=1, pp=1, dp=8, micro_batch_size=2, grad_accum_steps=8, seq_len=8192, precision="bf16",
                        engine="megatron", recompute="none")
    gb300 = _cluster("gb300")
    kf = gb300.gpu.kernel_facts()
    assert kf.sfu_exp_tera_per_s > kf.attention_exp_tera_per_s  # Blackwell Ultra's doubled SFU
    same_rate = _with_kernels(gb300, attention_exp_tera_per_s=kf.sfu_exp_tera_per_s)
    faster, reference = _attention(gb300, plan, model), _attention(same_rate, plan, model)
    assert reference.attention_exp_delta_s == 0.0
    # one exponential per executed (query, key) pair and head: a causal kernel runs half the s x s square
    exps = plan.micro_batch_size * plan.seq_len * plan.seq_len / 2 * model.num_attention_heads
    per_exp = (1 / kf.sfu_exp_tera_per_s - 1 / kf.attention_exp_tera_per_s) / 1e12 / DEFAULT_EFFICIENCY.gemm_peak_fraction
    assert faster.attention_exp_delta_s == pytest.approx(exps * per_exp)
    assert faster.attention_s == pytest.approx(reference.attention_s + exps * per_exp)
    assert faster.gemm_s == reference.gemm_s


def test_backward_counts_the_exponentials_once():
    plan = ParallelPlan(seq_len=4096)
    assert attention_bwd_s(1.0, 0.0, plan) == attention_bwd_factor(plan)
    # the backward recomputes each probability once: the exponentials' part counts once, the GEMMs' part 2.5 times
    assert attention_bwd_s(1.0, -0.2, plan) == pytest.approx(attention_bwd_factor(plan) * 1.2 - 0.2)


def test_a_gpus_own_attention_fraction_moves_nothing():
    model = load_model_preset("llama3-8b")
    plan = ParallelPlan(tp=1, pp=1, dp=8, micro_batch_size=1, grad_accum_steps=8, seq_len=8192, precision="bf16",
                        engine="megatron", recompute="none")
    assert _attention(_cluster("gb200"), plan, model).attention_exp_delta_s == 0.0


def test_a_reference_exponential_rate_needs_the_gpus_own():
    kf = load_gpu_preset("gb200").kernel_facts()
    with pytest.raises(InputError):
        KernelFacts(**{f.name: getattr(kf, f.name) for f in dataclasses.fields(KernelFacts)
                       if f.name not in ("sfu_exp_tera_per_s", "attention_exp_tera_per_s")},
                    attention_exp_tera_per_s=5.0)
