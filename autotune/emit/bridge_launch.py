"""A launch line of Megatron-Bridge's ``scripts/training/run_recipe.py`` read as the overrides it applies: the recipe
it names and the ConfigContainer fields its arguments set, as run_recipe.py of megatron-bridge 0.6.0 parses them
(``_build_parser``, ``parse_args``: NVIDIA-NeMo/Megatron-Bridge@6124fbe, scripts/training/run_recipe.py:135-151,
160-261, 444-451). Nothing is run.

``--recipe NAME`` (or ``--model STEM``: the recipe ``STEM_<task>_config``, run_recipe.py:418-420) picks the recipe;
the convenience flags (``-gb``, ``-tp``, ``--seq_length``, ...) become the overrides of ``COMMON_OVERRIDE_FIELDS``,
and the trailing ``KEY=VALUE`` words follow them, in order (Hydra's ``+KEY`` / ``~KEY`` as their key).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from autotune.emit.argv_lint import filled_at_launch

__all__ = ["RUN_RECIPE", "RecipeCommand", "runs_recipe", "recipe_command"]

RUN_RECIPE = "run_recipe.py"

# run_recipe.py:135-151: (argument, the ConfigContainer field it sets)
_COMMON = (("max_steps", "train.train_iters"), ("global_batch_size", "train.global_batch_size"),
           ("micro_batch_size", "train.micro_batch_size"), ("seq_length", "dataset.seq_length"),
           ("tensor_model_parallel_size", "model.tensor_model_parallel_size"),
           ("pipeline_model_parallel_size", "model.pipeline_model_parallel_size"),
           ("context_parallel_size", "model.context_parallel_size"),
           ("virtual_pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size"),
           ("expert_model_parallel_size", "model.expert_model_parallel_size"),
           ("expert_tensor_parallel_size", "model.expert_tensor_parallel_size"), ("lr", "optimizer.lr"),
           ("min_lr", "optimizer.min_lr"), ("warmup_iters", "scheduler.lr_warmup_iters"),
           ("pretrained_checkpoint", "checkpoint.pretrained_checkpoint"), ("save_dir", "checkpoint.save"),
           ("load_dir", "checkpoint.load"), ("save_interval", "checkpoint.save_interval"))
_SHORT = {"max_steps": "-ms", "global_batch_size": "-gb", "micro_batch_size": "-mb", "seq_length": "-sl",
          "tensor_model_parallel_size": "-tp", "pipeline_model_parallel_size": "-pp", "context_parallel_size": "-cp",
          "virtual_pipeline_model_parallel_size": "-vp", "expert_model_parallel_size": "-ep",
          "expert_tensor_parallel_size": "-etp"}
_INTS = {"max_steps", "global_batch_size", "micro_batch_size", "seq_length", "tensor_model_parallel_size",
         "pipeline_model_parallel_size", "context_parallel_size", "virtual_pipeline_model_parallel_size",
         "expert_model_parallel_size", "expert_tensor_parallel_size", "warmup_iters", "save_interval"}


@dataclass(frozen=True)
class RecipeCommand:
    recipe: str
    """The recipe function run_recipe.py loads."""
    mode: str
    overrides: list[str]
    """``KEY=VALUE`` overrides, in the order run_recipe.py applies them (the convenience flags' first)."""
    unread: tuple[str, ...] = ()
    """Words the shell fills at launch (``$(echo "$CLI_OVERRIDES" | tr ...)``, unrun: autotune.emit.bash_reader):
    the overrides they give are not read."""


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # what run_recipe.py's parser would print, raised instead of exiting
        raise _Refused(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=RUN_RECIPE, add_help=False, allow_abbrev=False)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model")
    which.add_argument("--recipe")
    p.add_argument("--mode", choices=["pretrain", "sft", "lora", "dora"])
    p.add_argument("--step-func", "--step_func", dest="step_func")
    p.add_argument("--dataset")
    for name, _ in _COMMON:
        names = ([_SHORT[name]] if name in _SHORT else []) + [f"--{name}"]
        p.add_argument(*names, dest=name, type=int if name in _INTS else float if "lr" in name else str)
    for flags, dest in ((("--dry-run", "--dry_run"), "dryrun"), (("--deterministic",), "deterministic"),
                        (("--dump-env", "--dump_env"), "dump_env")):
        p.add_argument(*flags, action="store_true", dest=dest)
    return p


def runs_recipe(script: str | None) -> bool:
    """Whether a launch line's training script is Bridge's run_recipe.py."""
    return script is not None and PurePosixPath(script).name == RUN_RECIPE


def _infer_mode(recipe: str) -> str | None:
    """run_recipe.py's mode from a conventional recipe name (recipe_metadata.py infer_recipe_mode)."""
    name = f"_{recipe.lower().strip('_')}_"
    for marker, mode in (("_pretrain_", "pretrain"), ("_sft_", "sft"), ("_finetune_", "sft"), ("_dora_", "dora"),
                         ("_peft_", "lora"), ("_lora_", "lora")):
        if marker in name:
            return mode
    return None


def recipe_command(argv: Sequence[str]) -> RecipeCommand:
    """The recipe and overrides of run_recipe.py's arguments ``argv``; ValueError with run_recipe.py's own complaint
    where it refuses them (an unknown option, a word not KEY=VALUE, no --recipe / --model, no inferable mode)."""
    try:
        args, unknown = _parser().parse_known_args(list(argv))
    except _Refused as err:
        raise ValueError(str(err)) from None
    unread = tuple(w for w in unknown if filled_at_launch(w))
    unknown = [w for w in unknown if w not in unread]
    for word in unknown:  # run_recipe.py:262-271 _collect_overrides
        if word.startswith("-"):
            raise ValueError(f"Unknown option: {word}")
        if "=" not in word:
            raise ValueError(f"Expected override in KEY=VALUE form, got {word!r}")
    mode = args.mode or (_infer_mode(args.recipe) if args.recipe else None)
    if mode is None:
        raise ValueError("Unable to infer training mode; pass --mode or use a conventional --recipe name.")
    task = "peft" if mode in ("lora", "dora") else mode
    inferred = _infer_mode(args.recipe) if args.recipe else None
    if inferred is not None and ("peft" if inferred in ("lora", "dora") else inferred) != task:  # :300-304
        raise ValueError(f"Mode '{mode}' is incompatible with recipe '{args.recipe}'.")
    recipe = args.recipe or f"{args.model}_{task}_config"
    common = [f"{field}={getattr(args, name)}" for name, field in _COMMON if getattr(args, name) is not None]
    if args.seq_length is not None:  # "Set dataset.seq_length and synchronize the model" (sync_model_dataset_...)
        common.append(f"model.seq_length={args.seq_length}")
    return RecipeCommand(recipe, mode, [*common, *unknown], unread)
