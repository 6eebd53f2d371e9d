"""What a Megatron-DeepSpeed argument list states beyond the flags it shares with Megatron-LM (``autotune.job_files``
reads those): its ZeRO stage and offload (``--zero-stage``, the DeepSpeed config), its older flags
(``--checkpoint-activations``, ``--use-flash-attn*``), DeepSpeed-Ulysses (``--ds-sequence-parallel-size``) and
DeepSpeed-MoE's experts (``--num-experts``, ``--topk``, ``--expert-interval``), with the fork's defaults.

Source: deepspeedai/Megatron-DeepSpeed@4efb479d megatron/arguments.py (the flags and defaults; validate_args),
megatron/model/transformer.py (which layers hold experts; the attention kernel), DeepSpeed 0.19.8
deepspeed/moe/sharded_moe.py (the gate).
"""

from __future__ import annotations

from autotune.emit.job_args import FROM_SUBJECT as _SUBJECT
from autotune.errors import InputError
from autotune.specs.model import MoESpec

__all__ = ["megatron_deepspeed_fields", "deepspeed_moe", "FLASH_FLAGS"]

FLASH_FLAGS = ("--use-flash-attn", "--use-flash-attn-v1", "--use-flash-attn-v2", "--use-flash-attn-triton",
               "--use-flash-attn-builder")
"""The fork's fused attention flags (arguments.py:927-936); without one, ParallelAttention runs CoreAttention, which
materialises the s x s scores (transformer.py:528-533)."""


def megatron_deepspeed_fields(f: dict, n, ds: dict | None, path: str, notes: list[str]) -> dict:
    """The plan fields of a Megatron-DeepSpeed argument list (``f``: its flags; ``n(flag)``: an integer flag) that
    differ from Megatron-LM's reading, with the DeepSpeed config ``ds`` beside it."""
    zero = (ds or {}).get("zero_optimization") or {}
    out: dict = {"engine": "megatron-deepspeed",
                 "zero_stage": n("--zero-stage") if "--zero-stage" in f else int(zero.get("stage", 0))}
    for name in ("offload_optimizer", "offload_param"):
        out[name] = (zero.get(name) or {}).get("device") or "none"
    # --checkpoint-activations: every layer recomputed, --checkpoint-num-layers (default 1) at a time
    # (transformer.py:2082, gpt_model.py:446-447); the fork keeps it beside --recompute-granularity
    if "--checkpoint-activations" in f and not f.get("--recompute-granularity"):
        out["recompute"] = "full"
    # DeepSpeed-Ulysses: dp = world / (tp x pp x sp) (arguments.py:98-108)
    if (sp := n("--ds-sequence-parallel-size")) and sp > 1:
        out["cp"] = sp
    if "--ds-sequence-parallel-fpdt" in f:
        notes.append(f"{path}: --ds-sequence-parallel-fpdt (FPDT's chunked attention and offload) is not modelled: "
                     "estimated as DeepSpeed-Ulysses")
    out["flash_attention"] = any(flag in f for flag in FLASH_FLAGS)
    if not out["flash_attention"]:
        notes.append(f"{path}: no --use-flash-attn* flag: the fork's unfused attention (the s x s scores kept), "
                     "read so")
    if "--use-flash-attn-triton" in f:
        notes.append(f"{path}: --use-flash-attn-triton: estimated with FlashAttention-2's speed; `estimate "
                     "--attention-kernel fa-triton` costs the Triton kernel")
    return out


def deepspeed_moe(f: dict, n, experts: list[str], width: int, path: str, notes: list[str]) -> MoESpec | None:
    """DeepSpeed-MoE's experts as the fork builds them (None: ``--num-experts 1``, its default, is dense): every
    ``--expert-interval``-th layer (default 2) from the interval-th holds them (transformer.py:1650-1660), routed by a
    softmax of a bias-free linear gate to ``--topk`` (default 1) experts, each ``width`` wide (the dense MLP's)."""
    try:
        counts = [int(v) for word in experts for v in word.split()]  # an unquoted $EXPERTS list, or its words
    except ValueError:
        raise InputError([f"{path}: --num-experts {' '.join(experts)} is not a list of integers: write one count, "
                          "or one per MoE layer"], subject=_SUBJECT) from None
    if not counts or max(counts) <= 1:
        return None
    interval = n("--expert-interval") or 2
    if len(set(counts)) > 1:
        notes.append(f"{path}: --num-experts {' '.join(experts)} (pyramid MoE): every MoE layer estimated with "
                     f"{max(counts)} experts, the most")
    if f.get("--mlp-type") == "residual":
        notes.append(f"{path}: --mlp-type residual (a dense MLP beside the experts) is not modelled")
    if "--disable-moe-token-dropping" not in f:
        notes.append(f"{path}: DeepSpeed-MoE drops tokens over capacity factor "
                     f"{f.get('--moe-train-capacity-factor', '1.0')} (the fork's default; --disable-moe-token-dropping "
                     "turns it off): estimated dropless, every routed token computed")
    return MoESpec(num_experts=max(counts), top_k=n("--topk") or 1, expert_ffn_hidden_size=width,
                   num_dense_layers=0, moe_layer_step=interval, router_score="softmax", router_bias=False)
