"""What of a model Megatron-DeepSpeed (the microsoft fork) cannot build, beyond its layer norms and DeepSpeed-MoE's
form (``emit.megatron``), and the model flags it needs that Megatron-core spells otherwise.

Its GPT layer (microsoft/Megatron-DeepSpeed megatron/model/transformer.py, ParallelAttention / ParallelMLP at
4efb479, the flag table megatron_deepspeed_flags.json) has full causal attention over every layer with rotary or
learned positions (``--use-rotary-position-embeddings``, ``--rotary-position-embeddings-theta``, no YaRN or other
RoPE scaling), no per-head Q/K norm, no attention sinks, no sliding or chunked windows, biases on every linear or
none (``--disable-bias-linear``: no Q/K/V-only bias), and a plain SwiGLU or GeLU (no clamp). Its experts are
DeepSpeed-MoE's: ``TopKGate`` scores them with a softmax of a bias-free linear layer (deepspeed/moe/sharded_moe.py
``TopKGate.__init__``: ``torch.nn.Linear(model_dim, num_experts, bias=False)``; ``top1gating`` / ``top2gating`` /
``topkgating``: ``F.softmax(logits, dim=1)``, DeepSpeed 0.19.8). Emitting such a model would train another one, so
the writer refuses it and the engine's rules ask the same (the planner proposes no plan the writer refuses).
"""

from __future__ import annotations

from autotune.specs.gemma_parts import gemma_parts
from autotune.specs.model import ModelSpec
from autotune.specs.model_parts import local_attention_below

__all__ = ["megatron_deepspeed_model_problems", "rope_theta_flags", "experts_whole_per_tp_rank", "ROPE_THETA_DEFAULT",
           "SOURCE"]

ROPE_THETA_DEFAULT = 10000
"""``--rotary-position-embeddings-theta``'s default in the microsoft fork (megatron/arguments.py, an int flag)."""

SOURCE = ("microsoft/Megatron-DeepSpeed megatron/model/transformer.py (ParallelAttention, ParallelMLP); "
          "deepspeed/moe/sharded_moe.py TopKGate (DeepSpeed 0.19.8)")


def megatron_deepspeed_model_problems(model: ModelSpec, seq_len: int) -> list[str]:
    """Each feature of ``model`` the fork's GPT layer or DeepSpeed-MoE's gate does not build (module docstring); a
    window no shorter than ``seq_len`` is full causal attention, which it builds."""
    out = []
    if model.mla is not None:
        out.append(f"{model.name} uses multi-latent attention, which Megatron-DeepSpeed does not implement")
    if local := local_attention_below(model, seq_len):
        out.append(f"{model.name} has {local}, under seq_len {seq_len}; Megatron-DeepSpeed attends over the whole "
                   "sequence")
    if model.attention_sinks:
        out.append(f"{model.name} has attention sinks (a learned logit per head); Megatron-DeepSpeed has none")
    if model.post_norm:
        out.append(f"{model.name} normalises the attention and MLP outputs (OLMo 2); Megatron-DeepSpeed's layer "
                   "normalises their inputs")
    if model.qk_norm is not None:
        out.append(f"{model.name} normalises Q and K (qk_norm {model.qk_norm}); Megatron-DeepSpeed has no Q/K norm")
    if model.rope_scaling is not None:
        out.append(f"{model.name} scales RoPE ({model.rope_scaling}); Megatron-DeepSpeed's rotary embedding is "
                   f"unscaled")
    if model.rope_layers is not None:
        out.append(f"{model.name} leaves RoPE out of some layers (NoPE); Megatron-DeepSpeed rotates every layer")
    if model.position_embedding == "rope" and model.rope_theta != int(model.rope_theta):
        out.append(f"{model.name}'s RoPE base {model.rope_theta:g} is not an integer, which the fork's "
                   f"--rotary-position-embeddings-theta (an int) cannot take")
    if (model.qkv_bias or model.attention_output_bias) and not model.linear_bias:
        out.append(f"{model.name} has attention biases without MLP ones; Megatron-DeepSpeed biases every linear "
                   "or none")
    if model.activation == "relu":
        out.append(f"{model.name}'s MLP is ReLU (OPT); Megatron-DeepSpeed builds GeLU, SwiGLU or squared ReLU")
    if model.activation_clamp is not None:
        out.append(f"{model.name} clamps its GLU activation; Megatron-DeepSpeed's SwiGLU is unclamped")
    out += [f"{model.name} has {part}; Megatron-DeepSpeed's GPT model does not" for part in gemma_parts(model)]
    moe = model.moe
    if moe is not None and (moe.router_score != "softmax" or moe.router_bias or moe.router_groups is not None
                            or moe.router_scaling_factor != 1.0 or moe.router_probs_on_input):
        out.append(f"{model.name}'s router ({moe.router_score}"
                   f"{', biased' if moe.router_bias else ''}"
                   f"{', group-limited' if moe.router_groups is not None else ''}"
                   f"{', scaled' if moe.router_scaling_factor != 1.0 else ''}) is not DeepSpeed-MoE's gate (a "
                   f"softmax of a bias-free linear layer)")
    return out


def experts_whole_per_tp_rank(experts: int | None, tp: int, flag_given: bool) -> str | None:
    """Why the fork's TP ranks each hold every expert whole (an argument list with ``experts`` experts, tensor
    parallelism ``tp`` and ``flag_given`` --enable-expert-tensor-parallelism or not); None where they split them.
    The emitted arguments give the flag (emit.megatron); the linter warns without it, and ``--from`` says so."""
    if not experts or experts <= 1 or tp <= 1 or flag_given:
        return None
    return (f"without --enable-expert-tensor-parallelism each of the {tp} TP ranks builds every one of the {experts} "
            "experts whole (microsoft/Megatron-DeepSpeed@f4157bea megatron/core/tensor_parallel/layers.py:529-531: "
            "moe and not enable_expert_tensor_parallelism -> world_size 1)")


def rope_theta_flags(model: ModelSpec) -> list[str]:
    """The fork's rotary flags for ``model`` (``--rotary-position-embeddings-theta`` where it is not the default)."""
    if model.position_embedding != "rope":
        return []
    flags = ["--use-rotary-position-embeddings", "--no-position-embedding"]
    if model.rope_theta != ROPE_THETA_DEFAULT:
        flags += ["--rotary-position-embeddings-theta", str(int(model.rope_theta))]
    if model.rotary_fraction != 1:  # megatron/model/language_model.py:431-432 at f4157bea: rotary_dim x the share
        flags += ["--rotary-percent", repr(float(model.rotary_fraction))]
    return flags
