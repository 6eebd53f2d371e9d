"""RoPE's bytes by engine (autotune.cost.rope_kernels): Megatron-core's unfused YaRN chain, counted by hand."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.cost.kernels import rates
from autotune.cost.layer_time import EAGER_BYTES, layer_time
from autotune.cost.rope_kernels import FUSED_ROPE_BYTES, UNFUSED_YARN_BYTES, rope_bytes
from autotune.cost.step_time import TimeSettings
from autotune.specs.loading import load_cluster
from autotune.specs.model import MLASpec, ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset


def _model(**changes) -> ModelSpec:
    base = ModelSpec(name="tiny", num_layers=2, hidden_size=256, num_attention_heads=4, num_kv_heads=2,
                     ffn_hidden_size=512, vocab_size=256, activation="swiglu", norm="rmsnorm",
                     position_embedding="rope")
    return dataclasses.replace(base, **changes)


def _layer(model: ModelSpec, kernels: str):
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    eff = TimeSettings().efficiency
    r = rates(cluster, "bf16", eff, "fa3", None)
    plan = ParallelPlan(engine="megatron", dp=8, seq_len=256, global_batch_size=8)
    return layer_time(model, cluster, plan, False, eff, r, kernels), r, plan


def test_unfused_yarn_chain_by_hand():
    # forward: t*cos 4, -x2 on half 2, cat 4, *sin 4, add 6, cat 4; backward: *sin 4, neg 2, chunk's cat 4,
    # *cos 4, the two gradients added 6, the slice's zeroed gradient 2 + 4
    assert UNFUSED_YARN_BYTES == (4 + 2 + 4 + 4 + 6 + 4, 4 + 2 + 4 + 4 + 6 + 2 + 4)
    assert FUSED_ROPE_BYTES == (4, 4)


def test_only_megatrons_fused_path_runs_yarn_unfused():
    yarn = _model(rope_scaling="yarn")
    assert rope_bytes(yarn, "fused") == UNFUSED_YARN_BYTES
    assert rope_bytes(yarn, "compiled") == FUSED_ROPE_BYTES  # torch.compile fuses the chain
    assert rope_bytes(_model(), "fused") == FUSED_ROPE_BYTES  # plain RoPE: TE's fused kernel
    mla = dataclasses.replace(load_model_preset("deepseek-v3"), rope_scaling="yarn")
    assert isinstance(mla.mla, MLASpec) and rope_bytes(mla, "fused") == FUSED_ROPE_BYTES  # MLA's own fused path
    assert load_model_preset("gpt-oss-120b").rope_scaling == "yarn"


def test_layer_time_charges_the_extra_bytes():
    plain, r, plan = _layer(_model(), "fused")
    yarn, _, _ = _layer(_model(rope_scaling="yarn"), "fused")
    m = _model()
    tokens = plan.seq_len * plan.micro_batch_size
    width = m.q_width + m.kv_width
    extra_fwd = UNFUSED_YARN_BYTES[0] - FUSED_ROPE_BYTES[0]
    extra_bwd = UNFUSED_YARN_BYTES[1] - FUSED_ROPE_BYTES[1]
    assert yarn.elementwise_s - plain.elementwise_s == pytest.approx(tokens * extra_fwd * width / r.hbm, rel=1e-9)
    assert yarn.elementwise_bwd_s - plain.elementwise_bwd_s == pytest.approx(tokens * extra_bwd * width / r.hbm,
                                                                             rel=1e-9)
    compiled, _, _ = _layer(_model(rope_scaling="yarn"), "compiled")
    assert compiled.elementwise_s == pytest.approx(plain.elementwise_s, rel=1e-12)
    eager_plain, _, _ = _layer(_model(), "eager")
    eager_yarn, _, _ = _layer(_model(rope_scaling="yarn"), "eager")
    assert eager_yarn.elementwise_s == eager_plain.elementwise_s and EAGER_BYTES["rope"] == (20, 20)
