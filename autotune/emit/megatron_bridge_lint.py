"""``autotune validate`` for Megatron-Bridge overrides (``bridge_overrides.yaml`` / ``bridge_overrides.args``).

Without Bridge installed only what the file itself says is checked: it reads (YAML, or Hydra-style ``key=value``
lines), its sections are ConfigContainer's (Megatron-Bridge 0.6 ``training/config.py``; an unknown one is skipped
by Bridge's YAML merge with only a log line), its model-parallel sizes divide the world size and the global batch
splits over the data-parallel ranks. Bridge's own validation of the files runs in
tests/emit/test_megatron_bridge_applied.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from autotune.emit.bridge_launch import RUN_RECIPE, recipe_command, runs_recipe
from autotune.emit.bridge_recipe_bases import recipe_base, with_base
from autotune.emit.job_args import launch_sizes
from autotune.emit.problems import JobSizes, Problem
from autotune.emit.shell_args import SHELL_SUFFIXES, read_megatron_launch
from autotune.inputs import read_text

__all__ = ["BASE_RECIPE_LINE", "base_recipe", "nested_overrides", "on_base", "CONFIG_CONTAINER_SECTIONS",
           "CONFIG_CONTAINER_TARGET", "read_bridge_overrides", "bridge_overrides_problems", "bridge_job_sizes"]

# dataclasses.fields(ConfigContainer) in megatron-bridge 0.6.2 (the underscore-prefixed internal one left out).
CONFIG_CONTAINER_SECTIONS = frozenset((
    "env_vars", "rng", "rerun_state_machine", "train", "model", "optimizer", "optimizer_config_override_provider",
    "ddp", "validation", "scheduler", "dataset", "logger", "tokenizer", "checkpoint", "dist", "ft", "straggler",
    "nvrx_straggler", "profiling", "peft", "comm_overlap", "mixed_precision", "tensor_inspect", "inprocess_restart"))

BASE_RECIPE_LINE = re.compile(r"^#\s*Base recipe:\s*([A-Za-z0-9_]+)", re.MULTILINE)
"""The comment that names an override file's base recipe (the line autotune writes at the top of the files it emits;
a user's own file may carry it too)."""


CONFIG_CONTAINER_TARGET = "megatron.bridge.training.config.ConfigContainer"
"""The ``_target_`` a whole config's top level names (``ConfigContainer.to_yaml``, as a checkpoint's run_config.yaml
holds it: Megatron-Bridge 0.6 training/checkpointing.py:1468)."""


def read_bridge_overrides(path: str | Path) -> tuple[dict, list[Problem]]:
    """The overrides as a nested dict: a YAML mapping, ``key=value`` lines nested at the dots, or the arguments of a
    launch line running Bridge's run_recipe.py (``autotune.emit.bridge_launch``)."""
    if Path(path).suffix.lower() in SHELL_SUFFIXES:
        return _launch_overrides(path)
    text = read_text(path, subject="Megatron-Bridge overrides")  # a regular file, bounded
    try:
        if Path(path).suffix.lower() in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            data = nested_overrides(text.splitlines())
    except _NotOverride as err:
        return {}, [Problem(path=str(err), severity="error", source="megatron-bridge",
                            message="not a KEY=VALUE override", fix="write one key=value a line")]
    except TypeError as err:  # nested_overrides' own words
        return {}, [Problem(path="$", severity="error", source="megatron-bridge", message=f"does not read: {err}",
                            fix="one KEY=VALUE a setting, a section's fields below it")]
    except (yaml.YAMLError, AttributeError) as err:
        return {}, [Problem(path="$", severity="error", source="megatron-bridge", message=f"does not read: {err}",
                            fix="rewrite the file (autotune emit writes it)")]
    except RecursionError:  # a value nested thousands of levels deep (yaml's composer recurses)
        return {}, [Problem(path="$", severity="error", source="megatron-bridge",
                            message="does not read: nested too deep for an override",
                            fix="rewrite the file (autotune emit writes it)")]
    if not isinstance(data, dict):
        return {}, [Problem(path="$", severity="error", source="megatron-bridge", message="not a mapping",
                            fix="give ConfigContainer sections (model:, train:, ...)")]
    return data, _section_problems(data)


_MAPPING_SECTIONS = ("model", "train", "dataset", "ddp", "optimizer", "scheduler", "checkpoint", "dist", "logger")
"""ConfigContainer sections that are dataclasses: an override sets their fields, never the section to a value."""


