"""The routed experts' host time (autotune.cost.expert_host), derived by hand:

- per local expert, forward 2 cuBLASLt GEMM calls and backward 4, each (0.267 - 0.069) / 7 ms (TE PR #3134), plus
  under a per-split FP8 recipe (MXFP8) 2 quantize launches per pass; delayed scaling's fused multi-tensor cast and
  16-bit plans add none;
- it scales with the experts a GPU holds (num_experts / ep), and is nothing for an engine without a launch model;
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
