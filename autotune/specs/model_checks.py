"""ModelSpec's validation: the shape (positive sizes, heads that divide), the field values, and the fields it gained
after its first presets (how a layer differs from a Llama layer: Q/K norms, parallel residual, post-norms, partial
RoPE; local attention windows; multi-token prediction). Each problem a sentence that names the field, its value and
what it takes; ModelSpec reports them all at once."""

from __future__ import annotations

__all__ = ["model_problems", "layer_variant_problems", "gemma_field_problems", "rope_scaling_problems"]


def model_problems(spec) -> list[str]:
    """Every problem of ``spec`` (a ModelSpec)."""
    out: list[str] = []
    for name in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size",
                 "max_position_embeddings", "norms_per_layer"):
        value = getattr(spec, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "norms_per_layer" else 1):
            out.append(f"{name} must be a positive integer, got {value!r}")
    for name in ("num_kv_heads", "head_dim"):
        value = getattr(spec, name)
        if value is not None and (not isinstance(value, int) or value < 1):
            out.append(f"{name} must be a positive integer or absent, got {value!r}")
    if spec.note is not None and not isinstance(spec.note, str):
        out.append(f"note must be a string or absent, got {spec.note!r}")
    if out:
        return out
    if spec.activation not in ("gelu", "gelu_tanh", "swiglu", "geglu", "relu", "squared_relu"):
        out.append(f"activation must be gelu, gelu_tanh, swiglu, geglu, relu or squared_relu, got "
                   f"{spec.activation!r}")
    if spec.norm not in ("layernorm", "rmsnorm"):
        out.append(f"norm must be layernorm or rmsnorm, got {spec.norm!r}")
    if spec.position_embedding not in ("learned", "rope", "alibi"):
        out.append(f"position_embedding must be learned, rope or alibi, got {spec.position_embedding!r}")
    if not (isinstance(spec.rope_theta, (int, float)) and spec.rope_theta > 0):
        out.append(f"rope_theta must be a positive number, got {spec.rope_theta!r}")
    out += rope_scaling_problems(spec)
    if spec.activation_clamp is not None and not (
            isinstance(spec.activation_clamp, (int, float)) and spec.activation_clamp > 0):
        out.append(f"activation_clamp must be a positive number or absent, got {spec.activation_clamp!r}")
    if not 0.0 <= spec.dropout < 1.0:
        out.append(f"dropout must be in [0, 1), got {spec.dropout}")
    if spec.head_dim is None and spec.mla is None and spec.hidden_size % spec.num_attention_heads:
        out.append(
            f"hidden_size ({spec.hidden_size}) is not divisible by num_attention_heads "
            f"({spec.num_attention_heads}): set head_dim explicitly or fix the head count"
        )
    if spec.kv_heads > spec.num_attention_heads or spec.num_attention_heads % spec.kv_heads:
        out.append(
            f"num_attention_heads ({spec.num_attention_heads}) must be a multiple of num_kv_heads "
            f"({spec.kv_heads}) for GQA/MQA"
        )
    if spec.moe is not None:
        out += spec.moe.problems()
        if spec.moe.num_dense_layers > spec.num_layers:
            out.append(f"moe.num_dense_layers ({spec.moe.num_dense_layers}) exceeds num_layers ({spec.num_layers})")
    if spec.mla is not None:
        out += spec.mla.problems()
    return out + layer_variant_problems(spec)


def layer_variant_problems(spec) -> list[str]:
    """The problems of ``spec``'s (a ModelSpec's) later fields, after its shape was found valid."""
    out: list[str] = []
    if spec.qk_norm not in (None, "head", "full", "l2"):
        out.append(f"qk_norm must be head, full, l2 or absent, got {spec.qk_norm!r}")
    if spec.parallel_residual not in (False, True) or (spec.parallel_residual and (
            spec.norms_per_layer not in (1, 2) or spec.post_norm)):
        out.append(f"parallel_residual must be true or false, true with one or two pre-norms per layer; got "
                   f"{spec.parallel_residual!r} with norms_per_layer {spec.norms_per_layer}")
    if spec.post_norm not in (False, True) or (spec.post_norm and spec.norms_per_layer != 2):
        out.append(f"post_norm must be true or false, true only with two norms per layer; got {spec.post_norm!r} "
                   f"with norms_per_layer {spec.norms_per_layer}")
    fraction = spec.rotary_fraction
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        out.append(f"rotary_fraction must be a number in (0, 1], got {fraction!r}")
    elif fraction != 1 and (spec.position_embedding != "rope" or spec.mla is not None
                            or (spec.attention_head_dim * fraction) % 2):
        out.append(f"rotary_fraction {fraction:g} needs RoPE on an even number of each head's dimensions (head "
                   f"dim {spec.attention_head_dim}), without MLA (whose RoPE has its own head dim)")
    offset = spec.position_offset
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0 or (
            offset and spec.position_embedding != "learned"):
        out.append(f"position_offset must be a non-negative integer, above 0 only with learned positions; got "
                   f"{offset!r} with position_embedding {spec.position_embedding!r}")
    if spec.qk_norm == "l2" and spec.position_embedding != "rope":
        out.append(f"qk_norm l2 normalises the rotary layers' Q and K (Llama 4), and position_embedding is "
                   f"{spec.position_embedding!r}: use rope, or qk_norm head")
    if spec.sliding_window is not None and (isinstance(spec.sliding_window, bool)
                                            or not isinstance(spec.sliding_window, int) or spec.sliding_window < 1):
        out.append(f"sliding_window must be a positive integer or absent, got {spec.sliding_window!r}")
    layers = spec.sliding_window_layers
    if layers is not None:
        if spec.sliding_window is None:
            out.append("sliding_window_layers needs a sliding_window (the local layers' window in tokens)")
        bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < spec.num_layers]
        if bad:
            out.append(f"sliding_window_layers must be layer indices in [0, {spec.num_layers}), got {bad[:5]}")
    rope = spec.rope_layers
    if rope is not None and (spec.position_embedding != "rope" or list(rope) != sorted(set(rope)) or any(
            isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < spec.num_layers for i in rope)):
        out.append(f"rope_layers must be increasing layer indices in [0, {spec.num_layers}), with rope only; got "
                   f"{list(rope)[:5]} with position_embedding {spec.position_embedding!r}")
    if spec.chunked_attention and spec.sliding_window is None:
        out.append("chunked_attention needs a sliding_window (the chunk size in tokens)")
    out += gemma_field_problems(spec)
    if isinstance(spec.num_mtp_layers, bool) or not isinstance(spec.num_mtp_layers, int) or spec.num_mtp_layers < 0:
        out.append(f"num_mtp_layers must be an integer >= 0, got {spec.num_mtp_layers!r}")
    return out


