"""Megatron-LM flags for the model itself: its shape, MLP activation, Q/K norms, attention variants
(``emit.megatron_attention``) and mixture of experts with its router, and what of the model Megatron-LM's GPT model
cannot build. Megatron-LM ``NVIDIA/Megatron-LM@d98e8a6``; flags of megatron-core 0.16-0.19 (the flag tables).
``emit.megatron`` writes them with the plan's parallel, precision and run flags, and re-exports these names.
"""

from __future__ import annotations

from autotune.emit.megatron_attention import (chunked_attention_problem, position_and_attention_flags,
                                              rope_scaling_problem)
from autotune.emit.megatron_attention import flag_number as _num
from autotune.specs.gemma_parts import gemma_parts
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["activation_flags", "moe_layer_pattern", "layer_norms_problem", "architecture_problems", "shape_flags",
           "router_flags", "router_bias_gap", "balancing_flags", "norm_eps_flags", "MEGATRON_NORM_EPS",
           "fp32_routing"]


MEGATRON_NORM_EPS = 1e-5
"""Megatron-LM's --norm-epsilon default (arguments.py, core 0.16-0.19) and Megatron-DeepSpeed's --layernorm-epsilon
one: what the norms run with when no flag says otherwise."""


def norm_eps_flags(model: ModelSpec, flag: str) -> list[str]:
    """``[flag, eps]`` where the checkpoint's norm epsilon is not Megatron's default (Qwen3, DeepSeek-V3, Gemma:
    1e-6); none where it is, or where the model states none."""
    eps = model.norm_eps
    return [] if eps is None or eps == MEGATRON_NORM_EPS else [flag, repr(float(eps))]


def activation_flags(model: ModelSpec) -> list[str]:
    """The MLP's activation: SwiGLU, GeLU (Megatron's default), or GPT-OSS's clamped GLU (``activation_clamp``, read
    from gpt_oss configs only): transformers GptOssExperts computes (up + 1) * gate * sigmoid(1.702 gate) with gate
    and up clamped to the limit, i.e. Megatron-core's quick_gelu GLU with glu_linear_offset 1 and
    activation_func_clamp_value the limit, as Megatron-Bridge's GPT-OSS bridge sets them (gpt_oss_bridge.py:81-84 at
    067f987; --quick-geglu: arguments.py:2452, argument_utils.py:323-326 at d98e8a6)."""
    if model.activation in ("gelu", "squared_relu"):
        # exact GeLU and squared ReLU need the bias-GeLU fusion off where there are biases: the fused kernel is
        # GeLU's tanh form, and the fused path takes GeLU only (mlp.py: "Only support fusion of gelu and swiglu");
        # without biases Megatron turns it off itself (arguments.py: not add_bias_linear -> bias_gelu_fusion False)
        return ((["--squared-relu"] if model.activation == "squared_relu" else [])
                + (["--no-bias-gelu-fusion"] if model.linear_bias else []))
    if model.activation != "swiglu":
        return []  # gelu_tanh with biases: the default fused bias-GeLU (fused_bias_gelu.py, the tanh form)
    if model.activation_clamp is not None:
        return ["--quick-geglu", "--activation-func-clamp-value", _num(model.activation_clamp),
                "--glu-linear-offset", "1"]
    return ["--swiglu"]


def moe_layer_pattern(model: ModelSpec) -> str:
    """Megatron's --moe-layer-freq list expression: leading dense layers, then MoE layers; with a
    moe_layer_step above 1 (Llama 4 Maverick: dense and MoE layers alternate), the per-layer list."""
    assert model.moe is not None
    if model.moe.moe_layer_step != 1:
        return "[" + ",".join("1" if model.is_moe_layer(i) else "0" for i in range(model.num_layers)) + "]"
    dense, moe = model.moe.num_dense_layers, model.num_moe_layers
    return f"([0]*{dense}+[1]*{moe})"


