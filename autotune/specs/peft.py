"""Parameter-efficient fine-tuning (LoRA) as a plan decision: the names, defaults and checks of the plan's ``peft``,
``lora_rank``, ``lora_alpha`` and ``lora_targets`` fields.

LoRA as Megatron-Bridge runs it (NVIDIA-NeMo/Megatron-Bridge @067f987, src/megatron/bridge/peft/lora.py): every
base parameter is frozen (peft/base.py:187-190 ``freeze_model``: ``param.requires_grad = False``), and each target
linear layer gets a trainable low-rank adapter beside it (``LoRALinear``, peft/lora_layers.py:80-85: the base output
plus ``linear_out(linear_in(x))``, ``linear_in`` hidden -> rank, ``linear_out`` rank -> output). The cost of it:
``autotune.cost.lora``.
"""

from __future__ import annotations

__all__ = ["PEFT_METHODS", "PEFT_SETTINGS", "LORA_TARGETS", "LORA_DEFAULT_RANK", "LORA_DEFAULT_ALPHA", "peft_problems"]

PEFT_METHODS = ("lora",)
# The plan fields of parameter-efficient fine-tuning (None: full training, left out of ``ParallelPlan.to_dict``).
PEFT_SETTINGS = ("peft", "lora_rank", "lora_alpha", "lora_targets")
# The linear layers LoRA may adapt, Megatron-core's module names, in this order in a plan; all four are Bridge's
# default target_modules (peft/lora.py:143-145).
LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
# Bridge's LoRA defaults: dim (the rank) 32, alpha 32 (peft/lora.py:146-147).
LORA_DEFAULT_RANK = 32
LORA_DEFAULT_ALPHA = 32.0


def peft_problems(peft: object, rank: object, alpha: object, targets: object) -> tuple[list[str], tuple | None]:
    """What is wrong with a plan's PEFT fields, and its targets as a tuple in :data:`LORA_TARGETS` order (a plan read
    from JSON holds a list)."""
    problems: list[str] = []
    if peft not in (None, *PEFT_METHODS):
        problems.append(f"peft must be one of {', '.join(PEFT_METHODS)} or absent (full training), got {peft!r}")
    if rank is not None and (type(rank) is not int or rank < 1):
        problems.append(f"lora_rank must be a positive integer or absent (Bridge's {LORA_DEFAULT_RANK}), got {rank!r}")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0):
        problems.append(f"lora_alpha must be a positive number or absent (Bridge's {LORA_DEFAULT_ALPHA:g}), "
                        f"got {alpha!r}")
    ordered = None
    if targets is not None:
        if isinstance(targets, str) or not isinstance(targets, (list, tuple)) or not targets:
            problems.append(f"lora_targets must be a non-empty list of {', '.join(LORA_TARGETS)} or absent (all "
                            f"four), got {targets!r}")
        elif unknown := [t for t in targets if t not in LORA_TARGETS]:
            problems.append(f"lora_targets: {', '.join(map(repr, unknown))} is not one of {', '.join(LORA_TARGETS)}")
        else:
            ordered = tuple(t for t in LORA_TARGETS if t in targets)
    if peft is None and (rank, alpha, targets) != (None, None, None):
        problems.append("lora_rank / lora_alpha / lora_targets shape a LoRA adapter, and this plan trains every "
                        "weight: add --peft lora or drop them")
    return problems, ordered
