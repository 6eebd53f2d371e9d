"""The built-in model's MoE layers route and combine as transformers' own models do: each config.json read by
autotune's reader into a ModelSpec, the built-in model built from it, the weights of transformers' model copied in,
the same loss. Mixtral (softmax over the top-k), Qwen3-MoE (norm_topk_prob true and false), Llama 4 (a top-1 sigmoid
that scales the expert's input, a shared expert, dense layers between) and GLM-4.5 (sigmoid with a routing bias for
the choice only, the top-k normalised and scaled, a shared expert, a dense first layer, RoPE on half of each
head) and Qwen2-MoE (a shared expert behind a sigmoid gate, Q/K/V biases, softmax weights left unnormalised)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from test_transformer_vs_hf import copy_attention  # tests/workloads is on sys.path (no __init__)

from autotune.specs.loading import load_model
from autotune.workloads.transformer import build_model

SEQ = 16
BASE = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            rms_norm_eps=1e-5, tie_word_embeddings=False)


def _dense(mine, mlp) -> None:
    mine.fc1.weight.copy_(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    mine.fc2.weight.copy_(mlp.down_proj.weight)


def _copy(ours, theirs, *, ffn: str, router: str, transposed: bool, shared: str | None) -> None:
    """transformers' weights into the built-in model; ``transposed``: experts stored [E, in, out] (Llama 4)."""
    spec = ours.spec
    with torch.no_grad():
        ours.embed.weight.copy_(theirs.model.embed_tokens.weight)
        ours.final_norm.weight.copy_(theirs.model.norm.weight)
        ours.output.weight.copy_(theirs.lm_head.weight)
        for i, (mine, layer) in enumerate(zip(ours.layers, theirs.model.layers)):
            a = layer.self_attn
            mine.norm1.weight.copy_(layer.input_layernorm.weight)
            mine.norm2.weight.copy_(layer.post_attention_layernorm.weight)
            copy_attention(mine.attn, a, spec)
            for name in ("q", "k", "v"):  # Qwen2-MoE's Q/K/V biases
                if getattr(mine.attn, name).bias is not None:
                    getattr(mine.attn, name).bias.copy_(getattr(a, f"{name}_proj").bias)
            block = getattr(layer, ffn)
            if not spec.is_moe_layer(i):
                _dense(mine.mlp, block)
                continue
            gate = getattr(block, router)
            mine.mlp.router.weight.copy_(gate.weight)
            if mine.mlp.router_bias is not None:
                mine.mlp.router_bias.copy_(gate.e_score_correction_bias)
            for e, expert in enumerate(mine.mlp.experts):
                up, down = block.experts.gate_up_proj[e], block.experts.down_proj[e]
                expert.fc1.weight.copy_(up.T if transposed else up)
                expert.fc2.weight.copy_(down.T if transposed else down)
            if shared is not None:
                _dense(mine.mlp.shared[0], getattr(block, shared))
            if mine.mlp.shared_gate is not None:
                mine.mlp.shared_gate.weight.copy_(block.shared_expert_gate.weight)


def load_model_from(tmp_path, config):
    """The ModelSpec autotune reads from ``config`` written as a config.json."""
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    return load_model(str(tmp_path / "config.json"))


def _check(tmp_path, model_class, config, prepare=None, **copy) -> tuple:
    """The built-in model of ``config``'s spec with transformers' weights gives transformers' loss; (the built-in
    model, the batch, that loss). ``prepare``: what to change in transformers' model first."""
    spec = load_model_from(tmp_path, config)
    torch.manual_seed(0)
    theirs = model_class(config).eval()
    with torch.no_grad():  # a routing bias that moves the choice, where the model has one
        for name, buf in theirs.named_buffers():
            if "e_score_correction_bias" in name:
                buf.uniform_(-0.5, 0.5)
        if prepare is not None:
            prepare(theirs)
    ours = build_model(spec, seq_len=SEQ, dtype=torch.float32).eval()
    # the routing bias is a buffer in transformers and in its checkpoints a tensor like the weights: counted
    theirs_count = sum(p.numel() for p in theirs.parameters()) + sum(
        b.numel() for n, b in theirs.named_buffers() if "e_score_correction_bias" in n)
    assert sum(p.numel() for p in ours.parameters()) == spec.num_params == theirs_count
    _copy(ours, theirs, **copy)
    g = torch.Generator().manual_seed(0)
    ids, labels = (torch.randint(0, 128, (2, SEQ), generator=g) for _ in range(2))
    with torch.no_grad():
        logits = theirs(input_ids=ids).logits
        expected = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1)).item()
        assert ours(ids, labels).item() == pytest.approx(expected, rel=1e-5, abs=1e-5)
    return ours, ids, labels, expected


