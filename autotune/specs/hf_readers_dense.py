"""config.json readers for the dense decoders of 2024-26: qwen3, gemma2, gemma3 (and gemma3_text), olmo2, phi3.

Each reader maps one ``model_type``'s fields onto :class:`ModelSpec` keyword arguments. Defaults are
those of the ``transformers`` 5.24 config class of the type (cited per reader); when ``transformers``
is installed the config is first normalised through that class (``hf_fields.transformers_view``).
:func:`decoder_base` is the part every pre-norm, rotary, gated-MLP decoder here shares; the MoE
readers (``hf_readers_moe``) build on it too.

Parameter-free details are not carried: Gemma's logit soft-capping and embedding scale, Llama 4's
weightless L2 Q/K norm, partial rotary factors, rope scaling.
"""

from __future__ import annotations

from autotune.specs.hf_fields import (
    Fields,
    head_dim_or_none,
    layer_indices,
    local_layers,
    transformers_view,
)

__all__ = ["DENSE_READERS", "decoder_base", "normalised", "rope_theta", "rope_scaling_fields",
           "attention_biases"]

_SHAPE = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size")


def normalised(f: Fields, model_type: str, required: tuple[str, ...] = _SHAPE) -> Fields:
    """``f`` read through transformers' config class for ``model_type`` where it can be (sharing ``f``'s
    problem list); shape fields in ``required`` must then be in the config itself, not class defaults."""
    view = transformers_view(f.data, model_type)
    if view is None:
        return f
    f.required(f.data, *required)
    g = Fields(view, f.model_type)
    g.problems = f.problems
    return g


def rope_theta(f: Fields, default: float) -> float:
    """``rope_theta`` at the top level (config.json files) or in ``rope_parameters`` (transformers 5), where
    Gemma 3 nests one per attention type: the global layers' is taken."""
    if f.data.get("rope_theta") is not None:
        return float(f.get("rope_theta", default))
    params = f.data.get("rope_parameters")
    if isinstance(params, dict):
        params = params.get("full_attention", params)
        theta = params.get("rope_theta") if isinstance(params, dict) else None
        if isinstance(theta, int | float) and not isinstance(theta, bool) and theta > 0:
            return float(theta)
    return default


def local_rope_theta(f: Fields, default: float = 10000.0) -> float:
    """Gemma 3's RoPE base on its sliding-window layers: ``rope_local_base_freq`` (config.json files) or
    ``rope_parameters["sliding_attention"]`` (transformers 5); Gemma3TextConfig's default 10,000."""
    if f.data.get("rope_local_base_freq") is not None:
        return float(f.get("rope_local_base_freq", default))
    params = f.data.get("rope_parameters")
    local = params.get("sliding_attention") if isinstance(params, dict) else None
    theta = local.get("rope_theta") if isinstance(local, dict) else None
    return float(theta) if isinstance(theta, int | float) and not isinstance(theta, bool) and theta > 0 else default


def rotary_fraction(f: Fields) -> float:
    """The share of each head's dimensions RoPE rotates: ``partial_rotary_factor`` (GLM, Phi, StableLM) or
    ``rotary_pct`` (GPT-NeoX) at the top level (config.json files) or in ``rope_parameters`` (transformers 5); 1.0
    where none is given."""
    for key in ("partial_rotary_factor", "rotary_pct"):
        if f.data.get(key) is not None:
            return float(f.get(key, 1.0))
    params = f.data.get("rope_parameters")
    if isinstance(params, dict):
        params = params.get("full_attention", params)
        value = params.get("partial_rotary_factor") if isinstance(params, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return 1.0


def rope_scaling_fields(f: Fields) -> dict:
    """ModelSpec's RoPE scaling fields from ``rope_scaling`` (config.json) or ``rope_parameters`` (transformers 5;
    Gemma 3 nests one per attention type: the global layers' is taken) where its ``rope_type`` (or the older
    ``type``) is one ModelSpec carries: yarn with a factor above 1 (a factor of 1 scales nothing: mscale 1), llama3 with
    its low / high frequency factors and original context, linear; empty where there is none."""
    for key in ("rope_scaling", "rope_parameters"):
        params = f.data.get(key)
        if isinstance(params, dict):
            params = params.get("full_attention", params)
        if not isinstance(params, dict):
            continue
        kind = params.get("rope_type", params.get("type"))
        factor = params.get("factor", 1.0)
        if kind not in ("yarn", "llama3", "linear") or isinstance(factor, bool) or not isinstance(factor, int | float):
            continue
        if kind == "yarn" and factor > 1:
            out = {"rope_scaling": "yarn", "rope_scaling_factor": float(factor)}
            for field, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow"),
                                ("yarn_mscale", "mscale"), ("yarn_mscale_all_dim", "mscale_all_dim"),
                                ("rope_original_max_positions", "original_max_position_embeddings")):
                value = params.get(name)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    out[field] = int(value) if field == "rope_original_max_positions" else float(value)
            if isinstance(params.get("truncate"), bool):
                out["yarn_truncate"] = params["truncate"]
            return out
        if kind == "linear" and factor != 1:
            return {"rope_scaling": "linear", "rope_scaling_factor": float(factor)}
        if kind == "llama3":  # transformers' _compute_llama3_parameters reads these four
            out = {"rope_scaling": "llama3", "rope_scaling_factor": float(factor),
                   "rope_low_freq_factor": float(params.get("low_freq_factor", 1.0)),
                   "rope_high_freq_factor": float(params.get("high_freq_factor", 4.0)),
                   "rope_original_max_positions": int(params.get("original_max_position_embeddings", 8192))}
            return out
    return {}


