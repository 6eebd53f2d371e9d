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

Where engines' code differs, :class:`ActivationFacts` (``Engine.activation_facts``) says how: the selective
recompute policy (attention core, Megatron; or torchtitan's op-level SAC), the bytes the loss backward adds
beyond the saved fp32 log-probabilities, whether column-parallel linears save their sequence-gathered input
(DTensor) or the SP shard (Megatron re-gathers it in backward), and what an FP8 linear saves.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from autotune.cost.op_sac import block_linears, block_mms, op_sac_layer_bytes
from autotune.cost.stage_chunks import first_chunk_in_flight, moe_layers_in, uneven_chunks
from autotune.cost.cp_ring import ring_transient_bytes
from autotune.cost.fp8_attention import saved_bytes
from autotune.cost.lora import saved_input_change
from autotune.cost.moe_time import routed_share
from autotune.cost.mtp import mtp_extra_activation_bytes
from autotune.engines.facts import MEGATRON_FACTS, ActivationFacts
from autotune.specs.layout import (
    interleaved_chunk_loads,
    microbatches_in_flight,
    stage_layers,
)
from autotune.specs.model import ModelSpec
from autotune.specs.nvfp4 import FP4_PRECISION, NVFP4_INPUT_BYTES
from autotune.specs.plan import FP8_BLOCK_SCALE_BYTES, ParallelPlan

__all__ = ["LayerActivations", "STAGE_ACTIVATION_FIELDS", "layer_activations", "block_linears", "block_mms",
           "grouped_mlp_bytes", "linear_input_bytes",
           "op_sac_layer_bytes", "recompute_module_bytes", "loss_backward_bytes", "embedding_activation_bytes",
           "output_activation_bytes", "stage_activation_bytes"]


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


def linear_input_bytes(plan: ParallelPlan, facts: ActivationFacts = MEGATRON_FACTS) -> float:
    """Bytes per element a linear saves of its input. A Transformer Engine block-scaled recipe keeps the column-wise
    FP8 copy and its scales (module/linear.py @d0067d0 lines 600-616: "Discard row-wise data since it is not needed
    in backward pass"; scale bytes: ``FP8_BLOCK_SCALE_BYTES``); NVFP4 its column-wise FP4 copy and 1-D scales
    (``autotune.specs.nvfp4.NVFP4_INPUT_BYTES``), where the engine saves the quantised input."""
    if plan.precision == FP4_PRECISION:
        return NVFP4_INPUT_BYTES if facts.fp8_input_bytes == 1 else 2
    if plan.precision != "fp8":
        return 2
    scales = FP8_BLOCK_SCALE_BYTES.get(plan.fp8_recipe or "", (0.0, 0.0))[0] if facts.fp8_input_bytes == 1 else 0.0
    return facts.fp8_input_bytes + scales


def _gathered_split(plan: ParallelPlan, facts: ActivationFacts) -> int:
    """The split of a column-parallel linear's saved input: tp with Megatron SP, 1 where the gathered one is saved."""
    return 1 if facts.gathered_linear_inputs or not plan.sequence_parallel else plan.tp


def layer_activations(model: ModelSpec, plan: ParallelPlan, layer_index: int = 0,
                      facts: ActivationFacts = MEGATRON_FACTS) -> LayerActivations:
    """Activations one layer saves for backward with no recompute (Korthikanti Sec. 4.1, generalised)."""
    s = plan.seq_len / plan.cp
    b = plan.micro_batch_size
    h = model.hidden_size
    t = plan.tp
    t_seq = t if plan.sequence_parallel else 1  # split of residual-stream terms
    t_in = _gathered_split(plan, facts)  # split of the QKV and fc1 inputs
    sb = s * b
    lin = linear_input_bytes(plan, facts)
    stat_bytes = 8 if model.norm == "layernorm" else 4

    norms = model.norms_per_layer * (2 * sb * h + stat_bytes * sb) / t_seq
    dropout_masks = (2 * sb * h / t_seq) if model.dropout > 0 else 0.0

    # Attention block: QKV input, q/k/v, output (shared with the output projection's input).
    attn = lin * sb * h / t_in
    if model.mla is not None:
        m = model.mla
        latent = (m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim
        attn += 2 * sb * latent * 2  # latent norms' inputs and the up-projections' inputs (replicated)
    # q, k, v and the attention output, saved by the kernel (and the output by the projection where it is 16-bit)
    qkv_bytes, out_bytes = saved_bytes(facts.fp8_attention_recipe) if facts.fp8_attention_recipe else (2.0, 2.0)
    attn += qkv_bytes * sb * (model.q_width + model.kv_width + model.v_width) / t
    attn += out_bytes * sb * model.attention_output_width / t
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
    mlp = _mlp_activation_bytes(model, plan, layer_index, sb, t, t_in, lin, facts.moe_expert_outputs_saved)
    if plan.peft:  # LoRA: frozen linears save no input (autotune.cost.lora)
        attn_change, mlp_change = saved_input_change(model, plan, sb, t_in, lin)
        attn, mlp = attn + attn_change, mlp + mlp_change
    return LayerActivations(norms=norms, attention=attn, attention_core=core, mlp=mlp, dropout_masks=dropout_masks)


def _dense_mlp_bytes(model: ModelSpec, width: float, tokens: float, t: int, lin: int) -> float:
    """Saved bytes of one dense MLP on ``tokens`` tokens, excluding its input."""
    fc1_out = (2 if model.gated_mlp else 1) * width
    return tokens * (2 * fc1_out + lin * width) / t


def grouped_mlp_bytes(model: ModelSpec, pairs: float, t: int, lin: int) -> float:
    """Saved bytes of the routed experts' grouped MLP on ``pairs`` routed (token, expert) pairs: its permuted
    input and the dense MLP's saved tensors (what Megatron's paged stash holds, ``autotune.specs.sync_free_moe``)."""
    assert model.moe is not None
    permuted_input = pairs * lin * model.hidden_size / t
    return _dense_mlp_bytes(model, model.moe.expert_ffn_hidden_size, pairs, t, lin) + permuted_input


def _mlp_activation_bytes(model: ModelSpec, plan: ParallelPlan, layer_index: int, sb: float, t: int, t_in: int,
                          lin: int, expert_outputs_saved: bool) -> float:
    h = model.hidden_size
    fc1_input = lin * sb * h / t_in
    if not model.is_moe_layer(layer_index):
        return fc1_input + _dense_mlp_bytes(model, model.ffn_hidden_size, sb, t, lin)
    moe = model.moe
    assert moe is not None
    routing = 4 * sb * moe.num_experts / t_in  # fp32 routing probabilities
    pairs = sb * moe.top_k * routed_share(plan)  # token dropping keeps fewer, padding its capacity's rows
    # Per routed pair the permuted input (fc1's saved input), and the expert output where the combine keeps it
    # (ActivationFacts.moe_expert_outputs_saved).
    experts = grouped_mlp_bytes(model, pairs, t, lin) + pairs * (2 if expert_outputs_saved else 0) * h / t
    shared = moe.num_shared_experts * _dense_mlp_bytes(model, moe.shared_width, sb, t, lin)
    return fc1_input + routing + experts + shared


def recompute_module_bytes(model: ModelSpec, plan: ParallelPlan, layer: LayerActivations, moe_layer: bool,
                           facts: ActivationFacts = MEGATRON_FACTS) -> dict[str, float]:
    """Bytes one layer no longer keeps for backward when Megatron's selective recompute reruns each module
    (``ParallelPlan.recompute_modules``; megatron-core 0.19.2 transformer_config.py:546-563), by module; absent: the
    module is not in this layer. Normal checkpointing keeps the module's input and drops what it saves inside;
    output-discarding checkpointing drops the module's output, which the next module saved.
      core_attn: the attention core's saved tensors (flash: the fp32 log-sum-exp; unfused: Korthikanti's 5as^2b).
      mla_up_proj: q, k, v after MLA's up-projections and RoPE (output-discarding), the core's saved inputs.
      layernorm: the output of a norm that is not fused into the next linear (output-discarding), which that linear
        saved: MLA's input norm, MoE layers' pre-MLP norm (Transformer Engine fuses the others into linear_qkv /
        linear_fc1, gpt_layer_specs.py:313-336, and transformer_layer.py:452-507 skips them).
      mlp: a dense MLP's saved tensors except its input (fc1 output, activation output).
      moe: the whole MoE block's but its input (routing probabilities, per routed pair the permuted input, fc1
        output and activation output; shared experts).
      moe_act: the experts' activation output (fc2's saved input; output-discarding, experts.py:268-274).
      shared_experts: the shared experts' saved tensors except their input."""
    s = plan.seq_len / plan.cp
    sb, t, h = s * plan.micro_batch_size, plan.tp, model.hidden_size
    lin = linear_input_bytes(plan, facts)
    norm_output = lin * sb * h / _gathered_split(plan, facts)
    out = {"core_attn": layer.attention_core}
    if model.mla is not None:
        out["mla_up_proj"] = 2 * sb * (model.q_width + model.kv_width + model.v_width) / t
    if model.mla is not None or moe_layer:
        out["layernorm"] = norm_output * ((model.mla is not None) + moe_layer)
    if not moe_layer:
        out["mlp"] = _dense_mlp_bytes(model, model.ffn_hidden_size, sb, t, lin)
        return out
    moe = model.moe
    assert moe is not None
    out["moe"] = layer.mlp - norm_output
    out["moe_act"] = sb * moe.top_k * routed_share(plan) * lin * moe.expert_ffn_hidden_size / t
    if moe.num_shared_experts:
        out["shared_experts"] = moe.num_shared_experts * _dense_mlp_bytes(model, moe.shared_width, sb, t, lin)
    return out


def recomputed(modules: tuple[str, ...]) -> tuple[str, ...]:
    """The modules whose savings (and recompute time) count: "moe" reruns the whole MoE block, moe_act and shared_experts within it."""
    return tuple(m for m in modules if "moe" not in modules or m not in ("moe_act", "shared_experts"))


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


def output_activation_bytes(model: ModelSpec, plan: ParallelPlan, facts: ActivationFacts = MEGATRON_FACTS) -> float:
    """Last stage, one micro-batch: final norm input, output-layer input, the logits as the loss keeps them
    (``ActivationFacts.loss_logit_bytes``: fp32, 4*s*b*V/t, or Transformer Engine's cross entropy's 16-bit ones),
    and the int64 labels the loss keeps.

    Chunked loss (``plan.loss_chunks`` = n, torchtitan 0.3 ``ChunkedLossWrapper``, components/loss.py): the output
    layer and the loss run chunk by chunk along the sequence, each chunk's backward at once, so one chunk's logits
    (1/n) live at a time, and the hidden states' gradient is accumulated into an fp32 buffer of the whole
    sequence (``GradAccumulator(..., dtype=torch.float32)``)."""
    sb = plan.seq_len / plan.cp * plan.micro_batch_size
    t_seq = plan.tp if plan.sequence_parallel else 1
    h = model.hidden_size
    chunks = plan.loss_chunks or 1
    norm = (2 * h + (8 if model.norm == "layernorm" else 4)) * sb / t_seq
    # 16-bit at any precision: the output layer is no Transformer Engine module (megatron-core 0.19.2
    # models/gpt/gpt_model.py:264-268), so no FP8 autocast quantizes it; with fp8_output_proj (MXFP8 only) a TE linear
    # (TELMHeadColumnParallelLinear, gpt_model.py:273-277 at d98e8a6) that saves its input as the others do
    head_bytes = linear_input_bytes(plan, facts) if plan.fp8_output_proj else 2
    head_input = head_bytes * sb * h / _gathered_split(plan, facts)
    logits = facts.loss_logit_bytes * sb * model.vocab_size / plan.tp / chunks
    accumulator = 4 * sb * h / _gathered_split(plan, facts) if chunks > 1 else 0.0
    labels = 8 * sb
    return norm + head_input + logits + accumulator + labels


def loss_backward_bytes(model: ModelSpec, plan: ParallelPlan, facts: ActivationFacts) -> float:
    """Bytes the loss backward allocates beyond the saved log-probabilities (``ActivationFacts``); one chunk's
    with a chunked loss."""
    return facts.loss_backward_bytes_per_logit * plan.seq_len / plan.cp * plan.micro_batch_size \
        * model.vocab_size / plan.tp / (plan.loss_chunks or 1)


_kinds_cache: dict[tuple, tuple[ModelSpec, tuple[LayerActivations, LayerActivations]]] = {}


def _layer_kinds(model: ModelSpec, key: tuple, facts: ActivationFacts) -> tuple[LayerActivations, LayerActivations]:
    """(dense layer, MoE layer) activations of the plan fields in ``key`` (``_activation_key``), the others at
    their defaults: only the fields that matter vary between calls (cached; ModelSpec hashes slowly: its id)."""
    hit = _kinds_cache.get((id(model), facts, key))
    if hit is None or hit[0] is not model:
        (seq_len, cp, micro_batch_size, tp, sequence_parallel, precision, flash_attention, fp8_recipe, peft,
         lora_rank, lora_targets, capacity_factor, pad_to_capacity) = key
        plan = ParallelPlan(seq_len=seq_len, cp=cp, micro_batch_size=micro_batch_size, tp=tp,
                            sequence_parallel=sequence_parallel, precision=precision, flash_attention=flash_attention,
                            fp8_recipe=fp8_recipe, peft=peft, lora_rank=lora_rank, lora_targets=lora_targets,
                            moe_capacity_factor=capacity_factor, moe_pad_to_capacity=pad_to_capacity)
        dense = layer_activations(model, plan, 0 if not model.is_moe_layer(0) else -1, facts)
        moe = layer_activations(model, plan, model.num_layers - 1, facts) if model.is_moe else dense
        if len(_kinds_cache) > 4096:
            _kinds_cache.clear()
        hit = _kinds_cache[(id(model), facts, key)] = (model, (dense, moe))
    return hit[1]


def _activation_key(plan: ParallelPlan) -> tuple:
    """The plan fields activations depend on (a cache key; building a plan per call costs its validation)."""
    return (plan.seq_len, plan.cp, plan.micro_batch_size, plan.tp, plan.sequence_parallel, plan.precision,
            plan.flash_attention, plan.fp8_recipe, plan.peft, plan.lora_rank, plan.lora_targets,
            plan.moe_capacity_factor, plan.moe_pad_to_capacity)


# Every plan field the activations read (here and in the layout functions they call): plans that agree on these
# (and differ in ZeRO stage, replicas, offload, dp, engine) hold the same activations.
STAGE_ACTIVATION_FIELDS = (
    "seq_len", "cp", "micro_batch_size", "tp", "sequence_parallel", "precision", "flash_attention", "pp", "vpp",
    "grad_accum_steps", "recompute", "recompute_num_layers", "loss_chunks", "fp8_recipe", "recompute_modules",
    "ep_overlap",  # the EP overlap's extra warm-up forward (layout.interleaved_forwards_at_peak)
    "peft", "lora_rank", "lora_targets", "activation_offload_layers",  # LoRA's frozen linears save no input
    "moe_capacity_factor", "moe_pad_to_capacity",  # the routed rows kept (moe_time.routed_share)
    "mtp_layers", "fp8_output_proj")  # the LM head's saved input (output_activation_bytes)
_STAGE_ACTIVATION_FIELDS = operator.attrgetter(*STAGE_ACTIVATION_FIELDS)
_stage_cache: dict[tuple, tuple[ModelSpec, dict[str, float], ActivationFacts]] = {}


def stage_activation_bytes(model: ModelSpec, plan: ParallelPlan, stage: int,
                           facts: ActivationFacts = MEGATRON_FACTS, scheme: str = "megatron") -> dict[str, float]:
    """Activation bytes held at the peak by pipeline stage ``stage``, by part (:func:`_stage_activation_bytes`,
    cached: the planner asks the same of every ZeRO stage, replica count and offload of a layout)."""
    key = (id(model), id(facts), stage, scheme, _STAGE_ACTIVATION_FIELDS(plan))  # the specs hash slowly: their ids
    hit = _stage_cache.get(key)
    if hit is None or hit[0] is not model or hit[2] is not facts:
        if len(_stage_cache) > 65536:
            _stage_cache.clear()
        hit = _stage_cache[key] = (model, _stage_activation_bytes(model, plan, stage, facts, scheme), facts)
    return dict(hit[1])


def _stage_activation_bytes(model: ModelSpec, plan: ParallelPlan, stage: int, facts: ActivationFacts,
                            scheme: str) -> dict[str, float]:
    """Activation bytes held at the peak by pipeline stage ``stage``, by part.

    ``recompute_working_set`` (one layer rerun in backward) and ``loss_backward`` (the loss's fp32 gradients,
    first in backward) never coexist: ``loss_backward`` is only what the latter adds beyond the former.
    ``scheme``: how the engine splits layers over stages (``autotune.specs.layout``)."""
    first, layers_per_stage = stage_layers(model.num_layers, plan.pp, stage, scheme)
    in_flight = microbatches_in_flight(plan, stage)
    dense, moe = _layer_kinds(model, _activation_key(plan), facts)
    t_seq = plan.tp if plan.sequence_parallel else 1
    layer_input = 2 * plan.seq_len / plan.cp * plan.micro_batch_size * model.hidden_size / t_seq

    def full(start: int, stop: int) -> float:
        n_moe = moe_layers_in(model, start, stop)
        return (stop - start - n_moe) * dense.total + n_moe * moe.total

    stop = first + layers_per_stage
    if plan.recompute == "full":
        n_recompute = min(plan.recompute_num_layers or layers_per_stage, layers_per_stage)
        # While one recomputed layer runs backward, its full activations exist once (one micro-batch).
        has_moe = moe_layers_in(model, first, first + n_recompute) > 0
        has_dense = n_recompute - moe_layers_in(model, first, first + n_recompute) > 0
        working = max(moe.total if has_moe else 0.0, dense.total if has_dense else 0.0)
    elif plan.recompute == "selective" and facts.selective in ("op-sac", "op-sac-0.3"):
        working = dense.total  # the recomputed ops of one layer, during its backward
        sac_layer = op_sac_layer_bytes(model, plan, facts)  # what a dense layer keeps: once, not once per chunk
    elif plan.recompute == "selective":
        # Megatron's modules (default: the attention core); one layer's recomputed module lives during its backward.
        n_moe = moe_layers_in(model, first, stop)
        modules = recomputed(plan.recompute_modules or ("core_attn",))
        working, dropped_per_layer = 0.0, {}
        for count, layer, is_moe in ((layers_per_stage - n_moe, dense, False), (n_moe, moe, True)):
            dropped = recompute_module_bytes(model, plan, layer, is_moe, facts) if count else {}
            dropped_per_layer[is_moe] = sum(dropped.get(m, 0.0) for m in modules)
            working = max([working, *(dropped.get(m, 0.0) for m in modules)])
    else:
        working = 0.0

    def stored_in(start: int, stop: int) -> float:
        """Bytes layers [start, stop) keep for backward per micro-batch (full recompute: the first
        recompute_num_layers of them rerun, keeping their input)."""
        count, n_moe = stop - start, moe_layers_in(model, start, stop)
        if plan.recompute == "full":
            n = min(plan.recompute_num_layers or count, count)
            return n * layer_input + full(start + n, stop)
        if plan.recompute == "selective" and facts.selective in ("op-sac", "op-sac-0.3"):
            return (count - n_moe) * sac_layer + n_moe * (moe.total - moe.attention_core)
        if plan.recompute == "selective":
            return full(start, stop) - (count - n_moe) * dropped_per_layer.get(False, 0.0) \
                - n_moe * dropped_per_layer.get(True, 0.0)
        return full(start, stop)

    chunks = uneven_chunks(model.num_layers, plan, stage, scheme)
    if chunks is None:
        held = stored_in(first, stop) * in_flight
        if plan.activation_offload_layers:  # TE offload: the first N layers' sets leave (cost/activation_offload.py)
            held -= stored_in(first, first + min(plan.activation_offload_layers, layers_per_stage)) * in_flight
    else:  # chunks of unequal layers: the steady-state step whose held chunks weigh most
        if model.moe is None:  # stored_in reads a chunk's layer count alone (moe_layers_in is 0): once per count
            by_count: dict[int, float] = {}
            for a, b in chunks:
                if b - a not in by_count:
                    by_count[b - a] = stored_in(a, b)
            per_chunk = [by_count[b - a] for a, b in chunks]
        else:
            per_chunk = [stored_in(a, b) for a, b in chunks]
        # sum(map(mul, ...)): the products and their order of summation of sum(n * x for ...), at half its cost
        held = max(sum(map(operator.mul, load, per_chunk)) for load in interleaved_chunk_loads(
            plan.pp, plan.vpp, plan.num_microbatches, stage, int(plan.ep_overlapped)))

    if facts.cp_kind and plan.cp > 1:  # CP's K/V buffers (cost/cp_ring.py), beyond the MLP's, freed by then
        working += max(0.0, ring_transient_bytes(model, plan, facts.cp_kind, facts.cp_repeat_kv,
                                                 facts.cp_node_gpus) - dense.mlp)
    parts = {"layers": held, "recompute_working_set": working}
    if stage == 0:
        parts["embedding"] = embedding_activation_bytes(model, plan) * first_chunk_in_flight(plan)
    if stage == plan.pp - 1:
        parts["output_and_loss"] = output_activation_bytes(model, plan, facts)
        if plan.mtp_layers:  # the MTP modules' layers (saved as the last layer's) and their own parts (cost/mtp.py)
            parts["mtp"] = plan.mtp_layers * stored_in(model.num_layers - 1, model.num_layers) + \
                mtp_extra_activation_bytes(model, plan, linear_input_bytes(plan, facts), _gathered_split(plan, facts),
                                           parts["output_and_loss"])
        extra = loss_backward_bytes(model, plan, facts) - working
        if extra > 0:
            parts["loss_backward"] = extra
    return parts
