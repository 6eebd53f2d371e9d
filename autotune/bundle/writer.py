"""Write every file a job needs for one plan into a folder, atomically.

The folder is built under a temporary name beside the target, every file is reloaded (JSON and
YAML parsed, shell scripts checked with ``bash -n``, Python compiled, the DeepSpeed config
validated by our schema and DeepSpeed's own parser), and only then renamed into place. A failure
at any point leaves no half-written folder; an existing folder is replaced only with ``force``.

Replacing (``force``) never leaves the target missing and never deletes a file the user added:

- on Linux the new folder and the old one swap names in one step (``renameat2`` with
  ``RENAME_EXCHANGE``); the new files first take an aside name ``.NAME.old-XXXX/NAME`` and the
  swap leaves the previous folder there. Where the exchange is not available (another OS, a file
  system without it) the previous folder is renamed aside, then the new one in: a kill between the
  two leaves the target missing, the previous folder intact in the aside copy;
- the aside copy is removed only when every entry of it is a file emit writes (this bundle's files
  and those the previous ``plan.md`` lists); otherwise it is kept and ``notes`` says where, and so
  does every later ``autotune emit`` of the same folder
  (:func:`autotune.commands.emit_out.clean_leftovers`), which never deletes an aside copy.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import yaml

from autotune.bundle.fallback_files import FALLBACK_DIR, fallback_files, fallback_section
from autotune.bundle.plan_md import plan_markdown
from autotune.cost.checkpoint import CheckpointPolicy, checkpoint_policy
from autotune.cost.estimate import Estimate
from autotune.emit.launch import render_launch_scripts
from autotune.emit.megatron import megatron_env
from autotune.emit.options import EmitOptions
from autotune.emit.precision import is_te_recipe, te_fp8_recipe_snippet
from autotune.emit.validate import has_errors, validate_deepspeed_config
from autotune.engines import engine_for
from autotune.engines.common import DS_CONFIG
from autotune.errors import InputError
from autotune.report import plan_summary
from autotune.search.fallback import Fallback
from autotune.specs.plan import ParallelPlan

__all__ = ["Bundle", "render_bundle", "write_bundle", "engine_version_record", "builtin_trainer_problem", "DS_CONFIG"]


@dataclass(frozen=True, slots=True)
class Bundle:
    files: dict[str, str]
    """File name -> content."""
    policy: CheckpointPolicy
    notes: tuple[str, ...] = ()
    """What the user should know of the files (emit prints it): the launch scripts' program cannot run the plan."""


def render_bundle(est: Estimate, options: EmitOptions | None = None, *, measured: dict | None = None,
                  fallback: Fallback | None = None, load_universal: bool = False) -> Bundle:
    """Every file for the plan, as text (nothing written yet). ``fallback``: the plan to resume on after losing
    GPUs, written under ``fallback/`` with ``resume_fallback.sh``; ``load_universal``: this plan resumes a DeepSpeed
    universal checkpoint (it is such a fallback)."""
    options = options or EmitOptions()
    model, cluster, plan = est.model, est.cluster, est.plan
    policy = checkpoint_policy(est, options.checkpoint)
    files: dict[str, str] = {}
    # The allocator setting the ledger assumed (MemoryEstimate.expandable_segments), unless the user's own wins.
    allocator = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} if est.memory.expandable_segments else {}
    env = megatron_env(plan, extra={**allocator, **options.launch.nccl_env})

    engine = engine_for(plan)
    engine_files = engine.render_files(model, cluster, plan, options, policy.files(load_universal=load_universal), env)
    files.update(engine_files.files)
    summary = plan_summary(plan)
    fp8_recipe = plan.fp8_recipe or engine.comm.fp8_recipe
    if plan.precision == "fp8" and is_te_recipe(fp8_recipe):
        # a Transformer Engine recipe only: torchao's Float8 / MX recipes (FSDP2) run no TE module
        files["te_fp8_recipe.py"] = te_fp8_recipe_snippet(plan, summary, fp8_recipe)
    files.update(render_launch_scripts(cluster, plan, options, program_args=engine_files.program_args,
                                       env=engine_files.env, entry=engine_files.entry,
                                       bundle_files={*engine_files.files, "plan.json"}, summary=summary))
    if fallback is not None:
        # Which node is lost is not known here: the fallback's files name no hosts (placeholders to edit).
        remaining = replace(options, launch=replace(options.launch, hosts=(), master_addr=None))
        files.update(fallback_files(fallback, est, policy.save_dir,
                                    lambda other, universal: render_bundle(other, remaining,
                                                                           load_universal=universal).files))
    # The optimizer settings emit was given: the FSDP2 built-in trainer's learning-rate schedule reads them.
    extra = {"optimizer": asdict(options.optimizer), "engine_version": engine_version_record(plan, options)} | (
        {} if fallback is None else {"fallback": fallback.to_dict()})
    files["plan.json"] = json.dumps(est.to_dict() | {"checkpoint": policy.to_dict()} | extra, indent=2) + "\n"
    files["plan.md"] = plan_markdown(est, checkpoint_policy_text=policy.to_text() + _builtin_saving(est, options),
                                     measured=measured,
                                     files=sorted(f for f in files if "/" not in f),
                                     user_script_needs=engine_files.user_script_needs,
                                     fallback_lines=fallback_section(fallback, est),
                                     host_at_save=policy.host_at_save,
                                     trainer_problem=(problem := builtin_trainer_problem(est, options)))
    notes = ()
    if problem:
        own = sorted(engine_files.files)
        notes = (f"the launch scripts run autotune's built-in trainer, which cannot run this plan: {problem}; run it "
                 + (f"with {' or '.join(own)} (plan.md says how) or " if own else "")
                 + "with your own script (emit --script: plan.md says what it must do)",)
    return Bundle(files=files, policy=policy, notes=notes)