def layer_norms_problem(model: ModelSpec) -> str | None:
    """Why Megatron's GPT layer cannot take the model's norms (None where it can): the layer is pre-norm with two
    norms (megatron/core/transformer/transformer_layer.py: input_layernorm, pre_mlp_layernorm). The engines' rules
    ask it too, so the planner proposes no plan whose arguments this writer refuses."""
    if model.norms_per_layer == 2 and model.parallel_residual:
        return (f"{model.name} runs attention and MLP side by side on the layer's input (parallel residual, "
                f"GPT-NeoX / Falcon); Megatron's GPT layer runs them one after the other")
    if model.norms_per_layer == 2:
        return None
    kind = ("one norm shared by a parallel attention and MLP block" if model.norms_per_layer == 1
            else "post-norms beside the pre-norms (Gemma 2/3's sandwich)")
    return (f"{model.name} has {model.norms_per_layer} norm(s) per layer ({kind}); Megatron-LM's GPT layer is "
            f"pre-norm with two")


def architecture_problems(model: ModelSpec, *, megatron_core: bool = True) -> list[str]:
    """What of the model Megatron-LM's GPT model cannot build (empty where it can); the megatron engine's rules ask
    it too, so the planner proposes no plan whose arguments this writer refuses. ``megatron_core`` False: the part
    Megatron-DeepSpeed's GPT model shares (:func:`megatron_core_problems` left out)."""
    out = []
    if model.position_embedding == "alibi":
        out.append(f"{model.name} uses ALiBi, which Megatron's GPT model does not implement (position embeddings: "
                   f"learned_absolute, rope, yarn, mrope, relative, none): train it with a DeepSpeed script")
    norms = layer_norms_problem(model)
    if norms:
        out.append(norms)
    if model.embedding_norm:
        out.append(f"{model.name} normalises the embeddings (BLOOM); Megatron-LM's GPT has no embedding norm")
    if model.post_norm:
        out.append(f"{model.name} normalises the attention and MLP outputs (OLMo 2's post-norm layers); Megatron-LM's "
                   "GPT layer normalises their inputs")
    if model.activation == "relu":  # arguments.py: --swiglu, --openai-gelu, --squared-relu, --quick-geglu; no ReLU
        out.append(f"{model.name}'s MLP is ReLU (OPT); Megatron-LM's flags build GeLU, SwiGLU, squared ReLU or "
                   "quick-GeGLU, not ReLU")
    if model.qk_norm == "full":
        out.append(f"{model.name} normalises Q and K over all heads at once (OLMo 2); Megatron-LM's --qk-layernorm "
                   "normalises each head")
    if model.attention_output_bias and not model.linear_bias:
        out.append(f"{model.name} has an attention output bias without MLP biases (Llama's attention_bias); "
                   "Megatron-LM's --add-bias-linear biases every linear layer, --add-qkv-bias Q/K/V only")
    return out + (megatron_core_problems(model) if megatron_core else [])


def megatron_core_problems(model: ModelSpec) -> list[str]:
    """What of the model Megatron-LM's flags cannot build that Megatron-DeepSpeed's may (it lists its own):
    GeLU's tanh form without biases, RoPE scaling other than Megatron-core's, Gemma's layer parts."""
    out = []
    if model.activation == "gelu_tanh" and not model.linear_bias:
        out.append(f"{model.name}'s MLP is GeLU's tanh form without biases; Megatron-LM then runs F.gelu, the exact "
                   "form (its tanh form is the fused bias-GeLU; --openai-gelu sets nothing in Megatron-core 0.16-0.19)")
    if scaling := rope_scaling_problem(model):
        out.append(scaling)
    # (1 + weight) norms are --apply-layernorm-1p (TransformerConfig.layernorm_zero_centered_gamma); GeGLU would be
    # F.gelu's exact form (argument_utils.py: only --swiglu / --quick-geglu choose a gated activation)
    return out + [f"{model.name} has {part}; Megatron-LM's GPT model does not" for part in
                  gemma_parts(model, zero_centered_norms=True)]


