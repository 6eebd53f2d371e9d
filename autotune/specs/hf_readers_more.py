"""config.json readers for more decoders transformers 5.25 builds: qwen2_moe, starcoder2, smollm3, exaone4, ernie4_5,
ernie4_5_moe, seed_oss, dots1, minimax_m2, hunyuan_v1_dense, hunyuan_v1_moe.

Each maps one ``model_type``'s fields onto :class:`ModelSpec` keyword arguments, as ``hf_readers_dense`` and
``hf_readers_moe`` do: the config is first normalised through transformers' own config class where it is installed,
and the defaults written here are that class's (transformers 5.25 ``models/<type>/configuration_<type>.py``), so a
file read without transformers counts the same. Each reader's docstring names what its modeling file builds.

SmolLM3's and EXAONE 4's rotary-free (NoPE) layers are carried as ``ModelSpec.rope_layers`` (the layers that apply
RoPE), which the RoPE kernels' cost reads. Not carried, as it changes no parameter count: residual or embedding
dropout beside the attention dropout.
"""

from __future__ import annotations

from autotune.specs.hf_fields import Fields, layer_indices
from autotune.specs.hf_readers_dense import decoder_base, normalised, set_local_attention

__all__ = ["MORE_READERS"]

_MOE_SHAPE = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "moe_intermediate_size")


def _biases(f: Fields, out: dict) -> None:
    """attention_bias (q/k/v and o_proj biases) and mlp_bias (the MLP's), as LlamaAttention / LlamaMLP build them."""
    attention_bias, mlp_bias = bool(f.get("attention_bias", False)), bool(f.get("mlp_bias", False))
    if attention_bias and mlp_bias:
        out["linear_bias"] = True
    elif attention_bias:
        out.update(qkv_bias=True, attention_output_bias=True)
    elif mlp_bias:
        f.unsupported("mlp_bias without attention_bias is not modelled: set both or neither")


def _leading(f: Fields, key: str) -> int:
    """The number of leading dense layers a list field names (Qwen's mlp_only_layers: [0, 1, ..., k-1] only)."""
    dense = f.get(key, None) or []
    if not isinstance(dense, list) or dense != list(range(len(dense))):
        f.unsupported(f"{key} {dense!r} is not modelled (only the leading layers [0, 1, ..., k-1])")
        return 0
    return len(dense)


def _qwen2_moe(f: Fields) -> dict:
    """Qwen2MoeConfig: 60 experts of moe_intermediate_size 1408, top-4, softmax weights left unnormalised
    (norm_topk_prob False), one shared expert of shared_expert_intermediate_size 5632 whose output is scaled by a
    sigmoid gate (Qwen2MoeSparseMoeBlock.shared_expert_gate: hidden_size -> 1, no bias); q/k/v biases (qkv_bias True),
    o_proj none; MoE layers as Qwen3-MoE's (mlp_only_layers, decoder_sparse_step); with use_sliding_window, a window
    on the layers its layer_types name (the class: even indices below max_window_layers, 28)."""
    f = normalised(f, "qwen2_moe", _MOE_SHAPE)
    out = decoder_base(f, kv_heads=16, head_dim=None, max_positions=32768, theta=10000.0, tied=False)
    if f.get("qkv_bias", True):
        out["qkv_bias"] = True
    num_experts = f.get_int("num_experts", default=60)
    dense = _leading(f, "mlp_only_layers")
    if num_experts:
        out["moe"] = dict(num_experts=num_experts, top_k=f.get_int("num_experts_per_tok", default=4),
                          expert_ffn_hidden_size=f.need("moe_intermediate_size", what="expert width"),
                          num_shared_experts=1, shared_expert_ffn_hidden_size=f.get_int(
                              "shared_expert_intermediate_size", default=5632), shared_expert_gate=True,
                          num_dense_layers=dense, moe_layer_step=f.positive("decoder_sparse_step", 1),
                          **f.router(score="softmax", norm_topk=False))
    if f.get("use_sliding_window", False):
        first = f.get_int("max_window_layers", default=28)
        fallback = [i for i in layer_indices(out["num_layers"]) if (i + 1) % 2 and i < first]
        set_local_attention(out, f, f.get_int("sliding_window", default=4096), fallback)
    return out


