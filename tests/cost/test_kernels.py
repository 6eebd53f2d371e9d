"""Kernel facts per GPU (gpus.yaml kernels:), the rates built from them, FP8 as it runs, and the memory rows."""

import pytest

from autotune.cost.efficiency import DEFAULT_EFFICIENCY
from autotune.cost.kernels import FP8_RECIPES, TRITON_FLASH, Rates, rates
from autotune.cost.memory import estimate_memory
from autotune.cost.step_time import TimeSettings, estimate_step_time
from autotune.errors import InputError
from autotune.specs.hardware import KERNEL_FACT_FIELDS, GPUSpec
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import gpu_preset_names, load_gpu_preset, load_model_preset
from autotune.specs.settings import MemorySettings

GIB = 2**30


@pytest.mark.parametrize("name", gpu_preset_names())
def test_every_preset_has_kernel_facts_with_a_source(name):
    kf = load_gpu_preset(name).kernel_facts()
    assert kf.source and kf.gemm_fraction and kf.attention_fraction


def test_reachable_gemm_fraction_falls_from_a100_to_h100_and_fp8_is_lower():
    # stas00/ml-engineering "maximum achievable matmul FLOPS": A100 86.9%, H100 80.3% bf16, 70.9% fp8.
    a100, h100 = load_gpu_preset("a100-80gb").kernel_facts(), load_gpu_preset("h100-sxm-80gb").kernel_facts()
    assert a100.gemm("bf16") > h100.gemm("bf16") > h100.gemm("fp8")
    assert h100.gemm("fp16") == h100.gemm("bf16")


def test_narrow_gemm_curve_against_the_xla_h100_table():
    # OpenXLA matmul_interpolator_data.h, sm_90: 4096x4096x256 runs at 392 of 783 TFLOP/s (0.50) for 4096^3.
    r = rates(load_cluster(gpu="h100-sxm-80gb", num_gpus=8, gpus_per_node=None, cluster_path=None), "bf16",
              DEFAULT_EFFICIENCY, "fa2", None)
    ratio = Rates.shape(r.bf16_half, 4096, 4096, 256) / Rates.shape(r.bf16_half, 4096, 4096, 4096)
    # The curve fitted on whole training steps is flatter than XLA's isolated-kernel table (0.50): narrow
    # dimensions cost less in a step than in a microbenchmark, or the published runs do not constrain it.
    assert 0.5 <= ratio < 0.97
    assert Rates.shape(r.bf16_half, 4096, 4096, 64) < Rates.shape(r.bf16_half, 4096, 4096, 256)


def test_attention_kernel_falls_back_to_what_the_gpu_runs():
    a100 = load_gpu_preset("a100-80gb").kernel_facts()
    assert a100.attention("fa3")[0] == "fa2"  # no FlashAttention-3 before Hopper
    h100 = load_gpu_preset("h100-sxm-80gb").kernel_facts()
    assert h100.attention("fa3")[1] > h100.attention("fa2")[1]


def test_inline_gpu_without_kernel_facts_is_a_clear_error():
    gpu = GPUSpec(name="mine", memory_gib=80, peak_tflops={"bf16": 900}, hbm_bandwidth_gb_per_s=3000)
    with pytest.raises(InputError) as err:
        gpu.kernel_facts()
    text = str(err.value)
    assert "mine" in text and "kernels_like" in text and "gpus.yaml" in text
    assert all(f in text for f in KERNEL_FACT_FIELDS)


def test_inline_kernel_facts_name_each_missing_field():
    with pytest.raises(InputError) as err:
        GPUSpec(name="mine", memory_gib=80, peak_tflops={"bf16": 900}, hbm_bandwidth_gb_per_s=3000,
                kernels={"gemm_fraction": {"bf16": 0.8}, "hbm_fraction": 0.8})
    text = str(err.value)
    assert "attention_fraction" in text and "inter_node_latency_us" in text and "gemm_fraction," not in text


