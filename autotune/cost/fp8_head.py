"""The output layer's (LM head's) GEMM time, 16-bit or in MXFP8 (``ParallelPlan.fp8_output_proj``).

Megatron-core builds the output layer as ``tensor_parallel.ColumnParallelLinear``, no Transformer Engine module, so
no FP8 autocast quantizes it: its forward, data-gradient and weight-gradient GEMMs run in 16 bits. With
``TransformerConfig.fp8_output_proj`` (NVIDIA/Megatron-LM 3f6a2ed844, "Add opt-in MXFP8 LM-head output projection
(#4825)", first in core_v0.18.0) and the MXFP8 recipe (transformer_config.py:1569-1575 raises otherwise;
fp8_utils.py:730-745 ``is_mxfp8_output_proj_active``: fp8, recipe mxfp8, TE installed) it builds
``TELMHeadColumnParallelLinear`` instead (models/gpt/gpt_model.py:273-277; line numbers at d98e8a6): a TE linear
under the MXFP8 autocast. Its three GEMMs then run as the transformer's linear layers do: at the FP8 linear rate
(``Rates.linear_s``), each pass casting its operands as ``autotune.cost.layer_time`` charges a linear layer
(``Rates.cast_bytes``: the recipe's ``FP8_CAST_BYTES`` per element of the input and output widths, half in the
forward, half in the backward). The cross entropy after it is unchanged (``step_time``). The multi-token-prediction
modules call the same output layer (``autotune.cost.mtp.mtp_head_s``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.cost.flops import logits_flops_per_token

if TYPE_CHECKING:
    from autotune.cost.kernels import Rates
    from autotune.specs.model import ModelSpec
    from autotune.specs.plan import ParallelPlan

__all__ = ["output_layer_s"]


def output_layer_s(model: ModelSpec, plan: ParallelPlan, r: Rates, tokens: float, hbm: float) -> tuple[float, float]:
    """(one GEMM's seconds, the casts' seconds per pass) of the output layer for ``tokens`` tokens per micro-batch
    on one tensor-parallel rank (its weight column-parallel, V / tp wide): the forward runs one GEMM and the casts,
    the backward two GEMMs (data and weight gradients) and the casts. 16-bit, no casts, unless the plan's
    ``fp8_output_proj`` runs it in MXFP8."""
    t, h, v = plan.tp, model.hidden_size, model.vocab_size
    flops = logits_flops_per_token(model) * tokens / t
    if not plan.fp8_output_proj:
        return r.bf16_s(flops, tokens, h, v / t), 0.0  # output layer: 16-bit
    casts = tokens * (h + v) / t * r.cast_bytes / 2 / hbm  # as a linear layer's (layer_time), its k + n widths
    return r.linear_s(flops, tokens, h, v / t), casts