def _starcoder2(f: Fields) -> dict:
    """Starcoder2Config: LayerNorms (with biases), a plain MLP (c_fc, c_proj) of hidden_act gelu_pytorch_tanh,
    biases on every linear layer with use_bias (True; the output head none), tied embeddings, a sliding window on
    every layer where sliding_window is set (default none)."""
    f = normalised(f, "starcoder2")
    out = decoder_base(f, kv_heads=2, head_dim=None, max_positions=4096, theta=10000.0, tied=True)
    act = f.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu"):
        f.unsupported(f"hidden_act {act!r} is not modelled (Starcoder2MLP: a GeLU)")
    out.update(activation="gelu" if act == "gelu" else "gelu_tanh", norm="layernorm")
    if f.get("use_bias", True):
        out["linear_bias"] = True
    set_local_attention(out, f, f.get_int("sliding_window", default=None), list(layer_indices(out["num_layers"])))
    return out


def _rope_layers(out: dict, layers: list[int]) -> None:
    """``rope_layers`` where some layers apply no RoPE (left out where every layer does)."""
    if len(layers) != out["num_layers"]:
        out["rope_layers"] = tuple(layers)


def _smollm3(f: Fields) -> dict:
    """SmolLM3Config: Llama's layer (q/k/v/o biases with attention_bias, MLP ones with mlp_bias), tied embeddings; RoPE
    on the layers no_rope_layers marks 1 (SmolLM3Attention ``use_rope = config.no_rope_layers[layer_idx]``; the class
    fills it as every layer but each no_rope_layer_interval-th, 4th); a sliding window, with use_sliding_window, on
    the rotary-free layers its layer_types name."""
    f = normalised(f, "smollm3")
    out = decoder_base(f, kv_heads=4, head_dim=None, max_positions=32768, theta=2000000.0, tied=True)
    _biases(f, out)
    layers, every = layer_indices(out["num_layers"]), f.positive("no_rope_layer_interval", 4)
    marks = f.data.get("no_rope_layers")
    if marks is None:
        marks = [int((i + 1) % every != 0) for i in layers]
    elif not isinstance(marks, list) or len(marks) != len(layers) or any(m not in (0, 1) for m in marks):
        f.problems.append(f"'no_rope_layers' must mark each layer ({len(layers)}) 1 (RoPE) or 0, got {marks!r}")
        marks = [1] * len(layers)
    _rope_layers(out, [i for i in layers if marks[i]])
    if f.get("use_sliding_window", False):
        fallback = [i for i in layers if not marks[i]]
        set_local_attention(out, f, f.get_int("sliding_window", default=None), fallback)
    return out


def _exaone4(f: Fields) -> dict:
    """Exaone4Config: norms after attention and MLP (post_attention_layernorm, post_feedforward_layernorm: OLMo 2's
    placement), a per-head Q/K RMSNorm, no biases; sliding_window 4096 on the layers layer_types names (the class:
    all but every sliding_window_pattern-th, 4; "LLLG" as a string); with a window, RoPE on those layers only
    (Exaone4Attention.forward: ``if self.sliding_window is None or self.is_sliding``, the global layers NoPE)."""
    f = normalised(f, "exaone4")
    out = decoder_base(f, kv_heads=32, head_dim=None, max_positions=2048, theta=10000.0, tied=False)
    out.update(qk_norm="head", post_norm=True)
    window = None if "sliding_window" in f.data and f.data["sliding_window"] is None else \
        f.get_int("sliding_window", default=4096)
    pattern = f.data.get("sliding_window_pattern", 4)
    layers = layer_indices(out["num_layers"])
    if isinstance(pattern, str) and pattern and set(pattern) <= {"L", "G"}:
        fallback = [i for i in layers if pattern[i % len(pattern)] == "L"]
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        fallback = [i for i in layers if (i + 1) % pattern]
    else:
        f.unsupported(f"sliding_window_pattern {pattern!r} is not modelled (a positive integer or an L/G string)")
        fallback = []
    set_local_attention(out, f, window, fallback)
    if window is not None:  # the windowed layers rotate (all of them where sliding_window_layers is None), no other
        local = out.get("sliding_window_layers")
        _rope_layers(out, list(local) if local is not None else list(layers) if "sliding_window" in out else [])
    return out