def _section_problems(data: dict) -> list[Problem]:
    return [Problem(path=f"$.{name}", severity="error", source="megatron-bridge",
                    message=f"{name} is set to {data[name]!r}: it is a ConfigContainer section, whose fields an "
                            "override sets (megatron-bridge 0.6.2's merge puts the value in its place unchecked, and "
                            "the run fails where it reads the section's fields)",
                    fix=f"set its fields ({name}.FIELD=VALUE, or {name}: with FIELD: VALUE lines under it)")
            for name in _MAPPING_SECTIONS if name in data and data[name] is not None
            and not isinstance(data[name], dict)]


class _NotOverride(ValueError):
    pass


def nested_overrides(lines) -> dict:
    """Hydra-style ``KEY=VALUE`` overrides (``+KEY`` / ``~KEY`` as KEY) nested at the dots, the later winning;
    ``_NotOverride`` (its text) for a line that is none. Blank lines and ``#`` comments are skipped."""
    data: dict = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.lstrip("+~").partition("=")
        if not eq:
            raise _NotOverride(line)
        node = data
        *parents, leaf = key.split(".")
        for i, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise TypeError(f"{key} sets a field of {'.'.join(parents[:i + 1])}, which an earlier override set "
                                f"to {node!r}, no mapping")
        try:
            node[leaf] = yaml.safe_load(value) if value else None
        except yaml.YAMLError:
            raise TypeError(f"{key}: its value {value!r} does not read (YAML)") from None
    return data


def _unset(override: str) -> bool:
    """A KEY=VALUE whose value does not read for a variable the shell fills at launch
    (`"dataset.blend=[[${BLEND_PATHS}],null]"` inside a single-quoted script, read unexpanded)."""
    if "$" not in override.partition("=")[2]:
        return False
    try:
        nested_overrides([override])
    except (TypeError, ValueError):
        return True
    return False


def _launch_overrides(path: str | Path) -> tuple[dict, list[Problem]]:
    """The overrides of a launch script's run_recipe.py line (none where it runs another program)."""
    argv, lines, _, script = read_megatron_launch(path)
    if not runs_recipe(script):
        return {}, [Problem(path="$", severity="error", source="megatron-bridge", message=(
            f"its launch line runs {script or 'no training script'}, not Megatron-Bridge's {RUN_RECIPE}"),
            fix=f"give the override file (bridge_overrides.yaml) or a script that runs scripts/training/{RUN_RECIPE}")]
    first = lines[0] if lines else None
    try:
        command = recipe_command(argv)
        data = nested_overrides([w for w in command.overrides if not _unset(w)])
        unread = [Problem(path=word[:60], severity="warning", source="megatron-bridge", line=first, message=(
            f"{word[:60]!r} is filled in by the shell at launch: the overrides it gives are not checked"),
            fix="write them as KEY=VALUE words if autotune should check them")
            for word in [*command.unread, *filter(_unset, command.overrides)]]
        return data, [*unread, *_section_problems(data)]
    except TypeError as err:
        return {}, [Problem(path=RUN_RECIPE, severity="error", source="megatron-bridge", line=first,
                            message=f"its overrides do not read: {err}", fix="one KEY=VALUE a setting")]
    except ValueError as err:
        return {}, [Problem(path=RUN_RECIPE, severity="error", source="megatron-bridge", line=first,
                            message=f"run_recipe.py refuses its arguments: {err}",
                            fix="give --recipe NAME (or --model STEM with --mode) and KEY=VALUE overrides, as "
                                "`python scripts/training/run_recipe.py --help` lists them")]


def base_recipe(path: str | Path) -> str | None:
    """The recipe function a file's overrides apply to: the one its launch line's run_recipe.py loads, or the one a
    "# Base recipe: NAME" comment names (None: neither)."""
    if Path(path).suffix.lower() in SHELL_SUFFIXES:
        argv, _, _, script = read_megatron_launch(path)
        try:
            return recipe_command(argv).recipe if runs_recipe(script) else None
        except ValueError:
            return None
    found = BASE_RECIPE_LINE.search(read_text(path, subject="Megatron-Bridge overrides"))
    return found.group(1) if found else None


