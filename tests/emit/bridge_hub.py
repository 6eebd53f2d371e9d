"""The offline Hugging Face hub cache test_megatron_bridge_applied.py hands Bridge's library recipes
(``AutoBridge.from_hf_pretrained``, HF_HUB_OFFLINE=1): each recipe model's config.json with the fields of that
model's own file on the hub, the sizes written from autotune's preset, at the revision the recipe pins.

Weights-only fields (GPT-OSS's ``quantization_config``: mxfp4 experts) are left out: the recipes load no weights
(``to_megatron_provider(load_weights=False)``). Kimi-K2's repository ships its own config class (``auto_map``,
``trust_remote_code=True`` in the recipe): its configuration_deepseek.py is stood in by transformers' DeepseekV3Config
under Kimi's model_type, which holds the same fields.
"""

from __future__ import annotations

import json
from pathlib import Path

from autotune.emit.megatron_bridge import bridge_recipe
from autotune.specs.presets import load_model_preset

# The revisions recipes pin (Megatron-Bridge v0.6.0 recipes/qwen/h100/qwen3.py:29, qwen3_moe.py:29).
PINNED = {"qwen3-8b": "b968826d9c46dd6066d109eabc6255188de91218",
          "qwen3-30b-a3b": "ad44e777bcd18fa416d9da3bd8f70d33ebb85d39"}

# Kimi-K2's remote config class (moonshotai/Kimi-K2-Instruct configuration_deepseek.py: DeepseekV3Config with
# model_type "kimi_k2"), as transformers' own class of that architecture.
KIMI_CONFIG_PY = '''
from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config as _DeepseekV3Config


class DeepseekV3Config(_DeepseekV3Config):
    model_type = "kimi_k2"
'''


def hf_cache(root: Path) -> Path:
    """A hub cache holding the config.json of each library recipe's model, written from its preset."""
    for name, bos, eos, dtype in (("llama3-70b", 128000, 128001, "bfloat16"), ("llama3-8b", 128000, 128001, "bfloat16"),
                                  ("llama3-405b", 128000, 128001, "bfloat16"), ("llama2-7b", 1, 2, "float16")):
        _llama_config(root, name, bos, eos, dtype)
    _qwen2_config(root, "qwen2.5-72b")
    _qwen3_config(root, "qwen3-8b")
    for name in ("qwen3-30b-a3b", "qwen3-235b-a22b"):
        _qwen3_moe_config(root, name)
    _deepseek_config(root, "deepseek-v3")
    _deepseek_config(root, "kimi-k2")
    for name in ("gpt-oss-20b", "gpt-oss-120b"):
        _gpt_oss_config(root, name)
    return root


def _snapshot(root: Path, name: str, config: dict, files: dict[str, str] | None = None) -> None:
    """Preset ``name``'s recipe model's config.json (and ``files``) as the hub cache lays it out: one snapshot,
    refs/main naming it, under the commit the recipe pins (else zeros)."""
    m = load_model_preset(name)
    repo, revision = bridge_recipe(m).hf_model, PINNED.get(name, "0" * 40)
    assert repo is not None, name
    snap = root / ("models--" + repo.replace("/", "--")) / "snapshots" / revision
    snap.mkdir(parents=True)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text(revision)
    (snap / "config.json").write_text(json.dumps(config))
    for file, text in (files or {}).items():
        (snap / file).write_text(text)