def builtin_trainer_problem(est: Estimate, options: EmitOptions) -> str | None:
    """Why the program the launch scripts run, autotune's built-in trainer, cannot run the plan (None when it can,
    or they run the user's ``--script``, or the engine's own program)."""
    if options.launch.script is not None:
        return None
    return engine_for(est.plan).builtin_trainer_problem(est.model, est.plan)


def engine_version_record(plan: ParallelPlan, options: EmitOptions) -> dict[str, str]:
    """plan.json's ``engine_version``: the release of the engine's package the files are written for
    (``Engine.release_written``); `emit --plan-json` of the file writes for it again unless told otherwise."""
    engine = engine_for(plan)
    return {"engine": engine.name, "package": engine.versions.package, "release": engine.release_written(options)}


def _builtin_saving(est: Estimate, options: EmitOptions) -> str:
    """What the built-in trainer does with the policy (autotune/train/checkpointing.py), where it runs."""
    plan, engine = est.plan, engine_for(est.plan)
    if options.launch.script is not None or not engine.trainer_saves:
        return ""
    if plan.pp > 1:
        return " The built-in trainer does not save pipelined runs (pp > 1) yet: it says so when it starts."
    where = ("the newest `step-N` folder marked `autotune_complete`" if engine.checkpoint_format == "dcp"
             else "`latest`")
    return (" The built-in trainer saves at this interval into the folder above (relative to this bundle) and keeps "
            "the newest ones; starting the same launch script again resumes from the last complete checkpoint ("
            f"{where}) with the same learning rate and data order. Extra trainer flags: "
            "`AUTOTUNE_TRAIN_ARGS=\"--steps N\" bash launch_torchrun.sh`.")


def _check_file(path: Path, est: Estimate) -> list[str]:
    """Reload one written file (``est``: the plan it was written for); the problems found (empty when it loads)."""
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
                return [f"{path.parent.name}/{name} is not valid bash: {proc.stderr.strip()}"]
    except (ValueError, SyntaxError, yaml.YAMLError) as err:
        return [f"{name} does not reload: {err}"]
    if name == DS_CONFIG:
        p = est.plan
        problems = validate_deepspeed_config(path, world_size=p.world_size, tp=p.tp, pp=p.pp, cp=p.cp)
        if has_errors(problems):
            return [f"{name}: {x.render()}" for x in problems if x.severity == "error"]
    return []


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_UNSUPPORTED = frozenset({errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP})


