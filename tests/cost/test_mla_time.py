"""Multi-head latent attention (DeepSeek-V3, Kimi-K2) costs the GEMMs it runs: the low-rank Q and KV
projections, not a full-width QKV projection.

- the projections' FLOPs per token are exactly the ones ``flops.layer_flops_per_token`` counts for MFU (one
  count of the same GEMMs, not two models of them);
- under TP the down-projections are duplicated on every rank (Megatron-core: TELinear parallel_mode
  'duplicated'), the up- and output projections split;
- a dense-attention model's projections are unchanged (the QKV and output GEMMs);
- the time of an MLA layer's linear layers is below that of the same heads projected at full width (the error
  this fixes: DeepSeek-V3 on NVIDIA's GB300 recipe was predicted 37% slow).
"""

from __future__ import annotations

import dataclasses

import pytest

from autotune.cost.flops import layer_flops_per_token
from autotune.cost.layer_time import attention_projections, layer_time
from autotune.cost.kernels import rates
from autotune.cost.step_time import TimeSettings
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset


def _per_token(projections) -> float:
    # FLOPs per token summed over the TP ranks' shares: a duplicated GEMM runs on every rank
    return sum(2 * k * n for _, k, n, _ in projections)


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2"])
def test_mla_projection_flops_are_the_counted_ones(name):
    m = load_model_preset(name)
    assert m.mla is not None
    counted = layer_flops_per_token(m, 4096, layer_index=0)
    mlp = 2.0 * (3 if m.activation == "swiglu" else 2) * m.hidden_size * m.ffn_hidden_size
    assert _per_token(attention_projections(m, 1)) == pytest.approx(counted.gemm - mlp, rel=1e-12)


def test_down_projections_are_duplicated_over_tp_and_the_rest_split():
    m = load_model_preset("deepseek-v3")
    kinds = [(kind, split) for kind, _, _, split in attention_projections(m, 8)]
    assert kinds == [("dup", 1), ("col", 8), ("dup", 1), ("col", 8), ("row", 8)]


def test_dense_attention_is_one_qkv_and_one_output_projection():
    m = load_model_preset("llama3-70b")
    assert attention_projections(m, 4) == [("col", m.hidden_size, m.q_width + 2 * m.kv_width, 4),
                                           ("row", m.q_width, m.hidden_size, 4)]


def test_an_mla_layer_is_faster_than_full_width_projections_of_its_heads():
    m = load_model_preset("deepseek-v3")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    plan = ParallelPlan(engine="megatron", dp=8, seq_len=4096, global_batch_size=8)
    settings = TimeSettings()
    r = rates(cluster, plan.precision, settings.efficiency, "fa3", None)
    mla = layer_time(m, cluster, plan, False, settings.efficiency, r)
    # the same model with MLA removed: heads projected at full width (what the time model did before)
    wide = dataclasses.replace(m, mla=None, head_dim=m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim)
    full = layer_time(wide, cluster, plan, False, settings.efficiency, r)
    assert mla.gemm_s < full.gemm_s
    saved = _per_token(attention_projections(wide, 1)) - _per_token(attention_projections(m, 1))
    assert saved > 0.5 * _per_token(attention_projections(m, 1))
