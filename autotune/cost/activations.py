"""Activation bytes saved for backward, per transformer layer and per pipeline stage.

Base: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Sec. 4: one GPT layer with 16-bit activations and 1-byte dropout masks saves
``s*b*h*(34 + 5*a*s/h)`` bytes; with tensor parallelism t and sequence parallelism
``s*b*h/t*(34 + 5*a*s/h)``; selective recompute drops the ``5*a*s^2*b`` attention-core
terms; full recompute keeps the layer input ``2*s*b*h`` only.

Generalised here term by term, so that it holds for the kernels GPU frameworks run:
  * GQA/MQA: K and V are ``kv_width`` wide, not h.
  * Fused (flash) attention keeps q, k, v, its output and an fp32 log-sum-exp per head and
    token, and no s^2 tensor (and regenerates its dropout mask from the RNG state).
  * SwiGLU as Megatron's fused ``bias_swiglu`` kernel: it saves the fc1 output
    ([gate|up], 2f wide) and recomputes silu in backward; fc2 saves its input (f wide).
    GeLU saves its input (f) and fc2 its input (f): Korthikanti's 16 s*b*h at f = 4h.
  * Norms save their input (2 bytes) plus fp32 statistics per token (LayerNorm mean and
    rstd: 8 bytes; RMSNorm rstd: 4 bytes) — Korthikanti folds the statistics away.
  * FP8 (Transformer Engine) saves 1-byte casts of linear-layer inputs.
  * MoE: router input and fp32 routing probabilities; per routed (token, expert) pair the
    expert MLP's saved tensors plus the permuted input and output; shared experts like a
    dense MLP. Balanced routing is assumed (each GPU processes as many token-expert pairs as
    its tokens routed), so expert parallelism does not change the per-GPU size.
  * Context parallelism splits the sequence: every term uses s/cp.
Terms on the h-wide residual stream (norm inputs, QKV and fc1 inputs, dropout masks) are
split by tp only with sequence parallelism; all other terms are split by tp always.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from autotune.specs.layout import stage_layers
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["LayerActivations", "layer_activations", "embedding_activation_bytes", "output_activation_bytes",
           "stage_activation_bytes", "microbatches_in_flight"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerActivations:
    """Bytes one layer saves for one micro-batch on one GPU, by part."""

    norms: float
    attention: float
    attention_core: float
    """s^2 scores or flash log-sum-exp: what selective recompute drops."""
    mlp: float
    dropout_masks: float

    @property
    def total(self) -> float:
        return self.norms + self.attention + self.attention_core + self.mlp + self.dropout_masks


def _linear_input_bytes(plan: ParallelPlan) -> int:
    return 1 if plan.precision == "fp8" else 2


def layer_activations(model: ModelSpec, plan: ParallelPlan, layer_index: int = 0) -> LayerActivations:
    """Activations one layer saves for backward with no recompute (Korthikanti Sec. 4.1, generalised)."""
    s = plan.seq_len / plan.cp
    b = plan.micro_batch_size
    h = model.hidden_size
    t = plan.tp
    t_seq = t if plan.sequence_parallel else 1  # split of residual-stream terms
    sb = s * b
    lin = _linear_input_bytes(plan)
    stat_bytes = 8 if model.norm == "layernorm" else 4

    norms = model.norms_per_layer * (2 * sb * h + stat_bytes * sb) / t_seq
    dropout_masks = (2 * sb * h / t_seq) if model.dropout > 0 else 0.0

    # Attention block: QKV input, q/k/v, output (shared with the output projection's input).
    attn = lin * sb * h / t_seq
    if model.mla is not None:
        m = model.mla
        latent = (m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim
        attn += 2 * sb * latent * 2  # latent norms' inputs and the up-projections' inputs (replicated)
    attn += 2 * sb * (model.q_width + model.kv_width + model.v_width) / t
    attn += 2 * sb * model.attention_output_width / t  # attention output, saved by the kernel and the projection
    if lin != 2:
        attn += lin * sb * model.attention_output_width / t  # FP8 cast of the output projection's input
    a = model.num_attention_heads
    if plan.flash_attention:
        core = 4 * sb * a / t  # fp32 log-sum-exp per head and token
    else:
        # softmax output 2as^2b; with dropout also its 1-byte mask and the dropped-out copy (Korthikanti 5as^2b);
        # and grouped K and V expanded to every query head before the matmuls that save them (the
        # expansion is inside the core that selective recompute reruns).
        core = (5 if model.dropout > 0 else 2) * a * s * s * b / t
        core += 2 * sb * (max(model.kv_width, model.q_width) - model.kv_width
                          + max(model.v_width, model.attention_output_width) - model.v_width) / t
    mlp = _mlp_activation_bytes(model, plan, layer_index, sb, t, t_seq, lin)
    return LayerActivations(norms=norms, attention=attn, attention_core=core, mlp=mlp, dropout_masks=dropout_masks)


def _dense_mlp_bytes(model: ModelSpec, width: float, tokens: float, t: int, lin: int) -> float:
    """Saved bytes of one dense MLP on ``tokens`` tokens, excluding its input."""
    fc1_out = (2 if model.activation == "swiglu" else 1) * width
    return tokens * (2 * fc1_out + lin * width) / t


def _mlp_activation_bytes(model: ModelSpec, plan: ParallelPlan, layer_index: int, sb: float, t: int, t_seq: int,
                          lin: int) -> float:
    h = model.hidden_size
    fc1_input = lin * sb * h / t_seq
    if not model.is_moe_layer(layer_index):
        return fc1_input + _dense_mlp_bytes(model, model.ffn_hidden_size, sb, t, lin)
    moe = model.moe
    assert moe is not None
    routing = 4 * sb * moe.num_experts / t_seq  # fp32 routing probabilities
    pairs = sb * moe.top_k
    experts = _dense_mlp_bytes(model, moe.expert_ffn_hidden_size, pairs, t, lin) + pairs * (lin + 2) * h / t
    shared = moe.num_shared_experts * _dense_mlp_bytes(model, moe.shared_width, sb, t, lin)
    return fc1_input + routing + experts + shared


def embedding_activation_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """First stage, one micro-batch: int64 token ids and the embedding dropout mask."""
    sb = plan.seq_len / plan.cp * plan.micro_batch_size
    t_seq = plan.tp if plan.sequence_parallel else 1
    out = 8 * sb
    if model.dropout > 0:
        out += sb * model.hidden_size / t_seq
    if model.embedding_norm:
        out += (2 * model.hidden_size + (8 if model.norm == "layernorm" else 4)) * sb / t_seq
    return out


def output_activation_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Last stage, one micro-batch: final norm input, output-layer input, fp32 logits (4*s*b*V/t),
    and the int64 labels the loss keeps."""
    sb = plan.seq_len / plan.cp * plan.micro_batch_size
    t_seq = plan.tp if plan.sequence_parallel else 1
    h = model.hidden_size
    norm = (2 * h + (8 if model.norm == "layernorm" else 4)) * sb / t_seq
    head_input = _linear_input_bytes(plan) * sb * h / t_seq
    logits = 4 * sb * model.vocab_size / plan.tp
    labels = 8 * sb
    return norm + head_input + logits + labels