@functools.cache
def _libc_renameat2():
    """The C library's ``renameat2`` (glibc 2.28+), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        func = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    func.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    func.restype = ctypes.c_int
    return func


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """``renameat2(src, dst, flags)``; False where the C library, the kernel or the file system lacks it."""
    func = _libc_renameat2()
    if func is None:
        return False
    if func(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(src), None, str(dst))


_LISTED_FILE = re.compile(r"^\s*- `([^`/]+)`:", re.MULTILINE)


def _not_ours(folder: Path, names: set[str]) -> list[str]:
    """Entries of ``folder`` emit did not write: not in ``names`` nor listed by the folder's plan.md, or not a
    regular file (a folder, a link)."""
    listed = set(names) | {"plan.md"}
    try:
        listed |= set(_LISTED_FILE.findall((folder / "plan.md").read_text(encoding="utf-8", errors="replace")))
    except OSError:
        pass
    out = []
    with os.scandir(folder) as entries:
        for entry in entries:
            inside = {n.split("/", 1)[1] for n in names if n.startswith(entry.name + "/")}
            if inside and entry.is_dir(follow_symlinks=False):  # a folder emit writes (fallback/): its own files
                out += [f"{entry.name}/{x}" for x in _not_ours(Path(entry.path), inside)]
            elif entry.name not in listed or not entry.is_file(follow_symlinks=False):
                out.append(entry.name + ("/" if entry.is_dir(follow_symlinks=False) else ""))
    return sorted(out)


def _replace(tmp: Path, out: Path, parent: Path, names: set[str], notes: list[str]) -> None:
    """Put the finished folder ``tmp`` in place of the existing folder ``out``; the previous one is removed only
    when it holds nothing but files emit writes, else kept aside (a line in ``notes`` says where)."""
    aside_dir = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.old-"))
    aside = aside_dir / out.name
    os.rename(tmp, aside)  # the new files, under the aside name until the swap
    try:
        swapped = _renameat2(aside, out, _RENAME_EXCHANGE)
    except BaseException:
        shutil.rmtree(aside_dir, ignore_errors=True)  # not swapped: the aside copy holds only the new files
        raise
    if not swapped:
        # No exchange here: the previous folder aside, then the new one in. A kill between the two leaves
        # ``out`` missing and the previous folder whole at ``previous``; the next emit says where it is.
        previous_dir = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.old-"))
        try:
            os.rename(out, previous_dir / out.name)
        except BaseException:
            shutil.rmtree(aside_dir, ignore_errors=True)
            os.rmdir(previous_dir)
            raise
        os.rename(aside, out)
        os.rmdir(aside_dir)
        aside_dir, aside = previous_dir, previous_dir / out.name
    try:
        extra = _not_ours(aside, names)
    except OSError as err:
        extra = [f"(its entries cannot be listed: {err.strerror or err})"]
    if extra:
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        notes.append(f"{out} held {len(extra)} file(s) emit does not write ({shown}): the previous folder is kept "
                     f"at {aside}; take what you need from it, then remove {aside_dir}")
    else:
        shutil.rmtree(aside_dir, ignore_errors=True)


def write_bundle(est: Estimate, out_dir: str | Path, options: EmitOptions | None = None, *, force: bool = False,
                 measured: dict | None = None, notes: list[str] | None = None,
                 fallback: Fallback | None = None) -> list[Path]:
    """Write the plan's files into ``out_dir`` atomically; returns the written paths.

    ``notes`` (when given) gets a line for what the user should know: a replaced folder kept aside because it
    held files emit does not write.
    """
    notes = [] if notes is None else notes
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
    bundle = render_bundle(est, options, measured=measured, fallback=fallback)
    notes += bundle.notes
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.tmp-"))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the job's folder is an ordinary one
        for name, text in bundle.files.items():
            path = tmp / name
            if "/" in name:
                path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            if name.endswith((".sh", ".sbatch")):
                path.chmod(0o755)
        owner = {FALLBACK_DIR: fallback.estimate} if fallback is not None and fallback.estimate else {}
        problems = [p for name in bundle.files
                    for p in _check_file(tmp / name, owner.get(name.split("/", 1)[0], est) if "/" in name else est)]
        if problems:
            raise InputError(problems, subject="emitted files (a bug: please report it)")
        if out.exists():
            _replace(tmp, out, parent, set(bundle.files), notes)
        elif not _renameat2(tmp, out, _RENAME_NOREPLACE):  # an ``out`` made meanwhile is not replaced
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [out / name for name in sorted(bundle.files)]
