"""ModelSpec from a Hugging Face ``config.json``.

Maps the field names of each supported ``model_type`` onto :class:`ModelSpec`, so that the
parameter count of a loaded config equals that of the checkpoint (and of our preset for the
same model). Where a field is absent, the default of the ``transformers`` config class applies;
fields that fix a tensor's size and have no sensible default are required.

Two simplifications, neither of which changes a parameter count:
- ``ModelSpec.activation`` tells a gated MLP (``swiglu``: gate, up, down) from a plain one
  (``gelu``: up, down). Llama-family configs are gated whatever their ``hidden_act``; GPT-2,
  NeoX, BLOOM, Falcon and OPT are plain, OPT's ReLU included.
- Rotary and ALiBi settings beyond the position-embedding kind are ignored; for the families read
  by ``hf_readers_dense``, ``hf_readers_moe`` and ``hf_readers_more`` (qwen3, qwen3_moe, gpt_oss, llama4, gemma2,
  gemma3, glm4_moe, olmo2, phi3, qwen2_moe, starcoder2, smollm3, exaone4, dots1) sliding-window and
  chunked-attention layers are carried.
"""

from __future__ import annotations

from pathlib import Path

from autotune.errors import InputError, suggest_names
from autotune.inputs import nonfinite_problems, parse_json, read_text
from autotune.specs.hf_fields import Fields as _Fields
from autotune.specs.hf_fields import head_dim_or_none
from autotune.specs.hf_fields import layer_indices
from autotune.specs.hf_readers_dense import (DENSE_READERS, rope_scaling_fields, rope_theta, rotary_fraction,
                                             set_local_attention)
from autotune.specs.hf_readers_moe import MOE_READERS
from autotune.specs.hf_readers_more import MORE_READERS
from autotune.specs.limits import model_limit_problems
from autotune.specs.model import ModelSpec

__all__ = ["model_from_hf_config", "read_hf_config", "SUPPORTED_MODEL_TYPES"]

_LINEAR = "linear-attention layers (Gated DeltaNet, lightning or KDA attention) beside its softmax ones"
_SSM = "Mamba (state-space) layers beside or instead of attention"
_NOT_TRANSFORMERS = {
    "qwen3_next": _LINEAR, "qwen3_5": _LINEAR, "qwen3_5_moe": _LINEAR, "kimi_linear": _LINEAR, "minimax": _LINEAR,
    "bailing_hybrid": _LINEAR, "falcon_h1": _SSM, "granitemoehybrid": _SSM, "nemotron_h": _SSM, "jamba": _SSM,
    "bamba": _SSM, "zamba": _SSM, "zamba2": _SSM, "falcon_mamba": _SSM, "mamba": _SSM, "mamba2": _SSM,
    "lfm2": "short-convolution layers beside attention", "lfm2_moe": "short-convolution layers beside attention",
    "deepseek_v32": "DeepSeek Sparse Attention (a lightning indexer choosing each query's keys)",
    "recurrent_gemma": "recurrent (RG-LRU) layers", "rwkv": "RWKV's recurrent time mixing",
    "xlstm": "xLSTM's recurrent cells"}
"""transformers model_types whose layers ModelSpec cannot describe (transformers 5.25's modeling files), refused
with what they have rather than with a near supported name."""

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "gpt2", "gpt_neox", "bloom", "falcon",
                         "RefinedWeb", "RefinedWebModel", "opt", "deepseek_v3", "kimi_k2", "deepseek_v2",
                         *DENSE_READERS, *MOE_READERS, *MORE_READERS)

# transformers' defaults for max_position_embeddings (only learned tables use it for counting).
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "mistral": 4096 * 32, "mixtral": 4096 * 32, "qwen2": 32768,
                          "deepseek_v3": 4096, "kimi_k2": 4096, "deepseek_v2": 2048, "gpt_neox": 2048, "falcon": 2048, "opt": 2048}


def _head_dim(f: _Fields, hidden: int, heads: int) -> int | None:
    return head_dim_or_none(f.get_int("head_dim", default=None), hidden, heads)


def _dropout(f: _Fields, *keys: str, default: float) -> float:
    for key in keys:
        if f.data.get(key) is not None:
            return float(f.get(key, 0.0))
    return default


