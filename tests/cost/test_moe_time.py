"""The MoE layer's terms beside its GEMMs (autotune.cost.moe_time), derived by hand for a small case, and the
sliding-window attention share (flops.causal_attention_share):

- the dispatcher's permutations move 2h + 2kh elements per token, the received tokens' sorts 4kh more when a rank
  holds several experts, and none with one expert per rank;
- the router's kernels move 9 / 12 bytes per logit forward / backward;
- the busiest EP rank's share under random routing is 1 + sigma sqrt(2 ln ep) / mean, sigma from the
  hypergeometric variance; 1 without expert parallelism, and shrinking as the tokens grow;
- one MoE layer's memory-bound time grows by exactly those bytes at the plan's HBM rate;
- GPT-OSS's biased experts and clamped GLU (moe_time.expert_extra_bytes): fc2's probability-weighted bias moves
  12 / 16 B per element of fc2's k h output, the clamp 8 / 10 B per element of fc1's k 2f output, forward /
  backward; nothing without bias or clamp, and no clamp on a non-gated activation; the layer's memory-bound time
  grows by exactly those bytes, and moe_act recompute by the clamp's forward;
- a sliding window of w on every other layer executes (1 + (2ws - w^2)/s^2)/2 of causal attention, and the
  attention time of such a model drops by that share; a model without windows is unchanged.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from autotune.cost import moe_time
from autotune.cost.attention_seq import key_length_factor
from autotune.cost.attention_tiles import executed_attention_share
from autotune.cost.flops import causal_attention_share
from autotune.cost.kernels import rates
from autotune.cost.layer_time import layer_time
from autotune.cost.step_time import TimeSettings, estimate_step_time
from autotune.specs.loading import load_cluster
from autotune.specs.model import ModelSpec, MoESpec
from autotune.specs.plan import ParallelPlan

H, K, E = 64, 2, 8


def _model(**changes) -> ModelSpec:
    base = ModelSpec(name="tiny-moe", num_layers=4, hidden_size=H, num_attention_heads=4, ffn_hidden_size=128,
                     vocab_size=256, activation="swiglu", norm="rmsnorm", position_embedding="rope",
                     moe=MoESpec(num_experts=E, top_k=K, expert_ffn_hidden_size=32))
    return dataclasses.replace(base, **changes)


def _plan(ep: int) -> ParallelPlan:
    return ParallelPlan(engine="megatron", dp=8, ep=ep, seq_len=256, global_batch_size=8)


def test_dispatch_elements_by_hand():
    m = _model()
    assert moe_time.dispatch_elements(m, _plan(2)) == (2 * H + 2 * K * H, 4 * K * H)  # 4 local experts: sorted
    assert moe_time.dispatch_elements(m, _plan(8)) == (2 * H + 2 * K * H, 0)  # one expert per rank: no sort


def test_router_bytes_by_hand():
    assert moe_time.router_bytes(_model()) == (9 * E, 12 * E)


def test_busiest_rank_by_hand():
    tokens, ep = 1000, 4
    share = 1 / ep  # E/ep of E experts
    var_one = K * share * (1 - share) * (E - K) / (E - 1)
    expected = 1 + math.sqrt(tokens * ep * var_one) * math.sqrt(2 * math.log(ep)) / (tokens * ep * K * share)
    assert moe_time.busiest_rank_factor(tokens, ep, E, K) == pytest.approx(expected, rel=1e-12)
    assert moe_time.busiest_rank_factor(tokens, 1, E, K) == 1.0
    assert 1.0 < moe_time.busiest_rank_factor(100 * tokens, ep, E, K) < moe_time.busiest_rank_factor(tokens, ep, E, K)


def _layer(model: ModelSpec, plan: ParallelPlan, moe_layer: bool):
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    eff = TimeSettings().efficiency
    r = rates(cluster, plan.precision, eff, "fa3", None)
    return layer_time(model, cluster, plan, moe_layer, eff, r), r


def test_moe_layer_adds_the_dispatch_and_router_bytes():
    m, plan = _model(), _plan(2)
    with_moe, r = _layer(m, plan, True)
    tokens = plan.seq_len * plan.micro_batch_size
    busiest = moe_time.busiest_rank_factor(tokens, 2, E, K)
    # the same layer's memory-bound kernels, the routed experts' SwiGLU in place of the dense one
    dense_like, _ = _layer(dataclasses.replace(m, ffn_hidden_size=K * 32), plan, False)
    permutes, sorts = moe_time.dispatch_elements(m, plan)
    fwd, bwd = moe_time.router_bytes(m)
    dispatch = tokens * (2 * permutes + 2 * sorts * busiest) / r.hbm
    assert with_moe.elementwise_s - dense_like.elementwise_s == pytest.approx(dispatch + tokens * fwd / r.hbm,
                                                                              rel=1e-9)
    assert with_moe.elementwise_bwd_s - dense_like.elementwise_bwd_s == pytest.approx(
        dispatch + tokens * bwd / r.hbm, rel=1e-9)


def test_sliding_window_share_by_hand():
    w, s = 128, 4096
    m = _model(sliding_window=w, sliding_window_layers=(0, 2))
    assert causal_attention_share(m, s) == pytest.approx(0.5 + 0.5 * (2 * w * s - w * w) / s ** 2, rel=1e-12)
    assert causal_attention_share(_model(), s) == 1.0
    chunked = _model(sliding_window=w, chunked_attention=True)  # every layer chunked
    assert causal_attention_share(chunked, s) == pytest.approx(w / s, rel=1e-12)
    plan = dataclasses.replace(_plan(2), seq_len=s)
    windowed, _ = _layer(m, plan, True)
    full, _ = _layer(_model(), plan, True)
    # the kernel runs whole tiles (autotune.cost.attention_tiles), not the exact band, and each query row's fixed
    # work stays: the rows' useful keys are the executed share's (autotune.cost.attention_seq)
    e = executed_attention_share(m, s)
    slower = key_length_factor("fa3", s) / key_length_factor("fa3", e * s)
    assert windowed.attention_s == pytest.approx(full.attention_s * e * slower, rel=1e-12)


def test_expert_bias_and_clamp_bytes_by_hand():
    f = 32  # the experts' width
    both = _model(linear_bias=True, activation_clamp=7.0)
    assert moe_time.expert_extra_bytes(both) == (K * H * 12 + K * 2 * f * 8, K * H * 16 + K * 2 * f * 10,
                                                 K * 2 * f * 8)
    assert moe_time.expert_extra_bytes(_model()) == (0, 0, 0)
    assert moe_time.expert_extra_bytes(_model(linear_bias=True)) == (K * H * 12, K * H * 16, 0)
    assert moe_time.expert_extra_bytes(_model(activation_clamp=7.0, activation="gelu")) == (0, 0, 0)


def test_moe_layer_adds_the_bias_and_clamp_bytes():
    plan = _plan(2)
    base, with_both = _model(linear_bias=True), _model(linear_bias=True, activation_clamp=7.0)
    plain, r = _layer(_model(), plan, True)
    biased, _ = _layer(base, plan, True)
    clamped, _ = _layer(with_both, plan, True)
    tokens = plan.seq_len * plan.micro_batch_size
    busiest = moe_time.busiest_rank_factor(tokens, 2, E, K)
    clamp_fwd, clamp_bwd = K * 2 * 32 * 8, K * 2 * 32 * 10
    assert clamped.elementwise_s - biased.elementwise_s == pytest.approx(busiest * tokens * clamp_fwd / r.hbm,
                                                                         rel=1e-9)
    assert clamped.elementwise_bwd_s - biased.elementwise_bwd_s == pytest.approx(
        busiest * tokens * clamp_bwd / r.hbm, rel=1e-9)
    moe_act = {name: s for name, s in clamped.module_recompute_s}["moe_act"]
    assert moe_act - {name: s for name, s in biased.module_recompute_s}["moe_act"] == pytest.approx(
        busiest * tokens * clamp_fwd / r.hbm, rel=1e-9)
    # forward: the linear biases add no kernel but the experts' weighted one (backward also counts their gradients)
    assert biased.elementwise_s - plain.elementwise_s == pytest.approx(busiest * tokens * K * H * 12 / r.hbm,
                                                                       rel=1e-9)
    assert clamped.experts_s[1] - plain.experts_s[1] == pytest.approx(
        busiest * tokens * (K * H * 12 + clamp_fwd) / r.hbm, rel=1e-9)


def test_ep_group_lies_etp_apart_with_parallel_folding():
    """Megatron's expert grid is etp x ep x edp x pp without cp (parallel_state.py:887-895): with etp 1 an EP group of
    8 is 8 neighbouring ranks, inside one 8-GPU node whatever tp is; with etp = tp = 2 its ranks lie 2 apart and
    span two nodes. The layer's dispatcher time (and the layer time the planner caches) follows the etp given."""
    model = _model(moe=MoESpec(num_experts=16, top_k=K, expert_ffn_hidden_size=32), hidden_size=256)
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=16)
    folded = ParallelPlan(engine="megatron", tp=2, dp=8, ep=8, etp=1, sequence_parallel=True, seq_len=4096,
                          global_batch_size=8)
    eff = TimeSettings().efficiency
    inside = moe_time.dispatcher_comm_s(model, cluster, folded, eff, 4096)
    across = moe_time.dispatcher_comm_s(model, cluster, folded.with_(etp=2), eff, 4096)
    assert across > 2 * inside > 0
    moe_s = [estimate_step_time(model, cluster, p, TimeSettings()).comm_parts_s["moe"]
             for p in (folded, folded.with_(etp=2))]  # one process: the layer-time cache must tell them apart
    assert moe_s[1] > 2 * moe_s[0] > 0