def gemma_field_problems(spec) -> list[str]:
    """The problems of the fields Gemma 2/3 brought: logit caps, the attention scale, scaled embeddings,
    zero-centred norms, the local layers' RoPE base."""
    out: list[str] = []
    for name in ("attn_logit_softcap", "final_logit_softcap", "query_pre_attn_scalar", "local_rope_theta", "norm_eps"):
        value = getattr(spec, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            out.append(f"{name} must be a positive number or absent, got {value!r}")
    for name in ("scaled_embeddings", "norm_zero_centered"):
        if getattr(spec, name) not in (False, True):
            out.append(f"{name} must be true or false, got {getattr(spec, name)!r}")
    if spec.local_rope_theta is not None and (spec.position_embedding != "rope" or spec.sliding_window is None):
        out.append("local_rope_theta is the RoPE base of the local-attention layers: it needs position_embedding "
                   "rope and a sliding_window; or leave it out")
    if spec.attn_logit_softcap is not None and spec.mla is not None:
        out.append("attn_logit_softcap with MLA: no model caps MLA's scores; leave it out")
    return out


def rope_scaling_problems(spec) -> list[str]:
    """The problems of the RoPE scaling fields: a known kind, its factor, llama3's three parameters with llama3 only."""
    out: list[str] = []
    kind, factor = spec.rope_scaling, spec.rope_scaling_factor
    if kind not in (None, "yarn", "llama3", "linear"):
        return [f"rope_scaling must be yarn, llama3, linear or absent, got {kind!r}"]
    number = not isinstance(factor, bool) and isinstance(factor, (int, float))
    if factor is not None and (kind is None or not number or factor <= (1 if kind == "yarn" else 0)):
        out.append(f"rope_scaling_factor must be a positive number (yarn: above 1) with a rope_scaling, or absent; "
                   f"got {factor!r}")
    if kind in ("llama3", "linear") and factor is None:
        out.append(f"rope_scaling {kind} needs rope_scaling_factor (config.json rope_scaling.factor)")
    if kind is not None and spec.position_embedding != "rope":
        out.append(f"rope_scaling {kind} scales RoPE, and position_embedding is {spec.position_embedding!r}")
    llama3 = {"rope_low_freq_factor": spec.rope_low_freq_factor, "rope_high_freq_factor": spec.rope_high_freq_factor,
              "rope_original_max_positions": spec.rope_original_max_positions}
    yarn = {"yarn_beta_fast": spec.yarn_beta_fast, "yarn_beta_slow": spec.yarn_beta_slow,
            "yarn_mscale": spec.yarn_mscale, "yarn_mscale_all_dim": spec.yarn_mscale_all_dim}
    if spec.yarn_truncate not in (None, True, False):
        out.append(f"yarn_truncate must be true, false or absent, got {spec.yarn_truncate!r}")
    elif spec.yarn_truncate is not None and kind != "yarn":
        out.append(f"yarn_truncate: yarn scaling's, and rope_scaling is {kind!r}; leave it out")
    if kind == "yarn":
        yarn["rope_original_max_positions"] = llama3.pop("rope_original_max_positions")
        bad = [k for k, v in yarn.items() if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                                                or v < 0)]
        if bad:
            out.append(f"{', '.join(bad)} must be numbers >= 0 or absent (config.json rope_scaling's yarn fields)")
    elif any(v is not None for v in yarn.values()):
        out.append(f"{', '.join(k for k, v in yarn.items() if v is not None)}: yarn scaling's, and rope_scaling is "
                   f"{kind!r}; leave them out")
    if kind == "llama3":
        bad = [k for k, v in llama3.items() if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0]
        if bad:
            out.append(f"rope_scaling llama3 needs positive {', '.join(bad)} (config.json rope_scaling's "
                       "low_freq_factor, high_freq_factor, original_max_position_embeddings)")
        elif spec.rope_high_freq_factor < spec.rope_low_freq_factor:
            out.append("rope_high_freq_factor must be at least rope_low_freq_factor (llama3 scaling)")
    elif any(v is not None for v in llama3.values()):
        out.append(f"{', '.join(k for k, v in llama3.items() if v is not None)}: llama3 scaling's (yarn: the original "
                   f"context too), and rope_scaling is {kind!r}; leave them out")
    return out
