"""Megatron-Bridge 0.6 base recipes: which recipe function a model's overrides start from.

A model preset whose shape is the Hugging Face config a Bridge library recipe loads gets that recipe (its H100
pretraining recipe, ``megatron.bridge.recipes``); any other model gets the generic GPT recipe (``vanilla_gpt``), whose
model shape the overrides set, unless it has a feature that recipe's GPTModelProvider cannot take.
Sources: NVIDIA-NeMo/Megatron-Bridge@6124fbe38a68eea9c4f4be3aa5e084bd5d461d98 (r0.6.0)
``src/megatron/bridge/recipes/{llama,qwen,deepseek,kimi,gpt_oss,gpt}/h100/*.py``, ``recipes/common.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autotune.emit.megatron_attention import no_rope_freq, rope_scaling_problem
from autotune.emit.megatron_model_flags import fp32_routing
from autotune.errors import InputError
from autotune.specs.gemma_parts import gemma_parts
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model_preset, preset_matching

__all__ = ["BridgeRecipe", "RECIPES", "GENERIC", "bridge_recipe", "bridge_model_problems", "generic_model_fields"]


@dataclass(frozen=True, slots=True)
class BridgeRecipe:
    name: str
    """The recipe function (run_recipe.py ``--recipe``), exported by ``megatron.bridge.recipes``."""
    module: str
    hf_model: str | None
    """The Hugging Face config the recipe builds its model from (``AutoBridge.from_hf_pretrained``); None: the
    generic GPT recipe, whose model shape the overrides set."""
    precision_is_named: bool
    """The recipe's ``mixed_precision`` is a registered recipe name (``recipes/common.py _pretrain_common``:
    "bf16_mixed"), not a MixedPrecisionConfig: only another name replaces it."""
    comm_overlap: bool
    """The recipe sets a CommOverlapConfig (else ``comm_overlap`` is None, which no override can fill)."""


# Model presets whose shape is the Hugging Face config the library recipe loads (their H100 pretraining recipes).
_R = "megatron.bridge.recipes"
_LLAMA_H100 = f"{_R}.llama.h100"
RECIPES: dict[str, BridgeRecipe] = {
    "llama3-8b": BridgeRecipe("llama3_8b_pretrain_2gpu_h100_bf16_config", f"{_LLAMA_H100}.llama3",
                              "meta-llama/Meta-Llama-3-8B", precision_is_named=True, comm_overlap=False),
    "llama3-70b": BridgeRecipe("llama3_70b_pretrain_32gpu_h100_bf16_config", f"{_LLAMA_H100}.llama3",
                               "meta-llama/Meta-Llama-3-70B", precision_is_named=False, comm_overlap=True),
    "llama3-405b": BridgeRecipe("llama31_405b_pretrain_256gpu_h100_bf16_config", f"{_LLAMA_H100}.llama3",
                                "meta-llama/Meta-Llama-3.1-405B", precision_is_named=False, comm_overlap=True),
    "llama2-7b": BridgeRecipe("llama2_7b_pretrain_2gpu_h100_bf16_config", f"{_LLAMA_H100}.llama2",
                              "meta-llama/Llama-2-7b-hf", precision_is_named=True, comm_overlap=True),
    # Read from the recipes' source (precision and comm_overlap as each sets them). Every recipe here and the generic
    # one is built by tests/emit/test_megatron_bridge_applied.py (Bridge 0.6.2, from hub configs written from the
    # presets at the revisions the recipes pin), which applies the overrides and runs Bridge's validate().
    "qwen2.5-72b": BridgeRecipe("qwen25_72b_pretrain_32gpu_h100_bf16_config", f"{_R}.qwen.h100.qwen2",
                                "Qwen/Qwen2.5-72B", precision_is_named=True, comm_overlap=False),
    "qwen3-8b": BridgeRecipe("qwen3_8b_pretrain_4gpu_h100_bf16_config", f"{_R}.qwen.h100.qwen3", "Qwen/Qwen3-8B",
                             precision_is_named=True, comm_overlap=False),
    "qwen3-30b-a3b": BridgeRecipe("qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", f"{_R}.qwen.h100.qwen3_moe",
                                  "Qwen/Qwen3-30B-A3B", precision_is_named=False, comm_overlap=True),
    "qwen3-235b-a22b": BridgeRecipe("qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config", f"{_R}.qwen.h100.qwen3_moe",
                                    "Qwen/Qwen3-235B-A22B", precision_is_named=True, comm_overlap=False),
    "deepseek-v3": BridgeRecipe("deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config",
                                f"{_R}.deepseek.h100.deepseek_v3", "deepseek-ai/DeepSeek-V3",
                                precision_is_named=False, comm_overlap=True),
    "kimi-k2": BridgeRecipe("kimi_k2_pretrain_512gpu_h100_bf16_config", f"{_R}.kimi.h100.kimi_k2",
                            "moonshotai/Kimi-K2-Instruct", precision_is_named=False, comm_overlap=True),
    "gpt-oss-20b": BridgeRecipe("gpt_oss_20b_pretrain_16gpu_h100_bf16_config", f"{_R}.gpt_oss.h100.gpt_oss",
                                "openai/gpt-oss-20b", precision_is_named=True, comm_overlap=False),
    "gpt-oss-120b": BridgeRecipe("gpt_oss_120b_pretrain_64gpu_h100_bf16_config", f"{_R}.gpt_oss.h100.gpt_oss",
                                 "openai/gpt-oss-120b", precision_is_named=True, comm_overlap=False),
}
# vanilla_gpt: a bare GPTModelProvider with Megatron-LM's pretrain_gpt.py defaults, mixed_precision "bf16_mixed".
GENERIC = BridgeRecipe("vanilla_gpt_pretrain_1gpu_h100_bf16_config", "megatron.bridge.recipes.gpt.h100.vanilla_gpt",
                       None, precision_is_named=True, comm_overlap=False)


def bridge_model_problems(model: ModelSpec) -> list[str]:
    """Why Bridge 0.6 cannot build the model (no recipe for it, and features the generic GPT recipe lacks); empty
    when it can."""
    if bridge_recipe(model).hf_model is not None:
        return []
    return [f"model: {model.name} has {why}; Megatron-Bridge 0.6 has no recipe for {model.name}"
            for why in _unexpressible(model)]


def bridge_recipe(model: ModelSpec) -> BridgeRecipe:
    """The base recipe for the model: its family's library recipe where Bridge 0.6 has one (for the preset itself:
    a model named like a preset but shaped otherwise is not the recipe's), else the generic GPT recipe."""
    name = preset_matching(model, tuple(RECIPES))  # a config.json of the preset's model too
    if name is None:
        return GENERIC
    try:
        return RECIPES[name] if load_model_preset(name) == replace(model, name=name) else GENERIC
    except InputError:
        return GENERIC