def _llama_like(f: _Fields) -> dict:
    """llama, mistral, mixtral, qwen2, deepseek_v3: pre-norm RMSNorm, gated MLP, rotary positions."""
    mt = f.model_type
    hidden = f.need("hidden_size", what="model width")
    heads = f.need("num_attention_heads", what="attention heads")
    ffn = f.need("intermediate_size", what="dense MLP width")
    out = dict(
        num_layers=f.need("num_hidden_layers", what="transformer layers"), hidden_size=hidden,
        num_attention_heads=heads, num_kv_heads=f.get_int("num_key_value_heads", default=heads),
        head_dim=_head_dim(f, hidden, heads), ffn_hidden_size=ffn,
        vocab_size=f.need("vocab_size", what="vocabulary size"),
        activation="swiglu", norm="rmsnorm", position_embedding="rope",
        max_position_embeddings=f.get_int("max_position_embeddings", default=_DEFAULT_MAX_POSITIONS[mt]),
        rope_theta=rope_theta(f, 10000.0),  # top level, or transformers 5's rope_parameters
        tied_embeddings=bool(f.get("tie_word_embeddings", False)),
        dropout=_dropout(f, "attention_dropout", default=0.0),
        # Llama 3.1's llama3 scaling (and a linear one); DeepSeek-V3 / Kimi-K2's YaRN (with MLA's mscale_all_dim)
        **rope_scaling_fields(f),
    )
    attention_bias, mlp_bias = bool(f.get("attention_bias", False)), bool(f.get("mlp_bias", False))
    # Sliding windows: Mistral's on every layer where sliding_window is set; Qwen2's with use_sliding_window from
    # max_window_layers on (Qwen2Config.layer_types); layer_types where the file lists them (transformers 5)
    if mt in ("mistral", "mixtral"):  # MistralConfig's default window 4096, MixtralConfig's none (transformers 5.25)
        window = None if "sliding_window" in f.data and f.data["sliding_window"] is None else \
            f.get_int("sliding_window", default=4096 if mt == "mistral" else None)  # null: full attention
        set_local_attention(out, f, window, list(layer_indices(out["num_layers"])))
    elif mt == "qwen2" and f.get("use_sliding_window", False):
        first = f.get_int("max_window_layers", default=28)
        set_local_attention(out, f, f.get_int("sliding_window", default=4096),
                            [i for i in layer_indices(out["num_layers"]) if i >= first])
    if mt in ("mistral", "mixtral"):
        pass  # MistralAttention / MixtralAttention and their MLPs build no biases, whatever attention_bias says
    elif mt == "qwen2":
        out["qkv_bias"] = True  # Qwen2Attention: q/k/v projections always carry a bias, o_proj none
    elif attention_bias and mlp_bias:
        out["linear_bias"] = True
    elif attention_bias:  # LlamaAttention: q/k/v and o_proj biases (transformers 5.25 modeling_llama.py)
        out.update(qkv_bias=True, attention_output_bias=True)
    elif mlp_bias:
        f.unsupported("mlp_bias without attention_bias is not modelled: set both or neither")
    if mt == "mixtral":
        out["moe"] = dict(num_experts=f.need("num_local_experts", what="experts per MoE layer"),
                          top_k=f.need("num_experts_per_tok", what="experts per token"),
                          expert_ffn_hidden_size=ffn, **f.router(score="softmax"))
    if mt in ("deepseek_v3", "kimi_k2"):
        _deepseek_v3(f, out)
    elif mt == "deepseek_v2":
        _deepseek_v2(f, out)
    return out


