"""Write every file a job needs for one plan into a folder, atomically.

The folder is built under a temporary name beside the target, every file is reloaded (JSON and
YAML parsed, shell scripts checked with ``bash -n``, Python compiled, the DeepSpeed config
validated by our schema and DeepSpeed's own parser), and only then renamed into place. A failure
at any point leaves no half-written folder; an existing folder is replaced only with ``force``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from autotune.bundle.plan_md import plan_markdown
from autotune.cost.checkpoint import CheckpointPolicy, checkpoint_policy
from autotune.cost.estimate import Estimate
from autotune.emit.launch import render_launch_scripts
from autotune.emit.megatron import megatron_env
from autotune.emit.options import EmitOptions
from autotune.emit.precision import te_fp8_recipe_snippet
from autotune.emit.validate import has_errors, validate_deepspeed_config
from autotune.engines import engine_for
from autotune.engines.common import DS_CONFIG
from autotune.errors import InputError
from autotune.report import plan_summary

__all__ = ["Bundle", "render_bundle", "write_bundle", "DS_CONFIG"]


@dataclass(frozen=True, slots=True)
class Bundle:
    files: dict[str, str]
    """File name -> content."""
    policy: CheckpointPolicy


def render_bundle(est: Estimate, options: EmitOptions | None = None, *, measured: dict | None = None) -> Bundle:
    """Every file for the plan, as text (nothing written yet)."""
    options = options or EmitOptions()
    model, cluster, plan = est.model, est.cluster, est.plan
    policy = checkpoint_policy(est, options.checkpoint)
    files: dict[str, str] = {}
    env = megatron_env(plan, extra=options.launch.nccl_env)

    engine = engine_for(plan)
    engine_files = engine.render_files(model, cluster, plan, options, policy.files(), env)
    files.update(engine_files.files)
    summary = plan_summary(plan)
    if plan.precision == "fp8":
        files["te_fp8_recipe.py"] = te_fp8_recipe_snippet(plan, summary)
    files.update(render_launch_scripts(cluster, plan, options, program_args=engine_files.program_args,
                                       env=engine_files.env, entry=engine_files.entry,
                                       bundle_files={*engine_files.files, "plan.json"}, summary=summary))
    files["plan.json"] = json.dumps(est.to_dict() | {"checkpoint": policy.to_dict()}, indent=2) + "\n"
    files["plan.md"] = plan_markdown(est, checkpoint_policy_text=policy.to_text(), measured=measured,
                                     files=sorted(files), user_script_needs=engine_files.user_script_needs)
    return Bundle(files=files, policy=policy)


def _check_file(path: Path, est: Estimate) -> list[str]:
    """Reload one written file; the problems found (empty when it loads)."""
    name = path.name
    text = path.read_text(encoding="utf-8")
    try:
        if name.endswith(".json"):
            json.loads(text)
        elif name.endswith((".yaml", ".yml")):
            yaml.safe_load(text)
        elif name.endswith(".py"):
            compile(text, name, "exec")
        elif name.endswith((".sh", ".sbatch")):
            proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
            if proc.returncode:
                return [f"{name} is not valid bash: {proc.stderr.strip()}"]
    except (ValueError, SyntaxError, yaml.YAMLError) as err:
        return [f"{name} does not reload: {err}"]
    if name == DS_CONFIG:
        p = est.plan
        problems = validate_deepspeed_config(path, world_size=p.world_size, tp=p.tp, pp=p.pp, cp=p.cp)
        if has_errors(problems):
            return [f"{name}: {x.render()}" for x in problems if x.severity == "error"]
    return []


def write_bundle(est: Estimate, out_dir: str | Path, options: EmitOptions | None = None, *, force: bool = False,
                 measured: dict | None = None) -> list[Path]:
    """Write the plan's files into ``out_dir`` atomically; returns the written paths."""
    out = Path(out_dir)
    if out.exists() and not force:
        raise InputError([f"{out} already exists: choose another --out or pass --force to replace it"],
                         subject="output folder")
    if out.exists() and not out.is_dir():
        raise InputError([f"{out} exists and is not a folder"], subject="output folder")
    parent = out.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError([f"cannot create {parent}: {err.strerror}; choose another --out"],
                         subject="output folder") from None
    if not os.access(parent, os.W_OK):
        raise InputError([f"cannot write into {parent}: not writable; choose another --out"],
                         subject="output folder")
    bundle = render_bundle(est, options, measured=measured)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.tmp-"))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the job's folder is an ordinary one
        for name, text in bundle.files.items():
            path = tmp / name
            path.write_text(text, encoding="utf-8")
            if name.endswith((".sh", ".sbatch")):
                path.chmod(0o755)
        problems = [p for name in bundle.files for p in _check_file(tmp / name, est)]
        if problems:
            raise InputError(problems, subject="emitted files (a bug: please report it)")
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.old-"))
            os.replace(out, old / out.name)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [out / name for name in sorted(bundle.files)]
