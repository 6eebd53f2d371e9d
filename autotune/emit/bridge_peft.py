"""Megatron-Bridge overrides of a LoRA plan (``ParallelPlan.peft``): its ``peft`` block and the pretrained checkpoint
it fine-tunes.

Megatron-LM has no adapters (pretrain_gpt.py trains every weight): a LoRA plan of the megatron engine is written as
Megatron-Bridge files only. Bridge 0.6 (megatron-bridge 0.6.2, NVIDIA-NeMo/Megatron-Bridge v0.6.0):

- the overrides start from the model's pretraining recipe, whose ``peft`` is None. A PEFT recipe's ``LoRA`` cannot be
  changed by overrides: it is callable, so ``create_omegaconf_dict_config`` leaves it out and ``apply_overrides``
  puts the original back after merging (training/utils/omegaconf_utils.py ``_dataclass_to_omegaconf_dict``,
  ``_restore_excluded_fields``). An override of a None field with a ``_target_`` mapping is instantiated
  (``_apply_overrides``: "Handle dictionaries with _target_ fields"): ``megatron.bridge.peft.lora.LoRA`` with its
  dataclass fields ``dim``, ``alpha`` (an int), ``dropout`` and ``target_modules`` (peft/lora.py:143-149 at 067f987);
- training applies ``cfg.peft`` whatever the mode (training/setup.py:340-342, the pre-wrap hook that freezes the
  model and adds the adapters) and loads the pretrained weights in that hook (setup.py:395-402), so run_recipe.py
  runs it with the pretraining recipe's own ``--mode pretrain`` (``_validate_recipe_mode`` refuses ``--mode lora``
  with a "_pretrain_" recipe name);
- ``ConfigContainer.validate`` asserts ``checkpoint.pretrained_checkpoint`` (training/config.py:1482-1483): "PEFT
  requires a pretrained checkpoint path".
"""

from __future__ import annotations

from autotune.emit.options import EmitOptions
from autotune.specs.lora import lora_run
from autotune.specs.plan import ParallelPlan

__all__ = ["LORA_TARGET", "peft_problems", "peft_overrides"]

LORA_TARGET = "megatron.bridge.peft.lora.LoRA"
"""The class Bridge instantiates from the ``peft`` override's ``_target_``."""


def peft_problems(plan: ParallelPlan) -> list[str]:
    """What of a LoRA plan Bridge's files cannot express (empty for full training)."""
    run = lora_run(plan)
    if run is not None and run.alpha != int(run.alpha):
        return [f"peft.alpha: Bridge's LoRA.alpha is an integer (peft/lora.py:147), not {run.alpha:g}"]
    return []


def peft_overrides(plan: ParallelPlan, options: EmitOptions, problems: list[str]) -> dict:
    """The ``peft`` block and the pretrained checkpoint of a LoRA plan's overrides (empty for full training)."""
    run = lora_run(plan)
    if run is None:
        return {}
    problems += peft_problems(plan)
    pretrained = options.checkpoint.pretrained_dir
    if pretrained is None:
        problems.append("checkpoint.pretrained_checkpoint: LoRA fine-tunes a pretrained model and Bridge asserts its "
                        "path (training/config.py:1482-1483): give --pretrained-checkpoint DIR (a Megatron "
                        "checkpoint of the base model)")
    return {"peft": {"_target_": LORA_TARGET, "dim": run.rank, "alpha": int(run.alpha), "dropout": 0.0,
                     "target_modules": list(run.targets)},
            "checkpoint": {"pretrained_checkpoint": pretrained}}