def _unexpressible(model: ModelSpec) -> list[str]:
    """Model features the generic GPT recipe's GPTModelProvider has no override for."""
    why = []
    if model.mla is not None:
        why.append("multi-latent attention (the generic recipe builds a GPTModelProvider; MLA needs Bridge's "
                   "MLAModelProvider, a DeepSeek/Kimi recipe)")
    if model.position_embedding == "alibi":
        why.append("ALiBi position embeddings (model.position_embedding_type: learned_absolute, rope, yarn, "
                   "mrope, relative, none)")
    if model.norms_per_layer != 2:
        why.append(f"{model.norms_per_layer} norm(s) per layer (GPTModelProvider's layer is pre-norm with two)")
    if model.embedding_norm:
        why.append("an embedding norm")
    if model.post_norm:
        why.append("norms on the attention and MLP outputs (OLMo 2)")
    if model.activation == "relu":
        why.append("a ReLU MLP (OPT)")
    if model.parallel_residual:
        why.append("attention and MLP side by side (parallel residual)")
    if model.attention_sinks or model.chunked_attention or model.sliding_window is not None:
        why.append("sliding-window, chunked or sink attention")
    if model.qk_norm == "full":  # "head" and "l2" are TransformerConfig's qk_layernorm / qk_l2_norm
        why.append("a Q/K norm over all heads at once (TransformerConfig's qk_layernorm normalises each head)")
    if model.num_mtp_layers:
        why.append("multi-token prediction layers")
    if model.attention_output_bias and not model.linear_bias:
        why.append("an attention output bias without MLP biases (add_bias_linear biases every linear)")
    if model.rope_scaling == "yarn" or (model.rope_scaling == "llama3" and rope_scaling_problem(model)):
        why.append("YaRN RoPE scaling (Bridge's YaRN providers)" if model.rope_scaling == "yarn" else
                   "llama3 RoPE scaling other than Llama 3.1's (Megatron-core fixes low / high 1 / 4, context 8192)")
    return why + gemma_parts(model, zero_centered_norms=True)  # TransformerConfig.layernorm_zero_centered_gamma


_BRIDGE_ACTIVATION = {"swiglu": "silu", "gelu": "gelu", "gelu_tanh": "fast_gelu", "squared_relu": "squared_relu"}
"""ModelSpec.activation -> the activation_func name Bridge restores (utils/activation_map.py ACTIVATION_FUNC_MAP at
067f987: gelu is F.gelu, fast_gelu megatron.core.activations' tanh form, squared_relu)."""


