"""Write every file a job needs for one plan into a folder, atomically.

The folder is built under a temporary name beside the target, every file is reloaded (JSON and
YAML parsed, shell scripts checked with ``bash -n``, Python compiled, the DeepSpeed config
validated by our schema and DeepSpeed's own parser), and only then renamed into place. A failure
at any point leaves no half-written folder; an existing folder is replaced only with ``force``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from autotune.api import Estimate
from autotune.emit.checkpoint import CheckpointPolicy, checkpoint_policy
from autotune.emit.deepspeed import accelerate_config_yaml, deepspeed_config, hf_deepspeed_config
from autotune.emit.launch import render_launch_scripts
from autotune.emit.megatron import megatron_args, megatron_deepspeed_args, megatron_env
from autotune.emit.options import EmitOptions
from autotune.emit.plan_md import plan_markdown
from autotune.emit.precision import te_fp8_recipe_snippet
from autotune.emit.validate import has_errors, validate_deepspeed_config
from autotune.errors import InputError

__all__ = ["Bundle", "render_bundle", "write_bundle"]

DS_CONFIG = "ds_config.json"


@dataclass(frozen=True, slots=True)
class Bundle:
    files: dict[str, str]
    """File name -> content."""
    policy: CheckpointPolicy


def _shell_array(name: str, argv: list[str], env: dict[str, str], comment: str) -> str:
    lines = ["#!/usr/bin/env bash", f"# {comment}", "# Source it, then pass \"${%s[@]}\" to the program." % name]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines.append(f"{name}=(")
    i = 0
    while i < len(argv):
        # one flag per line, with its values
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        lines.append("  " + " ".join(shlex.quote(a) for a in argv[i:j]))
        i = j
    lines.append(")")
    return "\n".join(lines) + "\n"


def render_bundle(est: Estimate, options: EmitOptions | None = None, *, measured: dict | None = None) -> Bundle:
    """Every file for the plan, as text (nothing written yet)."""
    options = options or EmitOptions()
    model, cluster, plan = est.model, est.cluster, est.plan
    policy = checkpoint_policy(est, options.checkpoint)
    files: dict[str, str] = {}
    env = megatron_env(plan, extra=options.launch.nccl_env)

    if plan.framework == "megatron":
        argv = megatron_args(model, cluster, plan, options, checkpoint_flags=policy.megatron_flags())
        files["megatron_args.sh"] = _shell_array("MEGATRON_ARGS", argv, env,
                                                 "Megatron-LM pretrain_gpt.py arguments written by autotune")
        entry = "pretrain_gpt.py" if options.launch.script == "train.py" else options.launch.script
        program_args = argv
    else:
        ds = deepspeed_config(model, cluster, plan, options, checkpoint_block=policy.ds_checkpoint_block())
        files[DS_CONFIG] = json.dumps(ds, indent=2) + "\n"
        files["ds_config_hf.json"] = json.dumps(hf_deepspeed_config(model, cluster, plan, options), indent=2) + "\n"
        files["accelerate_config.yaml"] = accelerate_config_yaml(plan, cluster, "ds_config_hf.json")
        if plan.tp > 1 or plan.pp > 1:
            mds = megatron_deepspeed_args(model, cluster, plan, options, DS_CONFIG)
            files["megatron_deepspeed_args.sh"] = _shell_array(
                "MEGATRON_DEEPSPEED_ARGS", mds, env, "Megatron-DeepSpeed pretrain_gpt.py arguments written by autotune")
        entry = options.launch.script
        program_args = ["--deepspeed", "--deepspeed_config", DS_CONFIG]
    if plan.precision == "fp8":
        files["te_fp8_recipe.py"] = te_fp8_recipe_snippet(plan)
    files.update(render_launch_scripts(cluster, plan, options, program_args=program_args, env=env,
                                       framework_entry=entry))
    files["plan.json"] = json.dumps(est.to_dict() | {"checkpoint": policy.to_dict()}, indent=2) + "\n"
    files["plan.md"] = plan_markdown(est, checkpoint_policy_text=policy.to_text(), measured=measured,
                                     files=sorted(files))
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