def test_kernels_like_takes_a_named_presets_facts(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("gpu: {name: mine, memory_gib: 96, peak_tflops: {bf16: 900}, hbm_bandwidth_gb_per_s: 3000,"
                    " kernels_like: h100-sxm-80gb}\nnum_gpus: 8\ngpus_per_node: 8\n"
                    "intra_node_bandwidth_gb_per_s: 450\ninter_node_bandwidth_gb_per_s: 50\n")
    cluster = load_cluster(cluster_path=str(path))
    assert cluster.gpu.kernel_facts() == load_gpu_preset("h100-sxm-80gb").kernel_facts()


H100_8 = load_cluster(gpu="h100-sxm-80gb", num_gpus=8, gpus_per_node=None, cluster_path=None)
LLAMA8 = load_model_preset("llama3-8b")


def _fsdp(precision="bf16"):
    return ParallelPlan(dp=8, micro_batch_size=2, global_batch_size=16, grad_accum_steps=1, seq_len=8192,
                        engine="fsdp", zero_stage=3, recompute="selective", precision=precision)


def test_fp8_gains_what_published_runs_gain_not_2x():
    # torchtitan Llama-3.1-8B on H100: +28% (6,667 -> 8,532 tokens/s/GPU); torchao: tensorwise +25%.
    bf16 = estimate_step_time(LLAMA8, H100_8, _fsdp()).tokens_per_s
    fp8 = estimate_step_time(LLAMA8, H100_8, _fsdp("fp8")).tokens_per_s
    assert 1.1 < fp8 / bf16 < 1.6


def test_fp8_recipes_cost_their_casts():
    t = {r: estimate_step_time(LLAMA8, H100_8, _fsdp("fp8"), TimeSettings(fp8_recipe=r)).step_time_s
         for r in FP8_RECIPES}
    assert t["te-delayed"] < t["te-current"] <= t["torchao-rowwise"]
    with pytest.raises(InputError):
        TimeSettings(fp8_recipe="nope")


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm-80gb"])
def test_triton_flash_runs_at_flashattention2s_rate_over_its_smallest_reported_gap(gpu):
    # FlashAttention-2 paper Sec. 4.1: FA2 1.3-2.5x faster than FlashAttention in Triton (the smallest gap taken).
    cluster = load_cluster(gpu=gpu, num_gpus=8, gpus_per_node=None, cluster_path=None)
    fa2 = rates(cluster, "bf16", DEFAULT_EFFICIENCY, "fa2", None)
    triton = rates(cluster, "bf16", DEFAULT_EFFICIENCY, TRITON_FLASH, None)
    assert triton.attention_kernel == TRITON_FLASH
    assert triton.attention == pytest.approx(fa2.attention / 1.3)
    assert triton.bf16_peak == fa2.bf16_peak  # only the attention kernel differs


def test_a_slower_attention_kernel_costs_most_at_long_sequences():
    # The attention core grows with the sequence per token, the linear layers do not: the kernel's rate moves the
    # step time of a 32k-token plan more than that of a 2k-token one (llm-foundry's long-sequence MPT rows).
    def slowdown(seq):
        plan = ParallelPlan(dp=8, micro_batch_size=1, global_batch_size=8, seq_len=seq, engine="fsdp", zero_stage=3,
                            recompute="full")
        fa2 = estimate_step_time(LLAMA8, H100_8, plan).step_time_s
        return estimate_step_time(LLAMA8, H100_8, plan, TimeSettings(attention_kernel=TRITON_FLASH)).step_time_s / fa2
    assert 1.0 < slowdown(2048) < slowdown(32768) < 1.3
    with pytest.raises(InputError):
        TimeSettings(attention_kernel="nope")


def test_async_tp_and_compile_help():
    plan = ParallelPlan(tp=8, dp=1, micro_batch_size=1, global_batch_size=4, grad_accum_steps=4, seq_len=8192,
                        engine="fsdp", zero_stage=3, sequence_parallel=True)
    base = estimate_step_time(LLAMA8, H100_8, plan).step_time_s
    assert estimate_step_time(LLAMA8, H100_8, plan, TimeSettings(tp_overlap="async-tp")).step_time_s < base
    assert estimate_step_time(LLAMA8, H100_8, plan, TimeSettings(torch_compile=True)).step_time_s < base


def test_memory_peaks_allocated_reserved_total():
    mem = estimate_memory(LLAMA8, H100_8, _fsdp(), MemorySettings(expandable_segments=False))
    assert mem.allocated < mem.reserved < mem.total
    d = mem.to_dict()
    assert {"allocated", "reserved", "optimizer_step", "total_is"} <= set(d)
    assert d["total"] == pytest.approx(sum(d[k] for k in mem.terms()), abs=8)


def test_optimizer_step_peak_is_its_own_row_not_activations():
    # Llama-3-70B on one GPU with full recompute: the fp32 gradient copies of the step dwarf the activations.
    one = load_cluster(gpu="h100-sxm-80gb", num_gpus=1, gpus_per_node=None, cluster_path=None)
    plan = ParallelPlan(seq_len=4096, recompute="full", engine="deepspeed", zero_stage=0)
    mem = estimate_memory(load_model_preset("llama3-70b"), one, plan)
    assert mem.activations < 20 * GIB
    assert mem.optimizer_step > 100 * GIB and "optimizer_step" in mem.terms()


@pytest.mark.parametrize("family", ["llama", "llama-eager", "gpt"])
def test_memory_bound_kernels_count_their_own_backward_bytes(family):
    # Per token at tp 1, bytes the elementwise kernels move, forward and backward (layer_time's table):
    # Llama (RMSNorm x2, no dropout, no biases, SwiGLU, RoPE, flash): norms 4h / 6h, residual adds 6h / 0,
    #   SwiGLU 6f / 10f, RoPE 4(q + kv) both ways.
    # GPT of the Megatron papers (LayerNorm x2, dropout, biases, GeLU, unfused attention): norms 4h / 6h,
    #   bias-dropout-adds 7h / 5h + 2h bias gradient, GeLU 4f / 6f + the QKV and fc1 bias gradients 2(3h + f),
    #   softmax + dropout over heads x s scores 9 / 11.
    from autotune.cost.layer_time import layer_time, time_key
    from autotune.specs.model import ModelSpec

    cluster = load_cluster(gpu="a100-80gb", num_gpus=8)
    h, f, s = 1024, 4096, 1024
    kernels = "eager" if family.endswith("eager") else "fused"
    if family.startswith("llama"):
        model = ModelSpec(name="l", num_layers=2, hidden_size=h, num_attention_heads=8, num_kv_heads=2,
                          ffn_hidden_size=f, vocab_size=32000, activation="swiglu", norm="rmsnorm",
                          position_embedding="rope", max_position_embeddings=s)
        kv = 2 * h // 8
        fwd, bwd = 2 * 4 * h + 2 * 6 * h + 6 * f + 4 * (h + kv), 2 * 6 * h + 10 * f + 4 * (h + kv)
        if kernels == "eager":  # torchtitan's / transformers' RMSNorm, SwiGLU and complex RoPE op by op
            fwd, bwd = 2 * 36 * h + 2 * 6 * h + 10 * f + 20 * (h + kv), 2 * 70 * h + 18 * f + 20 * (h + kv)
        flash = True
    else:
        model = ModelSpec(name="g", num_layers=2, hidden_size=h, num_attention_heads=8, ffn_hidden_size=f,
                          vocab_size=32000, max_position_embeddings=s, linear_bias=True, dropout=0.1)
        scores = 8 * s
        fwd = 2 * 4 * h + 2 * 7 * h + 4 * f + 9 * scores
        bwd = 2 * 6 * h + 2 * (5 * h + 2 * h) + 6 * f + 2 * (3 * h + f) + 11 * scores
        flash = False
    plan = ParallelPlan(tp=1, dp=8, seq_len=s, micro_batch_size=1, global_batch_size=8, engine="megatron",
                        flash_attention=flash, precision="bf16")
    r = rates(cluster, "bf16", DEFAULT_EFFICIENCY, "fa2", None)
    lt = layer_time(model, cluster, time_key(plan), False, DEFAULT_EFFICIENCY, r, kernels)
    assert lt.elementwise_s * r.hbm / s == pytest.approx(fwd)
    assert lt.elementwise_bwd_s * r.hbm / s == pytest.approx(bwd)
    # The score kernels are their own part: selective recompute reruns them with the attention core.
    from autotune.cost.layer_passes import layer_passes

    assert lt.scores_s * r.hbm / s == pytest.approx(0 if flash else 9 * scores)
    rerun = layer_passes(lt, plan.with_(recompute="selective"), 0.0, "none", True).recompute_s
    assert rerun == pytest.approx(lt.attention_s + lt.scores_s)


def test_torch_compile_fuses_what_torchtitan_runs_op_by_op():
    # FSDP2 / torchtitan: eager RMSNorm / SwiGLU / RoPE chains unless torch.compile; Megatron's kernels are fused.
    from autotune.engines import engine_for

    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    model = load_model_preset("llama3-8b")
    plan = ParallelPlan(tp=1, dp=8, seq_len=8192, micro_batch_size=1, global_batch_size=8, engine="fsdp",
                        zero_stage=3)
    assert engine_for(plan).comm.elementwise_kernels == "eager"
    assert engine_for(plan.with_(engine="megatron", zero_stage=1)).comm.elementwise_kernels == "fused"
    eager = estimate_step_time(model, cluster, plan)
    compiled = estimate_step_time(model, cluster, plan, TimeSettings(torch_compile=True))
    assert 1.03 < eager.step_time_s / compiled.step_time_s < 1.3


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_op_level_sac_reruns_every_second_mm_and_every_cheap_op(precision):
    # torchtitan's op SAC (models/llama3/infra/parallelize.py): mm outputs saved except every second one (wk, wo,
    # w3 rerun of wq, wk, wv, wo, w1, w3, w2), SDPA saved, every other op rerun; Float8's aten._scaled_mm is not in
    # the save list, so every linear reruns. Megatron's selective reruns only the attention core.
    from autotune.cost.layer_passes import layer_passes
    from autotune.cost.layer_time import layer_time, time_key

    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    model = load_model_preset("llama3-8b")
    plan = ParallelPlan(tp=1, dp=8, seq_len=8192, micro_batch_size=1, global_batch_size=8, engine="fsdp",
                        zero_stage=3, recompute="selective", precision=precision)
    r = rates(cluster, precision, DEFAULT_EFFICIENCY, "fa2", "torchao-tensorwise")
    lt = layer_time(model, cluster, time_key(plan), False, DEFAULT_EFFICIENCY, r, "eager")
    op_sac = layer_passes(lt, plan, 0.0, "none", False, "op-sac").recompute_s
    core = layer_passes(lt, plan, 0.0, "none", False).recompute_s
    assert core == pytest.approx(lt.attention_s)
    h, kv, f = model.hidden_size, model.kv_width, model.ffn_hidden_size
    linear = h * (model.q_width + 2 * kv) + model.attention_output_width * h + 3 * h * f
    share = 1.0 if precision == "fp8" else (h * kv + model.attention_output_width * h + h * f) / linear
    # The rerun GEMMs are those FLOPs at about the layer's GEMM rate (the three are not the same shape).
    assert op_sac - lt.elementwise_s == pytest.approx(share * lt.gemm_s, rel=0.03)



def test_op_level_sac_reruns_fc2_of_a_gelu_block():
    # GeLU MLP: wq, wk, wv, wo, fc1, fc2 in module order, so wk, wo and fc2 rerun (activations.block_mms[1::2]).
    from autotune.cost.layer_passes import layer_passes
    from autotune.cost.layer_time import layer_time, time_key
    from autotune.specs.model import ModelSpec

    cluster = load_cluster(gpu="a100-80gb", num_gpus=8)
    h, f = 2048, 8192
    model = ModelSpec(name="g", num_layers=2, hidden_size=h, num_attention_heads=16, ffn_hidden_size=f,
                      vocab_size=32000, max_position_embeddings=4096)
    plan = ParallelPlan(tp=1, dp=8, seq_len=4096, micro_batch_size=1, global_batch_size=8, engine="fsdp",
                        zero_stage=3, recompute="selective", precision="bf16")
    r = rates(cluster, "bf16", DEFAULT_EFFICIENCY, "fa2", None)
    lt = layer_time(model, cluster, time_key(plan), False, DEFAULT_EFFICIENCY, r, "fused")
    rerun = layer_passes(lt, plan, 0.0, "none", False, "op-sac").recompute_s - lt.elementwise_s
    assert rerun == pytest.approx((h * h + h * h + f * h) / (4 * h * h + 2 * h * f) * lt.gemm_s, rel=0.03)


def _unfused_layer(hidden: int, heads: int):
    from autotune.cost.layer_time import layer_time
    from autotune.specs.model import ModelSpec

    model = ModelSpec(name=f"h{hidden}-a{heads}", num_layers=8, hidden_size=hidden, num_attention_heads=heads,
                      ffn_hidden_size=4 * hidden, vocab_size=51200, max_position_embeddings=2048)
    cluster = load_cluster(gpu="a100-80gb", num_gpus=8, gpus_per_node=None, cluster_path=None)
    plan = ParallelPlan(tp=8, micro_batch_size=1, global_batch_size=8, seq_len=2048, engine="megatron",
                        precision="bf16", flash_attention=False)
    r = rates(cluster, "bf16", DEFAULT_EFFICIENCY, "fa2", None)
    return layer_time(model, cluster, plan, False, DEFAULT_EFFICIENCY, r), r


def test_unfused_attention_with_an_unaligned_head_dim_leaves_the_tensor_cores():
    # BLOOM tr11 prequel (chronicles-prequel.md, NHEADs comparison): hidden 13824 on 128 heads (head dim 108, not a
    # multiple of 8) ran 162.72 s per iteration against 121.28 s on 64 heads (216).
    aligned, r = _unfused_layer(13824, 64)
    unaligned, _ = _unfused_layer(13824, 128)
    assert r.cuda_core_peak < r.bf16_peak / 10  # A100: 19.5 of 312 TFLOP/s
    assert unaligned.attention_s > 8 * aligned.attention_s
    assert unaligned.gemm_s == aligned.gemm_s  # the linear layers' GEMMs do not depend on the head count
    # a head dim that is a multiple of 8 keeps the tensor-core rate: 112 (hidden 14336) against 108, as many heads
    near, _ = _unfused_layer(14336, 128)
    assert unaligned.attention_s > 8 * near.attention_s