def _deepseek_v3(f: _Fields, out: dict) -> None:
    """MLA attention and DeepSeekMoE (shared + routed experts, leading dense layers), and the
    multi-token-prediction modules (num_nextn_predict_layers: DeepSeek-V3 1, Kimi-K2 0; not built by
    transformers, so carried beside the parameter count). Kimi-K2 is this architecture: its
    config.json names DeepseekV3ForCausalLM (model_type deepseek_v3 or kimi_k2)."""
    if f.get("moe_layer_freq", 1) != 1:
        f.unsupported(f"moe_layer_freq {f.get('moe_layer_freq', 1)} is not modelled (only 1: every layer after "
                      "the first_k_dense_replace dense ones is MoE)")
    if f.get("attention_bias", False):
        f.unsupported("attention_bias with MLA is not modelled (biases on q_a_proj, kv_a_proj_with_mqa and o_proj "
                      "but not q_b_proj / kv_b_proj: DeepseekV3Attention, DeepseekV2Attention)")
    for key in ("qkv_bias", "attention_output_bias", "linear_bias"):
        out.pop(key, None)
    out["num_kv_heads"] = out["num_attention_heads"]  # MLA: every head has its own K and V
    out["head_dim"] = None
    out["moe"] = dict(
        num_experts=f.need("n_routed_experts", what="routed experts per MoE layer"),
        top_k=f.need("num_experts_per_tok", what="routed experts per token"),
        expert_ffn_hidden_size=f.need("moe_intermediate_size", what="routed expert width"),
        num_shared_experts=f.get_int("n_shared_experts", default=1),
        num_dense_layers=f.get_int("first_k_dense_replace", default=3),
        router_bias=f.get("topk_method", "noaux_tc") == "noaux_tc",  # e_score_correction_bias
        # DeepseekV3Config's defaults: sigmoid scores, 8 groups of which 4 kept, the weights scaled by 2.5
        **f.router(score="sigmoid", groups=8, group_topk=4, scaling=2.5),
    )
    if "aux_loss_coeff" not in out["moe"]:
        # DeepSeek-V3's file states no balancing loss: its paper's sequence-wise one of weight 0.0001 (arXiv:2412.19437
        # §4.2, "alpha = 0.0001"), as Megatron-Bridge's DeepSeek-V3 bridge sets it (deepseek_v3_bridge.py:68-71 at
        # v0.6.0: seq_aux_loss, aux_loss_alpha else 0.0001)
        out["moe"] |= {"aux_loss_coeff": 0.0001, "aux_loss_per_sequence": True}
    mtp = f.get_int("num_nextn_predict_layers", default=1)  # DeepseekV3Config's default
    if mtp:
        out["num_mtp_layers"] = mtp
    # q_lora_rank: null means a plain Q projection (DeepSeek-V2-Lite); absent means the class default.
    q_lora = f.data["q_lora_rank"] if "q_lora_rank" in f.data else 1536
    out["mla"] = dict(
        kv_lora_rank=f.need("kv_lora_rank", what="compressed KV width"),
        qk_nope_head_dim=f.need("qk_nope_head_dim", what="non-rotary Q/K head width"),
        qk_rope_head_dim=f.need("qk_rope_head_dim", what="rotary Q/K head width"),
        v_head_dim=f.need("v_head_dim", what="value head width"),
        q_lora_rank=None if q_lora is None else f._check_int("q_lora_rank", q_lora),
    )


def _deepseek_v2(f: _Fields, out: dict) -> None:
    """DeepSeek-V2 (and V2-Lite: q_lora_rank null): V3's MLA and DeepSeekMoE, with DeepseekV2Config's defaults and
    router: a softmax over the routed experts, no bias or correction bias, greedy top-k (group-limited over n_group
    where the file says so), weights unnormalised and scaled by routed_scaling_factor (1.0); every layer from
    first_k_dense_replace (0) on is MoE; no multi-token prediction (transformers 5.25 modeling_deepseek_v2.py)."""
    _deepseek_v3(f, out)
    out["moe"].update(num_shared_experts=f.get_int("n_shared_experts", default=2),
                      num_dense_layers=f.get_int("first_k_dense_replace", default=0), router_bias=False)
    for key in ("router_score", "router_groups", "router_group_topk", "router_scaling_factor", "router_pre_softmax",
                "aux_loss_coeff", "aux_loss_per_sequence"):
        out["moe"].pop(key, None)
    greedy = f.get("topk_method", "greedy") == "greedy"  # plain top-k, whatever n_group says
    out["moe"].update(f.router(score="softmax", groups=1, group_topk=1, norm_topk=False))
    if greedy:
        out["moe"].pop("router_groups", None)
        out["moe"].pop("router_group_topk", None)
    out.pop("num_mtp_layers", None)


_HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                   "relu": "relu", "relu2": "squared_relu"}
"""transformers' ACT2FN names of a plain MLP's activation -> ModelSpec.activation (gelu is erf's exact GeLU; gelu_new,
gelu_fast and gelu_pytorch_tanh its tanh form)."""


