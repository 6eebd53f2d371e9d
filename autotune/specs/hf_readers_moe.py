"""config.json readers for mixture-of-experts decoders: qwen3_moe, gpt_oss, llama4 (and llama4_text), glm4_moe.

Each maps one ``model_type``'s fields onto :class:`ModelSpec` keyword arguments, the MoE block
included: routed experts, their width, top-k, shared experts, which layers are dense, router biases.
Defaults are those of the ``transformers`` 5.24 config class (cited per reader). DeepSeek-V3 and
Kimi-K2 (MLA) are read by ``hf_config``.
"""

from __future__ import annotations

from autotune.specs.hf_fields import Fields, layer_indices
from autotune.specs.hf_readers_dense import (
    attention_biases,
    decoder_base,
    language_model,
    normalised,
    set_local_attention,
)

__all__ = ["MOE_READERS"]


def _qwen3_moe(f: Fields) -> dict:
    """Qwen3MoeConfig: 128 experts of moe_intermediate_size 768, top-8, no shared expert, per-head Q/K RMSNorm;
    a layer is MoE unless listed in mlp_only_layers, every decoder_sparse_step-th layer."""
    f = normalised(f, "qwen3_moe", ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size",
                                    "moe_intermediate_size"))
    out = decoder_base(f, kv_heads=4, head_dim=None, max_positions=32768, theta=10000.0, tied=False)
    attention_biases(f, out)
    out["qk_norm"] = "head"
    num_experts = f.get_int("num_experts", "num_local_experts", default=128)  # transformers 5 renames it
    dense = f.get("mlp_only_layers", None) or []
    if not isinstance(dense, list) or dense != list(range(len(dense))):
        f.unsupported(f"mlp_only_layers {dense!r} is not modelled (only the leading layers [0, 1, ..., k-1])")
        dense = []
    if num_experts:
        out["moe"] = dict(num_experts=num_experts, top_k=f.get_int("num_experts_per_tok", default=8),
                          expert_ffn_hidden_size=f.need("moe_intermediate_size", what="expert width"),
                          num_dense_layers=len(dense), moe_layer_step=f.positive("decoder_sparse_step", 1),
                          **f.router(score="softmax", norm_topk=False))  # Qwen3MoeConfig: norm_topk_prob False
    if f.get("use_sliding_window", False):  # Qwen3MoeAttention: the window on every layer (transformers 5.25)
        set_local_attention(out, f, f.get_int("sliding_window", default=4096), list(layer_indices(out["num_layers"])))
    return out


def _gpt_oss(f: Fields) -> dict:
    """GptOssConfig: every layer MoE (128 experts, top-4, experts as wide as intermediate_size, biased, a biased
    router), q/k/v/o biases, a sink logit per head, sliding window 128 on every other layer, head_dim 64."""
    f = normalised(f, "gpt_oss", ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size",
                                  "intermediate_size"))
    if not f.get("attention_bias", True):
        f.unsupported("attention_bias false (bias-free attention with biased experts) is not modelled")
    out = decoder_base(f, kv_heads=8, head_dim=64, max_positions=131072, theta=150000.0, tied=False)
    out.update(linear_bias=True, attention_sinks=True, activation_clamp=float(f.get("swiglu_limit", 7.0)))
    top_k = f.get_int("num_experts_per_tok", "experts_per_token", default=4)
    out["moe"] = dict(num_experts=f.get_int("num_local_experts", "num_experts", default=128), top_k=top_k,
                      expert_ffn_hidden_size=out["ffn_hidden_size"], router_bias=True,  # the router's linear bias
                      **f.router(score="softmax"))
    fallback = [i for i in layer_indices(out["num_layers"]) if (i + 1) % 2]
    set_local_attention(out, f, f.get_int("sliding_window", default=128), fallback)
    return out


