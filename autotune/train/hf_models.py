"""Hugging Face transformers models built from a ModelSpec (for AutoTP and the HF Trainer).

AutoTP shards the ``nn.Linear`` layers of models it recognises (deepspeed/module_inject/auto_tp.py:
q/k/v/gate/up column-parallel, o_proj/down_proj row-parallel), so the AutoTP and HF trainers build a
transformers ``LlamaForCausalLM`` (Llama-style specs: RoPE, RMSNorm, SwiGLU; ``Qwen2ForCausalLM`` with Q/K/V
biases, ``Qwen3ForCausalLM`` with a per-head Q/K norm, ``MixtralForCausalLM`` / ``Qwen3MoeForCausalLM`` for MoE
specs their routers compute, ``DeepseekV3ForCausalLM`` / ``Glm4MoeForCausalLM`` for sigmoid-routed MoE specs with shared
experts (MLA: DeepSeek-V3, Kimi-K2, Moonlight; GQA: GLM-4.5), ``Gemma2ForCausalLM`` / ``Gemma3ForCausalLM`` for Gemma's
layer, HF trainer only) or ``GPT2LMHeadModel``
(GPT-2-style specs: learned positions, LayerNorm, GeLU, biases, tied embeddings, HF trainer only) with
the spec's sizes, so the parameter count is the spec's. Other architectures are refused by name.
"""

from __future__ import annotations

from autotune.engines.builtin_trainer import hf_model_family, hf_model_problem

__all__ = ["build_hf_model", "hf_model_problem"]


def _moe_fields(spec, family: str) -> dict:
    """The MoE block as MixtralConfig / Qwen3MoeConfig take it (their routers: a softmax over the top-k, or for
    Qwen3 without norm_topk_prob over every expert first), with the checkpoint's load-balancing loss
    (router_aux_loss_coef, output_router_logits on: the classes add it to the loss)."""
    moe = spec.moe
    if moe is None:
        return {}
    # the checkpoint's load-balancing loss, added to the loss where the model returns its router logits
    balancing = ({"output_router_logits": True, "router_aux_loss_coef": moe.aux_loss_coeff}
                 if moe.aux_loss_coeff else {})
    if family == "mixtral":  # every layer MoE, experts of intermediate_size
        return {"intermediate_size": moe.expert_ffn_hidden_size, "num_local_experts": moe.num_experts,
                "num_experts_per_tok": moe.top_k, **balancing}
    return {"moe_intermediate_size": moe.expert_ffn_hidden_size, "num_experts": moe.num_experts,
            "num_experts_per_tok": moe.top_k, "decoder_sparse_step": moe.moe_layer_step,
            "norm_topk_prob": not moe.router_pre_softmax, **balancing}


def rope_parameters(spec) -> dict:
    """transformers 5's ``rope_parameters`` of the spec's RoPE: its base, and its llama3 or linear scaling."""
    out = {"rope_type": spec.rope_scaling or "default", "rope_theta": spec.rope_theta}
    if spec.rope_scaling is not None:
        out["factor"] = spec.rope_scaling_factor
    if spec.rope_scaling == "llama3":
        out |= {"low_freq_factor": spec.rope_low_freq_factor, "high_freq_factor": spec.rope_high_freq_factor,
                "original_max_position_embeddings": spec.rope_original_max_positions}
    return out


def sigmoid_router_config(spec, family: str, seq_len: int):
    """DeepseekV3Config / Glm4MoeConfig of the spec (builtin_trainer._sigmoid_router_family): its dense leading
    layers, routed and shared experts (the shared ones as one MLP of their summed width, as both classes build them),
    the router's groups and scale, MLA's ranks and YaRN (DeepSeek) or the rotary share, Q/K norm and Q/K/V biases
    (GLM), the norms' eps (else the class's); no MTP module (transformers' num_mtp_layers: the trainer runs the
    next-token loss only)."""
    import transformers

    moe = spec.moe
    rope = rope_parameters(spec)
    if spec.rope_scaling == "yarn":  # DeepseekV3Attention scales its softmax by mscale_all_dim's factor squared
        stated = {"original_max_position_embeddings": spec.rope_original_max_positions,
                  "beta_fast": spec.yarn_beta_fast, "beta_slow": spec.yarn_beta_slow, "mscale": spec.yarn_mscale,
                  "mscale_all_dim": spec.yarn_mscale_all_dim, "truncate": spec.yarn_truncate is not False}
        rope |= {k: v for k, v in stated.items() if v is not None}  # unstated: transformers' YaRN defaults
    fields = dict(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.ffn_hidden_size,
                  num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_attention_heads,
                  num_key_value_heads=spec.kv_heads, moe_intermediate_size=moe.expert_ffn_hidden_size,
                  n_routed_experts=moe.num_experts, num_experts_per_tok=moe.top_k,
                  n_shared_experts=moe.num_shared_experts, first_k_dense_replace=moe.num_dense_layers,
                  routed_scaling_factor=moe.router_scaling_factor, n_group=moe.router_groups or 1,
                  topk_group=moe.router_group_topk or 1, norm_topk_prob=True, num_mtp_layers=0,
                  max_position_embeddings=max(seq_len, 8, spec.max_position_embeddings),
                  tie_word_embeddings=spec.tied_embeddings, attention_dropout=spec.dropout,
                  # the router logits, for the checkpoint's balancing loss (autotune.train.hf_balancing)
                  output_router_logits=bool(moe.aux_loss_coeff),
                  **({"rms_norm_eps": spec.norm_eps} if spec.norm_eps is not None else {}))
    if family == "deepseek_v3":
        m = spec.mla
        return transformers.DeepseekV3Config(**fields, q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank,
                                             qk_nope_head_dim=m.qk_nope_head_dim, qk_rope_head_dim=m.qk_rope_head_dim,
                                             v_head_dim=m.v_head_dim, rope_parameters=rope)
    return transformers.Glm4MoeConfig(**fields, head_dim=spec.attention_head_dim, attention_bias=True,
                                      use_qk_norm=spec.qk_norm == "head",
                                      rope_parameters=rope | {"partial_rotary_factor": spec.rotary_fraction})