def _ernie4_5(f: Fields) -> dict:
    """Ernie4_5Config: head_dim 128, 2 KV heads, tied embeddings, biases on every linear layer with use_bias (False;
    the output head none)."""
    f = normalised(f, "ernie4_5")
    out = decoder_base(f, kv_heads=2, head_dim=128, max_positions=131072, theta=500000.0, tied=True)
    if f.get("use_bias", False):
        out["linear_bias"] = True
    return out


ERNIE_MOE_ROUTER_NOTE = (
    "ERNIE 4.5 picks each token's experts by softmax plus a per-expert correction bias (moe_statics."
    "e_score_correction_bias, counted as moe.router_bias) and weights them by the softmax alone, renormalised; "
    "Megatron-core's expert bias (--moe-router-enable-expert-bias) takes sigmoid or sqrtsoftplus scores only "
    "(transformer_config.py:2617-2625), so Megatron-LM files route by the softmax alone (the same routing while the "
    "bias is zero, its initial value)")


def _ernie4_5_moe(f: Fields) -> dict:
    """Ernie4_5_MoeConfig: RMSNorms, SwiGLU, tied embeddings, RoPE; MoE layers where (i + 1) % moe_layer_interval == 0
    from moe_layer_start_index (1) to moe_layer_end_index (-1: the last), the others dense of intermediate_size:
    moe_num_experts (64) routed experts of moe_intermediate_size, top moe_k (6), and moe_num_shared_experts (2) as one
    MLP of their summed width (Ernie4_5_MoeSparseMoeBlock). Its router (Ernie4_5_MoeTopKRouter, fp32, bias-free
    weight) selects by softmax + e_score_correction_bias, a frozen [1, experts] Parameter (counted as router_bias),
    and weights by the selected softmax scores renormalised: Megatron-core's softmax over the top-k logits where the
    bias is zero (ERNIE_MOE_ROUTER_NOTE). use_bias biases attention, dense and shared MLPs and lm_head but not the
    routed experts (Ernie4_5_MoeExperts' 3-D weights), which ModelSpec's linear_bias cannot say: refused. The MTP
    layers (num_nextn_predict_layers) transformers does not build are not carried."""
    f = normalised(f, "ernie4_5_moe", _MOE_SHAPE)
    out = decoder_base(f, kv_heads=4, head_dim=None, max_positions=131072, theta=500000.0, tied=True)
    if f.get("use_bias", False):
        f.unsupported("use_bias is not modelled: Ernie4_5_MoE biases attention, the dense and shared MLPs and lm_head "
                      "but not its routed experts")
    layers = out["num_layers"]
    start, step = f.get_int("moe_layer_start_index", default=1), f.positive("moe_layer_interval", 1)
    end = f.get_int("moe_layer_end_index", default=-1)
    if end is not None and -1 < end < layers - 1:
        f.unsupported(f"moe_layer_end_index {end} is not modelled (dense layers after the MoE ones: -1 or the last)")
    experts, shared = f.get_int("moe_num_experts", default=64), f.get_int("moe_num_shared_experts", default=2)
    width = f.need("moe_intermediate_size", what="expert width")
    if experts and start is not None and start < layers:
        out["moe"] = dict(num_experts=experts, top_k=f.get_int("moe_k", default=6), expert_ffn_hidden_size=width,
                          num_shared_experts=1 if shared else 0,
                          shared_expert_ffn_hidden_size=shared * width if shared else None,
                          num_dense_layers=max(start, 0), moe_layer_step=step, router_bias=True, router_score="softmax",
                          **f.aux_loss())
        out["note"] = ERNIE_MOE_ROUTER_NOTE
    return out


