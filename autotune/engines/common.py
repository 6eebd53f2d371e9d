"""Pieces several engines share: the built-in training entry point and the DeepSpeed-engine files."""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.api import Estimate
    from autotune.emit.options import EmitOptions

__all__ = ["BUILTIN_ENTRY", "PLAN_FILE", "DS_CONFIG", "builtin_or_user_entry", "shell_array", "deepspeed_json"]

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


def deepspeed_json(est: Estimate, options: EmitOptions, checkpoint_block: dict | None) -> str:
    from autotune.emit.deepspeed import deepspeed_config

    cfg = deepspeed_config(est.model, est.cluster, est.plan, options, checkpoint_block=checkpoint_block)
    return json.dumps(cfg, indent=2) + "\n"
