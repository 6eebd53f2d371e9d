"""Megatron-Bridge overrides of a LoRA plan (``ParallelPlan.peft``): the base recipe it starts from, its ``peft``
block and the pretrained checkpoint it fine-tunes.

Megatron-LM has no adapters (pretrain_gpt.py trains every weight): a LoRA plan of the megatron engine is written as
Megatron-Bridge files only. Bridge 0.6 (NVIDIA-NeMo/Megatron-Bridge v0.6.0):

- the base recipe is the model's PEFT recipe (src/megatron/bridge/recipes/llama/h100/llama3.py:2338
  ``llama3_8b_peft_1gpu_h100_bf16_config``, :2578 ``llama3_70b_peft_8gpu_h100_bf16_config``): ``cfg.peft`` is already a
  ``LoRA`` (recipes/common.py ``_peft_common``), its mixed precision the registered name "bf16_mixed" (llama3.py
  :2627) and its ``comm_overlap`` None (common.py:327), so the overrides set the LoRA's own fields;
- ``peft.dim`` / ``peft.alpha`` / ``peft.target_modules`` / ``peft.dropout`` are the ``LoRA`` dataclass fields
  (src/megatron/bridge/peft/lora.py:143-149 at 067f987; ``alpha`` an int);
- ``ConfigContainer.validate`` asserts ``checkpoint.pretrained_checkpoint`` (training/config.py:1482-1483): "PEFT
  requires a pretrained checkpoint path";
- scripts/training/run_recipe.py takes ``--mode lora`` (its PublicMode) and refuses a recipe name whose task is
  another (``_validate_recipe_mode``; recipe_metadata.py ``infer_recipe_mode``: "_peft_" names are lora).
"""

from __future__ import annotations

from autotune.emit.megatron_bridge_recipes import BridgeRecipe
from autotune.emit.options import EmitOptions
from autotune.errors import InputError
from autotune.specs.lora import lora_run
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset

__all__ = ["PEFT_RECIPES", "bridge_peft_recipe", "peft_problems", "peft_overrides", "bridge_mode"]

_LLAMA_H100 = "megatron.bridge.recipes.llama.h100.llama3"
PEFT_RECIPES: dict[str, BridgeRecipe] = {
    "llama3-8b": BridgeRecipe("llama3_8b_peft_1gpu_h100_bf16_config", _LLAMA_H100, "meta-llama/Meta-Llama-3-8B",
                              precision_is_named=True, comm_overlap=False),
    "llama3-70b": BridgeRecipe("llama3_70b_peft_8gpu_h100_bf16_config", _LLAMA_H100, "meta-llama/Meta-Llama-3-70B",
                               precision_is_named=True, comm_overlap=False),
}
"""Model preset -> its Bridge 0.6 PEFT recipe (the presets whose shape is the recipe's Hugging Face config)."""


def bridge_peft_recipe(model: ModelSpec) -> BridgeRecipe | None:
    """The model's PEFT recipe, for the preset itself only (as ``bridge_recipe``); None where Bridge has none."""
    recipe = PEFT_RECIPES.get(model.name)
    try:
        return recipe if recipe is not None and load_model_preset(model.name) == model else None
    except InputError:
        return None


def peft_problems(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    """What of a LoRA plan Bridge's files cannot express (empty for full training)."""
    run = lora_run(plan)
    if run is None:
        return []
    out = []
    if bridge_peft_recipe(model) is None:
        out.append(f"peft: Megatron-Bridge 0.6 has no LoRA recipe for {model.name} (autotune writes LoRA over "
                   f"{', '.join(PEFT_RECIPES)}'s PEFT recipes), and Megatron-LM has no LoRA: drop --peft")
    if run.alpha != int(run.alpha):
        out.append(f"peft.alpha: Bridge's LoRA.alpha is an integer (peft/lora.py:147), not {run.alpha:g}")
    return out


def peft_overrides(plan: ParallelPlan, options: EmitOptions, problems: list[str]) -> dict:
    """The ``peft`` block and the pretrained checkpoint of a LoRA plan's overrides (empty for full training)."""
    run = lora_run(plan)
    if run is None:
        return {}
    pretrained = options.checkpoint.pretrained_dir
    if pretrained is None:
        problems.append("checkpoint.pretrained_checkpoint: LoRA fine-tunes a pretrained model and Bridge asserts its "
                        "path (training/config.py:1482-1483): give --pretrained-checkpoint DIR (a Megatron "
                        "checkpoint of the base model)")
    return {"peft": {"dim": run.rank, "alpha": int(run.alpha), "dropout": 0.0, "target_modules": list(run.targets)},
            "checkpoint": {"pretrained_checkpoint": pretrained}}


def bridge_mode(plan: ParallelPlan) -> str:
    """run_recipe.py's ``--mode`` for the plan: lora, or pretrain."""
    return "lora" if plan.peft == "lora" else "pretrain"
