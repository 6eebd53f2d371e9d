"""The parts of Gemma 2/3's layers a Llama-style GPT layer does not have, in words: what each engine that cannot
build one names when it refuses the model (transformers ``Gemma2DecoderLayer`` / ``Gemma3DecoderLayer``)."""

from __future__ import annotations

from autotune.specs.model import ModelSpec

__all__ = ["gemma_parts"]


def gemma_parts(model: ModelSpec, *, zero_centered_norms: bool = False) -> list[str]:
    """Each such part of ``model`` (empty where it has none). ``zero_centered_norms``: the engine builds norms that
    multiply by (1 + weight) (Megatron-core's ``layernorm_zero_centered_gamma``), so they are not named."""
    out = []
    if model.activation == "geglu":
        out.append("a GeGLU MLP (GeLU in its tanh form on the gate)")
    if model.attn_logit_softcap is not None:
        out.append(f"attention scores capped at {model.attn_logit_softcap:g} (cap * tanh(score / cap))")
    if model.final_logit_softcap is not None:
        out.append(f"output logits capped at {model.final_logit_softcap:g}")
    if model.query_pre_attn_scalar is not None:
        out.append(f"attention scaled by query_pre_attn_scalar {model.query_pre_attn_scalar:g}, not the head width")
    if model.scaled_embeddings:
        out.append("embeddings multiplied by sqrt(hidden_size)")
    if model.norm_zero_centered and not zero_centered_norms:
        out.append("norms that multiply by (1 + weight)")
    if model.local_rope_theta is not None:
        out.append(f"a RoPE base of {model.local_rope_theta:g} on the local layers beside {model.rope_theta:g}")
    return out