def attention_biases(f: Fields, out: dict) -> None:
    """``attention_bias`` as these readers' models build it: a bias on q, k, v *and* o_proj, none on the MLP (the four
    projections of Qwen3Attention, Qwen3MoeAttention, Gemma2Attention, Gemma3Attention, Olmo2Attention, OlmoeAttention
    and Llama4TextAttention take ``bias=config.attention_bias``, their MLPs and experts ``bias=False``: transformers
    5.25 ``modeling_<type>.py``)."""
    if f.get("attention_bias", False):
        out.update(qkv_bias=True, attention_output_bias=True)


def decoder_base(f: Fields, *, kv_heads: int | None, head_dim: int | None, max_positions: int,
                 theta: float, tied: bool, vocab: int | None = None, heads: int | None = None) -> dict:
    """Pre-norm RMSNorm decoder with rotary positions and a gated MLP of ``intermediate_size``.

    ``kv_heads``/``head_dim``: the class defaults (None: the head count / hidden_size over heads); ``vocab`` /
    ``heads``: the class defaults where a config may leave them out (None: required)."""
    hidden = f.need("hidden_size", what="model width")
    heads = f.need("num_attention_heads", what="attention heads") if heads is None else \
        f.get_int("num_attention_heads", default=heads)
    vocab_size = f.need("vocab_size", what="vocabulary size") if vocab is None else f.get_int("vocab_size",
                                                                                             default=vocab)
    scaling = rope_scaling_fields(f)
    return dict(
        num_layers=f.need("num_hidden_layers", what="transformer layers"), hidden_size=hidden,
        num_attention_heads=heads, num_kv_heads=f.get_int("num_key_value_heads", default=kv_heads or heads),
        head_dim=head_dim_or_none(f.get_int("head_dim", default=head_dim), hidden, heads),
        ffn_hidden_size=f.need("intermediate_size", what="MLP width"), vocab_size=vocab_size,
        activation="swiglu", norm="rmsnorm", position_embedding="rope",
        max_position_embeddings=f.get_int("max_position_embeddings", default=max_positions),
        rope_theta=rope_theta(f, theta), tied_embeddings=bool(f.get("tie_word_embeddings", tied)),
        dropout=float(f.get("attention_dropout", 0.0)), **scaling,
        **({} if (fraction := rotary_fraction(f)) == 1.0 else {"rotary_fraction": fraction}),
    )


def set_local_attention(out: dict, f: Fields, window: int | None, fallback: list[int], *,
                        chunked: bool = False) -> None:
    """Fill sliding_window / sliding_window_layers (None: every layer) from layer_types or ``fallback``."""
    layers = local_layers(f, out["num_layers"], fallback)
    if window is None or not layers:
        return
    out["sliding_window"] = window
    out["sliding_window_layers"] = None if len(layers) == out["num_layers"] else tuple(layers)
    if chunked:
        out["chunked_attention"] = True


def _qwen3(f: Fields) -> dict:
    """Qwen3Config: head_dim 128, RMSNorm on each Q and K head; sliding window only with use_sliding_window,
    on the layers from max_window_layers (28) on."""
    f = normalised(f, "qwen3")
    out = decoder_base(f, kv_heads=None, head_dim=128, max_positions=32768, theta=10000.0, tied=False)
    attention_biases(f, out)
    out["qk_norm"] = "head"
    window = f.get_int("sliding_window", default=4096) if f.get("use_sliding_window", False) else None
    first = f.get_int("max_window_layers", default=28)
    set_local_attention(out, f, window, [i for i in layer_indices(out["num_layers"]) if i >= first])
    return out


