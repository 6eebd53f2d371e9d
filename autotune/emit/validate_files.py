"""One entry point for every file ``autotune emit`` writes, and for users' own: which kind of file it is,
and its problems for a job of ``world_size`` ranks.

Kinds: ``deepspeed`` (a DeepSpeed JSON; ``*_hf.json``: a Hugging Face Trainer one, whose "auto" values are
filled first), ``megatron`` (Megatron-LM arguments, a shell file), ``megatron-deepspeed`` (Megatron-DeepSpeed
arguments: a shell file that passes ``--deepspeed``), ``accelerate`` (an accelerate config YAML) and
``torchtitan`` (a torchtitan TOML job config), ``plan`` (autotune's own ``plan.json``: it must rebuild the plan),
``hostfile`` (DeepSpeed's ``HOST slots=N`` lines), ``megatron-bridge`` (``bridge_overrides.yaml`` / ``.args``:
Megatron-Bridge ConfigContainer overrides) and ``launch`` (a shell or ``.sbatch`` file that starts a program
with no Megatron argument in it: autotune's DeepSpeed / FSDP / HF launch scripts, a user's launcher).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from autotune.emit.accelerate_lint import accelerate_config_problems, accelerate_job_sizes
from autotune.emit.job_args import launch_sizes
from autotune.emit.launch_lint import hostfile_job_sizes, hostfile_problems, launch_script_problems
from autotune.emit.bridge_launch import runs_recipe
from autotune.emit.megatron_bridge_lint import (BASE_RECIPE_LINE, CONFIG_CONTAINER_TARGET, bridge_job_sizes,
                                               bridge_overrides_problems)
from autotune.emit.megatron_flags import is_flag
from autotune.emit.megatron_deepspeed_lint import megatron_deepspeed_args_problems
from autotune.emit.megatron_lint import megatron_args_problems
from autotune.emit.megatron_versions import header_release, release_in_use
from autotune.emit.problems import JobSizes, Problem
from autotune.emit.shell_args import (SHELL_SUFFIXES, read_megatron_args_file, read_megatron_args_file_with_lines,
                                      read_megatron_launch)
from autotune.emit.torchtitan_lint import torchtitan_config_problems, torchtitan_job_sizes
from autotune.emit.torchtitan_module_read import module_function, torchtitan_module_problems, torchtitan_module_sizes
from autotune.emit.validate import read_deepspeed_config, validate_deepspeed_config
from autotune.errors import InputError
from autotune.inputs import read_json

__all__ = ["FILE_KINDS", "JobSizes", "file_kind", "validate_file", "megatron_file_kind", "sizes_from_file"]

FILE_KINDS = ("deepspeed", "megatron", "megatron-deepspeed", "accelerate", "torchtitan", "plan", "hostfile", "launch",
              "megatron-bridge", "torchtitan-module")
_MDS_MARKERS = ("--deepspeed", "--deepspeed_config", "--deepspeed-config", "--zero-stage", "--no-pipeline-parallel")


def megatron_file_kind(argv: list[str]) -> str:
    """``megatron-deepspeed`` when the arguments hand the job to DeepSpeed, else ``megatron``."""
    return "megatron-deepspeed" if any(a.split("=", 1)[0] in _MDS_MARKERS for a in argv) else "megatron"


_BRIDGE_CONTAINER = re.compile(rf"^_target_:\s*{re.escape(CONFIG_CONTAINER_TARGET)}\s*$", re.MULTILINE)
"""The first line of a complete Megatron-Bridge config as ``ConfigContainer.to_yaml`` writes it (sorted keys)."""


def file_kind(path: str | Path) -> str:
    """The kind of a file, from its name (and, for a shell file, its arguments; for a YAML, whether it is a whole
    Megatron-Bridge ConfigContainer: a checkpoint's ``run_config.yaml``, Bridge 0.6 checkpoint_utils.py:34)."""
    if module_function(path)[1] is not None:  # FILE.py:NAME, one config of a torchtitan 0.3 registry
        return "torchtitan-module"
    if Path(path).is_dir():  # a checkpoint's save folder, most likely: its saved job is read by --from
        raise InputError([f"{str(path)!r} is a folder, not a config file: give its files; `autotune validate FOLDER` "
                          f"(the folder alone, no --kind) checks the config a DeepSpeed, Megatron-Bridge or "
                          f"Megatron-LM checkpoint saved, and `autotune estimate --from FOLDER --gpu GPU` reads any "
                          f"checkpoint's job"],
                         subject="validate request")
    name = Path(path).name.lower()
    if name == "hostfile" or name.endswith(".hostfile"):
        return "hostfile"
    if name.startswith("bridge_overrides") or (name.startswith("run_config") and name.endswith((".yaml", ".yml"))):
        return "megatron-bridge"
    if name.endswith(".json"):
        return "plan" if name == "plan.json" else "deepspeed"
    if name.endswith((".yaml", ".yml")):
        head = _head(path, 1 << 16)
        bridge = _BRIDGE_CONTAINER.search(head) or _bridge_sections(head) or BASE_RECIPE_LINE.search(head)
        return "megatron-bridge" if bridge else "accelerate"
    if name.endswith(".toml"):
        return "torchtitan"
    if name.endswith(".py"):
        return "torchtitan-module"  # a torchtitan 0.3 config module (torchtitan_plan.py)
    if name.endswith(SHELL_SUFFIXES) and runs_recipe(read_megatron_launch(path)[3]):
        return "megatron-bridge"  # a launch line of Bridge's run_recipe.py: the recipe and its overrides
    if name.endswith((*SHELL_SUFFIXES, ".args", ".txt")) or "megatron" in name:
        argv = read_megatron_args_file(path)
        if name.endswith(SHELL_SUFFIXES) and not any(is_flag(a.split("=", 1)[0]) for a in argv):
            return "launch"  # it starts a program whose arguments are not Megatron's (or live in another file)
        return megatron_file_kind(argv)
    raise InputError([f"cannot tell what kind of file {str(path)!r} is from its name: give --kind "
                      f"({', '.join(FILE_KINDS)})"], subject="validate request")


_TOP_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*:", re.MULTILINE)
_BRIDGE_SECTIONS = {"train", "optimizer", "scheduler", "dataset", "checkpoint", "ddp", "dist", "logger", "tokenizer",
                    "rng", "comm_overlap", "mixed_precision", "peft"}
"""Megatron-Bridge ConfigContainer's sections besides ``model`` (training/config.py): an override YAML of a recipe
(Bridge's own examples/*/conf/*_override_example.yaml, tutorials/recipes/*/conf) has model and some of them."""


def _bridge_sections(text: str) -> bool:
    """A YAML whose top-level keys are a Bridge ConfigContainer's (``model`` beside ``train`` / ``dataset`` / ...), and
    not an accelerate config's (``distributed_type``, ``compute_environment``)."""
    keys = set(_TOP_KEY.findall(text))
    return "model" in keys and bool(keys & _BRIDGE_SECTIONS) and not keys & {"distributed_type",
                                                                             "compute_environment"}


def _head(path: str | Path, size: int = 4096) -> str:
    """The start of a file ('' where it does not read: the kind's own reader then says why)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(size)
    except OSError:
        return ""


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def sizes_from_file(path: str | Path, kind: str) -> JobSizes:
    """The world size and degrees a file states (DeepSpeed's batch triple does not give tp/pp)."""
    if kind in ("megatron", "megatron-deepspeed"):
        argv = read_megatron_args_file(path)
        last: dict[str, str] = {}
        for i, a in enumerate(argv):
            name, eq, value = a.partition("=")
            if eq:
                last[name] = value
            elif i + 1 < len(argv):
                last[name] = argv[i + 1]
        nodes, per_node, _ = launch_sizes(str(path))  # its torchrun / deepspeed line, as --from reads it
        return JobSizes(world_size=nodes * per_node if nodes and per_node else None,
                        tp=_int(last.get("--tensor-model-parallel-size")) or 1,
                        pp=_int(last.get("--pipeline-model-parallel-size")) or 1,
                        cp=_int(last.get("--context-parallel-size")) or 1)
    if kind == "plan":
        doc = read_json(path, subject="plan JSON")
        plan = doc.get("plan") if isinstance(doc, dict) else None
        if isinstance(plan, dict):
            sizes = {k: plan.get(k) if isinstance(plan.get(k), int) else None for k in ("tp", "pp", "cp", "dp")}
            world = None if None in sizes.values() else sizes["tp"] * sizes["pp"] * sizes["cp"] * sizes["dp"]
            return JobSizes(world_size=world, tp=sizes["tp"], pp=sizes["pp"], cp=sizes["cp"])
        return JobSizes()
    if kind == "accelerate":
        return accelerate_job_sizes(path)
    if kind == "deepspeed":  # Ulysses: DeepSpeed's dp is world / sequence_parallel_size (runtime/config.py:468-469)
        doc = read_deepspeed_config(path)[0]  # an unreadable file: its own check says why
        sp = doc.get("sequence_parallel_size") if isinstance(doc, dict) else None
        return JobSizes(cp=sp if isinstance(sp, int) and not isinstance(sp, bool) and sp > 1 else None)
    if kind == "hostfile":
        return hostfile_job_sizes(path)
    if kind == "torchtitan":
        return torchtitan_job_sizes(path)
    if kind == "megatron-bridge":
        return bridge_job_sizes(path)
    if kind == "torchtitan-module":
        return torchtitan_module_sizes(path)
    return JobSizes()


def validate_file(path: str | Path, *, world_size: int, tp: int = 1, pp: int = 1, cp: int = 1,
                  kind: str | None = None, hf: bool | None = None,
                  engine_versions: Mapping[str, str] | None = None,
                  client_optimizer: str | None = None, launch_options: frozenset[str] = frozenset()
                  ) -> list[Problem]:
    """Every problem of one file for a job of ``world_size`` ranks (InputError: the file is unusable).

    ``kind``: one of :data:`FILE_KINDS` (default: :func:`file_kind`). ``hf`` (DeepSpeed JSON only): fill
    Hugging Face "auto" values first (default: for a file named ``*_hf.json``). ``engine_versions``: the releases
    asked for by engine ({"megatron": "0.16", "fsdp": "0.3"}); a Megatron file is checked against the flag table of
    the release in use (:func:`autotune.emit.megatron_versions.release_in_use`). ``client_optimizer`` (DeepSpeed
    JSON only): the optimizer the program run with it passes to deepspeed.initialize, where known (a paired
    Megatron-DeepSpeed script's: :func:`autotune.emit.validate_rules.rule_problems`). ``launch_options``
    (accelerate config only): the command-line options every script given that launches it passes, which take
    precedence over the file's keys (:mod:`autotune.emit.accelerate_launch`).
    """
    asked = dict(engine_versions or {})
    kind = kind or file_kind(path)
    if kind == "deepspeed":
        hf = Path(path).name.lower().endswith("_hf.json") if hf is None else hf
        return validate_deepspeed_config(path, world_size=world_size, tp=tp, pp=pp, cp=cp, hf=hf,
                                         client_optimizer=client_optimizer)
    if kind == "megatron":
        argv, lines, env, script = read_megatron_launch(path)
        declared = header_release(Path(path).read_text(encoding="utf-8", errors="replace"))
        release, installed = release_in_use(asked.get("megatron"), declared)
        return megatron_args_problems(argv, world_size, env=env, lines=lines, release=release, installed=installed,
                                      declared=declared, script=script)
    if kind == "megatron-deepspeed":
        argv, lines, _ = read_megatron_args_file_with_lines(path)
        return megatron_deepspeed_args_problems(argv, world_size, lines=lines)
    if kind == "accelerate":
        return accelerate_config_problems(path, world_size=world_size, tp=tp, cp=cp, launch_options=launch_options)
    if kind == "torchtitan":
        return torchtitan_config_problems(path, world_size=world_size, release=asked.get("fsdp"))
    if kind == "hostfile":
        return hostfile_problems(path, world_size=world_size)
    if kind == "launch":
        return launch_script_problems(path)
    if kind == "megatron-bridge":
        return bridge_overrides_problems(path, world_size=world_size)
    if kind == "torchtitan-module":
        return torchtitan_module_problems(path, world_size=world_size)
    if kind == "plan":
        raise InputError(["an autotune plan.json is checked by rebuilding its estimate: use autotune.lint.lint_file "
                          "(what `autotune validate` runs)"], subject="validate request")
    raise InputError([f"unknown file kind {kind!r}: use one of {', '.join(FILE_KINDS)}"], subject="validate request")
