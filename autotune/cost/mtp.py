"""Multi-token prediction (``ParallelPlan.mtp_layers``, Megatron-core ``--mtp-num-layers N``): what the N MTP
modules add to the last pipeline stage's time, memory and FLOPs.

What Megatron-core runs (megatron/core/transformer/multi_token_prediction.py at d98e8a6, the DeepSeek-V3 design,
arXiv 2412.19437 Sec. 2.2): after the decoder, module k takes the previous hidden states and the embeddings of the
tokens shifted by k, normalises each (``enorm``, ``hnorm``), concatenates them (2h wide) and projects them back to
h (``eh_proj``, a column-parallel linear), runs one transformer layer built from the decoder's layer spec (so a
MoE layer where the decoder's last layer is one), a final norm, and the model's output layer (shared weights) with
its own cross-entropy loss (scaled by ``--mtp-loss-scaling-factor``). Without an explicit pipeline layout the
modules sit on the last pipeline stage, after its decoder layers (``mtp_on_this_rank``: the last pipeline rank and
virtual stage; NVIDIA's DeepSeek-V3 layouts put them there too, "...|t m L" in Megatron-Bridge's
``_get_deepseek_v3_pipeline_layout``, recipes/deepseek/h100/deepseek_v3.py:50-68 at 067f987).

Megatron's own FLOPs count has the same parts (megatron/training/training.py:1288-1303 at d98e8a6: the MTP layers
with the MoE or dense layers, "MTP norms and proj" 3h + 2h^2 per module, and the logits ``x (mtp_num_layers +
1)``), which :func:`mtp_flops_per_token` follows.

So, per module and micro-batch on the last stage:
- time: one more layer of the last layer's kind (its forward, backward, recompute and collectives as the
  decoder's, ``autotune.cost.step_time``), the 2h -> h projection's GEMMs, and the output layer and its loss once
  more (:func:`mtp_head_s`);
- memory: the module's parameters (``ModelSpec.mtp_module_params``, counted by ``stage_param_groups``), the
  layer's saved activations as the decoder's last layer saves them, and :func:`mtp_extra_activation_bytes`: the
  two norms' inputs, the projection's (2h-wide) input and a second set of output-layer activations (final norm,
  head input, logits, labels).
The embedding of the shifted tokens reuses the main embedding's table (on the first stage, or a copy on the last
one where pp > 1, Megatron's shared-embedding group); its lookup's cost is not counted (memory-bound, tiny).
"""

from __future__ import annotations

from autotune.cost.flops import layer_flops_per_token, logits_flops_per_token
from autotune.cost.kernels import Rates
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["mtp_extra_activation_bytes", "mtp_flops_per_token", "mtp_head_s", "mtp_layer_is_moe"]


def mtp_layer_is_moe(model: ModelSpec) -> bool:
    """Whether the MTP modules' layer is a MoE layer: Megatron builds it from the decoder's last layer's spec."""
    return model.is_moe_layer(model.num_layers - 1)


def mtp_head_s(model: ModelSpec, plan: ParallelPlan, r: Rates, logits_s: float, ce_s: float,
               cast_s: float = 0.0) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch of the MTP modules' parts beyond their transformer layer: the
    2h -> h projection (column-parallel over tp; backward twice its forward) and the output layer and loss again
    (``logits_s`` and ``ce_s``: the main output layer's forward GEMM and its loss's memory-bound time; ``cast_s``:
    its MXFP8 casts per pass, ``autotune.cost.fp8_head``: the MTP block calls the model's output layer,
    gpt_model.py:750-767 at d98e8a6)."""
    n = plan.mtp_layers or 0
    if not n:
        return 0.0, 0.0
    tokens = plan.seq_len * plan.micro_batch_size / plan.cp
    h, t = model.hidden_size, plan.tp
    proj = r.linear_s(2 * tokens * 2 * h * h / t, tokens, 2 * h, h / t)
    return n * (proj + logits_s + cast_s), n * (2 * proj + 2 * logits_s + cast_s + ce_s)


def mtp_extra_activation_bytes(model: ModelSpec, plan: ParallelPlan, linear_input: float, gathered_split: int,
                               output_bytes: float) -> float:
    """Bytes per micro-batch the MTP modules save beyond their transformer layer's: the two norms' inputs (the
    hidden states and the shifted tokens' embeddings, on the residual stream's split) with their fp32 statistics,
    the projection's 2h-wide input (``linear_input`` bytes per element, ``gathered_split``: its split, as the
    decoder's QKV input), and ``output_bytes``: the output layer's and loss's activations once more."""
    n = plan.mtp_layers or 0
    if not n:
        return 0.0
    sb = plan.seq_len / plan.cp * plan.micro_batch_size
    h = model.hidden_size
    t_seq = plan.tp if plan.sequence_parallel else 1
    stats = 8 if model.norm == "layernorm" else 4
    norms = 2 * (2 * h + stats) * sb / t_seq
    proj_input = linear_input * sb * 2 * h / gathered_split
    return n * (norms + proj_input + output_bytes)


def mtp_flops_per_token(model: ModelSpec, seq_len: int, mtp_layers: int | None) -> tuple[float, float]:
    """(forward FLOPs per token of the MTP modules as Megatron counts them, training.py:1288-1303 at d98e8a6: a
    layer like the last, the 2h -> h projection and the logits once more; of which their layers', what full
    recompute reruns)."""
    n = mtp_layers or 0
    if not n:
        return 0.0, 0.0
    last = layer_flops_per_token(model, seq_len, model.num_layers - 1)
    h = model.hidden_size
    layer = last.gemm + last.attention
    return n * (layer + 2.0 * 2 * h * h + logits_flops_per_token(model)), n * layer