def _seed_oss(f: Fields) -> dict:
    """SeedOssConfig: head_dim 128, 8 KV heads, q/k/v biases (attention_bias True) and none on o_proj
    (attention_out_bias False) or the MLP (mlp_bias False), attention dropout 0.1."""
    f = normalised(f, "seed_oss")
    out = decoder_base(f, kv_heads=8, head_dim=128, max_positions=524288, theta=10000.0, tied=False)
    out["dropout"] = float(f.get("attention_dropout", 0.1))
    bias = (bool(f.get("attention_bias", True)), bool(f.get("attention_out_bias", False)),
            bool(f.get("mlp_bias", False)))
    if bias == (True, True, True):
        out["linear_bias"] = True
    elif bias == (True, False, False):
        out["qkv_bias"] = True
    elif bias != (False, False, False):
        f.unsupported(f"attention_bias, attention_out_bias, mlp_bias {list(bias)} are not modelled (q/k/v biases "
                      "only, every linear's, or none)")
    return out


def _sigmoid_router(f: Fields) -> dict:
    """A sigmoid router with e_score_correction_bias whose top-k weights are normalised (ModelSpec's sigmoid)."""
    if not f.get("norm_topk_prob", True):
        f.unsupported("norm_topk_prob false with a sigmoid router is not modelled (the top-k weights normalised)")
    return f.router(score="sigmoid")


def _dots1(f: Fields) -> dict:
    """Dots1Config: first_k_dense_replace (0) dense layers of intermediate_size, then MoE layers of n_routed_experts
    of moe_intermediate_size, n_shared_experts as one wider MLP, a sigmoid router with e_score_correction_bias (n_group /
    topk_group 1, routed_scaling_factor 1.0), per-head Q/K RMSNorm, q/k/v/o biases with attention_bias;
    a sliding window from max_window_layers (62) on where layer_types says so."""
    f = normalised(f, "dots1", _MOE_SHAPE + ("intermediate_size",))
    out = decoder_base(f, kv_heads=None, head_dim=None, max_positions=2048, theta=10000.0, tied=False)
    if f.get("attention_bias", False):
        out.update(qkv_bias=True, attention_output_bias=True)  # Dots1Attention: q/k/v and o_proj
    out["qk_norm"] = "head"
    out["moe"] = dict(num_experts=f.need("n_routed_experts", "num_local_experts", what="routed experts per layer"),
                      top_k=f.need("num_experts_per_tok", what="routed experts per token"),
                      expert_ffn_hidden_size=f.need("moe_intermediate_size", what="routed expert width"),
                      num_shared_experts=f.need("n_shared_experts", what="shared experts"),
                      num_dense_layers=f.get_int("first_k_dense_replace", default=0), router_bias=True,
                      **_sigmoid_router(f))
    first = f.get_int("max_window_layers", default=62)
    fallback = [i for i in layer_indices(out["num_layers"]) if i >= first]
    set_local_attention(out, f, f.get_int("sliding_window", default=4096), fallback)
    return out