def gemma_config(spec, family: str, seq_len: int):
    """Gemma2Config / Gemma3TextConfig of the spec: its layer types (sliding or full, ModelSpec.sliding_window_layers),
    its GeLU-tanh GeGLU, query scale, logit caps and RoPE (Gemma 3: the local layers' base, the global ones' linear
    scaling), at the spec's norm eps (else Gemma's 1e-6)."""
    import transformers

    layer_types = ["sliding_attention" if spec.is_local_attention_layer(i) else "full_attention"
                   for i in range(spec.num_layers)]
    fields = dict(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.ffn_hidden_size,
                  num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_attention_heads,
                  num_key_value_heads=spec.kv_heads, head_dim=spec.attention_head_dim,
                  hidden_activation="gelu_pytorch_tanh", max_position_embeddings=max(seq_len, 8,
                                                                                     spec.max_position_embeddings),
                  query_pre_attn_scalar=int(spec.query_pre_attn_scalar or spec.attention_head_dim),  # an int there
                  attn_logit_softcapping=spec.attn_logit_softcap, final_logit_softcapping=spec.final_logit_softcap,
                  sliding_window=spec.sliding_window or max(seq_len, 8), layer_types=layer_types,
                  attention_dropout=spec.dropout, tie_word_embeddings=True, rms_norm_eps=spec.norm_eps or 1e-6,
                  attn_implementation="eager" if spec.attn_logit_softcap is not None else "sdpa")
    if family == "gemma2":
        return transformers.Gemma2Config(**fields, rope_parameters=rope_parameters(spec))
    local = {"rope_type": "default", "rope_theta": spec.local_rope_theta or spec.rope_theta}
    return transformers.Gemma3TextConfig(**fields, rope_parameters={"sliding_attention": local,
                                                                    "full_attention": rope_parameters(spec)})


def _gemma_model(spec, family: str, seq_len: int):
    import transformers

    cls = transformers.Gemma2ForCausalLM if family == "gemma2" else transformers.Gemma3ForCausalLM
    return cls(gemma_config(spec, family, seq_len))


def build_hf_model(spec, *, seq_len: int, dtype, recompute: str = "none"):
    """The transformers causal LM of ``spec`` (weights seeded by torch's global RNG)."""

    family = hf_model_family(spec)
    assert family is not None, hf_model_problem(spec)
    if family in ("gemma2", "gemma3"):
        model = _gemma_model(spec, family, seq_len)
    elif family in ("deepseek_v3", "glm4_moe"):
        import transformers

        cls = transformers.DeepseekV3ForCausalLM if family == "deepseek_v3" else transformers.Glm4MoeForCausalLM
        model = cls(sigmoid_router_config(spec, family, seq_len))
    elif family in ("llama", "qwen2", "qwen3", "mixtral", "qwen3_moe"):
        import transformers

        prefix = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mixtral": "Mixtral", "qwen3_moe": "Qwen3Moe"}[
            family]
        config_class, model_class = (getattr(transformers, prefix + suffix) for suffix in ("Config", "ForCausalLM"))
        fields = dict(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                      intermediate_size=spec.ffn_hidden_size, num_hidden_layers=spec.num_layers,
                      num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.kv_heads,
                      head_dim=spec.attention_head_dim,
                      # (transformers wants a scaled RoPE's original context below it)
                      max_position_embeddings=max(seq_len, 8, spec.max_position_embeddings * bool(spec.rope_scaling)),
                      rope_parameters=rope_parameters(spec), tie_word_embeddings=spec.tied_embeddings,
                      attention_dropout=spec.dropout, attn_implementation="sdpa",
                      **({"attention_bias": False} if family in ("qwen3", "qwen3_moe") else {}),
                      **({"rms_norm_eps": spec.norm_eps} if spec.norm_eps is not None else {}))
        cfg = config_class(**(fields | _moe_fields(spec, family)))
        model = model_class(cfg)
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(vocab_size=spec.vocab_size, n_embd=spec.hidden_size, n_layer=spec.num_layers,
                         n_head=spec.num_attention_heads, n_inner=spec.ffn_hidden_size,
                         n_positions=spec.max_position_embeddings + spec.position_offset, resid_pdrop=spec.dropout,
                         embd_pdrop=spec.dropout, attn_pdrop=spec.dropout,
                         activation_function="gelu_new" if spec.activation == "gelu_tanh" else "gelu",
                         bos_token_id=0, eos_token_id=0, attn_implementation="sdpa",
                         **({"layer_norm_epsilon": spec.norm_eps} if spec.norm_eps is not None else {}))
        model = GPT2LMHeadModel(cfg)
    if recompute == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model.to(dtype) if dtype is not None else model