def _llama4_text(f: Fields) -> dict:
    """Llama4TextConfig: MoE layers (16 experts of intermediate_size 8192, top-1, one shared expert as wide,
    a bias-free router) every interleave_moe_layer_step-th layer, dense layers of intermediate_size_mlp 16384;
    chunked attention (attention_chunk_size 8192) on three layers of four (the rotary ones), head_dim 128.
    use_qk_norm (Scout: true, Maverick: false) divides each head's Q and K by their root mean square, without
    weights, on the rotary layers (Llama4TextL2Norm in Llama4TextAttention): qk_norm ``l2``."""
    f = normalised(f, "llama4_text")
    out = decoder_base(f, kv_heads=8, head_dim=128, max_positions=131072, theta=500000.0, tied=False)
    attention_biases(f, out)
    layers, expert_width = out["num_layers"], out["ffn_hidden_size"]
    out["ffn_hidden_size"] = f.get_int("intermediate_size_mlp", default=16384)
    step = f.positive("interleave_moe_layer_step", 1)
    moe_layers = f.data.get("moe_layers")
    if moe_layers is not None and moe_layers != list(layer_indices(layers))[step - 1::step]:
        f.unsupported(f"moe_layers {moe_layers!r} is not modelled (only every interleave_moe_layer_step-th layer)")
    out["moe"] = dict(num_experts=f.get_int("num_local_experts", default=16),
                      top_k=f.get_int("num_experts_per_tok", default=1), expert_ffn_hidden_size=expert_width,
                      num_shared_experts=1, moe_layer_step=step, router_score="sigmoid",  # Llama4TextMoe's router:
                      router_probs_on_input=True,  # the top-1 logit's sigmoid scales the expert's input
                      **f.aux_loss())
    if f.get("use_qk_norm", True):
        out["qk_norm"] = "l2"
    every = f.positive("no_rope_layer_interval", 4)
    fallback = [i for i in layer_indices(layers) if (i + 1) % every]
    set_local_attention(out, f, f.get_int("attention_chunk_size", default=8192), fallback, chunked=True)
    return out


def _glm4_moe(f: Fields) -> dict:
    """Glm4MoeConfig: first_k_dense_replace (1) dense layers of intermediate_size, then MoE layers of
    n_routed_experts (128) of moe_intermediate_size, top-8, n_shared_experts (1) as one wider MLP, a routing
    bias (e_score_correction_bias); q/k/v biases with attention_bias (o_proj none), per-head Q/K RMSNorm with
    use_qk_norm, num_nextn_predict_layers (1) MTP modules."""
    f = normalised(f, "glm4_moe", ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size",
                                   "intermediate_size", "moe_intermediate_size"))
    out = decoder_base(f, kv_heads=8, head_dim=None, max_positions=131072, theta=10000.0, tied=False)
    if f.get("attention_bias", False):
        out["qkv_bias"] = True
    if f.get("use_qk_norm", False):
        out["qk_norm"] = "head"
    out["num_mtp_layers"] = f.get_int("num_nextn_predict_layers", default=1)
    out["moe"] = dict(num_experts=f.get_int("n_routed_experts", "num_local_experts", default=128),
                      top_k=f.get_int("num_experts_per_tok", default=8),
                      expert_ffn_hidden_size=f.need("moe_intermediate_size", what="routed expert width"),
                      num_shared_experts=f.get_int("n_shared_experts", default=1),
                      num_dense_layers=f.get_int("first_k_dense_replace", default=1), router_bias=True,
                      **f.router(score="sigmoid"))  # Glm4MoeConfig: sigmoid (noaux_tc), n_group 1, scaling 1.0
    return out


def _olmoe(f: Fields) -> dict:
    """OlmoeConfig: every layer MoE (64 experts, each intermediate_size wide: OLMoE-1B-7B's 1024; top-8; softmax
    scores left unnormalised: norm_topk_prob False), a bias-free router, RMSNorm over the whole Q and K widths (as
    OLMo 2) but pre-norm layers (transformers 5.25 modeling_olmoe.py)."""
    f = normalised(f, "olmoe")
    out = decoder_base(f, kv_heads=None, head_dim=None, max_positions=4096, theta=10000.0, tied=False)
    attention_biases(f, out)
    out["qk_norm"] = "full"
    out["moe"] = dict(num_experts=f.get_int("num_experts", default=64),
                      top_k=f.get_int("num_experts_per_tok", default=8), expert_ffn_hidden_size=out["ffn_hidden_size"],
                      **f.router(score="softmax", norm_topk=False))
    return out


MOE_READERS = {
    "qwen3_moe": _qwen3_moe, "gpt_oss": _gpt_oss, "llama4_text": _llama4_text,
    "llama4": lambda f: language_model(f, "llama4_text", _llama4_text, "Llama4ForConditionalGeneration"),
    "glm4_moe": _glm4_moe, "olmoe": _olmoe,
}
