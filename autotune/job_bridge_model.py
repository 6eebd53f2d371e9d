"""The model a Megatron-Bridge config states in full: the ``model`` section of the ``run_config.yaml`` every Bridge
checkpoint holds (``ConfigContainer.to_yaml``: Megatron-Bridge 0.6 training/checkpointing.py:1468, the file name
training/utils/checkpoint_utils.py:34) or of any complete ConfigContainer dump, whose fields are megatron-core's
TransformerConfig / GPTModelProvider ones. They are read as the Megatron-LM flags that set them
(megatron/training/arguments.py ``core_transformer_config_from_args`` copies each flag to the config field of its
name, the exceptions are listed below), so one reader, ``job_megatron_model.megatron_model``, says which model it is:
a preset where one has the shape, else a ModelSpec of the stated fields. Read by :mod:`autotune.job_bridge`."""

from __future__ import annotations

from autotune.emit.job_args import FROM_SUBJECT
from autotune.errors import InputError
from autotune.job_megatron_model import megatron_model
from autotune.specs.model import ModelSpec

__all__ = ["SHAPE_FIELDS", "bridge_model", "states_model"]

SHAPE_FIELDS = ("num_layers", "hidden_size", "num_attention_heads")
"""The fields without which a config states no model (an overrides file on a base recipe leaves them out)."""

_RENAMED = {
    # TransformerConfig field -> the Megatron-LM flag that sets it, where the names differ (arguments.py at core_v0.19)
    "num_moe_experts": "--num-experts",
    "layernorm_epsilon": "--norm-epsilon",
    "seq_len_interpolation_factor": "--rotary-seq-len-interpolation-factor",
    "qk_head_dim": "--qk-head-dim",
    "qk_pos_emb_head_dim": "--qk-pos-emb-head-dim",
    # YaRN of a non-MLA model (GPT-OSS): TransformerConfig's yarn_* fields (core 0.19.2 transformer_config.py)
    "yarn_rotary_scaling_factor": "--rotary-scaling-factor",
    "yarn_mscale": "--mscale",
    "yarn_mscale_all_dim": "--mscale-all-dim",
}
_SWITCHES = {
    # boolean fields -> the store_true flag that sets them True (a False field: no flag)
    "qk_layernorm": "--qk-layernorm", "qk_l2_norm": "--qk-l2-norm", "add_qkv_bias": "--add-qkv-bias",
    "multi_latent_attention": "--multi-latent-attention", "layernorm_zero_centered_gamma": "--apply-layernorm-1p",
    "moe_router_enable_expert_bias": "--moe-router-enable-expert-bias",
    "moe_apply_probs_on_input": "--moe-apply-probs-on-input",
    "rope_scaling": "--use-rope-scaling",
}
_INVERTED = {
    # boolean fields whose flag turns them off (store_false): the flag where the field is False
    "add_bias_linear": "--disable-bias-linear",
    "share_embeddings_and_output_weights": "--untie-embeddings-and-output-weights",
}
_VALUES = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "kv_channels", "vocab_size",
           "seq_length", "normalization", "position_embedding_type", "rotary_base", "rotary_percent", "hidden_dropout",
           "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_layer_freq",
           "moe_router_score_function", "moe_router_num_groups", "moe_router_group_topk",
           "moe_router_topk_scaling_factor", "moe_aux_loss_coeff", "moe_router_load_balancing_type", "kv_lora_rank",
           "v_head_dim", "q_lora_rank", "rope_type", "rotary_scaling_factor", "mscale", "mscale_all_dim",
           "yarn_original_max_position_embeddings", "yarn_beta_fast", "yarn_beta_slow", "softmax_type",
           "window_attn_skip_freq", "activation_func_clamp_value", "rope_scaling_factor", "max_position_embeddings",
           "no_rope_freq")
"""Fields whose flag takes the value as it is (the name with dashes)."""


def states_model(model: dict) -> bool:
    """Whether a config's ``model`` section states the model's shape (a full dump), not only plan settings."""
    return all(model.get(k) is not None for k in SHAPE_FIELDS)


