"""The built-in model computes what transformers' Gemma 2 and Gemma 3 compute, from the spec autotune reads off their
config: GeGLU (GeLU's tanh form), four norms a layer (each before and after its sublayer), norms multiplying by
(1 + weight), embeddings times sqrt(hidden), the attention scaled by query_pre_attn_scalar, Gemma 2's capped attention
and output logits, Gemma 3's per-head Q/K norms and its local layers' own RoPE base. Each feature left out of the spec
moves the loss."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_transformer_vs_hf import SEQ, _another_loss, _same_loss, copy_attention  # tests/workloads: on sys.path

from autotune.specs.hf_config import model_from_hf_config
from autotune.specs.loading import load_model
from autotune.workloads.transformer import build_model

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5, tie_word_embeddings=True,
             attn_implementation="eager")


def _copy_gemma(ours, theirs) -> None:
    spec = ours.spec
    with torch.no_grad():
        ours.embed.weight.copy_(theirs.model.embed_tokens.weight)
        ours.final_norm.weight.copy_(theirs.model.norm.weight)
        for mine, layer in zip(ours.layers, theirs.model.layers):
            a, ffn = layer.self_attn, layer.mlp
            mine.norm1.weight.copy_(layer.input_layernorm.weight)
            mine.post_attn_norm.weight.copy_(layer.post_attention_layernorm.weight)
            mine.norm2.weight.copy_(layer.pre_feedforward_layernorm.weight)
            mine.post_mlp_norm.weight.copy_(layer.post_feedforward_layernorm.weight)
            copy_attention(mine.attn, a, spec)
            mine.mlp.fc1.weight.copy_(torch.cat([ffn.gate_proj.weight, ffn.up_proj.weight]))
            mine.mlp.fc2.weight.copy_(ffn.down_proj.weight)


def _theirs(cls, config):
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():  # (1 + weight) norms away from 1, so that a norm read as plain would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(-0.5, 0.5)
            elif "embed" in name:
                p.mul_(3.0)  # logits large enough for the output cap to bite
            elif "q_proj" in name or "k_proj" in name:
                p.mul_(10.0)  # attention scores large enough for the score cap and the scale to bite
    return model


def _check(spec, theirs, changes: dict) -> None:
    ours = build_model(spec, seq_len=SEQ, dtype=torch.float32).eval()
    assert sum(p.numel() for p in ours.parameters()) == spec.num_params == sum(p.numel() for p in theirs.parameters())
    _copy_gemma(ours, theirs)
    _same_loss(ours, theirs)
    for field, value in changes.items():  # each feature is in the model: without it, another loss
        _another_loss(ours, replace(spec, **{field: value}))


def test_gemma2_matches_transformers() -> None:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(**SMALL, sliding_window=SEQ, query_pre_attn_scalar=48, attn_logit_softcapping=2.0,
                          final_logit_softcapping=3.0)
    spec = model_from_hf_config(config.to_dict(), name="gemma2-like")
    assert (spec.activation, spec.norms_per_layer, spec.query_pre_attn_scalar) == ("geglu", 4, 48.0)
    assert (spec.attn_logit_softcap, spec.final_logit_softcap) == (2.0, 3.0)
    assert spec.scaled_embeddings and spec.norm_zero_centered
    _check(spec, _theirs(Gemma2ForCausalLM, config),
           {"activation": "swiglu", "attn_logit_softcap": None, "final_logit_softcap": None,
            "query_pre_attn_scalar": None, "scaled_embeddings": False, "norm_zero_centered": False})


def test_gemma3_matches_transformers() -> None:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(**(SMALL | {"num_hidden_layers": 6}), sliding_window=SEQ, query_pre_attn_scalar=48,
                              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                                               "full_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    spec = model_from_hf_config(config.to_dict() | {"model_type": "gemma3_text"}, name="gemma3-like")
    assert (spec.qk_norm, spec.local_rope_theta, spec.rope_theta) == ("head", 10.0, 10000.0)
    assert spec.attn_logit_softcap is None and spec.final_logit_softcap is None
    assert spec.sliding_window_layers == (0, 1, 2, 3, 4)  # five of six local: the sixth layer is global
    _check(spec, _theirs(Gemma3ForCausalLM, config), {"local_rope_theta": None, "activation": "swiglu"})


def test_geglu_backward_is_the_gradient_of_its_forward() -> None:
    from autotune.workloads.kernels import geglu

    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(geglu, (x,))
    gate, up = x.detach().chunk(2, dim=-1)
    assert torch.allclose(geglu(x), torch.nn.functional.gelu(gate, approximate="tanh") * up)


def test_zero_centered_norms_start_at_zero_and_act_as_one() -> None:
    spec = model_from_hf_config(__import__("transformers").Gemma2Config(**SMALL).to_dict(), name="g")
    model = build_model(spec, seq_len=SEQ, dtype=torch.float32)
    norms = [p for n, p in model.named_parameters() if "norm" in n]
    assert len(norms) == 4 * spec.num_layers + 1 and all(torch.count_nonzero(p) == 0 for p in norms)
    assert model.final_norm(torch.ones(1, 64)).sum().item() == pytest.approx(64.0, rel=1e-4)  # x * (1 + 0)


@pytest.mark.parametrize("source, family", [("tests/fixtures/hf/gemma2-9b/config.json", "gemma2"),
                                            ("gemma3-27b", "gemma3")])
def test_the_hf_trainer_builds_gemma_as_the_spec_says(source, family) -> None:
    """The hf trainer's Gemma2 / Gemma3 class of a spec has its parameter count, and its config reads back as the
    spec: layer types, query scale, logit caps, the local RoPE base and the linear scaling of Gemma 3's global
    layers."""
    from autotune.engines.builtin_trainer import hf_model_family
    from autotune.train.hf_models import build_hf_model

    every = 2 if family == "gemma2" else 6
    spec = replace(load_model(source), num_layers=6, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                   head_dim=32, ffn_hidden_size=96, vocab_size=128, sliding_window=8, query_pre_attn_scalar=24.0,
                   sliding_window_layers=tuple(i for i in range(6) if (i + 1) % every))
    assert hf_model_family(spec) == family
    model = build_hf_model(spec, seq_len=SEQ, dtype=torch.float32)
    assert type(model).__name__ == {"gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}[family]
    assert sum(p.numel() for p in model.parameters()) == spec.num_params
    config = model.config.to_dict() | ({"model_type": "gemma3_text"} if family == "gemma3" else {})
    # a text model's config: none of the multimodal preset's note on what is left out
    assert model_from_hf_config(config, name=spec.name) == replace(spec, note=None)
    if family == "gemma3":
        assert (spec.rope_scaling, spec.local_rope_theta) == ("linear", 10000.0)
