"""The routed experts' host time (autotune.cost.expert_host), derived by hand:

- per local expert, forward 2 cuBLASLt GEMM calls and backward 4, each (0.267 - 0.069) / 7 ms (TE PR #3134), plus
  under a per-split FP8 recipe (MXFP8) 2 quantize launches per pass; delayed scaling's fused multi-tensor cast and
  16-bit plans add none;
- it scales with the experts a GPU holds (num_experts / ep), and is nothing for an engine without a launch model;
- biased experts add fc2's bias loop (forward 2 kernels per local expert + a cat, data gradient 4 per expert + 2
  cats) and a clamped GLU its clamps, cat and offset copy (forward 4, data gradient 3), at the launch time each;
  what the forward issues after the clamped GLU's sync (fc2's call and bias kernels per expert, the cat) is
  waited for whole even under EP overlap;
- in a step: an MoE layer's passes wait for it whole (the dispatcher's host sync leaves no lead), so a plan with
  more local experts slows by exactly the extra host time per MoE layer and micro-batch; under EP overlap it hides
  behind GPU work (the paired micro-batch's), so a small addition costs nothing.
"""

from __future__ import annotations

import dataclasses

import pytest

from autotune.cost import expert_host
from autotune.cost.launch import launch_exposed_s
from autotune.specs.model import ModelSpec, MoESpec
from autotune.specs.plan import ParallelPlan

LAUNCH = 3.8e-6
CALL = (0.267e-3 - 0.069e-3) / 7


def _model(experts: int = 16) -> ModelSpec:
    return ModelSpec(name="tiny-moe", num_layers=4, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
                     vocab_size=256, activation="swiglu", norm="rmsnorm", position_embedding="rope",
                     moe=MoESpec(num_experts=experts, top_k=2, expert_ffn_hidden_size=32))


def _plan(ep: int = 2, precision: str = "fp8", **changes) -> ParallelPlan:
    return ParallelPlan(engine="megatron", dp=8, ep=ep, seq_len=256, global_batch_size=8, precision=precision,
                        **changes)


def test_calls_per_local_expert_by_hand():
    fwd, bwd = expert_host.grouped_mlp_host_s(_model(16), _plan(2), "te-mxfp8", LAUNCH)
    assert fwd == pytest.approx(8 * (2 * CALL + 2 * LAUNCH))
    assert bwd == pytest.approx(8 * (4 * CALL + 2 * LAUNCH))
    # delayed scaling casts all splits in one fused kernel; 16-bit plans cast nothing
    assert expert_host.grouped_mlp_host_s(_model(16), _plan(2), "te-delayed", LAUNCH) == \
        pytest.approx((8 * 2 * CALL, 8 * 4 * CALL))
    assert expert_host.grouped_mlp_host_s(_model(16), _plan(2, "bf16"), None, LAUNCH) == \
        pytest.approx((8 * 2 * CALL, 8 * 4 * CALL))


def test_the_backward_splits_into_data_and_weight_gradients():
    fwd, dgrad, wgrad = expert_host.grouped_mlp_host_parts_s(_model(16), _plan(2), "te-mxfp8", LAUNCH)
    whole = expert_host.grouped_mlp_host_s(_model(16), _plan(2), "te-mxfp8", LAUNCH)
    assert (fwd, dgrad + wgrad) == pytest.approx(whole)
    # the output gradient's per-split quantize goes with the data gradient; the weight gradient is GEMM calls only
    assert dgrad == pytest.approx(8 * (2 * CALL + 2 * LAUNCH)) and wgrad == pytest.approx(8 * 2 * CALL)


def test_scales_with_local_experts_and_needs_a_launch_model():
    few = expert_host.grouped_mlp_host_s(_model(16), _plan(8), "te-mxfp8", LAUNCH)
    many = expert_host.grouped_mlp_host_s(_model(16), _plan(2), "te-mxfp8", LAUNCH)
    assert many[0] == pytest.approx(4 * few[0]) and many[1] == pytest.approx(4 * few[1])
    assert expert_host.grouped_mlp_host_s(_model(16), _plan(2), "te-mxfp8", 0.0) == (0.0, 0.0)


def test_layer_waits_for_it_whole_unless_ep_overlap_hides_it():
    model, plan = _model(16), _plan(2)
    gpu_f, gpu_b = 1e-3, 2e-3  # far more GPU work than the other launches take: only the experts' time shows
    host_f, host_b = expert_host.grouped_mlp_host_s(model, plan, "te-mxfp8", LAUNCH)
    wait = launch_exposed_s(model, plan, True, gpu_f, gpu_b, LAUNCH, "te-mxfp8")
    assert wait == pytest.approx((host_f, host_b))
    assert launch_exposed_s(model, plan, False, gpu_f, gpu_b, LAUNCH, "te-mxfp8") == (0.0, 0.0)  # dense layer
    paired = dataclasses.replace(plan, ep_overlap="a2a")
    assert launch_exposed_s(model, paired, True, gpu_f, gpu_b, LAUNCH, "te-mxfp8") == (0.0, 0.0)
    tight = launch_exposed_s(model, paired, True, host_f / 2, host_b / 2, LAUNCH, "te-mxfp8")
    assert tight[0] > host_f / 2 and tight[1] > host_b / 2  # a GPU shorter than the host's issue waits for it


