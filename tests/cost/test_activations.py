"""Activation formulas against Korthikanti et al. 2022, Sec. 4 (hand-derived expectations)."""

import pytest

from autotune.cost.activations import layer_activations, stage_activation_bytes
from autotune.specs.layout import microbatches_in_flight
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

# GPT-3 175B shape (Korthikanti Table 3): a=96, h=12288, s=2048.
GPT = ModelSpec(name="gpt", num_layers=96, hidden_size=12288, num_attention_heads=96, ffn_hidden_size=4 * 12288,
                vocab_size=51200, dropout=0.1, linear_bias=True)
S, B, H, A = 2048, 1, 12288, 96
LN_STATS = 2 * 8 * S * B  # two LayerNorms x (mean + rstd) fp32 per token; Korthikanti folds these away


def plan(**kw):
    base = dict(seq_len=S, micro_batch_size=B, flash_attention=False)
    base.update(kw)
    return ParallelPlan(**base)


def test_no_parallelism_matches_korthikanti_eq1():
    # Eq. 1: s*b*h*(34 + 5*a*s/h)
    got = layer_activations(GPT, plan()).total
    assert got == pytest.approx(S * B * H * (34 + 5 * A * S / H) + LN_STATS, rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_parallel_matches_eq2(t):
    # Eq. 2: s*b*h*(10 + 24/t + 5*a*s/(h*t))
    got = layer_activations(GPT, plan(tp=t)).total
    assert got == pytest.approx(S * B * H * (10 + 24 / t + 5 * A * S / (H * t)) + LN_STATS, rel=1e-12)


@pytest.mark.parametrize("t", [2, 8])
def test_tensor_and_sequence_parallel_matches_eq4(t):
    # Eq. 4: s*b*h/t*(34 + 5*a*s/h)
    got = layer_activations(GPT, plan(tp=t, sequence_parallel=True)).total
    assert got == pytest.approx(S * B * H / t * (34 + 5 * A * S / H) + LN_STATS / t, rel=1e-12)


def test_selective_recompute_with_sp_is_34sbh_over_t():
    # Eq. 6 (Sec. 5): selective recompute + SP keeps 34*s*b*h/t per layer.
    t = 8
    p = plan(tp=t, sequence_parallel=True, recompute="selective")
    layer = layer_activations(GPT, p)
    assert layer.total - layer.attention_core == pytest.approx(34 * S * B * H / t + LN_STATS / t, rel=1e-12)


def test_full_recompute_keeps_layer_inputs_only():
    p = plan(recompute="full", pp=1)
    parts = stage_activation_bytes(GPT, p, 0)
    assert parts["layers"] == pytest.approx(96 * 2 * S * B * H)
    # plus one layer recomputed at a time during backward
    assert parts["recompute_working_set"] == pytest.approx(layer_activations(GPT, p).total)


def test_flash_attention_drops_the_s2_terms():
    eager = layer_activations(GPT, plan())
    flash = layer_activations(GPT, plan(flash_attention=True))
    assert eager.total - flash.total == pytest.approx(5 * A * S * S * B - 4 * S * B * A)


def test_gqa_and_swiglu_generalisation():
    # Llama-3-70B layer: q 8192 wide, K and V 8 heads x 128 = 1024 wide, SwiGLU f = 28672, RMSNorm, no dropout.
    llama = ModelSpec(name="l", num_layers=80, hidden_size=8192, num_attention_heads=64, num_kv_heads=8,
                      ffn_hidden_size=28672, vocab_size=128256, activation="swiglu", norm="rmsnorm",
                      position_embedding="rope")
    s, b, h, f, kv = 4096, 1, 8192, 28672, 1024
    got = layer_activations(llama, ParallelPlan(seq_len=s, micro_batch_size=b)).total
    expected = (2 * (2 * s * b * h + 4 * s * b)  # two RMSNorm inputs + fp32 rstd
                + 2 * s * b * h                  # QKV input
                + 2 * s * b * (h + 2 * kv)       # q, k, v
                + 2 * s * b * h                  # attention output = output projection input
                + 4 * s * b * 64                 # flash log-sum-exp, fp32 per head
                + 2 * s * b * h                  # fc1 input
                + 2 * s * b * 2 * f              # fused SwiGLU keeps [gate|up]
                + 2 * s * b * f)                 # fc2 input
    assert got == pytest.approx(expected, rel=1e-12)


def test_context_parallel_splits_the_sequence():
    full = layer_activations(GPT, plan(flash_attention=True)).total
    assert layer_activations(GPT, plan(flash_attention=True, cp=4, dp=1)).total == pytest.approx(full / 4)


def test_in_flight_microbatches():
    # 1F1B: first stage holds pp micro-batches; last stage one; interleaving adds (p-1)/(p*v).
    p = ParallelPlan(pp=8, grad_accum_steps=64, global_batch_size=64)
    assert microbatches_in_flight(p, 0) == 8
    assert microbatches_in_flight(p, 7) == 1
    assert microbatches_in_flight(p.with_(grad_accum_steps=3, global_batch_size=3), 0) == 3
    assert microbatches_in_flight(p.with_(vpp=3), 0) == pytest.approx(8 * (1 + 7 / 24))

    # Megatron's interleaved warm-up, (pp - i - 1) * 2 + (vpp - 1) * pp chunk-micro-batches plus the first
    # steady-state forward, in stage-micro-batches: the last stage holds (2*8 + 1) / 3, not ~1.3; with m == pp
    # the warm-up is capped at all m * vpp chunk-micro-batches, so the first stage holds all 8, not 10.3.
    interleaved = p.with_(vpp=3, grad_accum_steps=16, global_batch_size=16)
    assert microbatches_in_flight(interleaved, 7) == pytest.approx(17 / 3)
    assert microbatches_in_flight(interleaved, 0) == pytest.approx((14 + 16 + 1) / 3)
    assert microbatches_in_flight(p.with_(vpp=3, grad_accum_steps=8, global_batch_size=8), 0) == 8


def test_interleaved_warmup_with_as_many_microbatches_as_stages():
    # Megatron-LM since the tunable schedule (schedules.py get_pp_rank_microbatches at d98e8a6) has no
    # "every micro-batch in warm-up when m == pp" case: the last of 8 stages (vpp 3, m 8) warms up with
    # (3 - 1) * 8 = 16 of its 24 chunk-micro-batches and holds 17 at its first steady-state forward.
    p = ParallelPlan(pp=8, vpp=3, grad_accum_steps=8, global_batch_size=8)
    assert microbatches_in_flight(p, 7) == pytest.approx(17 / 3)
    assert microbatches_in_flight(p, 7) < microbatches_in_flight(p, 0) == 8


def test_uneven_interleaved_chunks_weigh_what_each_holds():
    # 14 layers on pp 4 x vpp 2: stages 3, 4, 4, 3 layers; Megatron's virtual layout gives stage 0 chunks of 1 and 2
    # layers (the embedding takes the first chunk's other slot) and stage 3 chunks of 2 and 1 (the loss's slot).
    # 8 micro-batches, schedule table [0]*4 + [1]*4 + [0]*4 + [1]*4 (chunk of each forward, groups of pp).
    # Stage 0 warms up with 3*2 + 4 = 10 forwards (chunk 0: 6, chunk 1: 4); its steady steps hold (7, 4) or (8, 3)
    # micro-batches per chunk, at most 7*1 + 4*2 = 15 layer-micro-batches (not (10 + 1) / 2 * 3 = 16.5).
    # Stage 3 warms up with 4 (all chunk 0) and, after the second group's forwards start, holds (5, 0): 5*2 = 10
    # layer-micro-batches (not (4 + 1) / 2 * 3 = 7.5).
    model = ModelSpec(name="m", num_layers=14, hidden_size=1024, num_attention_heads=8, ffn_hidden_size=4096,
                      vocab_size=32000)
    p = ParallelPlan(pp=4, vpp=2, grad_accum_steps=8, global_batch_size=8, seq_len=1024)
    one = layer_activations(model, p).total
    assert stage_activation_bytes(model, p, 0)["layers"] == pytest.approx(15 * one)
    assert stage_activation_bytes(model, p, 3)["layers"] == pytest.approx(10 * one)
    # Equal chunks (16 layers: 2 per chunk) keep the first steady-state forward's count: (3*2 + 4 + 1) / 2 * 4.
    even = ModelSpec(name="m", num_layers=16, hidden_size=1024, num_attention_heads=8, ffn_hidden_size=4096,
                     vocab_size=32000)
    assert stage_activation_bytes(even, p, 0)["layers"] == pytest.approx(11 / 2 * 4 * one)


def test_interleaved_embedding_activations_follow_the_first_chunk():
    # Megatron get_model_chunk_id: of the first stage's 31 forwards at its peak (pp 8, vpp 3, 16 micro-batches),
    # chunk 0 (the embedding's) ran 8 + 7; the stage's layers hold 31 / 3 micro-batches' worth.
    from autotune.cost.activations import embedding_activation_bytes

    p = ParallelPlan(pp=8, vpp=3, grad_accum_steps=16, global_batch_size=16, seq_len=2048)
    parts = stage_activation_bytes(GPT, p, 0)
    assert parts["embedding"] == pytest.approx(15 * embedding_activation_bytes(GPT, p))


def test_seed_hidden_state_numbers():
    # Seed chapter §1.2: 70B, seq 4096, batch 1, d 8192: one layer's hidden state 1*4096*8192*2 B = 64 MiB;
    # full recompute keeps exactly that per layer: 80 layers ~ 5 GiB.
    llama = ModelSpec(name="l", num_layers=80, hidden_size=8192, num_attention_heads=64, num_kv_heads=8,
                      ffn_hidden_size=28672, vocab_size=128256, activation="swiglu", norm="rmsnorm",
                      position_embedding="rope")
    parts = stage_activation_bytes(llama, ParallelPlan(seq_len=4096, recompute="full"), 0)
    assert parts["layers"] / 80 == 64 * 2**20
    assert parts["layers"] / 2**30 == pytest.approx(5.0)


def test_the_output_layer_saves_its_16_bit_input_whatever_the_precision():
    """Megatron-core's output layer is tensor_parallel.ColumnParallelLinear, not a Transformer Engine module
    (models/gpt/gpt_model.py:264-268 in 0.19.2; TE's only with MXFP8 and fp8_output_proj): FP8 / FP4 autocast does
    not quantize it, so it saves the final norm's bf16 output, 2 bytes per element."""
    from autotune.cost.activations import output_activation_bytes

    model = ModelSpec(name="m", num_layers=2, hidden_size=1024, num_attention_heads=8, ffn_hidden_size=4096,
                      vocab_size=32000)
    bf16 = output_activation_bytes(model, ParallelPlan(seq_len=2048, micro_batch_size=2, precision="bf16"))
    for precision, recipe in (("fp8", "te-current"), ("fp8", "te-mxfp8"), ("fp4", None)):
        plan = ParallelPlan(seq_len=2048, micro_batch_size=2, precision=precision, fp8_recipe=recipe)
        assert output_activation_bytes(model, plan) == pytest.approx(bf16)