def test_mixtral(tmp_path):
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(**BASE, intermediate_size=48, num_hidden_layers=2, num_local_experts=4,
                           num_experts_per_tok=2, attn_implementation="eager")
    _check(tmp_path, MixtralForCausalLM, config, ffn="mlp", router="gate", transposed=False, shared=None)


@pytest.mark.parametrize("norm_topk", [True, False])
def test_qwen3_moe(tmp_path, norm_topk):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(**BASE, moe_intermediate_size=48, intermediate_size=96, num_hidden_layers=2,
                            num_experts=4, num_experts_per_tok=2, norm_topk_prob=norm_topk,
                            attn_implementation="eager")
    assert load_model_from(tmp_path, config).moe.router_pre_softmax is not norm_topk
    _check(tmp_path, Qwen3MoeForCausalLM, config, ffn="mlp", router="gate", transposed=False, shared=None)


def test_llama4(tmp_path):
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    # MoE on layers 1 and 3 (interleave step 2), dense layers between, layer 3 without RoPE. Llama 4 rotates Q and K
    # in (2i, 2i + 1) pairs and the built-in model in (i, i + d/2) ones (test_transformer_vs_hf.py checks RoPE with
    # the rows reordered): here Q is zero, so attention is uniform and the order does not matter.
    config = Llama4TextConfig(**BASE, intermediate_size=48, intermediate_size_mlp=96, num_hidden_layers=4,
                              num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
                              use_qk_norm=False, rope_scaling=None, attn_implementation="eager")
    spec = load_model_from(tmp_path, config)
    assert spec.moe.router_probs_on_input and spec.moe.router_score == "sigmoid"

    def uniform_attention(theirs):
        for layer in theirs.model.layers:
            layer.self_attn.q_proj.weight.zero_()

    ours, ids, labels, expected = _check(tmp_path, Llama4ForCausalLM, config, prepare=uniform_attention,
                                         ffn="feed_forward", router="router", transposed=True, shared="shared_expert")
    for i, layer in enumerate(ours.layers):  # the weight on the expert's output instead of its input: another model
        if spec.is_moe_layer(i):
            layer.mlp.moe = replace(layer.mlp.moe, router_probs_on_input=False)
    with torch.no_grad():
        assert abs(ours(ids, labels).item() - expected) > 1e-4


def test_glm4_moe(tmp_path):
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    config = Glm4MoeConfig(**BASE, moe_intermediate_size=48, intermediate_size=96, num_hidden_layers=3,
                           n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1, n_shared_experts=1,
                           routed_scaling_factor=2.5, n_group=1, topk_group=1, norm_topk_prob=True,
                           partial_rotary_factor=0.5, attn_implementation="eager")
    spec = load_model_from(tmp_path, config)
    assert spec.moe.router_score == "sigmoid" and spec.moe.router_bias and spec.moe.router_scaling_factor == 2.5
    assert spec.rotary_fraction == 0.5  # RoPE on the first half of each head's dimensions
    _check(tmp_path, Glm4MoeForCausalLM, config, ffn="mlp", router="gate", transposed=False, shared="shared_experts")


def test_qwen2_moe(tmp_path):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    config = Qwen2MoeConfig(**BASE, moe_intermediate_size=48, shared_expert_intermediate_size=80, intermediate_size=96,
                            num_hidden_layers=2, num_experts=4, num_experts_per_tok=2, attn_implementation="eager")
    spec = load_model_from(tmp_path, config)
    assert spec.moe.shared_expert_gate and spec.qkv_bias and spec.moe.router_pre_softmax

    def biased(theirs):  # biases and a gate far from zero, so that dropping either would show
        for layer in theirs.model.layers:
            for name in ("q", "k", "v"):
                getattr(layer.self_attn, f"{name}_proj").bias.uniform_(-0.5, 0.5)
            layer.mlp.shared_expert_gate.weight.uniform_(-1.0, 1.0)
            layer.mlp.shared_expert.down_proj.weight.mul_(100.0)  # a shared output that moves the logits

    ours, ids, labels, expected = _check(tmp_path, Qwen2MoeForCausalLM, config, prepare=biased, ffn="mlp",
                                         router="gate", transposed=False, shared="shared_expert")
    for layer in ours.layers:  # the shared expert ungated: another model
        layer.mlp.shared_gate = None
    with torch.no_grad():
        assert abs(ours(ids, labels).item() - expected) > 1e-4