def _llama_config(root: Path, name: str, bos: int, eos: int, dtype: str) -> None:
    """meta-llama's config.json (Llama 2 / 3 / 3.1: Llama 3.1's carries its RoPE scaling; Llama 2's weights are
    float16)."""
    m = load_model_preset(name)
    rope = None
    if m.rope_scaling == "llama3":
        rope = {"factor": m.rope_scaling_factor, "low_freq_factor": m.rope_low_freq_factor,
                "high_freq_factor": m.rope_high_freq_factor,
                "original_max_position_embeddings": m.rope_original_max_positions, "rope_type": "llama3"}
    _snapshot(root, name, {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": m.hidden_size,
        "intermediate_size": m.ffn_hidden_size, "num_attention_heads": m.num_attention_heads,
        "num_hidden_layers": m.num_layers, "num_key_value_heads": m.kv_heads, "vocab_size": m.vocab_size,
        "rope_theta": m.rope_theta, "rope_scaling": rope, "max_position_embeddings": m.max_position_embeddings,
        "rms_norm_eps": m.norm_eps, "tie_word_embeddings": m.tied_embeddings, "attention_bias": False,
        "mlp_bias": False, "pretraining_tp": 1, "torch_dtype": dtype, "hidden_act": "silu", "bos_token_id": bos,
        "eos_token_id": eos})


