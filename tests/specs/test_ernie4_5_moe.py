"""ERNIE 4.5 MoE's config.json (transformers Ernie4_5_MoeConfig / modeling_ernie4_5_moe.py): its MoE layout, shared
experts, and its router, which selects by softmax + e_score_correction_bias and weights by the softmax alone
(ModelSpec: a softmax router with router_bias; Megatron-core cannot take the bias, so the spec's note and the
Megatron files say so). The exact count against the meta-device model is tests/specs/test_hf_readers_exact.py's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.emit.megatron_model_flags import router_bias_gap, router_flags
from autotune.errors import InputError
from autotune.specs.hf_config import model_from_hf_config
from autotune.specs.hf_readers_more import ERNIE_MOE_ROUTER_NOTE
from autotune.specs.presets import load_model_preset

# Ernie4_5_MoeConfig's defaults, "the ERNIE-4.5-21B-A3B style configuration" (its docstring), written out
A3B = dict(model_type="ernie4_5_moe", hidden_size=2560, intermediate_size=12288, num_hidden_layers=28,
           num_attention_heads=20, num_key_value_heads=4, vocab_size=103424, moe_intermediate_size=1536, moe_k=6,
           moe_num_experts=64, moe_num_shared_experts=2, moe_layer_start_index=1, moe_layer_end_index=27,
           moe_layer_interval=1, tie_word_embeddings=True, rope_theta=500000.0, rms_norm_eps=1e-5)


def test_ernie4_5_moe_reads_its_layout_router_and_shared_experts():
    spec = model_from_hf_config(A3B)
    moe = spec.moe
    assert (moe.num_experts, moe.top_k, moe.expert_ffn_hidden_size, moe.num_dense_layers, moe.moe_layer_step) == \
        (64, 6, 1536, 1, 1)
    assert (moe.num_shared_experts, moe.shared_width) == (1, 3072)  # two shared experts as one MLP of 2 x 1536
    assert moe.router_score == "softmax" and moe.router_bias and not moe.router_pre_softmax
    assert spec.tied_embeddings and spec.kv_heads == 4 and spec.attention_head_dim == 128 and not spec.linear_bias
    assert spec.note == ERNIE_MOE_ROUTER_NOTE and "e_score_correction_bias" in spec.note
    # the meta-device model transformers builds from this file: 21,825,437,888 (3,352,150,208 active)
    assert (spec.num_params, spec.num_active_params) == (21_825_437_888, 3_352_150_208)
    wide = model_from_hf_config(A3B | {"moe_layer_start_index": 2, "moe_layer_interval": 2})
    assert [wide.is_moe_layer(i) for i in range(6)] == [False, False, False, True, False, True]
    assert model_from_hf_config(A3B | {"moe_layer_end_index": -1}).num_params == spec.num_params
    fixture = model_from_hf_config(Path(__file__).parents[1] / "fixtures" / "hf" / "ernie4.5-21b-a3b")
    assert dataclasses.replace(fixture, name=spec.name) == spec


@pytest.mark.parametrize("change, says", [({"use_bias": True}, "use_bias"),
                                          ({"moe_layer_end_index": 20}, "moe_layer_end_index")])
def test_what_modelspec_cannot_say_is_refused(change, says):
    with pytest.raises(InputError, match=says):
        model_from_hf_config(A3B | change)


def test_megatron_routes_by_the_softmax_alone_and_says_so():
    """Megatron-core's expert bias is for sigmoid / sqrtsoftplus scores (transformer_config.py:2617-2625): no
    --moe-router-enable-expert-bias for ERNIE, and the Megatron files name the bias they leave out. GPT-OSS's softmax
    router bias is its linear layer's (--add-bias-linear), nothing left out."""
    spec = model_from_hf_config(A3B)
    assert "--moe-router-enable-expert-bias" not in router_flags(spec.moe)
    assert "64 values per MoE layer" in router_bias_gap(spec)
    assert router_bias_gap(load_model_preset("gpt-oss-20b")) is None
    assert router_bias_gap(load_model_preset("deepseek-v3")) is None  # sigmoid: the expert bias flag carries it


def test_zero_correction_bias_routes_as_megatrons_softmax_over_the_top_k():
    """transformers' Ernie4_5_MoeTopKRouter with its correction bias at zero gives Megatron-core's default softmax
    routing (top-k of the logits, softmax over them: moe_utils.py topk_routing_with_score_function); a bias changes
    the selection, not the weights' form."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeTopKRouter

    cfg = transformers.AutoConfig.for_model("ernie4_5_moe", hidden_size=16, moe_num_experts=8, moe_k=2)
    torch.manual_seed(0)
    router = Ernie4_5_MoeTopKRouter(cfg)
    torch.nn.init.normal_(router.weight)
    x = torch.randn(32, 16)
    _, weights, chosen = router(x)
    logits = x @ router.weight.T
    top, index = torch.topk(logits, 2, dim=-1)
    assert torch.equal(chosen.sort(-1).values, index.sort(-1).values)
    assert torch.allclose(weights, torch.softmax(top, dim=-1), atol=1e-6)
    router.moe_statics.e_score_correction_bias.data[0, 0] = 10.0  # expert 0 now in every token's top-k
    assert (router(x)[2] == 0).any(-1).all()
