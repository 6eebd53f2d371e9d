"""The fused attention kernel's rate by head width: narrower heads reach less of the tensor cores' peak.

Each score of the attention core costs 4 d FLOPs of matrix multiply in the forward (QK^T and PV, head width
``d``) and a fixed amount of softmax work (max, exp, rescale) that does not shrink with ``d``; the kernel's rate is
then proportional to d / (d + c), ``c`` the softmax's cost in head-width equivalents. The attention fractions of
``autotune/presets/gpus.yaml`` are head_dim-128 figures (H100: FlashAttention-2 ~35%, the cuDNN / FlashAttention-3
class 0.61 of 989 TFLOP/s = 603, cuDNN's 609 below), so the rate at width ``d`` is the fraction times
(d / (d + c)) / (128 / (128 + c)).

``c`` per kernel class from one measured pair, FlashAttention-3 paper (Shah et al. 2024, arXiv 2407.08608)
Figure 5, forward, BF16, H100 SXM5, without causal mask, sequence length 4k (TFLOP/s, head_dim 64 / 128):
cuDNN 408 / 609, FlashAttention-2 321 / 368. Solving r = rate64 / rate128 = (128 + c) / (2 (64 + c)) for c:
c = 128 (1 - r) / (2 r - 1): cuDNN (what Transformer Engine runs as Megatron's "fa3" class, and the only fused
backend with attention sinks: TE d0067d0 attention/dot_product_attention/utils.py:1122-1124 turns FlashAttention
off for ``softmax_type != "vanilla"``) r = 0.670, c = 124; FlashAttention-2 ("fa2") r = 0.872, c = 22. The backward
is taken to scale as the forward (no per-width backward figure). Above 128 the factor stays 1 (the measured
fractions are 128-wide figures; no gain beyond them is modelled).
"""

from __future__ import annotations

__all__ = ["SOFTMAX_HEAD_DIM_EQUIVALENT", "head_dim_factor"]

_MEASURED = {"fa3": (408.0, 609.0), "fa2": (321.0, 368.0)}
"""Forward TFLOP/s at head_dim 64 and 128 (FlashAttention-3 paper Figure 5, H100, non-causal, 4k): the kernel class
"fa3" is TE's cuDNN attention (its cuDNN bars), "fa2" FlashAttention-2."""


def _softmax_cost(rate64: float, rate128: float) -> float:
    r = rate64 / rate128
    return 128.0 * (1.0 - r) / (2.0 * r - 1.0)


SOFTMAX_HEAD_DIM_EQUIVALENT = {kernel: _softmax_cost(*pair) for kernel, pair in _MEASURED.items()}
"""``c`` per kernel class: the softmax's cost per score in head-width equivalents of matrix multiply."""


def head_dim_factor(kernel: str, head_dim: float) -> float:
    """The fused attention kernel's rate at ``head_dim`` over its rate at 128 (at most 1); 1 for a kernel without a
    measured pair (unfused attention is costed as GEMMs of head_dim depth instead)."""
    c = SOFTMAX_HEAD_DIM_EQUIVALENT.get(kernel)
    if c is None or head_dim >= 128:
        return 1.0
    return (head_dim / (head_dim + c)) / (128.0 / (128.0 + c))