def generic_model_fields(model: ModelSpec) -> dict:
    """The model as GPTModelProvider / TransformerConfig fields: what the generic recipe's model is given (a
    library recipe builds its own); :func:`_unexpressible` names what it cannot be given."""
    out: dict = {"num_layers": model.num_layers, "hidden_size": model.hidden_size,
                 "ffn_hidden_size": model.ffn_hidden_size, "num_attention_heads": model.num_attention_heads,
                 "num_query_groups": model.kv_heads,
                 "kv_channels": model.head_dim or model.hidden_size // model.num_attention_heads,
                 "normalization": "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
                 # activation_func is restored from its name (omegaconf_utils _SERIALIZABLE_CALLABLE_FIELDS).
                 "activation_func": _BRIDGE_ACTIVATION.get(model.activation, "gelu"),
                 "gated_linear_unit": model.activation == "swiglu",
                 "position_embedding_type": "rope" if model.position_embedding == "rope" else "learned_absolute",
                 "rotary_base": model.rope_theta, "rotary_percent": model.rotary_fraction,
                 "share_embeddings_and_output_weights": model.tied_embeddings,
                 "add_bias_linear": model.linear_bias, "add_qkv_bias": model.qkv_bias or model.linear_bias,
                 "hidden_dropout": model.dropout, "attention_dropout": model.dropout,
                 "vocab_size": model.vocab_size}
    if model.rope_scaling == "llama3":  # GPTModelProvider.rope_scaling: Megatron-core's llama3 scaling (1 / 4 / 8192)
        out |= {"rope_scaling": True, "rope_scaling_factor": model.rope_scaling_factor}
    elif model.rope_scaling == "linear":  # positions divided by it (RotaryEmbedding seq_len_interpolation_factor)
        out["seq_len_interpolation_factor"] = model.rope_scaling_factor
    if model.activation in ("gelu", "gelu_tanh", "squared_relu"):  # the named function as it is: no fused bias-GeLU
        out["bias_activation_fusion"] = False
    if (nope := no_rope_freq(model)) is not None:  # rotary-free (NoPE) layers: the value Megatron-LM's --no-rope-freq
        # takes, an int N (every Nth layer) or the 0/1 list, 1 = no RoPE (megatron-core core_v0.19.0
        # transformer_config.py:284, its __post_init__ :2813-2830; attention.py:1321 skips RoPE where it is 1), as
        # Bridge's own EXAONE bridges fill it (v0.6.2 models/exaone/exaone_moe/exaone_moe_bridge.py:62-69)
        out["no_rope_freq"] = nope
    if model.norm_zero_centered:  # norms multiplying by (1 + weight)
        out["layernorm_zero_centered_gamma"] = True
    if model.norm_eps is not None:  # TransformerConfig.layernorm_epsilon (default 1e-5)
        out["layernorm_epsilon"] = model.norm_eps
    if model.qk_norm in ("head", "l2"):  # TransformerConfig.qk_layernorm / qk_l2_norm (ModelSpec.qk_norm's "full": no)
        out["qk_layernorm" if model.qk_norm == "head" else "qk_l2_norm"] = True
    if model.moe is not None:
        moe = model.moe
        out |= {"num_moe_experts": moe.num_experts, "moe_router_topk": moe.top_k,
                "moe_ffn_hidden_size": moe.expert_ffn_hidden_size, "moe_grouped_gemm": True,
                "moe_shared_expert_intermediate_size": (moe.num_shared_experts * moe.shared_width
                                                        if moe.num_shared_experts else None),
                # TransformerConfig.moe_layer_freq: 1 (every layer) or the per-layer 0/1 list (dense prefix,
                # interleaved dense/MoE layers: ModelSpec.is_moe_layer, as megatron_args' --moe-layer-freq)
                "moe_layer_freq": [int(model.is_moe_layer(i)) for i in range(model.num_layers)]
                if moe.num_dense_layers or moe.moe_layer_step != 1 else 1}
        # The router as megatron_args' router_flags writes it, in TransformerConfig's fields.
        out |= {"moe_router_score_function": moe.router_score,
                "moe_router_enable_expert_bias": moe.router_bias and moe.router_score != "softmax",
                "moe_router_pre_softmax": moe.router_pre_softmax, "moe_router_num_groups": moe.router_groups,
                "moe_router_group_topk": moe.router_group_topk,
                "moe_router_topk_scaling_factor": moe.router_scaling_factor if moe.router_scaling_factor != 1.0
                else None}
        if moe.router_probs_on_input:
            out["moe_apply_probs_on_input"] = True
        if moe.shared_expert_gate:
            out["moe_shared_expert_gate"] = True
        if fp32_routing(moe):
            out["moe_router_dtype"] = "fp32"
        if moe.aux_loss_coeff is not None:  # TransformerConfig's load-balancing loss (its weight defaults to 0)
            out |= {"moe_aux_loss_coeff": moe.aux_loss_coeff,
                    "moe_router_load_balancing_type": "seq_aux_loss" if moe.aux_loss_per_sequence else "aux_loss"}
    return out
