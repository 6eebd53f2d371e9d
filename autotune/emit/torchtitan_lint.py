"""Linting a torchtitan v0.2.x TOML job config for a world size: unknown sections and keys (nearest key, line),
values outside a field's choices, and torchtitan's own parallel-degree rules.

Sections and fields: ``torchtitan_keys.json`` (torchtitan v0.2.2 ``job_config.py``; its ConfigManager raises
``Invalid field names`` on anything else). Degrees: ``torchtitan/distributed/parallel_dims.py`` ``_validate``
(dp_replicate x dp_shard x cp x tp x pp must equal WORLD_SIZE; dp_shard -1 takes the ranks left) and the expert
mesh (ETP = TP or 1; ep x etp divides dp_shard x cp x tp: ``torchtitan_models.expert_mesh_problems_02``). Where
torchtitan is importable, its ConfigManager loads the file too; where the installed torchtitan is 0.3 or later (no
TOML job configs), the problem is the version, and the report says so.
"""

from __future__ import annotations

import difflib
import functools
import importlib.resources
import json
import re
from pathlib import Path
from typing import Any

from autotune.emit.problems import JobSizes, Problem, Severity, problem_at
from autotune.emit.torchtitan_models import expert_mesh_problems_02
from autotune.inputs import parse_toml, read_text

__all__ = ["torchtitan_key_table", "torchtitan_config_problems", "torchtitan_job_sizes", "read_torchtitan_config",
           "PIPELINE_SCHEDULES"]

# torch.distributed.pipelining.schedules.get_schedule_class names (torch 2.13), which torchtitan passes through.
PIPELINE_SCHEDULES = ("1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble",
                      "DualPipeV")
_HEADER = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\s\"-]+?)\s*\]\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_\"-]+)\s*=")


@functools.cache
def torchtitan_key_table() -> dict:
    return json.loads((importlib.resources.files("autotune.emit") / "torchtitan_keys.json").read_text("utf-8"))


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """1-based line of each ``[section]`` header and ``key =`` line, by path (simple TOML: what we and
    torchtitan's examples write; dotted keys and inline tables are located at their first line)."""
    out: dict[tuple[str, ...], int] = {}
    section: tuple[str, ...] = ()
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header and not line.lstrip().startswith("[["):
            section = tuple(p.strip().strip('"') for p in header.group(1).split("."))
            out.setdefault(section, number)
            continue
        key = _KEY.match(line)
        if key:
            out.setdefault(section + (key.group(1).strip('"'),), number)
    return out


def read_torchtitan_config(path: str | Path) -> tuple[dict, dict[tuple[str, ...], int]]:
    """(config, line of each key); InputError for a file that is not TOML."""
    text = read_text(path, subject="torchtitan config")
    # not TOML, nested too deep for tomllib's recursion, an integer of more than 4300 digits: InputError
    data = parse_toml(text, subject=f"torchtitan config {str(path)!r}")
    return data, _key_lines(text)


def _sections_at(path: tuple[str, ...]) -> dict | None:
    node: dict = torchtitan_key_table()["sections"]
    for part in path:
        entry = node.get(part)
        if not isinstance(entry, dict) or "section" not in entry:
            return None
        node = entry["section"]
    return node


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def torchtitan_job_sizes(path: str | Path):
    data, _ = read_torchtitan_config(path)
    p = data.get("parallelism") if isinstance(data.get("parallelism"), dict) else {}
    degrees = [_int(p.get(k, d)) for k, d in (("data_parallel_replicate_degree", 1), ("data_parallel_shard_degree", -1),
                                              ("context_parallel_degree", 1), ("tensor_parallel_degree", 1),
                                              ("pipeline_parallel_degree", 1))]
    world = None
    if all(d is not None and d >= 1 for d in degrees):
        world = degrees[0] * degrees[1] * degrees[2] * degrees[3] * degrees[4]
    return JobSizes(world_size=world, tp=_int(p.get("tensor_parallel_degree")), pp=_int(p.get("pipeline_parallel_degree")),
                    cp=_int(p.get("context_parallel_degree")))