def _gemma(f: Fields, model_type: str) -> dict:
    """Gemma2Config / Gemma3TextConfig: head_dim 256, 4 KV heads, tied embeddings, four RMSNorms per layer
    (before and after attention and MLP); sliding window 4096 on every other layer (Gemma 2) or on five
    layers of six (Gemma 3: sliding_window_pattern 6), Gemma 3 adds per-head Q/K RMSNorms."""
    gemma3 = model_type == "gemma3_text"
    # Gemma 3's text_configs leave out what Gemma3TextConfig defaults: vocab_size, num_attention_heads (8: Gemma 3 4B)
    required = tuple(k for k in _SHAPE if not (gemma3 and k in ("vocab_size", "num_attention_heads")))
    f = normalised(f, model_type, required)
    out = decoder_base(f, kv_heads=4, head_dim=256, max_positions=131072 if gemma3 else 8192,
                       theta=1000000.0 if gemma3 else 10000.0,
                       tied=True, vocab=262208 if gemma3 else None, heads=8 if gemma3 else None)
    attention_biases(f, out)
    out["norms_per_layer"] = 4
    if gemma3:
        out["qk_norm"] = "head"
    # Gemma2/3 MLP: act_fn(gate) * up with hidden_activation gelu_pytorch_tanh (the config classes' default); the
    # model multiplies its embeddings by sqrt(hidden_size) and each RMSNorm by (1 + weight) (Gemma2RMSNorm)
    act = f.get("hidden_activation", f.get("hidden_act", "gelu_pytorch_tanh"))
    if act not in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast"):
        f.unsupported(f"hidden_activation {act!r} (Gemma's MLP is GeGLU with GeLU's tanh form) is not modelled")
    out.update(activation="geglu", scaled_embeddings=True, norm_zero_centered=True)
    class_caps = {"attn_logit_softcapping": None if gemma3 else 50.0, "final_logit_softcapping": None if gemma3
                  else 30.0}  # Gemma2Config's defaults; Gemma3TextConfig's None (null in a file: no cap)
    for key, field in (("attn_logit_softcapping", "attn_logit_softcap"),
                       ("final_logit_softcapping", "final_logit_softcap")):
        cap = f.get(key, 1.0) if f.data.get(key) is not None else None if key in f.data else class_caps[key]
        if cap is not None:
            out[field] = float(cap)
    head_dim = out["head_dim"] or out["hidden_size"] // out["num_attention_heads"]
    scalar = float(f.get("query_pre_attn_scalar", 256))  # both classes' default
    if scalar != head_dim:
        out["query_pre_attn_scalar"] = scalar
    if gemma3:
        local = local_rope_theta(f)
        if local != out["rope_theta"]:
            out["local_rope_theta"] = local
    every = f.positive("sliding_window_pattern", 6) if gemma3 else 2
    fallback = [i for i in layer_indices(out["num_layers"]) if (i + 1) % every]
    set_local_attention(out, f, f.get_int("sliding_window", default=4096), fallback)
    return out


def _olmo2(f: Fields) -> dict:
    """Olmo2Config: norms after attention and MLP (not before: still two per layer), RMSNorm over the whole
    Q and K widths."""
    f = normalised(f, "olmo2")
    out = decoder_base(f, kv_heads=None, head_dim=None, max_positions=2048, theta=10000.0, tied=False)
    attention_biases(f, out)
    out["qk_norm"] = "full"
    out["post_norm"] = True  # Olmo2DecoderLayer: post_attention_layernorm / post_feedforward_layernorm on the outputs
    return out


def _phi3(f: Fields) -> dict:
    """Phi3Config: fused qkv_proj and gate_up_proj (the same weights as split ones), a sliding window on every
    layer when set (Phi-3-mini: 2047)."""
    f = normalised(f, "phi3")
    out = decoder_base(f, kv_heads=None, head_dim=None, max_positions=4096, theta=10000.0, tied=False)
    set_local_attention(out, f, f.get_int("sliding_window", default=None), list(layer_indices(out["num_layers"])))
    return out


def text_config(f: Fields, text_type: str) -> Fields:
    """The language model's fields of a multimodal config (``text_config``), sharing ``f``'s problems."""
    text = f.data.get("text_config")
    if not isinstance(text, dict):
        f.problems.append(f"missing 'text_config' (the language model's fields), required for model_type "
                          f"{f.model_type!r}; or give the {text_type!r} config itself")
        text = {}
    g = Fields(dict(text, model_type=text_type), text_type)
    g.problems = f.problems
    return g


def language_model(f: Fields, text_type: str, read, wrapper: str) -> dict:
    """A multimodal config's language model (``text_config``) read by ``read``, with a note that its vision tower and
    multimodal projector (``wrapper``, transformers' model of the whole config, builds them) are not counted."""
    out = read(text_config(f, text_type))
    out["note"] = (f"the language model (text_config) only: the vision tower (vision_config) and multimodal projector "
                   f"of {wrapper} are not counted in its parameters, memory or time")
    return out


DENSE_READERS = {
    "qwen3": _qwen3, "gemma2": lambda f: _gemma(f, "gemma2"), "gemma3_text": lambda f: _gemma(f, "gemma3_text"),
    "gemma3": lambda f: language_model(f, "gemma3_text", lambda g: _gemma(g, "gemma3_text"),
                                       "Gemma3ForConditionalGeneration"), "olmo2": _olmo2, "phi3": _phi3,
}