def _int(section: object, key: str, default: int = 1) -> int:
    value = section.get(key) if isinstance(section, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def on_base(path: str | Path, data: dict) -> dict:
    """``data`` (the file's overrides) on its base recipe's values where autotune holds them
    (``autotune.emit.bridge_recipe_bases``): the config the run gets."""
    recipe = base_recipe(path) if "_target_" not in data else None
    base = recipe_base(recipe) if recipe is not None else None
    return with_base(base, data) if base is not None else data


def bridge_job_sizes(path: str | Path) -> JobSizes:
    data, _ = read_bridge_overrides(path)
    data = on_base(path, data)
    model = data.get("model")
    world = None
    if str(path).lower().endswith(SHELL_SUFFIXES):  # a run_recipe.py launch line: its nodes x GPUs per node
        nodes, per_node, default = launch_sizes(str(path))
        world = nodes * per_node if nodes and per_node and not default else None
    return JobSizes(world_size=world, tp=_int(model, "tensor_model_parallel_size"),
                    pp=_int(model, "pipeline_model_parallel_size"), cp=_int(model, "context_parallel_size"))


def bridge_overrides_problems(path: str | Path, *, world_size: int) -> list[Problem]:
    data, problems = read_bridge_overrides(path)
    for key in data:
        if key == "_target_" and data[key] == CONFIG_CONTAINER_TARGET:  # a whole config (a checkpoint's run_config)
            continue
        if key not in CONFIG_CONTAINER_SECTIONS:
            problems.append(Problem(path=f"$.{key}", severity="error", source="megatron-bridge",
                                    message=f"{key!r} is not a ConfigContainer section (Megatron-Bridge 0.6 skips it)",
                                    fix=f"use one of {', '.join(sorted(CONFIG_CONTAINER_SECTIONS))}"))
    sizes = bridge_job_sizes(path) if not problems else JobSizes()
    model_parallel = (sizes.tp or 1) * (sizes.pp or 1) * (sizes.cp or 1)
    if world_size % model_parallel:
        problems.append(Problem(path="$.model", severity="error", source="megatron-bridge",
                                message=f"tp x pp x cp = {model_parallel} does not divide the world size {world_size}",
                                fix="change the parallel sizes or the GPU count"))
    train = on_base(path, data).get("train")  # a batch the file leaves to its recipe is the recipe's
    mbs, gbs = _int(train, "micro_batch_size", 0), _int(train, "global_batch_size", 0)
    dp = world_size // model_parallel if not world_size % model_parallel else 0
    if mbs and gbs and dp and gbs % (mbs * dp):
        problems.append(Problem(path="$.train.global_batch_size", severity="error", source="megatron-bridge",
                                message=f"global batch {gbs} is not a multiple of micro batch {mbs} x data "
                                        f"parallel {dp}", fix="change train.global_batch_size"))
    return problems + _seq_length_problems(data) + _tp_overlap_problems(data, on_base(path, data))


def _seq_length_problems(data: dict) -> list[Problem]:
    """Bridge's validate() asserts that the model's and the dataset's sequence lengths match (0.6.2
    training/config.py:1505-1509, for GPT datasets); judged where the file states both (an overrides file that sets
    one leaves the other to its base recipe)."""
    model, dataset = data.get("model"), data.get("dataset")
    a = model.get("seq_length") if isinstance(model, dict) else None
    b = dataset.get("seq_length") if isinstance(dataset, dict) else None
    if not (isinstance(a, int) and isinstance(b, int)) or a == b:
        return []
    return [Problem(path="$.model.seq_length", severity="error", source="megatron-bridge",
                    message=f"model.seq_length {a} and dataset.seq_length {b} differ: Bridge's validate() asserts "
                            "'Please ensure sequence length configuration in model config and dataset config match' "
                            "(training/config.py:1505-1509)",
                    fix=f"set both to the length the run trains (model.seq_length: {b}, as dataset.seq_length)")]


def _tp_overlap_problems(data: dict, run: dict) -> list[Problem]:
    """TP userbuffers the file asks for that Bridge turns off at setup, with only a log line
    (training/comm_overlap.py ``_get_model_comm_overlap_cfgs``: "Disabling tensor parallel communication overlap due
    to TP size < 2" / "sequence_parallel=False"): the job then runs without the overlap its author meant to have.
    ``run``: the file on its base recipe (:func:`on_base`), whose tp and sequence parallelism the file may leave
    to the recipe."""
    overlap = data.get("comm_overlap")
    if not isinstance(overlap, dict) or overlap.get("tp_comm_overlap") is not True:
        return []
    model = run.get("model") if isinstance(run.get("model"), dict) else {}
    why = ("tensor_model_parallel_size < 2" if _int(model, "tensor_model_parallel_size") < 2
           else "sequence_parallel is not true" if model.get("sequence_parallel") is not True else None)
    if why is None:
        return []
    return [Problem(path="$.comm_overlap.tp_comm_overlap", severity="warning", source="megatron-bridge",
                    message=f"TP communication overlap with {why}: Bridge turns it off at setup (comm_overlap.py), "
                            "and the run has no overlap",
                    fix="set model.sequence_parallel: true with tensor_model_parallel_size >= 2, or drop "
                        "tp_comm_overlap")]