def microbatches_in_flight(plan: ParallelPlan, stage: int) -> float:
    """Micro-batches whose activations a pipeline stage holds at its peak.

    1F1B: stage i holds min(pp - i, m) (Narayanan et al. 2021, Sec. 2.2.1). Interleaved: the
    first stage holds pp * (1 + (pp-1)/(pp*vpp)) micro-batches' worth of its layers
    (Korthikanti et al. 2022, Sec. 4.2.3). Without pipelining one micro-batch at a time.
    """
    if plan.pp == 1:
        return 1.0
    held = float(min(plan.pp - stage, plan.num_microbatches))
    if plan.interleaved:
        held *= 1 + (plan.pp - 1) / (plan.pp * plan.vpp)
    return held


def _moe_layers_in(model: ModelSpec, start: int, stop: int) -> int:
    """MoE layers among layer indices [start, stop) (MoE layers follow the leading dense ones)."""
    if model.moe is None:
        return 0
    return max(0, stop - max(start, model.moe.num_dense_layers))


@functools.lru_cache(maxsize=4096)
def _layer_kinds(model: ModelSpec, plan: ParallelPlan) -> tuple[LayerActivations, LayerActivations]:
    """(dense layer, MoE layer) activations; only the plan fields that matter vary between calls."""
    dense = layer_activations(model, plan, 0 if not model.is_moe_layer(0) else -1)
    moe = layer_activations(model, plan, model.num_layers - 1) if model.is_moe else dense
    return dense, moe


def _activation_key(plan: ParallelPlan) -> ParallelPlan:
    """The plan with every field activations do not depend on set to its default (a cache key)."""
    return ParallelPlan(seq_len=plan.seq_len, cp=plan.cp, micro_batch_size=plan.micro_batch_size, tp=plan.tp,
                        sequence_parallel=plan.sequence_parallel, precision=plan.precision,
                        flash_attention=plan.flash_attention)


def stage_activation_bytes(model: ModelSpec, plan: ParallelPlan, stage: int) -> dict[str, float]:
    """Activation bytes held at the peak by pipeline stage ``stage``, by part."""
    from autotune.cost.memory import split_scheme

    first, layers_per_stage = stage_layers(model.num_layers, plan.pp, stage, split_scheme(plan))
    in_flight = microbatches_in_flight(plan, stage)
    dense, moe = _layer_kinds(model, _activation_key(plan))
    t_seq = plan.tp if plan.sequence_parallel else 1
    layer_input = 2 * plan.seq_len / plan.cp * plan.micro_batch_size * model.hidden_size / t_seq

    def full(start: int, stop: int) -> float:
        n_moe = _moe_layers_in(model, start, stop)
        return (stop - start - n_moe) * dense.total + n_moe * moe.total

    stop = first + layers_per_stage
    if plan.recompute == "full":
        n_recompute = min(plan.recompute_num_layers or layers_per_stage, layers_per_stage)
        stored = n_recompute * layer_input + full(first + n_recompute, stop)
        # While one recomputed layer runs backward, its full activations exist once (one micro-batch).
        has_moe = _moe_layers_in(model, first, first + n_recompute) > 0
        has_dense = n_recompute - _moe_layers_in(model, first, first + n_recompute) > 0
        working = max(moe.total if has_moe else 0.0, dense.total if has_dense else 0.0)
    elif plan.recompute == "selective":
        n_moe = _moe_layers_in(model, first, stop)
        stored = full(first, stop) - (layers_per_stage - n_moe) * dense.attention_core - n_moe * moe.attention_core
        working = dense.attention_core
    else:
        stored = full(first, stop)
        working = 0.0

    parts = {"layers": stored * in_flight, "recompute_working_set": working}
    if stage == 0:
        parts["embedding"] = embedding_activation_bytes(model, plan) * in_flight
    if stage == plan.pp - 1:
        parts["output_and_loss"] = output_activation_bytes(model, plan)
    return parts