def _hf_activation(f: _Fields, key: str, default: str) -> str:
    name = f.get(key, default)
    if name not in _HF_ACTIVATIONS:
        f.unsupported(f"{key} {name!r} is not modelled (known: {', '.join(_HF_ACTIVATIONS)})")
        return "gelu"
    return _HF_ACTIVATIONS[name]


def _gpt2(f: _Fields) -> dict:
    hidden = f.need("n_embd", "hidden_size", what="model width")
    return dict(
        num_layers=f.need("n_layer", "num_hidden_layers", what="transformer layers"), hidden_size=hidden,
        num_attention_heads=f.need("n_head", "num_attention_heads", what="attention heads"),
        ffn_hidden_size=f.get_int("n_inner", default=4 * hidden),  # n_inner null: 4 * n_embd
        vocab_size=f.need("vocab_size", what="vocabulary size"),
        activation=_hf_activation(f, "activation_function", "gelu_new"), norm="layernorm", position_embedding="learned",
        max_position_embeddings=f.get_int("n_positions", "max_position_embeddings", default=1024),
        linear_bias=True, tied_embeddings=bool(f.get("tie_word_embeddings", True)),
        dropout=_dropout(f, "resid_pdrop", "attn_pdrop", default=0.1),
    )


def _gpt_neox(f: _Fields) -> dict:
    """Parallel residual (use_parallel_residual, default true) with two LayerNorms per layer (input and
    post-attention); untied by default; RoPE on rotary_pct of each head (0.25)."""
    if not f.get("attention_bias", True):
        f.unsupported("attention_bias false (bias-free attention, biased MLP) is not modelled")
    return dict(
        num_layers=f.need("num_hidden_layers", what="transformer layers"),
        hidden_size=f.need("hidden_size", what="model width"),
        num_attention_heads=f.need("num_attention_heads", what="attention heads"),
        ffn_hidden_size=f.need("intermediate_size", what="MLP width"),
        vocab_size=f.need("vocab_size", what="vocabulary size"),
        activation=_hf_activation(f, "hidden_act", "gelu"), norm="layernorm", position_embedding="rope",
        max_position_embeddings=f.get_int("max_position_embeddings", default=2048),
        rope_theta=float(f.get("rotary_emb_base", 10000.0)), rotary_fraction=rotary_fraction(f),
        parallel_residual=bool(f.get("use_parallel_residual", True)),
        linear_bias=True, tied_embeddings=bool(f.get("tie_word_embeddings", False)),
        dropout=_dropout(f, "hidden_dropout", "attention_dropout", default=0.0),
    )


def _bloom(f: _Fields) -> dict:
    """ALiBi (no position table), LayerNorm after the embedding, biases everywhere, MLP 4h, tied."""
    hidden = f.need("hidden_size", "n_embed", what="model width")
    return dict(
        num_layers=f.need("n_layer", "num_hidden_layers", what="transformer layers"), hidden_size=hidden,
        num_attention_heads=f.need("n_head", "num_attention_heads", what="attention heads"),
        ffn_hidden_size=4 * hidden, vocab_size=f.need("vocab_size", what="vocabulary size"),
        activation="gelu_tanh", norm="layernorm", position_embedding="alibi",  # BloomGelu: the tanh form
        max_position_embeddings=f.get_int("seq_length", default=2048),  # BLOOM trained at 2048
        linear_bias=True, embedding_norm=True, tied_embeddings=bool(f.get("tie_word_embeddings", True)),
        dropout=_dropout(f, "hidden_dropout", "attention_dropout", default=0.0),
    )


