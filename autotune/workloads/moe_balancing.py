"""The MoE load-balancing loss of the built-in model, as Megatron-core computes and applies it.

The loss (Switch Transformer's, arXiv:2101.03961; per sequence as DeepSeek-V3's, arXiv:2412.19437 §4.2), as
Megatron-core 0.19 writes it (``moe_utils.py`` ``switch_load_balancing_loss_func`` and
``compute_routing_scores_for_aux_loss``; ``router.py`` ``_apply_aux_loss`` / ``_apply_seq_aux_loss``)::

    loss = coeff * E * sum_i f_i * P_i,   f_i = (tokens routed to expert i) / (T * k),   P_i = mean_x p(x, i)

over the T tokens of the micro-batch (or of each sequence, then averaged over the sequences), where ``p`` is the
softmax over every expert's logit (a sigmoid router: each expert's sigmoid, normalised over the experts) and the
routing counted is the top-k of ``p`` itself (no expert bias, no group limit). transformers' Mixtral / Qwen3-MoE
``load_balancing_loss_func`` counts each token's k choices without the 1/k, so its loss is k times this one at the
same weight.

The loss is not added to the language-model loss: :class:`AttachBalancingLoss` ties it to the MoE layer's output,
which it leaves unchanged, and its backward adds the loss's gradient with the scale the trainer sets
(:func:`set_backward_scale`): the factor its main loss's gradient carries (Megatron's ``MoEAuxLossAutoScaler``
and ``set_loss_scale``). So the loss reaches the router on every pipeline stage, not only the one holding the
language-model loss, and the reported loss stays the cross entropy alone, as Megatron reports it.
"""

from __future__ import annotations

import torch

from autotune.specs.model_parts import MoESpec

__all__ = ["balancing_loss", "with_balancing_loss", "AttachBalancingLoss", "set_backward_scale", "backward_scale"]

_BACKWARD_SCALE = [1.0]


def set_backward_scale(scale: float) -> None:
    """The factor the trainer's main-loss gradient carries (1/accumulation steps where it divides the loss before
    backward; the fp16 loss scale; 1 where the schedule scales the gradients afterwards)."""
    _BACKWARD_SCALE[0] = float(scale)


def backward_scale() -> float:
    return _BACKWARD_SCALE[0]


def _switch_loss(scores: torch.Tensor, routed: torch.Tensor, k: int, coeff: float) -> torch.Tensor:
    """coeff * E * sum_i f_i P_i over the tokens of ``scores`` [T, E] and the 0/1 routing ``routed`` [T, E]."""
    tokens, experts = scores.shape
    return (scores.sum(0) * routed.sum(0)).sum() * (experts * coeff / (k * tokens * tokens))


def balancing_loss(logits: torch.Tensor, moe: MoESpec, seq_len: int) -> torch.Tensor | None:
    """The weighted load-balancing loss of the router ``logits`` [T, E] (T = sequences x ``seq_len`` tokens, one
    sequence after another), or None where the model states no weight."""
    coeff = moe.aux_loss_coeff
    if not coeff:
        return None
    logits = logits.float()
    if moe.router_score == "sigmoid":
        scores = torch.sigmoid(logits)
        scores = scores / (scores.sum(-1, keepdim=True) + 1e-20)
    else:
        scores = torch.softmax(logits, dim=-1)
    routed = torch.zeros_like(scores).scatter_(1, scores.topk(moe.top_k, dim=-1).indices, 1.0)
    if not moe.aux_loss_per_sequence:
        return _switch_loss(scores, routed, moe.top_k, coeff)
    per_sequence = [_switch_loss(s, r, moe.top_k, coeff)
                    for s, r in zip(scores.split(seq_len), routed.split(seq_len))]
    return torch.stack(per_sequence).mean()


class AttachBalancingLoss(torch.autograd.Function):
    """Returns ``output`` unchanged; its backward passes the output's gradient through and gives the loss the
    gradient ``backward_scale()``, as if the loss had been added to the main loss before backward."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        ctx.loss_shape, ctx.loss_dtype, ctx.loss_device = loss.shape, loss.dtype, loss.device
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        scale = torch.full(ctx.loss_shape, backward_scale(), dtype=ctx.loss_dtype, device=ctx.loss_device)
        return grad_output, scale


def with_balancing_loss(output: torch.Tensor, logits: torch.Tensor, moe: MoESpec, seq_len: int) -> torch.Tensor:
    """The MoE layer's ``output`` with the balancing loss of its router ``logits`` attached (unchanged where the
    model states no weight)."""
    loss = balancing_loss(logits, moe, seq_len)
    return output if loss is None else AttachBalancingLoss.apply(output, loss)