def _qwen2_config(root: Path, name: str) -> None:
    """Qwen/Qwen2.5-72B's config.json (QKV biases are the architecture's, not a field)."""
    m = load_model_preset(name)
    _snapshot(root, name, {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": m.vocab_size,
        "hidden_size": m.hidden_size, "intermediate_size": m.ffn_hidden_size, "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_attention_heads, "num_key_value_heads": m.kv_heads, "hidden_act": "silu",
        "max_position_embeddings": m.max_position_embeddings, "rms_norm_eps": m.norm_eps, "rope_theta": m.rope_theta,
        "use_sliding_window": False, "sliding_window": m.max_position_embeddings, "max_window_layers": m.num_layers,
        "tie_word_embeddings": m.tied_embeddings, "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "torch_dtype": "bfloat16"})


def _qwen3_config(root: Path, name: str) -> None:
    """Qwen/Qwen3-8B's config.json."""
    m = load_model_preset(name)
    _snapshot(root, name, {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": m.vocab_size,
        "hidden_size": m.hidden_size, "intermediate_size": m.ffn_hidden_size, "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_attention_heads, "num_key_value_heads": m.kv_heads,
        "head_dim": m.head_dim or m.hidden_size // m.num_attention_heads, "hidden_act": "silu",
        "max_position_embeddings": m.max_position_embeddings, "rms_norm_eps": m.norm_eps, "rope_theta": m.rope_theta,
        "rope_scaling": None, "use_sliding_window": False, "sliding_window": None, "max_window_layers": m.num_layers,
        "tie_word_embeddings": m.tied_embeddings, "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16"})


def _qwen3_moe_config(root: Path, name: str) -> None:
    """Qwen/Qwen3-30B-A3B's and Qwen/Qwen3-235B-A22B's config.json."""
    m = load_model_preset(name)
    moe = m.moe
    _snapshot(root, name, {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": m.vocab_size,
        "hidden_size": m.hidden_size, "intermediate_size": m.ffn_hidden_size,
        "moe_intermediate_size": moe.expert_ffn_hidden_size, "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_attention_heads, "num_key_value_heads": m.kv_heads, "head_dim": m.head_dim,
        "num_experts": moe.num_experts, "num_experts_per_tok": moe.top_k, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "norm_topk_prob": True, "router_aux_loss_coef": moe.aux_loss_coeff,
        "hidden_act": "silu", "max_position_embeddings": m.max_position_embeddings, "rms_norm_eps": m.norm_eps,
        "rope_theta": m.rope_theta, "tie_word_embeddings": m.tied_embeddings, "attention_bias": False,
        "max_window_layers": m.num_layers, "use_sliding_window": False, "sliding_window": None,
        "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16"})


def _deepseek_config(root: Path, name: str) -> None:
    """deepseek-ai/DeepSeek-V3's config.json, and moonshotai/Kimi-K2-Instruct's (the same architecture: model_type
    kimi_k2 with its own config class, one router group, no MTP layer)."""
    m = load_model_preset(name)
    moe, mla = m.moe, m.mla
    kimi = name == "kimi-k2"
    config = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2" if kimi else "deepseek_v3",
        "vocab_size": m.vocab_size, "hidden_size": m.hidden_size, "intermediate_size": m.ffn_hidden_size,
        "moe_intermediate_size": moe.expert_ffn_hidden_size, "num_hidden_layers": m.num_layers,
        "num_nextn_predict_layers": m.num_mtp_layers, "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.kv_heads, "n_shared_experts": moe.num_shared_experts,
        "n_routed_experts": moe.num_experts, "routed_scaling_factor": moe.router_scaling_factor,
        "kv_lora_rank": mla.kv_lora_rank, "q_lora_rank": mla.q_lora_rank, "qk_rope_head_dim": mla.qk_rope_head_dim,
        "v_head_dim": mla.v_head_dim, "qk_nope_head_dim": mla.qk_nope_head_dim, "topk_method": "noaux_tc",
        "n_group": moe.router_groups or 1, "topk_group": moe.router_group_topk or 1,
        "num_experts_per_tok": moe.top_k, "moe_layer_freq": 1, "first_k_dense_replace": moe.num_dense_layers,
        "norm_topk_prob": True, "scoring_func": moe.router_score, "aux_loss_alpha": moe.aux_loss_coeff,
        "seq_aux": moe.aux_loss_per_sequence, "hidden_act": "silu",
        "max_position_embeddings": m.max_position_embeddings, "rms_norm_eps": m.norm_eps, "rope_theta": m.rope_theta,
        "rope_scaling": {"beta_fast": m.yarn_beta_fast, "beta_slow": m.yarn_beta_slow,
                         "factor": m.rope_scaling_factor, "mscale": m.yarn_mscale,
                         "mscale_all_dim": m.yarn_mscale_all_dim,
                         "original_max_position_embeddings": m.rope_original_max_positions, "type": "yarn"},
        "tie_word_embeddings": m.tied_embeddings, "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 163584 if kimi else 0, "eos_token_id": 163585 if kimi else 1, "torch_dtype": "bfloat16"}
    if kimi:
        config["auto_map"] = {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                              "AutoModel": "modeling_deepseek.DeepseekV3Model",
                              "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"}
    _snapshot(root, name, config, {"configuration_deepseek.py": KIMI_CONFIG_PY} if kimi else None)


def _gpt_oss_config(root: Path, name: str) -> None:
    """openai/gpt-oss-20b's and openai/gpt-oss-120b's config.json (without the weights' quantization_config)."""
    m = load_model_preset(name)
    moe = m.moe
    _snapshot(root, name, {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": m.vocab_size,
        "hidden_size": m.hidden_size, "intermediate_size": moe.expert_ffn_hidden_size,
        "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.kv_heads, "head_dim": m.head_dim, "num_local_experts": moe.num_experts,
        "num_experts_per_tok": moe.top_k, "experts_per_token": moe.top_k,
        "router_aux_loss_coef": moe.aux_loss_coeff, "output_router_logits": False, "hidden_act": "silu",
        "swiglu_limit": m.activation_clamp, "sliding_window": m.sliding_window,
        "layer_types": ["sliding_attention" if i in m.sliding_window_layers else "full_attention"
                        for i in range(m.num_layers)],
        "max_position_embeddings": m.max_position_embeddings, "initial_context_length": m.rope_original_max_positions,
        "rms_norm_eps": m.norm_eps, "rope_theta": m.rope_theta,
        "rope_scaling": {"beta_fast": m.yarn_beta_fast, "beta_slow": m.yarn_beta_slow,
                         "factor": m.rope_scaling_factor,
                         "original_max_position_embeddings": m.rope_original_max_positions, "rope_type": "yarn",
                         "truncate": m.yarn_truncate},
        "tie_word_embeddings": m.tied_embeddings, "attention_bias": True, "attention_dropout": 0.0,
        "pad_token_id": 199999, "eos_token_id": 200002, "torch_dtype": "bfloat16"})