def _minimax_m2(f: Fields) -> dict:
    """MiniMaxM2Config: every layer MoE (256 experts, each intermediate_size 1536 wide, top-8), a sigmoid router with
    e_score_correction_bias and normalised top-k weights (MiniMaxM2TopKRouter), RMSNorm over the whole Q and K widths,
    head_dim 128, 8 KV heads, no biases; RoPE on rotary_dim of each head (partial_rotary_factor)."""
    f = normalised(f, "minimax_m2", ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size",
                                     "intermediate_size"))
    out = decoder_base(f, kv_heads=8, head_dim=128, max_positions=196608, theta=5000000.0, tied=False)
    if f.data.get("rotary_dim") is not None and "rotary_fraction" not in out:  # the released files' legacy field
        head_dim = out["head_dim"] or out["hidden_size"] // out["num_attention_heads"]
        if f.need("rotary_dim", what="rotary dimensions per head") != head_dim:
            out["rotary_fraction"] = f.need("rotary_dim", what="rotary dimensions per head") / head_dim
    out["qk_norm"] = "full"
    out["moe"] = dict(num_experts=f.get_int("num_local_experts", "num_experts", default=256),
                      top_k=f.get_int("num_experts_per_tok", default=8), expert_ffn_hidden_size=out["ffn_hidden_size"],
                      router_bias=True, router_score="sigmoid", **f.aux_loss())
    return out


def _per_layer(f: Fields, key: str, default: int, layers: int) -> int:
    """A field a file may give once or per layer (HunYuan's moe_topk, num_experts): one value, the same on every
    layer, or a problem."""
    value = f.data.get(key)
    if isinstance(value, list):
        if len(value) == layers and len(set(map(str, value))) == 1:
            return f._check_int(key, value[0])
        f.unsupported(f"{key} {value!r} is not modelled (one value for every layer)")
        return default
    return f.get_int(key, default=default)


def _hunyuan_v1_dense(f: Fields) -> dict:
    """HunYuanDenseV1Config: Llama's layer with a per-head Q/K RMSNorm (query_layernorm / key_layernorm, always built),
    q/k/v and o_proj biases with attention_bias, the MLP bias-free, untied by default."""
    f = normalised(f, "hunyuan_v1_dense")
    out = decoder_base(f, kv_heads=None, head_dim=None, max_positions=2048, theta=10000.0, tied=False)
    out["qk_norm"] = "head"
    if f.get("attention_bias", False):
        out.update(qkv_bias=True, attention_output_bias=True)
    return out


def _hunyuan_v1_moe(f: Fields) -> dict:
    """HunYuanMoEV1Config: every layer MoE, num_experts (1) routed experts and one shared MLP (shared_mlp), each
    intermediate_size wide (the class builds them so: a file's moe_intermediate_size or num_shared_expert that says
    otherwise is refused), top moe_topk (1) of a softmax over a bias-free router, renormalised; a per-head Q/K RMSNorm
    (query_layernorm / key_layernorm, always built); q/k/v and o_proj biases with attention_bias."""
    f = normalised(f, "hunyuan_v1_moe")
    out = decoder_base(f, kv_heads=None, head_dim=None, max_positions=2048, theta=10000.0, tied=False)
    out["qk_norm"] = "head"
    if f.get("attention_bias", False):
        out.update(qkv_bias=True, attention_output_bias=True)
    layers, width = out["num_layers"], out["ffn_hidden_size"]
    for key, built in (("moe_intermediate_size", width), ("num_shared_expert", 1)):
        if f.data.get(key) is not None and _per_layer(f, key, built, layers) != built:
            f.unsupported(f"{key} {f.data[key]!r} is not what transformers builds ({built}: HunYuanMoEV1Moe)")
    out["moe"] = dict(num_experts=_per_layer(f, "num_experts", 1, layers),
                      top_k=_per_layer(f, "moe_topk", 1, layers), expert_ffn_hidden_size=width,
                      num_shared_experts=1, **f.aux_loss())
    return out


MORE_READERS = {"qwen2_moe": _qwen2_moe, "starcoder2": _starcoder2, "smollm3": _smollm3, "exaone4": _exaone4,
                "ernie4_5": _ernie4_5, "ernie4_5_moe": _ernie4_5_moe, "seed_oss": _seed_oss, "dots1": _dots1,
                "minimax_m2": _minimax_m2, "hunyuan_v1_dense": _hunyuan_v1_dense, "hunyuan_v1_moe": _hunyuan_v1_moe}