def _falcon(f: _Fields) -> dict:
    """Falcon-7B (multi-query, one LayerNorm per parallel block) and the new decoder (40B/180B: GQA, two)."""
    hidden = f.need("hidden_size", what="model width")
    heads = f.need("num_attention_heads", "n_head", what="attention heads")
    new_arch = f.model_type == "RefinedWeb" or bool(f.get("new_decoder_architecture", False))
    if new_arch:
        kv_heads = f.get_int("num_kv_heads", "n_head_kv", default=heads)
        norms = f.get_int("num_ln_in_parallel_attn", default=2)  # ln_attn and ln_mlp
    else:
        kv_heads = 1 if f.get("multi_query", True) else heads
        norms = 1 if f.get("parallel_attn", True) else 2
    return dict(
        num_layers=f.need("num_hidden_layers", "n_layer", what="transformer layers"), hidden_size=hidden,
        num_attention_heads=heads, num_kv_heads=kv_heads,
        ffn_hidden_size=f.get_int("ffn_hidden_size", default=4 * hidden),
        vocab_size=f.need("vocab_size", what="vocabulary size"),
        activation="gelu", norm="layernorm", position_embedding="alibi" if f.get("alibi", False) else "rope",  # nn.GELU
        max_position_embeddings=f.get_int("max_position_embeddings", default=2048),
        rope_theta=rope_theta(f, 10000.0),  # top level, or transformers 5's rope_parameters
        linear_bias=bool(f.get("bias", False)), norms_per_layer=norms,
        parallel_residual=norms == 2 and (new_arch or bool(f.get("parallel_attn", True))),
        tied_embeddings=bool(f.get("tie_word_embeddings", True)),
        dropout=_dropout(f, "hidden_dropout", "attention_dropout", default=0.0),
    )


def _opt(f: _Fields) -> dict:
    """Learned positions from row 2 of a table of max_position_embeddings + 2 rows (OPTLearnedPositionalEmbedding's
    offset: position_offset 2, the sequence limit max_position_embeddings), biases, tied, ReLU."""
    hidden = f.need("hidden_size", what="model width")
    if f.get_int("word_embed_proj_dim", default=hidden) != hidden:
        f.unsupported(f"word_embed_proj_dim {f.get('word_embed_proj_dim', None)} differs from hidden_size {hidden} "
                      "(OPT-350m's project_in/project_out) and is not modelled")
    if not f.get("do_layer_norm_before", True) or not f.get("layer_norm_elementwise_affine", True):
        f.unsupported("post-norm OPT (do_layer_norm_before false) or LayerNorms without weights are not modelled")
    return dict(
        num_layers=f.need("num_hidden_layers", what="transformer layers"), hidden_size=hidden,
        num_attention_heads=f.need("num_attention_heads", what="attention heads"),
        ffn_hidden_size=f.need("ffn_dim", what="MLP width"), vocab_size=f.need("vocab_size", what="vocabulary size"),
        activation=_hf_activation(f, "activation_function", "relu"), norm="layernorm",
        position_embedding="learned", max_position_embeddings=f.get_int("max_position_embeddings", default=2048),
        position_offset=2,  # OPTLearnedPositionalEmbedding: max_position_embeddings + 2 rows, positions from row 2
        linear_bias=bool(f.get("enable_bias", True)), tied_embeddings=bool(f.get("tie_word_embeddings", True)),
        dropout=_dropout(f, "dropout", default=0.1),
    )


_FAMILIES = {"llama": _llama_like, "mistral": _llama_like, "mixtral": _llama_like, "qwen2": _llama_like,
             "deepseek_v3": _llama_like, "kimi_k2": _llama_like, "deepseek_v2": _llama_like, "gpt2": _gpt2, "gpt_neox": _gpt_neox, "bloom": _bloom, "falcon": _falcon,
             "RefinedWeb": _falcon, "RefinedWebModel": _falcon, "opt": _opt, **DENSE_READERS, **MOE_READERS,
             **MORE_READERS}
assert set(_FAMILIES) == set(SUPPORTED_MODEL_TYPES)


MODEL_YAML_FIELDS = (
    "name, num_layers, hidden_size, num_attention_heads, ffn_hidden_size, vocab_size (required); num_kv_heads, "
    "head_dim, activation (swiglu, gelu or relu), norm (rmsnorm or layernorm), tied_embeddings, position_embedding, "
    "linear_bias, qkv_bias, qk_norm, sliding_window, sliding_window_layers; for MoE a moe: block (num_experts, "
    "top_k, expert_ffn_hidden_size, num_shared_experts, num_dense_layers, moe_layer_step). "
    "autotune/presets/models/llama3-8b.yaml is an example; schemas/model.schema.json lists every field; "
    "pass the file as --model FILE.yaml")


