"""Padding rows of the routed experts' grouped GEMMs on the sync-free MoE path of a whole-iteration CUDA graph.

The path (``autotune.specs.sync_free_moe``) runs the experts through the Transformer Engine op fuser
(``use_transformer_engine_op_fuser``, Megatron-Bridge 067f987 src/megatron/bridge/perf_recipes/qwen/common.py:54;
``autotune.emit.megatron_moe_graph``), whose grouped-tensor and fused grouped-MLP kernels take each expert's rows
in multiples of 256 (Megatron-core d98e8a64 megatron/core/transformer/moe/moe_utils.py:1472-1474
``get_align_size_for_quantization``: "TE's grouped-tensor and fused grouped-MLP kernels require 256-token
alignment"). HybridEP pads them in its dispatch: the dispatcher passes that alignment as ``pad_multiple``
(token_dispatcher.py:1142-1144, :1162 there; fused_a2a.py:563-564, "Alignment multiple required for FP8 GEMM"), so
the expert module adds no padding of its own (moe_utils.py:1494-1509 ``skip_routed_expert_padding``) and the
split sizes the grouped GEMMs run on are the padded ones: each local expert's segment grows by its row count's
residue to the next multiple, zero rows that every expert GEMM (fc1, fc2, their data and weight gradients)
computes like the others, and quantizes with the rest of the buffer (``autotune.cost.layer_time`` counts the expert
GEMMs' FP8 casts on the padded rows).

Under the routing the NVIDIA recipes benchmark (random logits, ``autotune.cost.moe_time``) an expert's rows vary
from micro-batch to micro-batch by far more than a few rows, so the residue is spread over the multiple: the
expected padding is ``(alignment - 1) / 2`` rows per local expert and micro-batch. Its weight grows with the local
experts' count and falls with the rows each receives: 64 experts of 1,024 rows (Qwen3-30B-A3B, ep2, micro-batch 2)
run 12% more expert-GEMM rows, 16 of 8,192 (ep8, micro-batch 4) 1.6%.

Not modelled: the FP8 / FP4 alignments of the other MoE paths (16 or 32 rows, ``get_fp8_align_size``,
megatron/core/fp8_utils.py:356-361: at most 0.8% of an expert's rows from 2,048 rows up), and the padding's bytes
in the activation ledger.
"""

from __future__ import annotations

from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.sync_free_moe import sync_free_moe

__all__ = ["OP_FUSER_ROW_ALIGNMENT", "expert_padding_rows"]

OP_FUSER_ROW_ALIGNMENT = 256
"""Rows per expert segment of the op fuser's grouped kernels (moe_utils.py:1472-1474 at d98e8a64)."""


def expert_padding_rows(model: ModelSpec, plan: ParallelPlan) -> float:
    """Expected zero rows each local expert's grouped GEMMs run beyond its routed rows, per micro-batch (module
    docstring); 0 off the sync-free path."""
    if not sync_free_moe(model, plan):
        return 0.0
    return (OP_FUSER_ROW_ALIGNMENT - 1) / 2