def _whole(model: dict, path: str, fields: tuple[str, ...]) -> list[str]:
    """What is wrong with the integer fields a full config states (None: unstated, TransformerConfig's default)."""
    def bad(value: object) -> bool:
        return not isinstance(value, int) or isinstance(value, bool) or value < 1

    return [f"{path}: model.{k} must be a positive integer, got {model[k]!r}" for k in fields
            if model.get(k) is not None and bad(model[k])]


_PATTERNS = ("moe_layer_freq", "window_attn_skip_freq", "no_rope_freq")
"""Fields that hold an int or a per-layer list, whose flag takes a Python list expression (arguments.py
moe_freq_type; --no-rope-freq's no_rope_freq_type, core_v0.19.0 arguments.py:303-324, reads the same forms)."""


def _text(value: object, field: str = "") -> str:
    """A field's value as its flag's text: per-layer patterns as a list expression, other lists space-separated
    (Megatron's nargs='+'), numbers as written."""
    if isinstance(value, (list, tuple)) and field in _PATTERNS:
        return str(list(value))
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


def _activation(model: dict) -> str:
    """``activation_func`` as Bridge dumps a callable (``{_target_: torch.nn.functional.silu, _call_: false}``), or
    its plain name."""
    func = model.get("activation_func")
    name = func.get("_target_", "") if isinstance(func, dict) else str(func or "")
    return name.rsplit(".", 1)[-1]


def megatron_flags(model: dict, tokenizer: dict | None = None) -> dict:
    """The Megatron-LM flags (as ``job_files`` reads an argument file: flag -> value, a switch -> True) that build the
    TransformerConfig ``model`` states."""
    f: dict = {}
    for field in _VALUES:
        value = model.get(field)
        if value is not None and not isinstance(value, bool):
            f["--" + field.replace("_", "-")] = _text(value, field)
    for field, flag in _RENAMED.items():
        if model.get(field) is not None:
            f[flag] = _text(model[field])
    f |= {flag: True for field, flag in _SWITCHES.items() if model.get(field) is True}
    f |= {flag: True for field, flag in _INVERTED.items() if model.get(field) is False}
    # top-k before the softmax: a softmax router's setting only (a sigmoid one's dump may hold it True, unused)
    if model.get("moe_router_pre_softmax") is True and model.get("moe_router_score_function", "softmax") == "softmax":
        f["--moe-router-pre-softmax"] = True
    if model.get("yarn_correction_range_round_to_int") is False:
        f["--no-yarn-correction-range-round-to-int"] = True
    groups = model.get("num_query_groups")
    if isinstance(groups, int) and groups != model.get("num_attention_heads"):
        f |= {"--group-query-attention": True, "--num-query-groups": str(groups)}
    activation = _activation(model)
    if model.get("gated_linear_unit") is True:  # GLU: SwiGLU, or GPT-OSS's clamped one (quick_gelu, emit.megatron)
        f["--quick-geglu" if activation == "quick_gelu" else "--swiglu"] = True
    elif activation == "squared_relu":
        f["--squared-relu"] = True
    if model.get("bias_activation_fusion") is False:
        f["--no-bias-gelu-fusion"] = True
    window = model.get("window_size")
    if window is not None:  # (left, right) tokens each query sees; Megatron's --window-size "L,R"
        f["--window-size"] = ",".join(str(w) for w in window)
    if tokenizer and isinstance(tokenizer.get("tokenizer_model"), str):
        f["--tokenizer-model"] = tokenizer["tokenizer_model"]
    return f


def bridge_model(model: dict, tokenizer: dict | None, path: str, notes: list[str]) -> ModelSpec | None:
    """The model a full config's ``model`` section states (None where it states no shape: an overrides file)."""
    if not states_model(model):
        return None
    window = model.get("window_size")
    problems = _whole(model, path, (*SHAPE_FIELDS, "ffn_hidden_size", "num_query_groups", "kv_channels",
                                    "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size"))
    if window is not None and not (isinstance(window, (list, tuple)) and len(window) == 2 and all(
            isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window)):
        problems.append(f"{path}: model.window_size must be [left, right] token counts (e.g. [127, 0]) or null, got "
                        f"{window!r}")
    if problems:
        raise InputError(problems, subject=FROM_SUBJECT)
    # Megatron-core's dropout default is 0.1 where the field is absent; a dump always holds it
    return megatron_model(megatron_flags(model, tokenizer), path, notes)
