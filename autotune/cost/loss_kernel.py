"""HBM bytes the cross-entropy loss moves per logit (per token and vocabulary entry of this GPU), forward and
backward together: the loss's memory-bound time is ``tokens x bytes x vocab / tp / HBM bandwidth``.

- ``FP32_SOFTMAX_BYTES`` (26): the loss upcasts the 16-bit logits and keeps an fp32 softmax (Megatron-LM's
  vocab-parallel cross entropy without ``--cross-entropy-loss-fusion``; torchtitan's and transformers'
  ``cross_entropy(logits.float())``): about 14 bytes a logit forward (the cast, max, exp, sum and division
  passes over fp32 data) and 12 backward (the softmax minus the one-hot, scaled, cast back to 16 bits).
- ``TE_FUSED_BYTES`` (10): Transformer Engine's ``parallel_cross_entropy`` before TE 2.18 (Megatron-core's
  ``cross_entropy_fusion_impl = "te"``; ``MemorySettings.te_cross_entropy``). Its Triton kernels read the 16-bit
  logits twice in forward and write the gradient over them once: ``online_softmax_kernel`` (one read for the
  row's max and sum) and ``cross_entropy_kernel`` (one read, the gradient stored in place), 2 + 2 + 2 bytes; the
  backward's ``element_mul_kernel`` reads and writes it once more to scale it by the incoming gradient, 2 + 2
  (TransformerEngine 01bbe3eea~1 transformer_engine/common/triton/cross_entropy.py :70-82, :175-190, :259-262;
  transformer_engine/pytorch/triton/cross_entropy.py ``cross_entropy_backward``: the scaling is skipped only for
  a scalar gradient of 1.0, and Megatron-core's per-token losses pass a tensor).
  TE >= 2.18 writes the gradient to a new fp32 tensor instead (01bbe3eea, #3193): such a run is stated as
  ``te_cross_entropy=False`` for its memory and charged the fp32 loss's bytes here too (its own kernel, 2 + 2 + 4
  forward and 4 + 4 backward, would be 16: the fp32 figure over-charges it by 10 bytes a logit).
"""

from __future__ import annotations

__all__ = ["FP32_SOFTMAX_BYTES", "TE_FUSED_BYTES", "loss_bytes_per_logit"]

FP32_SOFTMAX_BYTES = 26.0
TE_FUSED_BYTES = 10.0


def loss_bytes_per_logit(te_cross_entropy: bool | None) -> float:
    """HBM bytes per logit of the loss's forward and backward: TE's fused kernel (True), else the fp32 softmax
    (False, or None: every engine's own loss keeps an fp32 softmax)."""
    return TE_FUSED_BYTES if te_cross_entropy else FP32_SOFTMAX_BYTES
