"""What autotune's built-in trainers (``python -m autotune.train``) refuse to run, decided from the plan alone.

The engines ask it (``Engine.builtin_trainer_problem``) so that plan.md says when the launch scripts' default
program cannot run the plan; the trainers ask it before they start (``UNSUPPORTED``, exit 2), so both say the same.
The trainers themselves (torch, DeepSpeed, transformers) live in ``autotune.train``.
"""

from __future__ import annotations

from autotune.specs.gemma_parts import gemma_parts
from autotune.specs.layout import layer_counts, virtual_layout
from autotune.specs.model import ModelSpec
from autotune.specs.model_parts import local_attention_below
from autotune.specs.plan import ParallelPlan

__all__ = ["CP_REFUSED", "window_problem", "built_model_problem", "fsdp_trainer_problem", "deepspeed_trainer_problem",
           "hf_trainer_problem", "hf_model_family", "hf_model_problem", "pipeline_stage_problem", "stage_layer_counts",
           "HF_OWN_BALANCING"]

# Measured here (torch 2.13.0+cpu, gloo, 2 ranks): context_parallel(mesh, buffers=[x], buffer_seq_dims=[1])
# around scaled_dot_product_attention raises "NotImplementedError: Operator
# aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy registered".
CP_REFUSED = ("context parallelism (cp > 1): torch 2.13's context_parallel has no ring-attention strategy for "
              "the CPU attention kernel (aten._scaled_dot_product_flash_attention_for_cpu), and the built-in "
              "trainer does not implement it on GPUs: use the emitted torchtitan config for cp > 1, or set cp=1")


def window_problem(model: ModelSpec, seq_len: int) -> str | None:
    """Why the built-in models cannot stand for ``model`` at ``seq_len``: windowed or chunked attention layers that see
    less than the sequence (autotune.workloads.transformer and the transformers Llama / GPT-2 models attend over the
    whole sequence); None where every layer sees all of it."""
    local = local_attention_below(model, seq_len)
    if local is None:
        return None
    return (f"model {model.name!r}: {local} is not implemented by the built-in model, whose layers would attend "
            f"over all {seq_len} tokens (another model, at another cost): use --seq-len {model.sliding_window} or "
            "less, or your own script (emit --script)")


def built_model_problem(model: ModelSpec, seq_len: int) -> str | None:
    """Why the built-in model (autotune.workloads.transformer, which the fsdp and deepspeed trainers train) is not
    ``model`` at ``seq_len``: local attention shorter than the sequence, or a part it does not build; None where it
    is the model."""
    if problem := window_problem(model, seq_len):
        return problem
    missing = [what for absent, what in (
        (model.mla is not None, "multi-head latent attention"),
        (model.position_embedding == "alibi", "ALiBi's attention biases"),
        (model.attention_sinks, "attention sinks (a learned logit per head)"),
        (model.activation_clamp is not None, f"the gated activation's clamp ({model.activation_clamp:g})"
         if model.activation_clamp is not None else ""),
        (model.rope_scaling == "yarn", "YaRN RoPE scaling")) if absent]
    if not missing:
        return None
    return (f"model {model.name!r}: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not implemented by "
            "the built-in model: train it with your own script (emit --script) or the engine's own files")


