"""Pieces several engines share: the built-in training entry point, bash argument arrays, and the DeepSpeed
config of a plan as an engine that runs DeepSpeed writes it (what its TP and CP are in DeepSpeed's terms)."""

from __future__ import annotations

import json
import shlex

from autotune.emit.deepspeed import deepspeed_config
from autotune.emit.options import EmitOptions
from autotune.engines.facts import EngineSupport
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["BUILTIN_ENTRY", "PLAN_FILE", "DS_CONFIG", "builtin_or_user_entry", "shell_array", "optimizer_need",
           "engine_deepspeed_config", "deepspeed_json"]

BUILTIN_ENTRY = ("-m", "autotune.train")
"""The built-in training program: trains the plan's model (built from its ModelSpec) with the engine's own APIs."""
PLAN_FILE = "plan.json"
DS_CONFIG = "ds_config.json"


def builtin_or_user_entry(options: EmitOptions, builtin_args: list[str],
                          user_args: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """(entry, program arguments): the user's ``launch.script`` with ``user_args``, else the built-in entry."""
    script = options.launch.script
    if script:
        return (script,), user_args
    return BUILTIN_ENTRY, ["--plan", PLAN_FILE, *builtin_args]


def shell_array(name: str, argv: list[str], env: dict[str, str], comment: str) -> str:
    """A bash file that exports ``env`` and defines the array ``name`` (one flag per line, with its values)."""
    lines = ["#!/usr/bin/env bash", f"# {comment}", "# Source it, then pass \"${%s[@]}\" to the program." % name]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines.append(f"{name}=(")
    i = 0
    while i < len(argv):
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        lines.append("  " + " ".join(shlex.quote(a) for a in argv[i:j]))
        i = j
    lines.append(")")
    return "\n".join(lines) + "\n"


def engine_deepspeed_config(support: EngineSupport, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                            options: EmitOptions | None = None, *, checkpoint_block: dict | None = None) -> dict:
    """The DeepSpeed config of ``plan`` for an engine that runs DeepSpeed: TP is DeepSpeed's AutoTP only where
    the engine does TP that way (Megatron-DeepSpeed's TP is Megatron's own), CP is Ulysses where the engine's is."""
    return deepspeed_config(model, cluster, plan, options, checkpoint_block=checkpoint_block,
                            autotp=support.tp == "autotp", ulysses=support.cp == "ulysses")


def deepspeed_json(support: EngineSupport, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                   options: EmitOptions, checkpoint_block: dict | None) -> str:
    """:func:`engine_deepspeed_config` as the JSON file text."""
    cfg = engine_deepspeed_config(support, model, cluster, plan, options, checkpoint_block=checkpoint_block)
    return json.dumps(cfg, indent=2) + "\n"


def optimizer_need(options: EmitOptions) -> str:
    """The optimizer, clipping and schedule a user's own loop runs (the values ds_config.json and the Megatron
    arguments carry; a plain PyTorch script has no file that says them)."""
    o = options.optimizer
    return (f"the plan's optimizer: torch.optim.AdamW(params, lr={o.lr:g}, betas=({o.betas[0]:g}, {o.betas[1]:g}), "
            f"eps={o.eps:g}, weight_decay={o.weight_decay:g}); torch.nn.utils.clip_grad_norm_(params, {o.grad_clip:g}) "
            f"before each step; the learning rate warmed up linearly over {o.warmup_steps} steps, then cosine down to "
            f"{o.min_lr:g} at step {o.train_steps}")