def read_hf_config(path: str | Path) -> dict:
    """The parsed ``config.json`` at ``path`` (a file, or a folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    subject = f"Hugging Face config {str(p)!r}"
    # transformers writes a config's infinite floats as Infinity (json.dumps' default: Mamba-2's time_step_limit,
    # transformers/models/mamba2/configuration_mamba2.py) and reads them back; a field a reader takes is checked
    # to be finite where it is read (hf_fields.Fields.get).
    data = parse_json(read_text(p, subject="Hugging Face config"), subject=subject, nonfinite=True)
    if not isinstance(data, dict):
        raise InputError([f"expected a JSON object, got {type(data).__name__}"], subject=subject)
    return data


_EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")
"""Where config.json files state their norms' epsilon (Llama / Qwen / Mistral / DeepSeek / Gemma rms_norm_eps,
GPT-NeoX / Phi layer_norm_eps, GPT-2 / BLOOM / Falcon layer_norm_epsilon)."""


def _norm_eps(f: _Fields) -> float | None:
    """The norms' epsilon the config states (a multimodal one in its text_config), else its class's default
    (``_CLASS_EPS``); None where neither is known."""
    text = f.data.get("text_config")
    source = _Fields(text, f.model_type) if isinstance(text, dict) else f
    for key in _EPS_KEYS:
        if source.data.get(key) is not None:
            known = len(source.problems)
            value = source.get(key, 0.0)  # records an ill-typed value as a problem, and gives 0.0
            if source is not f:
                f.problems += source.problems
            if value <= 0 and len(source.problems) == known:
                f.problems.append(f"{key!r} must be a positive number, got {value!r}")
            return value if value > 0 else None
    return _CLASS_EPS.get(f.model_type)


_CLASS_EPS = {"gemma2": 1e-6, "gemma3": 1e-6, "gemma3_text": 1e-6, "opt": 1e-5}
"""The epsilon of the model types whose config.json files may leave it out: transformers 5.25's Gemma2Config /
Gemma3TextConfig ``rms_norm_eps`` default; OPT's torch LayerNorm default (OPTConfig has no field)."""


def model_from_hf_config(path_or_dict: str | Path | dict, name: str | None = None, *,
                         origin: str = "Hugging Face config") -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` (path, folder, or parsed dict).

    ``name`` defaults to the config's ``_name_or_path`` (what ``from_pretrained`` was given), else
    the model_type; never the folder the file sits in. InputError names every missing or ill-typed
    field, or the supported model types.
    """
    if isinstance(path_or_dict, dict):
        data = path_or_dict
    else:
        p = Path(path_or_dict)
        data = read_hf_config(p)
        origin = f"Hugging Face config {str(p)!r}"
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    model_type = data.get("model_type")
    if model_type is None:
        raise InputError([f"no 'model_type' field: add the model's type (supported: {supported})"], subject=origin)
    if not isinstance(model_type, str):
        raise InputError([f"'model_type' must be a string such as \"llama\", got {model_type!r}"], subject=origin)
    if model_type in _NOT_TRANSFORMERS:  # a near name would invite a rename that counts another model
        raise InputError([f"model_type {model_type!r} is not supported: it has {_NOT_TRANSFORMERS[model_type]}, "
                          f"which autotune does not model; supported: {supported}. A model YAML describes "
                          f"softmax-attention transformer layers only: {MODEL_YAML_FIELDS}"], subject=origin)
    if model_type not in _FAMILIES:
        hint = suggest_names(str(model_type), SUPPORTED_MODEL_TYPES)
        raise InputError([f"model_type {model_type!r} is not supported{hint}; supported: {supported}. "
                          f"Describe the model in a model YAML instead: {MODEL_YAML_FIELDS}"], subject=origin)
    fields = _Fields(data, model_type)
    kwargs = _FAMILIES[model_type](fields)
    eps = _norm_eps(fields)
    if eps is not None:
        kwargs["norm_eps"] = eps
    name_or_path = data.get("_name_or_path")
    if name_or_path is not None and not isinstance(name_or_path, str):
        fields.problems.append(f"'_name_or_path' must be a string, got {name_or_path!r}")
    problems = fields.problems + nonfinite_problems(kwargs) + model_limit_problems(kwargs)
    if problems:
        raise InputError(problems, subject=origin)
    kwargs.setdefault("num_kv_heads", kwargs["num_attention_heads"])  # explicit, as in the presets
    kwargs["name"] = name or (name_or_path or "").strip() or model_type
    try:
        return ModelSpec.from_dict(kwargs)
    except InputError as err:
        raise InputError(err.problems, subject=origin) from None
