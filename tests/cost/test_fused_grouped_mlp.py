"""TE's fused grouped MLP on the sync-free MoE path (autotune.cost.fused_grouped_mlp).

By hand: the fused kernels take the experts' biases, the clamped GLU and its probabilities into their GEMM
epilogues, so GPT-OSS's eager bias loop (12 / 16 B per element of fc2's k h output, forward / backward) and
clamp (8 / 10 B per element of fc1's k 2f output) and the routed fc1 biases' gradient reduction (2 B per element
of fc1's k 2f output, backward) are not charged there; what is left is one read of fc2's output gradient for its
scaled bias (2 B per element of k h, backward). The path is taken only with the full-iteration graph's HybridEP
path, MXFP8 and a gated activation on expert TP 1; elsewhere the eager bytes stay. A model without biases or
clamp (Qwen3-30B-A3B) keeps its layer time.
"""

from __future__ import annotations

import dataclasses

import pytest

from autotune.cost import moe_time
from autotune.cost.fused_grouped_mlp import FUSED_FC2_BIAS_GRAD_BYTES, fused_grouped_mlp
from autotune.cost.kernels import rates
from autotune.cost.layer_time import layer_time, time_key
from autotune.cost.step_time import TimeSettings
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset


def _graphed(**changes) -> ParallelPlan:
    base = ParallelPlan(engine="megatron", dp=64, ep=16, seq_len=4096, micro_batch_size=4, global_batch_size=1280,
                        precision="fp8", fp8_recipe="te-mxfp8", cuda_graph="full-iteration",
                        moe_dispatcher="flex-hybridep", ep_overlap="a2a-delay-wgrad")
    return dataclasses.replace(base, **changes)


def test_fused_only_on_the_sync_free_mxfp8_path():
    gpt_oss, cluster = load_model_preset("gpt-oss-120b"), load_cluster(gpu="gb300", num_gpus=64)
    assert fused_grouped_mlp(gpt_oss, cluster, _graphed(), "te-mxfp8")
    assert not fused_grouped_mlp(gpt_oss, cluster, _graphed(), "te-blockwise")  # TE fuses MXFP8 / NVFP4 only
    assert not fused_grouped_mlp(gpt_oss, cluster, _graphed(precision="bf16", fp8_recipe=None), None)
    assert not fused_grouped_mlp(gpt_oss, cluster, _graphed(cuda_graph="transformer_engine",
                                                            cuda_graph_scope=("moe_router",)), "te-mxfp8")
    assert not fused_grouped_mlp(gpt_oss, cluster, _graphed(moe_dispatcher="alltoall"), "te-mxfp8")
    assert not fused_grouped_mlp(gpt_oss, cluster, _graphed(dp=32, tp=2, etp=2, ep=16), "te-mxfp8")
    gelu = dataclasses.replace(gpt_oss, activation="gelu", activation_clamp=None)
    assert not fused_grouped_mlp(gelu, cluster, _graphed(), "te-mxfp8")


def test_fused_extra_bytes_by_hand():
    gpt_oss = load_model_preset("gpt-oss-120b")
    k, h = gpt_oss.moe.top_k, gpt_oss.hidden_size
    assert moe_time.expert_extra_bytes(gpt_oss, fused=True) == (0.0, k * h * FUSED_FC2_BIAS_GRAD_BYTES, 0.0)
    unbiased = dataclasses.replace(gpt_oss, linear_bias=False, activation_clamp=None)
    assert moe_time.expert_extra_bytes(unbiased, fused=True) == (0.0, 0.0, 0.0)
    assert moe_time.expert_extra_bytes(gpt_oss)[0] > 0  # the eager path still charges them


def _moe_layers(model):
    cluster = load_cluster(gpu="gb300", num_gpus=64)
    plan = time_key(_graphed())
    eff = TimeSettings().efficiency
    r = rates(cluster, "fp8", eff, "fa3", "te-mxfp8")
    eager = layer_time(model, cluster, plan, True, eff, r, expert_pad_rows=127.5)
    fused = layer_time(model, cluster, plan, True, eff, r, expert_pad_rows=127.5, fused_experts=True)
    return plan, r, eager, fused


def test_fused_layer_drops_the_eager_passes_by_hand():
    gpt_oss = load_model_preset("gpt-oss-120b")
    plan, r, eager, fused = _moe_layers(gpt_oss)
    k, h, f = gpt_oss.moe.top_k, gpt_oss.hidden_size, gpt_oss.moe.expert_ffn_hidden_size
    tokens = plan.seq_len * plan.micro_batch_size
    busiest = moe_time.busiest_rank_factor(tokens, plan.ep, gpt_oss.moe.num_experts, k)
    fwd_saved = busiest * tokens * (k * h * 12 + k * 2 * f * 8) / r.hbm
    bwd_saved = (busiest * tokens * (k * h * (16 - FUSED_FC2_BIAS_GRAD_BYTES) + k * 2 * f * 10) / r.hbm
                 + tokens * 2 * 2 * k * f / r.hbm)  # and the routed fc1 biases' gradient reduction
    assert eager.elementwise_s - fused.elementwise_s == pytest.approx(fwd_saved, rel=1e-9)
    assert eager.elementwise_bwd_s - fused.elementwise_bwd_s == pytest.approx(bwd_saved, rel=1e-9)
    assert eager.experts_s[1] - fused.experts_s[1] == pytest.approx(fwd_saved, rel=1e-9)
    moe_act = {name: s for name, s in eager.module_recompute_s}["moe_act"]
    assert moe_act - {name: s for name, s in fused.module_recompute_s}["moe_act"] == pytest.approx(
        busiest * tokens * k * 2 * f * 8 / r.hbm, rel=1e-9)
    assert (fused.gemm_s, fused.attention_s) == (eager.gemm_s, eager.attention_s)


def test_fused_layer_unchanged_without_bias_or_clamp():
    qwen = load_model_preset("qwen3-30b-a3b")
    _, _, eager, fused = _moe_layers(qwen)
    assert (fused.elementwise_s, fused.elementwise_bwd_s) == (eager.elementwise_s, eager.elementwise_bwd_s)