def shape_flags(model: ModelSpec, plan: ParallelPlan, problems: list[str]) -> list[str]:
    """Model shape for Megatron-LM (core_v0.16 pretrain_gpt.py)."""
    problems += architecture_problems(model)
    if chunked := chunked_attention_problem(model, plan.seq_len):
        problems.append(chunked)
    max_pos = model.max_position_embeddings
    if model.position_embedding == "learned" and plan.seq_len > max_pos:
        problems.append(f"seq_len {plan.seq_len} exceeds the learned position table ({max_pos} rows): "
                        f"Megatron needs --max-position-embeddings >= --seq-length")
    args = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
            "--num-attention-heads", str(model.num_attention_heads), "--ffn-hidden-size", str(model.ffn_hidden_size),
            "--seq-length", str(plan.seq_len),  # the table's rows, an offset's (OPT's 2) included: the same parameters
            "--max-position-embeddings", str(max(max_pos + model.position_offset, plan.seq_len))]
    explicit_head_dim = model.head_dim is not None and model.head_dim * model.num_attention_heads != model.hidden_size
    if explicit_head_dim and model.mla is None:
        args += ["--kv-channels", str(model.head_dim)]
    if model.mla is None and model.kv_heads < model.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.kv_heads)]
    if model.mla is not None:
        m = model.mla
        args += ["--multi-latent-attention", "--kv-lora-rank", str(m.kv_lora_rank), "--qk-head-dim",
                 str(m.qk_nope_head_dim), "--qk-pos-emb-head-dim", str(m.qk_rope_head_dim), "--v-head-dim",
                 str(m.v_head_dim)]
        if m.q_lora_rank is not None:
            args += ["--q-lora-rank", str(m.q_lora_rank)]
    args += activation_flags(model)
    args += ["--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"]
    args += norm_eps_flags(model, "--norm-epsilon")
    if model.norm_zero_centered:
        args.append("--apply-layernorm-1p")
    if model.qk_norm == "head":
        # TransformerConfig.qk_layernorm: the layer's norm (RMSNorm) over each head's width, as Qwen3 / GLM-4.5's
        # per-head Q/K RMSNorm (megatron/core/transformer/attention.py q_layernorm / k_layernorm)
        args.append("--qk-layernorm")
    elif model.qk_norm == "l2":
        # TransformerConfig.qk_l2_norm: L2Norm (x / rms(x), no weights) on each head's Q and K, Llama 4 Scout's
        # use_qk_norm (attention.py:1709 at d98e8a6). Megatron-LM puts it on every layer; transformers only on the
        # rotary ones, so the --no-rope-freq layers differ from Meta's checkpoint there (no weight, no cost: the
        # planned step is the same). A rotation keeps a vector's norm, so before or after RoPE is one result.
        args.append("--qk-l2-norm")
    args += position_and_attention_flags(model)
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not model.linear_bias:
        args.append("--disable-bias-linear")
        if model.qkv_bias:
            args.append("--add-qkv-bias")
    args += ["--attention-dropout", _num(model.dropout), "--hidden-dropout", _num(model.dropout)]
    if model.moe is not None:
        moe = model.moe
        args += ["--num-experts", str(moe.num_experts), "--moe-router-topk", str(moe.top_k),
                 "--moe-ffn-hidden-size", str(moe.expert_ffn_hidden_size), "--moe-grouped-gemm"]
        if moe.num_shared_experts:
            args += ["--moe-shared-expert-intermediate-size", str(moe.num_shared_experts * moe.shared_width)]
            if moe.shared_expert_gate:  # TransformerConfig.moe_shared_expert_gate: SharedExpertMLP's gate_weight
                args.append("--moe-shared-expert-gate")
        if moe.num_dense_layers or moe.moe_layer_step != 1:
            args += ["--moe-layer-freq", moe_layer_pattern(model)]
        args += router_flags(moe) + balancing_flags(moe)
    return args