def _gpt_oss_like(experts: int = 16) -> ModelSpec:
    return dataclasses.replace(_model(experts), linear_bias=True, activation_clamp=7.0)


def test_biased_experts_and_a_clamped_glu_add_their_kernels_by_hand():
    model, plan = _gpt_oss_like(16), _plan(2, "bf16")  # 8 local experts
    fwd, dgrad, wgrad = expert_host.grouped_mlp_host_parts_s(model, plan, None, LAUNCH)
    assert fwd == pytest.approx(8 * (2 * CALL + 2 * LAUNCH) + (1 + 4) * LAUNCH)
    assert dgrad == pytest.approx(8 * (2 * CALL + 4 * LAUNCH) + (2 + 3) * LAUNCH)
    assert wgrad == pytest.approx(8 * 2 * CALL)
    # the bias alone (no clamp) and the clamp alone (no bias) add only their own kernels
    bias_only = dataclasses.replace(model, activation_clamp=None)
    assert expert_host.grouped_mlp_host_parts_s(bias_only, plan, None, LAUNCH)[0] == \
        pytest.approx(8 * (2 * CALL + 2 * LAUNCH) + LAUNCH)
    clamp_only = dataclasses.replace(model, linear_bias=False)
    assert expert_host.grouped_mlp_host_parts_s(clamp_only, plan, None, LAUNCH)[1] == \
        pytest.approx(8 * 2 * CALL + 3 * LAUNCH)
    # a full-iteration graph's launches cost nothing, so neither do these
    assert expert_host.grouped_mlp_host_parts_s(model, plan, None, 0.0) == (0.0, 0.0, 0.0)


def test_post_sync_forward_is_fc2_and_the_bias_loop():
    model, plan = _gpt_oss_like(16), _plan(2, "bf16")
    assert expert_host.post_sync_forward_host_s(model, plan, None, LAUNCH) == \
        pytest.approx(8 * (CALL + 2 * LAUNCH) + LAUNCH)
    # MXFP8 quantizes fc2's input split by split too
    assert expert_host.post_sync_forward_host_s(model, _plan(2, "fp8"), "te-mxfp8", LAUNCH) == \
        pytest.approx(8 * (CALL + 3 * LAUNCH) + LAUNCH)
    assert expert_host.post_sync_forward_host_s(dataclasses.replace(model, activation_clamp=None), plan, None,
                                                LAUNCH) == 0.0


def test_ep_overlap_cannot_hide_what_follows_the_clamped_glu_sync():
    model = _gpt_oss_like(16)
    paired = _plan(2, "bf16", ep_overlap="a2a")
    gpu_f, gpu_b = 1e-2, 2e-2  # ample GPU work: only the post-sync forward shows
    tail = expert_host.post_sync_forward_host_s(model, paired, None, LAUNCH)
    assert launch_exposed_s(model, paired, True, gpu_f, gpu_b, LAUNCH, None) == pytest.approx((tail, 0.0))
    plain = dataclasses.replace(model, activation_clamp=None)
    assert launch_exposed_s(plain, paired, True, gpu_f, gpu_b, LAUNCH, None) == (0.0, 0.0)


def test_moe_act_recompute_reruns_the_clamped_glu_and_its_sync():
    model = _gpt_oss_like(16)
    plain = _plan(2, "bf16")
    rerun = _plan(2, "bf16", recompute="selective", recompute_modules=("moe_act",))
    base = expert_host.grouped_mlp_host_parts_s(model, plain, None, LAUNCH)
    again = expert_host.grouped_mlp_host_parts_s(model, rerun, None, LAUNCH)
    assert again[1] - base[1] == pytest.approx(4 * LAUNCH)  # the clamps, the cat and the copy once more
    assert (again[0], again[2]) == pytest.approx((base[0], base[2]))
    assert expert_host.post_sync_backward_host_s(model, plain, None, LAUNCH) == 0.0
    assert expert_host.post_sync_backward_host_s(model, rerun, None, LAUNCH) == pytest.approx(again[1])
    # under EP overlap with ample GPU work the whole data gradient then shows, besides the forward's tail
    paired = dataclasses.replace(rerun, ep_overlap="a2a")
    tail = expert_host.post_sync_forward_host_s(model, paired, None, LAUNCH)
    assert launch_exposed_s(model, paired, True, 1e-2, 2e-2, LAUNCH, None) == pytest.approx((tail, again[1]))
