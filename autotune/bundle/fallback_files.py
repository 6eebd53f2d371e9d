"""The fallback plan in a bundle: its own files under ``fallback/``, ``resume_fallback.sh`` (the checkpoint
conversion the format needs, then the fallback's launcher) and the plan.md section that says when to use it."""

from __future__ import annotations

import shlex
from collections.abc import Callable

from autotune.cost.estimate import Estimate
from autotune.engines import engine_for
from autotune.report import plan_summary
from autotune.search.fallback import Fallback

__all__ = ["FALLBACK_DIR", "RESUME_SCRIPT", "fallback_section", "fallback_files"]

FALLBACK_DIR = "fallback"
RESUME_SCRIPT = "resume_fallback.sh"


def fallback_files(fallback: Fallback, est: Estimate, save_dir: str,
                   render: Callable[[Estimate, bool], dict[str, str]]) -> dict[str, str]:
    """``fallback/<file>`` for each file of the fallback's own bundle (``render(estimate, load_universal)``) and
    the resume script; nothing when there is no fallback plan."""
    if fallback.estimate is None:
        return {}
    universal = engine_for(est.plan).checkpoint_format == "deepspeed"
    files = {f"{FALLBACK_DIR}/{name}": text for name, text in render(fallback.estimate, universal).items()}
    files[RESUME_SCRIPT] = _resume_script(fallback, est, save_dir, universal)
    return files


def _resume_script(fallback: Fallback, est: Estimate, save_dir: str, universal: bool) -> str:
    fb = fallback.estimate
    lines = ["#!/usr/bin/env bash",
             f"# Resume {est.model.name} on {fallback.num_gpus} GPUs after losing {fallback.lost_gpus}: "
             f"{plan_summary(fb.plan)}",
             f"# (predicted {fb.time.tokens_per_s:,.0f} tokens/s; the full job's plan: {est.time.tokens_per_s:,.0f}).",
             "# Run it where fallback/launch_torchrun.sh would run (every remaining node; SLURM: sbatch "
             "fallback/launch_slurm.sbatch after the conversion). SAVE_DIR: the folder the job saved into.",
             "set -euo pipefail",
             'SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
             f'SAVE="${{SAVE_DIR:-{shlex.quote(save_dir)}}}"',
             "# A relative folder is the built-in trainer's, under this bundle; else the folder the job ran in.",
             'case "$SAVE" in /*) ;; *) if [ -d "$SCRIPT_DIR/$SAVE" ]; then SAVE="$SCRIPT_DIR/$SAVE"; fi ;; esac']
    if universal:
        lines += ['if [ ! -f "$SAVE/latest" ]; then',
                  '    echo "resume_fallback.sh: no $SAVE/latest: nothing saved yet (set SAVE_DIR)" >&2; exit 2',
                  "fi",
                  'TAG="$(cat "$SAVE/latest")"',
                  "# DeepSpeed's universal checkpoint loads into another layout (checkpoint.load_universal in "
                  "fallback/'s config); convert once, on one node.",
                  'if [ ! -d "$SAVE/${TAG}_universal" ]; then',
                  '    python -m deepspeed.checkpoint.ds_to_universal --input_folder "$SAVE/$TAG" '
                  '--output_folder "$SAVE/${TAG}_universal"',
                  "fi"]
    else:
        lines.append(f"# {fallback.conversion}")
    lines.append('exec bash "$SCRIPT_DIR/fallback/launch_torchrun.sh" "$@"')
    return "\n".join(lines) + "\n"


def fallback_section(fallback: Fallback | None, est: Estimate) -> list[str]:
    """plan.md's lines on the fallback plan (empty when none was asked for)."""
    if fallback is None:
        return []
    out = [f"## If {fallback.lost_gpus} GPUs are lost: the fallback plan", ""]
    if fallback.estimate is None:
        return [*out, f"No fallback plan: {fallback.reason}.", ""]
    fb = fallback.estimate
    ratio = fb.time.tokens_per_s / est.time.tokens_per_s
    return [*out,
            f"`{plan_summary(fb.plan)}` on {fallback.num_gpus} GPUs: predicted {fb.time.tokens_per_s:,.0f} tokens/s "
            f"({ratio:.0%} of this plan's), {fb.memory.total / 2**30:,.1f} GiB per GPU of "
            f"{fb.cluster.gpu.memory_gib:g}; same model, global batch, sequence length and precision, so the run "
            f"continues where its last checkpoint left it.",
            "",
            f"Resuming this plan's checkpoint there: {fallback.conversion}"
            + (f" (about {fallback.conversion_s / 60:,.1f} min on one node)" if fallback.conversion_s else "")
            + f"; reading it back takes about {fallback.load_s / 60:,.1f} min. `{RESUME_SCRIPT}` does it and starts "
            f"`{FALLBACK_DIR}/launch_torchrun.sh`; `{FALLBACK_DIR}/` holds the fallback's own files (its plan.md, "
            "configs and launchers for the remaining nodes: edit its hostfile / host names).",
            ""]