def _version_problem(path: str | Path, installed: str, in_use: str | None = None) -> Problem:
    in_use = in_use or installed
    return Problem(path="$", severity="error", source="torchtitan version",
                   message=f"version mismatch: this file ({Path(path).name}) is for torchtitan 0.2 (a 0.2.x TOML job "
                           f"config); the version in use is torchtitan {in_use} (installed: {installed or 'none'}): "
                           "torchtitan 0.3 has no TOML job configs (it runs `-m torchtitan.train --module M --config "
                           "FN`, FN returning a Trainer.Config), so it cannot load this file whatever it holds",
                   fix="emit with --engine-version fsdp=0.3 (or --torchtitan-version 0.3) for a config module "
                       "(torchtitan_plan.py), or run this TOML with torchtitan 0.2.2 installed (pip install "
                       "torchtitan==0.2.2; validate with --engine-version fsdp=0.2)")


def _installed_version() -> str:
    try:
        import torchtitan
    except Exception:  # noqa: BLE001 - absent or broken: the caller's import tells
        return ""
    return str(getattr(torchtitan, "__version__", ""))


def _torchtitan_own(path: str | Path) -> list[Problem]:
    try:
        from torchtitan.config import ConfigManager
    except Exception:  # noqa: BLE001 - torchtitan absent or not importable on this torch: our table still applies
        return []
    installed = _installed_version()
    parts = re.match(r"(\d+)\.(\d+)", installed)
    if parts and (int(parts[1]), int(parts[2])) >= (0, 3):
        return [_version_problem(path, installed)]
    import logging

    logging.disable(logging.WARNING)  # its root-logger warnings (a run-time path such as hf_assets_path missing here)
    try:
        ConfigManager().parse_args(["--job.config_file", str(path)])
    except ValueError as err:
        if "--module is required" in str(err):  # a source checkout of 0.3 or later whose version reads 0.0.0
            return [_version_problem(path, installed or "a version without TOML job configs")]
        return [Problem(path="$", severity="error", source="torchtitan", message=f"torchtitan's ConfigManager: {err}",
                        fix="fix the config as the message says")]
    except TypeError as err:
        return [Problem(path="$", severity="error", source="torchtitan", message=f"torchtitan's ConfigManager: {err}",
                        fix="fix the config as the message says")]
    except SystemExit as err:
        return [Problem(path="$", severity="error", source="torchtitan", fix="fix the config",
                        message=f"torchtitan's ConfigManager exited ({err.code}): a value of the wrong type")]
    except Exception as err:  # noqa: BLE001 - its checks assert, and a huge number overflows inside it
        return [Problem(path="$", severity="error", source="torchtitan", fix="fix the config as the message says",
                        message=f"torchtitan's ConfigManager raised {type(err).__name__}: {str(err)[:300]}")]
    finally:
        logging.disable(logging.NOTSET)
    return []