def balancing_flags(moe) -> list[str]:
    """The load-balancing loss the checkpoint was trained with (MoESpec.aux_loss_coeff): Megatron-core's
    --moe-aux-loss-coeff defaults to 0, no such loss, and --moe-router-load-balancing-type to aux_loss (over the
    micro-batch); DeepSeek's seq_aux is seq_aux_loss (arguments.py, core 0.16-0.19). None stated: nothing written."""
    if moe.aux_loss_coeff is None:
        return []
    kind = ["--moe-router-load-balancing-type", "seq_aux_loss"] if moe.aux_loss_per_sequence else []
    return kind + ["--moe-aux-loss-coeff", _num(moe.aux_loss_coeff)]


def router_bias_gap(model: ModelSpec) -> str | None:
    """What of a softmax router's routing bias Megatron-LM's arguments leave out (None: nothing). A softmax router's
    bias is its linear layer's, built with --add-bias-linear (GPT-OSS); without linear biases (ERNIE 4.5's
    selection-only e_score_correction_bias) Megatron-core builds none, and its expert bias
    (--moe-router-enable-expert-bias) takes sigmoid or sqrtsoftplus scores only (transformer_config.py:2617-2625)."""
    moe = model.moe
    if moe is None or not moe.router_bias or moe.router_score != "softmax" or model.linear_bias:
        return None
    return (f"megatron_args.sh (and Bridge's overrides) route {model.name}'s experts by the softmax alone, without "
            f"its per-expert routing bias ({moe.num_experts} values per MoE layer; Megatron-core's expert bias takes "
            "sigmoid scores only)")


def router_flags(moe) -> list[str]:
    """The router as the model computes it (MoESpec.router_*; Megatron-core's topk_routing_with_score_function,
    Megatron-LM @d98e8a6 megatron/core/transformer/moe/moe_utils.py:900-929). A sigmoid router's routing bias is
    aux-loss-free balancing's expert bias (DeepSeek-V3, arXiv:2412.19437 §2.1.2); a softmax router's (GPT-OSS) is its
    linear layer's, which Megatron-core builds with the other biases (router.py:67-72, add_bias_linear)."""
    args = []
    if moe.router_score != "softmax":
        args += ["--moe-router-score-function", moe.router_score]
        if moe.router_bias:
            args.append("--moe-router-enable-expert-bias")
    if moe.router_pre_softmax:
        args.append("--moe-router-pre-softmax")
    if moe.router_groups is not None:
        args += ["--moe-router-num-groups", str(moe.router_groups), "--moe-router-group-topk",
                 str(moe.router_group_topk)]
    if moe.router_scaling_factor != 1.0:
        args += ["--moe-router-topk-scaling-factor", _num(moe.router_scaling_factor)]
    if moe.router_probs_on_input:  # TransformerConfig.moe_apply_probs_on_input (transformer_config.py:949)
        args.append("--moe-apply-probs-on-input")
    if fp32_routing(moe):
        args += ["--moe-router-dtype", "fp32"]
    return args


ROUTER_FP32_EXPERTS = 32
"""From this many experts the router runs in fp32: Megatron-core warns below it "Using a large number of experts
(e.g. >=32) without fp32 routing. Consider enabling moe_router_dtype for better numerical stability."
(transformer_config.py:2794-2802 in core 0.19), and Megatron-Bridge's DeepSeek-V3, GLM-4.5 and Kimi bridges set
moe_router_dtype "fp32" (v0.6.0 models/deepseek/deepseek_v3_bridge.py:75, glm/glm45_bridge.py:77,
kimi/kimi_bridge.py:63). The router GEMM then runs in fp32 on the saved bf16 input (RouterGatingLinearFunction
saves its input as it came, moe_utils.py): nothing the cost model counts changes."""


def fp32_routing(moe) -> bool:
    return moe.num_experts >= ROUTER_FP32_EXPERTS