def fsdp_trainer_problem(model: ModelSpec, plan: ParallelPlan, scheme: str) -> str | None:
    """Why the fsdp engine's built-in trainer (autotune.train.fsdp) cannot run ``plan`` (None when it can);
    ``scheme``: the engine's layer split (``Engine.layer_split_of``: a plan's loss_slots too)."""
    if problem := built_model_problem(model, plan.seq_len):
        return problem
    if plan.cp > 1:
        return CP_REFUSED
    if plan.ep > 1:
        return "expert parallelism (ep > 1) is not implemented by the built-in FSDP trainer: set ep=1"
    if plan.precision == "fp8":
        return "fp8 needs torchao's float8 training on FP8 GPUs (H100 or newer): use bf16 for the built-in trainer"
    if plan.optimizer == "adamw8bit":
        return "adamw8bit needs bitsandbytes or torchao's 8-bit AdamW: use adamw, sgd or adafactor"
    if "nvme" in (plan.offload_param, plan.offload_optimizer):
        return "FSDP2 offloads to host memory only (CPUOffloadPolicy): use cpu offload"
    if plan.tp > 1:
        if model.moe is not None:
            return "tensor parallelism of MoE layers is not implemented by the built-in FSDP trainer: set tp=1"
        if model.qk_norm == "full":
            # measured here (torch 2.13.0+cpu, 2 ranks): the norm's weight is the whole width, each rank's Q a
            # ColwiseParallel shard of it ("The size of tensor a (128) must match the size of tensor b (256)")
            return ("a Q/K norm over all heads at once (qk_norm full, OLMo 2) needs each rank's whole Q and K, which "
                    "DTensor TP splits by heads: set tp=1")
        if plan.sequence_parallel and (model.tied_embeddings or model.position_embedding == "learned"
                                       or model.embedding_norm or model.norms_per_layer != 2
                                       or model.parallel_residual or model.post_norm):
            return ("sequence parallelism in the built-in FSDP trainer follows torchtitan's Llama plan (untied "
                    "embeddings, no learned positions, two norms per block): set sequence_parallel false "
                    "(--no-sequence-parallel) for this model")
        for what, n in (("attention heads", model.num_attention_heads), ("KV heads", model.kv_heads),
                        ("ffn_hidden_size", model.ffn_hidden_size), ("vocab_size", model.vocab_size)):
            if n % plan.tp:
                return f"DTensor TP splits the {what} ({n}) over tp={plan.tp}: choose a tp that divides it"
    if (plan.loss_chunks or 1) > 1:
        if model.tied_embeddings:
            return ("loss_chunks with tied embeddings: the built-in trainer chunks a separate output layer (torchtitan "
                    "0.3's lm_head): drop --loss-chunks for this model")
        if (plan.seq_len // plan.cp) % plan.loss_chunks:
            return (f"loss_chunks {plan.loss_chunks} does not divide the sequence ({plan.seq_len}) into equal chunks, "
                    "as torchtitan 0.3's ChunkedLossWrapper needs: choose a divisor")
    if plan.pp > 1:
        return pipeline_stage_problem(model, plan, scheme)
    return None


def deepspeed_trainer_problem(model: ModelSpec, plan: ParallelPlan) -> str | None:
    """Why the deepspeed engine's built-in trainer (autotune.train.deepspeed) cannot run ``plan`` (None when it
    can)."""
    if problem := built_model_problem(model, plan.seq_len):
        return problem
    if plan.tp > 1 and (plan.pp > 1 or plan.cp > 1):
        return "AutoTP runs with data parallelism and ZeRO only here (DeepSpeed issues #7147, #7730): set pp=cp=1"
    if plan.pp > 1 and plan.cp > 1:
        return "PipelineModule with Ulysses is not run by DeepSpeed 0.19.8 here: set cp=1 or pp=1"
    if plan.tp > 1:
        problem = hf_model_problem(model, llama_only=True)
        if problem:
            return f"AutoTP: {problem}"
    if plan.cp > 1 and model.kv_heads % plan.cp:
        return (f"Ulysses scatters attention heads over cp={plan.cp} ranks: {model.kv_heads} KV heads do not "
                f"divide (deepspeed/sequence/layer.py)")
    if plan.cp > 1 and plan.seq_len % plan.cp:
        return f"Ulysses: seq_len {plan.seq_len} does not divide over cp={plan.cp} ranks"
    if plan.cp > 1 and model.local_rope_theta is not None:
        # the local layers' own RoPE tables start at position 0; each Ulysses rank rotates its slice of the sequence
        return "Ulysses with local layers of their own RoPE base (Gemma 3) is not implemented here: set cp=1"
    return None


def hf_trainer_problem(model: ModelSpec, plan: ParallelPlan) -> str | None:
    """Why the hf engine's built-in trainer (autotune.train.hf: the Hugging Face Trainer or accelerate) cannot run
    ``plan`` (None when it can)."""
    # (Gemma's classes attend within their windows themselves: the spec's layer types are passed on)
    windowed = hf_model_family(model) not in ("gemma2", "gemma3")
    if problem := hf_model_problem(model) or (windowed and window_problem(model, plan.seq_len)):
        return problem
    if plan.tp > 1 or plan.pp > 1 or plan.cp > 1:
        return "the hf engine runs data parallelism with ZeRO only: use engine deepspeed for tp/pp/cp"
    return None


HF_OWN_BALANCING = ("mixtral", "qwen3_moe")
"""The hf trainer's MoE families whose transformers class adds router_aux_loss_coef x its load-balancing loss to the
loss itself (output_router_logits on); DeepseekV3 / Glm4Moe (transformers 5.25) add none."""


def _hf_moe_family(spec: ModelSpec) -> str | None:
    """"mixtral" or "qwen3_moe" for a MoE spec transformers' Mixtral / Qwen3-MoE computes: a softmax router (over the
    top-k: Mixtral, Qwen3 norm_topk_prob; over every expert first: Qwen3 without it), no routing bias, shared experts,
    groups, scale or dense leading layers (None: neither)."""
    moe = spec.moe
    if (moe is None or moe.router_score != "softmax" or moe.router_bias or moe.num_shared_experts
            or moe.num_dense_layers or moe.router_groups is not None or moe.router_scaling_factor != 1.0
            or moe.router_probs_on_input or spec.qkv_bias):
        return None
    if spec.qk_norm == "head":
        return "qwen3_moe"
    return "mixtral" if spec.qk_norm is None and moe.moe_layer_step == 1 and not moe.router_pre_softmax else None


def _sigmoid_router_family(spec: ModelSpec) -> str | None:
    """"deepseek_v3" / "glm4_moe" for DeepSeek-V3's layer (MLA; Kimi-K2, Moonlight) / GLM-4.5's (GQA with Q/K/V
    biases, a per-head Q/K norm or none, RoPE on part of each head): transformers DeepseekV3ForCausalLM /
    Glm4MoeForCausalLM, dense leading layers then MoE layers of a sigmoid router with a routing bias
    (e_score_correction_bias), group-limited or not, its top-k weights normalised and scaled (norm_topk_prob,
    routed_scaling_factor), beside shared experts as wide as the routed ones (one MLP of their summed width); None
    otherwise."""
    moe = spec.moe
    if (moe is None or moe.router_score != "sigmoid" or not moe.router_bias or moe.router_pre_softmax
            or moe.router_probs_on_input or moe.moe_layer_step != 1 or not moe.num_shared_experts
            or moe.shared_width != moe.expert_ffn_hidden_size or spec.activation != "swiglu" or spec.norm != "rmsnorm"
            or spec.norms_per_layer != 2 or spec.linear_bias or spec.embedding_norm or spec.post_norm
            or spec.parallel_residual or spec.attention_sinks or spec.activation_clamp is not None
            or spec.sliding_window is not None or spec.chunked_attention or spec.position_embedding != "rope"
            or spec.dropout or gemma_parts(spec)):
        return None
    if spec.mla is not None:
        mla_layer = not spec.qkv_bias and spec.qk_norm is None and spec.rotary_fraction == 1
        return "deepseek_v3" if mla_layer and spec.rope_scaling in (None, "yarn") else None
    glm_layer = spec.qkv_bias and spec.qk_norm in (None, "head") and spec.rope_scaling is None
    return "glm4_moe" if glm_layer else None


def _gemma_family(spec: ModelSpec) -> str | None:
    """"gemma2" / "gemma3" where ``spec`` is Gemma 2's / 3's layer (transformers Gemma2DecoderLayer / Gemma3's: four
    (1 + weight) RMSNorms, GeGLU, scaled and tied embeddings, RoPE, no biases; Gemma 3 with a per-head Q/K norm, its
    local layers' own RoPE base and a linear scaling of the global ones); None otherwise."""
    gemma_layer = (spec.norms_per_layer == 4 and spec.activation == "geglu" and spec.scaled_embeddings
                   and spec.norm_zero_centered and spec.norm == "rmsnorm" and spec.position_embedding == "rope"
                   and spec.tied_embeddings and not (spec.linear_bias or spec.qkv_bias or spec.embedding_norm)
                   and spec.moe is None and spec.mla is None and not spec.attention_sinks and spec.rotary_fraction == 1
                   and spec.activation_clamp is None and not spec.chunked_attention and not spec.post_norm
                   and not spec.parallel_residual and spec.rope_scaling in (None, "linear"))
    if not gemma_layer:
        return None
    if spec.qk_norm == "head":
        return "gemma3"
    return "gemma2" if spec.qk_norm is None and spec.local_rope_theta is None and spec.rope_scaling is None else None


def hf_model_family(spec: ModelSpec) -> str | None:
    """"llama", "qwen2", "qwen3", "mixtral", "qwen3_moe", "deepseek_v3", "glm4_moe", "gemma2", "gemma3" or "gpt2": the
    transformers model the AutoTP and HF trainers build for ``spec`` (None: none of them). Llama's attention_bias
    would put a bias on o_proj too, so Q/K/V biases alone are Qwen2's; a per-head Q/K RMSNorm is Qwen3's
    (Qwen3Attention q_norm / k_norm, no biases)."""
    if spec.rope_layers is not None:
        return None  # rotary-free layers (SmolLM3, EXAONE 4): each of these classes rotates every layer
    if family := _gemma_family(spec) or _sigmoid_router_family(spec):
        return family
    if (spec.mla is not None or spec.norms_per_layer != 2 or spec.embedding_norm or spec.attention_sinks
            or spec.activation_clamp is not None or spec.rope_scaling == "yarn" or spec.chunked_attention
            or spec.post_norm or spec.parallel_residual or spec.attention_output_bias or gemma_parts(spec)):
        return None  # no class of these has that layer
    llama_layer = (spec.position_embedding == "rope" and spec.norm == "rmsnorm" and spec.activation == "swiglu"
                   and not spec.linear_bias)
    if spec.moe is not None:
        return _hf_moe_family(spec) if llama_layer else None
    if spec.qk_norm not in (None, "head"):
        return None
    if llama_layer:
        if spec.qk_norm == "head":
            return None if spec.qkv_bias else "qwen3"
        return "qwen2" if spec.qkv_bias else "llama"
    if (spec.position_embedding == "learned" and spec.norm == "layernorm" and spec.activation in ("gelu", "gelu_tanh")
            and spec.linear_bias and spec.tied_embeddings and spec.kv_heads == spec.num_attention_heads
            and spec.attention_head_dim * spec.num_attention_heads == spec.hidden_size):
        return "gpt2"
    return None


def hf_model_problem(spec, *, llama_only: bool = False) -> str | None:
    """Why no transformers model of the spec's architecture can be built here (None when one can)."""
    family = hf_model_family(spec)
    if family == "llama" or (family is not None and not llama_only):
        return None
    want = "a Llama-style model (RoPE, RMSNorm, SwiGLU, no linear biases, dense)"
    if not llama_only:
        want += (", a Qwen2 / Qwen3-style one (the same with Q/K/V biases, or with a per-head Q/K RMSNorm), a "
                 "Mixtral / Qwen3-MoE-style one (softmax top-k routing, no shared experts or routing bias), a "
                 "DeepSeek-V3 / GLM-4.5-style one (sigmoid routing with a bias, shared experts as wide as the "
                 "routed ones, dense leading layers; MLA, or Q/K/V biases), Gemma 2 or 3 or a GPT-2-style one "
                 "(learned positions, LayerNorm, GeLU, biases, tied embeddings)")
    return f"model {spec.name!r}: the built-in trainer builds {want} as a transformers model; give such a model"


def stage_layer_counts(num_layers: int, pp: int, vpp: int, scheme: str) -> tuple[int, ...] | None:
    """Layers per virtual stage, first to last, as the engine's split ``scheme`` gives them (None: no such split)."""
    if scheme == "uniform":
        return layer_counts(num_layers, pp * vpp, scheme)
    return virtual_layout(num_layers, pp, vpp, scheme)


def pipeline_stage_problem(model: ModelSpec, plan: ParallelPlan, scheme: str) -> str | None:
    """Why ``plan``'s pipeline cannot be built by torch.distributed.pipelining in the built-in trainer (None when
    it can)."""
    stages = plan.pp * plan.vpp
    if model.tied_embeddings:
        return ("tied embeddings with pp > 1: torch.distributed.pipelining stages own disjoint modules, so the "
                "last stage's output layer cannot share the first stage's embedding; untie them or set pp=1")
    if stage_layer_counts(model.num_layers, plan.pp, plan.vpp, scheme) is None:
        return f"{model.num_layers} layers cannot be split over pp x vpp = {stages} stages: lower pp or vpp"
    n = plan.num_microbatches
    rounds = max(1, n // plan.pp)
    if plan.vpp > 1 and n % rounds:
        return (f"ScheduleInterleaved1F1B needs the micro-batches ({n}) to be a multiple of its rounds "
                f"(max(1, {n} // pp {plan.pp}) = {rounds}; torch/distributed/pipelining/schedules.py): "
                f"use a multiple of pp micro-batches")
    if plan.vpp == 1 and n < plan.pp:
        return (f"Schedule1F1B needs at least as many micro-batches as stages ({n} < pp {plan.pp}; "
                f"torch/distributed/pipelining/schedules.py): raise the global batch")
    return None