def torchtitan_config_problems(path: str | Path, *, world_size: int, release: str | None = None) -> list[Problem]:
    """Every problem of a torchtitan TOML job config for ``world_size`` ranks; ``release``: the torchtitan release
    asked for (``--engine-version fsdp=R``), 0.3 being a version mismatch for any TOML."""
    if release is not None and release != "0.2":
        return [_version_problem(path, _installed_version(), release)]
    data, lines = read_torchtitan_config(path)
    out: list[Problem] = []

    def bad(parts: tuple[str, ...], message: str, fix: str, severity: Severity = "error") -> None:
        out.append(problem_at(parts, lines, message=message, fix=fix, severity=severity))

    def walk(node: dict, parts: tuple[str, ...]) -> None:
        known = _sections_at(parts) or {}
        for key, value in node.items():
            here = parts + (str(key),)
            spec = known.get(key)
            if spec is None:
                near = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6) if len(str(key)) < 100 else []
                kind = "section" if isinstance(value, dict) else "key"
                where = f"[{'.'.join(parts)}]" if parts else "the top level"
                bad(here, f"unknown {kind} {key!r} in {where}: torchtitan v0.2.2 raises 'Invalid field names'",
                    f"did you mean {near[0]!r}?" if near else "remove it")
            elif "section" in spec:
                if isinstance(value, dict):
                    walk(value, here)
                else:
                    bad(here, f"{key} is a section: write [{'.'.join(here)}]", f"make {key} a table")
            elif spec.get("choices") and not (value is None and "None" in spec["type"]) \
                    and str(value) not in spec["choices"]:
                bad(here, f"{key} is {value!r}, not one of {', '.join(spec['choices'])}",
                    f"use one of {', '.join(spec['choices'])}")
            elif spec["type"] in ("int", "float", "bool") and not _type_ok(value, spec["type"]):
                bad(here, f"{key} must be {spec['type']}, got {value!r}", f"write a {spec['type']}")

    walk(data, ())
    _rule_problems(data, world_size, bad)
    if not any(p.severity == "error" for p in out):
        out += _torchtitan_own(path)
    return out


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return _int(value) is not None
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _rule_problems(data: dict, world_size: int, bad) -> None:
    p = data.get("parallelism") if isinstance(data.get("parallelism"), dict) else {}
    t = data.get("training") if isinstance(data.get("training"), dict) else {}
    get = {k: p.get(k, d) for k, d in (("data_parallel_replicate_degree", 1), ("data_parallel_shard_degree", -1),
                                       ("context_parallel_degree", 1), ("tensor_parallel_degree", 1),
                                       ("pipeline_parallel_degree", 1), ("expert_parallel_degree", 1),
                                       ("expert_tensor_parallel_degree", 1))}
    if not all(_int(v) is not None for v in get.values()):
        return  # the type check reported it
    for key, value in get.items():
        if value < 1 and not (key == "data_parallel_shard_degree" and value == -1):
            bad(("parallelism", key), f"{key} is {value}: torchtitan asserts degrees >= 1 (dp_shard may be -1)",
                "use a positive degree")
            return
    rep, shard, cp, tp, pp = (get[k] for k in ("data_parallel_replicate_degree", "data_parallel_shard_degree",
                                               "context_parallel_degree", "tensor_parallel_degree",
                                               "pipeline_parallel_degree"))
    rest = rep * cp * tp * pp
    if shard == -1:
        if world_size % rest:
            bad(("parallelism",), f"dp_shard -1 takes the ranks left, but {world_size} is not divisible by "
                f"dp_replicate x cp x tp x pp = {rest}", f"choose degrees whose product divides {world_size}")
        shard = max(1, world_size // rest)
    elif rest * shard != world_size:
        bad(("parallelism",), f"dp_replicate({rep}) * dp_shard({shard}) * cp({cp}) * tp({tp}) * pp({pp}) = "
            f"{rest * shard} != WORLD_SIZE({world_size}) (torchtitan ParallelDims asserts)",
            f"make the degrees multiply to {world_size}, or set data_parallel_shard_degree = -1")
    keys = {"ep": "expert_parallel_degree", "etp": "expert_tensor_parallel_degree"}
    for degree, message, fix in expert_mesh_problems_02(shard, cp, tp, get[keys["ep"]], get[keys["etp"]],
                                                        names=(keys["ep"], keys["etp"])):
        bad(("parallelism", keys[degree]), message, fix)
    schedule = p.get("pipeline_parallel_schedule", "1F1B")
    if isinstance(schedule, str) and schedule not in PIPELINE_SCHEDULES:
        near = difflib.get_close_matches(schedule, PIPELINE_SCHEDULES, n=1, cutoff=0.5)
        bad(("parallelism", "pipeline_parallel_schedule"), f"unknown pipeline schedule {schedule!r} "
            "(torch.distributed.pipelining get_schedule_class)", f"did you mean {near[0]!r}?" if near else
            f"use one of {', '.join(PIPELINE_SCHEDULES)}")
    local, global_ = _int(t.get("local_batch_size", 8)), _int(t.get("global_batch_size", -1))
    dp = rep * shard
    if local is not None and local < 1:
        bad(("training", "local_batch_size"), f"local_batch_size must be >= 1, got {local}", "use a positive batch")
    elif local and global_ not in (None, -1) and (global_ < 1 or global_ % (local * dp)):
        bad(("training", "global_batch_size"), f"global_batch_size {global_} is not a multiple of local_batch_size "
            f"x data-parallel degree = {local} x {dp}: torchtitan's gradient accumulation asserts",
            f"use a multiple of {local * dp}, or -1")
    micro = _int(p.get("pipeline_parallel_microbatch_size", 1))
    if pp > 1 and local and micro and local % micro:
        bad(("parallelism", "pipeline_parallel_microbatch_size"), f"local_batch_size {local} does not split into "
            f"pipeline micro-batches of {micro}", f"use a divisor of {local}")
    for key in ("seq_len", "steps"):
        value = t.get(key)
        if value is not None and not (_int(value) and value >= 1):
            bad(("training", key), f"{key} must be a positive integer, got {value!r}", f"give {key} a positive value")
    lr = data.get("optimizer", {}).get("lr") if isinstance(data.get("optimizer"), dict) else None
    if lr is not None and (not isinstance(lr, (int, float)) or isinstance(lr, bool) or not 0 < lr < float("inf")):
        bad(("optimizer", "lr"), f"lr must be a finite positive number, got {lr!r}", "use e.g. 3e-4")
