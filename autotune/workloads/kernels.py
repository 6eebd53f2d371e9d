"""Fused-kernel stand-ins for the built-in model (autotune.workloads.transformer): custom autograd functions that
save what the GPU kernels save (autotune.workloads.transformer's docstring says which), and the norms built on them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["RMSNorm", "L2Norm", "rms_norm", "swiglu", "geglu", "apply_rope", "bool_dropout"]


def _acc(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the accumulation dtype: fp32 for half types, unchanged for fp32/fp64."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class _RMSNormFn(torch.autograd.Function):
    """y = x * rstd * w, computed in fp32; saves x (model dtype) and rstd (fp32, one per token)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = _acc(x)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd * _acc(weight)).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        xhat = _acc(x) * rstd
        g = _acc(grad)
        gw = g * _acc(weight)
        grad_x = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        grad_w = (g * xhat).reshape(-1, x.shape[-1]).sum(0)
        return grad_x.to(x.dtype), grad_w.to(weight.dtype), None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return _RMSNormFn.apply(x, weight, eps)


class L2Norm(nn.Module):
    """x / rms(x) over the last dimension in fp32, no weight: Llama 4's Q/K norm (transformers Llama4TextL2Norm,
    Megatron-core's L2Norm)."""

    def __init__(self, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = _acc(x)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class RMSNorm(nn.Module):
    """``zero_centered``: the output multiplied by (1 + weight), the weight starting at zero (Gemma's RMSNorm,
    Megatron's ``--apply-layernorm-1p``)."""

    def __init__(self, width: int, eps: float = 1e-5, *, zero_centered: bool = False) -> None:
        super().__init__()
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.zeros(width) if zero_centered else torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, 1 + self.weight if self.zero_centered else self.weight, self.eps)


class _SwiGLUFn(torch.autograd.Function):
    """silu(gate) * up over a fused [gate | up] input; saves only that input (Megatron bias_swiglu)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        gate, up = _acc(x).chunk(2, dim=-1)
        g = _acc(grad)
        sig = torch.sigmoid(gate)
        silu = gate * sig
        d_gate = g * up * sig * (1 + gate * (1 - sig))
        d_up = g * silu
        return torch.cat([d_gate, d_up], dim=-1).to(x.dtype)


def swiglu(x: torch.Tensor) -> torch.Tensor:
    return _SwiGLUFn.apply(x)


_GELU_C = math.sqrt(2.0 / math.pi)


class _GeGLUFn(torch.autograd.Function):
    """gelu_tanh(gate) * up over a fused [gate | up] input (Gemma's MLP); saves only that input, as SwiGLU."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        gate, up = _acc(x).chunk(2, dim=-1)
        g = _acc(grad)
        t = torch.tanh(_GELU_C * (gate + 0.044715 * gate.pow(3)))
        d_gelu = 0.5 * (1 + t) + 0.5 * gate * (1 - t * t) * _GELU_C * (1 + 3 * 0.044715 * gate * gate)
        d_gate = g * up * d_gelu
        d_up = g * 0.5 * gate * (1 + t)
        return torch.cat([d_gate, d_up], dim=-1).to(x.dtype)


def geglu(x: torch.Tensor) -> torch.Tensor:
    return _GeGLUFn.apply(x)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def _rotate_half_transposed(y: torch.Tensor) -> torch.Tensor:
    y1, y2 = y.chunk(2, dim=-1)
    return torch.cat([y2, -y1], dim=-1)


class _RoPEFn(torch.autograd.Function):
    """x * cos + rotate_half(x) * sin on [b, s, heads, d]; linear, so nothing but cos/sin is kept."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # cos/sin are module buffers (constants): kept on ctx, not as saved activations.
        ctx.cos, ctx.sin = cos, sin
        xf = _acc(x)
        return (xf * cos + _rotate_half(xf) * sin).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        g = _acc(grad)
        out = g * ctx.cos + _rotate_half_transposed(g * ctx.sin)
        return out.to(grad.dtype), None, None


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [b, s, heads, d]; cos/sin: [s, d] (fp32)."""
    s = x.shape[1]
    return _RoPEFn.apply(x, cos[:s, None, :], sin[:s, None, :])


class _DropoutFn(torch.autograd.Function):
    """Inverted dropout keeping a 1-byte bool mask (as the CUDA kernel does; CPU's native one keeps
    the mask in the input dtype)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        mask = torch.rand(x.shape, device=x.device) >= p
        ctx.scale = 1.0 / (1.0 - p)
        ctx.save_for_backward(mask)
        return x * mask * ctx.scale

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (mask,) = ctx.saved_tensors
        return grad * mask * ctx.scale, None


def bool_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    return _DropoutFn.apply(x, p)
