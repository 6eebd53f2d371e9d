"""What a Megatron-DeepSpeed argument list states beyond the flags it shares with Megatron-LM (``autotune.job_files``
reads those): its ZeRO stage and offload (``--zero-stage``, the DeepSpeed config), its older flags
(``--checkpoint-activations``, ``--use-flash-attn*``), DeepSpeed-Ulysses (``--ds-sequence-parallel-size``) and
DeepSpeed-MoE's experts (``--num-experts``, ``--topk``, ``--expert-interval``), with the fork's defaults.

Source: deepspeedai/Megatron-DeepSpeed@4efb479d megatron/arguments.py (the flags and defaults; validate_args),
megatron/model/transformer.py (which layers hold experts; the attention kernel), DeepSpeed 0.19.8
deepspeed/moe/sharded_moe.py (the gate).
"""

from __future__ import annotations

import dataclasses

from autotune.emit.job_args import FROM_SUBJECT as _SUBJECT
from autotune.emit.job_args import whole as _int
from autotune.errors import InputError
from autotune.specs.model import ModelSpec, MoESpec

__all__ = ["megatron_deepspeed_fields", "deepspeed_moe", "pyramid_note", "FLASH_FLAGS", "DeepSpeedTemplate", "read_deepspeed_file"]


class DeepSpeedTemplate(str):
    """A --from DeepSpeed config that is not JSON, given beside a Megatron-DeepSpeed script: the template the
    script fills with sed (its path), read where the script names it."""


def read_deepspeed_file(path: str, kinds) -> dict | DeepSpeedTemplate:
    """A --from DeepSpeed config's JSON object; a template (:class:`DeepSpeedTemplate`) where it is not JSON and a
    Megatron-DeepSpeed script is among ``kinds`` ((path, kind) pairs)."""
    from autotune.inputs import read_json

    try:
        ds = read_json(path, subject="DeepSpeed config")
    except InputError:
        if any(kind == "megatron-deepspeed" for _, kind in kinds):
            return DeepSpeedTemplate(path)
        raise
    if not isinstance(ds, dict):
        raise InputError([f"{path}: a DeepSpeed config is a JSON object"], subject=_SUBJECT)
    return ds


FLASH_FLAGS = ("--use-flash-attn", "--use-flash-attn-v1", "--use-flash-attn-v2", "--use-flash-attn-triton",
               "--use-flash-attn-builder")
"""The fork's fused attention flags (arguments.py:927-936); without one, ParallelAttention runs CoreAttention, which
materialises the s x s scores (transformer.py:528-533)."""


def megatron_deepspeed_fields(f: dict, n, ds: dict | str | None, path: str, notes: list[str],
                              sizes: dict | None = None) -> dict:
    """The plan fields of a Megatron-DeepSpeed argument list (``f``: its flags; ``n(flag)``: an integer flag) that
    differ from Megatron-LM's reading, with the DeepSpeed config ``ds`` beside it (a :class:`DeepSpeedTemplate`:
    the --from template the script fills; None: the one the script writes, if it does); ``sizes``: the micro and
    global batch and precision read from the flags, which the DeepSpeed config completes or replaces."""
    if ds is None or isinstance(ds, DeepSpeedTemplate):
        ds = script_deepspeed_config(path, f, ds, notes)
    out: dict = {"engine": "megatron-deepspeed"}
    out |= deepspeed_config_fields(f, n, ds, path, notes, sizes or {})
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
    moe_layers = (n("--num-layers") or 0) // interval
    if len(counts) not in (1, moe_layers):  # the fork asserts it (transformer.py:1651-1652)
        raise InputError([f"{path}: --num-experts gives {len(counts)} counts for {moe_layers} MoE layers (--num-layers "
                          f"/ --expert-interval {interval}), which the fork refuses ({_FORK} megatron/model/"
                          f"transformer.py:1651-1652): give one count, or one per MoE layer"], subject=_SUBJECT)
    if f.get("--mlp-type") == "residual":
        notes.append(f"{path}: --mlp-type residual (a dense MLP beside the experts) is not modelled")
    if "--disable-moe-token-dropping" not in f:
        notes.append(f"{path}: DeepSpeed-MoE drops tokens over capacity factor "
                     f"{f.get('--moe-train-capacity-factor', '1.0')} (the fork's default; --disable-moe-token-dropping "
                     "turns it off): estimated dropless, every routed token computed")
    return MoESpec(num_experts=max(counts), top_k=n("--topk") or 1, expert_ffn_hidden_size=width,
                   num_dense_layers=0, moe_layer_step=interval, router_score="softmax", router_bias=False)


_FORK = "deepspeedai/Megatron-DeepSpeed@4efb479d"


def script_deepspeed_config(path: str, f: dict, given: str | None, notes: list[str]) -> dict | None:
    """The DeepSpeed config the script writes and names with --deepspeed_config
    (:func:`autotune.emit.written_deepspeed_config.written_deepspeed_config`: a here-document's JSON, or a template
    filled by sed, ``given`` with --from or next to the script); None, with a note saying what was not read, where
    it cannot be read."""
    from autotune.emit.written_deepspeed_config import written_deepspeed_config

    name = f.get("--deepspeed-config")
    written = written_deepspeed_config(path, name if isinstance(name, str) else None, given)
    if written is None:
        if given:
            notes.append(f"{given}: not read: no sed command of {path} fills it for --deepspeed_config")
        return None
    if written.data is None:
        notes.append(f"{path}: {written.unread}: its ZeRO stage, offload, precision and batch sizes are not read "
                     f"(the flags' are): {written.fix}")
        return None
    notes.append(f"{path}: read {written.what}")
    return written.data


