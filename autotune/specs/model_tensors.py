"""A model's parameter tensors in module order (``ModelSpec``), each with how TP / EP split it: what DeepSpeed's
ZeRO-1/2 flat partitioning walks (``autotune.engines.states``)."""

from __future__ import annotations

from autotune.specs.model import ModelSpec

__all__ = ["layer_tensors", "stage_tensors"]


def _norm_tensors(model: ModelSpec, width: int) -> list[tuple[int, str]]:
    return [(width, "replicated")] * (2 if model.norm == "layernorm" else 1)


def _mlp_tensors(model: ModelSpec, width: int, kind: str) -> list[tuple[int, str]]:
    h, n_in = model.hidden_size, (2 if model.gated_mlp else 1)
    out = [(n_in * width * h, kind)]
    if model.linear_bias:
        out.append((n_in * width, kind))
    out.append((width * h, kind))
    if model.linear_bias:
        out.append((h, "replicated" if kind == "tp_sharded" else kind))
    return out


def layer_tensors(model: ModelSpec, layer_index: int) -> list[tuple[int, str]]:
    """One layer's parameter tensors in module order (norm, Q, K, V, output, norm, MLP), each
    with how TP/EP split it. Sums to ``ModelSpec.layer_params``; DeepSpeed flattens in this order."""
    h = model.hidden_size
    out = _norm_tensors(model, h)
    bias = model.linear_bias or model.qkv_bias
    if model.mla is not None:
        attn = model.attention_params()
        out += [(attn.replicated, "replicated"), (attn.tp_sharded, "tp_sharded")]
    else:
        for width in (model.q_width, model.kv_width, model.kv_width):
            out.append((width * h, "tp_sharded"))
            if bias:
                out.append((width, "tp_sharded"))
        out.append((model.q_width * h, "tp_sharded"))
        if model.linear_bias or model.attention_output_bias:
            out.append((h, "replicated"))
        extras = model.attention_extras()
        out += [(n, kind) for n, kind in ((extras.replicated, "replicated"), (extras.tp_sharded, "tp_sharded")) if n]
    out += _norm_tensors(model, h)
    if not model.is_moe_layer(layer_index):
        return out + _mlp_tensors(model, model.ffn_hidden_size, "tp_sharded")
    moe = model.moe
    assert moe is not None
    out.append((moe.num_experts * h, "replicated"))
    if moe.router_bias:
        out.append((moe.num_experts, "replicated"))
    for _ in range(moe.num_experts):
        out += _mlp_tensors(model, moe.expert_ffn_hidden_size, "expert")
    for _ in range(moe.num_shared_experts):
        out += _mlp_tensors(model, moe.shared_width, "tp_sharded")
    return out


def stage_tensors(model: ModelSpec, first_layer: int, num_layers: int, *, has_embedding: bool,
                  has_output: bool) -> list[tuple[int, str]]:
    """Parameter tensors of a pipeline stage in module order (embedding, layers, final norm, output)."""
    out: list[tuple[int, str]] = []
    h = model.hidden_size
    if has_embedding:
        out.append((model.vocab_size * h, "tp_sharded"))
        if model.position_embedding == "learned":
            out.append(((model.max_position_embeddings + model.position_offset) * h, "replicated"))
        if model.embedding_norm:
            out += _norm_tensors(model, h)
    for i in range(first_layer, first_layer + num_layers):
        out += layer_tensors(model, i)
    if has_output:
        out += _norm_tensors(model, h)
        if not model.tied_embeddings or not has_embedding:
            out.append((model.vocab_size * h, "tp_sharded"))
    return out