def deepspeed_config_fields(f: dict, n, ds: dict | None, path: str, notes: list[str], sizes: dict) -> dict:
    """ZeRO stage, offload, precision and batch sizes of a Megatron-DeepSpeed job: DeepSpeed's, from its config
    where it is read, else the flags'."""
    zero = (ds or {}).get("zero_optimization") or {}
    flag = n("--zero-stage") if "--zero-stage" in f else None
    out: dict = {"zero_stage": flag or 0}
    if ds is not None:  # DeepSpeed runs its config's stage; --zero-stage only turns zero.Init on (pretrain_gpt.py:49)
        out["zero_stage"] = _int(zero.get("stage", 0), "the DeepSpeed config's zero_optimization.stage", path)
        if flag is not None and flag != out["zero_stage"]:
            notes.append(f"{path}: --zero-stage {flag}, the DeepSpeed config's stage {out['zero_stage']}: DeepSpeed "
                         f"runs the config's ({_FORK} pretrain_gpt.py:46-50 reads the flag for zero.Init alone)")
    for name in ("offload_optimizer", "offload_param"):
        device = (zero.get(name) or {}).get("device") if isinstance(zero.get(name), dict) else None
        out[name] = device if device in ("cpu", "nvme") else "none"
    out |= _cpu_optimizer(f, ds, path, notes)
    if ds is None:
        return out
    # with --deepspeed the fork leaves the model's dtype to DeepSpeed (megatron/training.py:406-407 returns before
    # Float16Module), which casts it to its config's fp16 / bf16 (deepspeed 0.19.8 runtime/engine.py:2080-2088)
    ran = "fp16" if (ds.get("fp16") or {}).get("enabled") is True else \
        "bf16" if (ds.get("bf16") or ds.get("bfloat16") or {}).get("enabled") is True else None
    if ran is None:
        notes.append(f"{path}: the DeepSpeed config enables neither fp16 nor bf16 (DeepSpeed trains in fp32): "
                     f"estimated as {sizes.get('precision', 'bf16')}")
    elif sizes.get("precision") not in ("fp8", "fp4", ran):
        notes.append(f"{path}: precision {ran}, the DeepSpeed config's, which casts the model (the flags say "
                     f"{sizes.get('precision')})")
        out["precision"] = ran
    # the fork sets DeepSpeed's batch from Megatron's flags every step (megatron/training.py:1253-1258)
    for flag, key, field in (("--micro-batch-size", "train_micro_batch_size_per_gpu", "micro_batch_size"),
                             ("--global-batch-size", "train_batch_size", "global_batch_size")):
        value = ds.get(key)
        if type(value) is not int:
            continue
        if flag not in f:
            out[field] = value
            notes.append(f"{path}: {field} {value}, the DeepSpeed config's {key} (no {flag})")
        elif n(flag) != value:
            notes.append(f"{path}: {flag} {n(flag)} taken, not the DeepSpeed config's {key} {value}: the fork "
                         f"sets DeepSpeed's batch from the flags each step ({_FORK} megatron/training.py:1253-1258)")
    return out


def _cpu_optimizer(f: dict, ds: dict | None, path: str, notes: list[str]) -> dict:
    """--cpu-optimizer: the fork builds DeepSpeedCPUAdam (torch.optim.AdamW with --cpu_torch_adam) as the optimizer
    it gives deepspeed.initialize (megatron/optimizer/__init__.py:83-94, megatron/training.py:617-623), which steps
    the ZeRO-Offload partitions in host memory; the combinations DeepSpeed refuses are refused here."""
    if ds is None:
        if "--cpu-optimizer" in f:
            notes.append(f"{path}: --cpu-optimizer (DeepSpeedCPUAdam steps in host memory, which needs the DeepSpeed "
                         "config's offload_optimizer, not read here): estimated with optimizer offload to cpu")
            return {"offload_optimizer": "cpu"}
        return {}
    from autotune.emit.megatron_deepspeed_pair import cpu_optimizer_problem

    if (found := cpu_optimizer_problem(f, ds)) is not None:
        raise InputError([f"{path}: {found[0]}: {found[1]}"], subject=_SUBJECT)
    return {}


def pyramid_note(model: ModelSpec, counts: list[int], path: str) -> str | None:
    """The assumed-setting note of a PR-MoE (``--num-experts 64 64 ... 128 128``, one count per MoE layer,
    transformer.py:1650-1660): ModelSpec holds one expert count, so every MoE layer is estimated with the most;
    the note gives the parameters that adds (those of the experts the smaller layers lack)."""
    if model.moe is None or len(set(counts)) < 2:
        return None
    most = max(counts)
    fewer = dataclasses.replace(model, moe=dataclasses.replace(model.moe, num_experts=most - 1))
    per_expert = (model.num_params - fewer.num_params) / len(counts)  # one expert of one MoE layer
    extra = per_expert * sum(most - c for c in counts)
    return (f"{path}: --num-experts {' '.join(map(str, counts))} (pyramid MoE): autotune's model holds one expert "
            f"count, so every MoE layer is estimated with {most} experts, the most: {extra / 1e9:.2f}B parameters "
            "more than the per-layer counts hold (their weights, gradients and optimizer states overstated)")
