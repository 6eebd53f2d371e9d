"""Model and cluster from what users type: preset names, files and flags.

Files are checked against the JSON Schemas in ``schemas/`` (draft 2020-12, unknown keys
rejected) and every problem is reported at once, each with its JSON path:

- :func:`load_model`: a model preset name, a Hugging Face ``config.json`` (or a folder holding
  one), or a model YAML (``schemas/model.schema.json``).
- :func:`load_cluster`: a GPU preset (or inline GPU) plus GPU counts from flags, or a cluster
  YAML (``schemas/cluster.schema.json``); fields left out take the GPU preset's defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import InputError, require_no_problems, suggest_names
from autotune.inputs import nonfinite_problems, parse_json, parse_yaml, read_text
from autotune.resources import schema as shipped_schema
from autotune.specs.hardware import ClusterSpec, GPUSpec
from autotune.specs.hf_config import model_from_hf_config
from autotune.specs.limits import (
    MAX_BANDWIDTH_GB_PER_S,
    MAX_GPUS,
    MAX_GPUS_PER_NODE,
    MAX_MEMORY_GIB,
    model_limit_problems,
)
from autotune.specs.model import ModelSpec
from autotune.specs.presets import (
    CLUSTER_DEFAULT_KEYS,
    cluster_defaults,
    gpu_preset_names,
    load_gpu_preset,
    load_model_preset,
    model_preset_names,
    nearest_gpu_preset,
)

if TYPE_CHECKING:
    import jsonschema

__all__ = ["load_model", "load_cluster", "model_from_mapping", "read_yaml", "schema_problems", "RELIABILITY_KEYS"]

_PRESETS_HELP = "`autotune estimate --help` lists the presets"
RELIABILITY_KEYS = ("gpu_mtbf_hours", "restart_s", "storage_bandwidth_gb_per_s", "checkpoint_tier",
                    "local_storage_bandwidth_gb_per_s")
"""Failure and checkpoint-storage figures a cluster file may give (the goodput and checkpoint policy read them)."""
_CLUSTER_OVERRIDES = ("name", "num_nodes") + CLUSTER_DEFAULT_KEYS[1:] + RELIABILITY_KEYS


# ---- files and schemas -------------------------------------------------------------------
def read_yaml(path: str | Path, *, subject: str) -> dict:
    """The mapping in YAML (or JSON) file ``path``; InputError if unreadable, malformed or not a mapping.

    Read by :mod:`autotune.inputs` (regular files only, size and depth bounded, UTF-8); a NaN or
    infinite number anywhere is a problem too.
    """
    subject = subject if str(path) in subject else f"{subject} {str(path)!r}"
    data = parse_yaml(read_text(path, subject=subject), subject=subject)
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise InputError([f"expected a mapping of keys to values, got {got}"], subject=subject)
    require_no_problems(nonfinite_problems(data), subject=subject)
    return data


def _cluster_limit_problems(settings: dict) -> list[str]:
    problems = []
    for key, limit in (("num_gpus", MAX_GPUS), ("num_nodes", MAX_GPUS), ("gpus_per_node", MAX_GPUS_PER_NODE)):
        value = settings.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            problems.append(f"{key} ({value:,}) is above {limit:,}, the largest this tool accepts: check the number")
    for key, value in settings.items():
        limit = (MAX_BANDWIDTH_GB_PER_S if key.endswith("_gb_per_s") else
                 MAX_MEMORY_GIB if key.endswith("_gib_per_node") else None)
        if limit is not None and isinstance(value, int | float) and not isinstance(value, bool) and value > limit:
            problems.append(f"{key} ({value:g}) is above {limit:g}: check the unit (GB/s per GPU, GiB per node)")
    gpu = settings.get("gpu")
    if isinstance(gpu, dict):
        checks = [("memory_gib", gpu.get("memory_gib"), MAX_MEMORY_GIB),
                  ("hbm_bandwidth_gb_per_s", gpu.get("hbm_bandwidth_gb_per_s"), MAX_BANDWIDTH_GB_PER_S)]
        tflops = gpu.get("peak_tflops")
        if isinstance(tflops, dict):
            checks += [(f"peak_tflops.{k}", v, 1e7) for k, v in tflops.items()]
        for key, value, limit in checks:
            if isinstance(value, int | float) and not isinstance(value, bool) and value > limit:
                problems.append(f"gpu.{key} ({value:g}) is above {limit:g}: check the unit")
    return problems


def _json_type(value: Any) -> str:
    for kind, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
                       (list, "array"), (dict, "mapping"), (type(None), "null")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _branch_kind(branch: dict) -> str:
    kind = branch.get("type")
    if kind is None:
        return "a mapping"
    return {"string": "a name", "null": "null", "object": "a mapping"}.get(kind, f"a {kind}")


def _yaml_number_hint(err) -> str:
    """Where a number field got text that reads as one: YAML 1.1 (PyYAML) takes 1e-6 as a string, not a float."""
    wanted = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
    if "number" not in wanted or not isinstance(err.instance, str):
        return ""
    try:
        float(err.instance)
    except ValueError:
        return ""
    return f" (YAML reads {err.instance} as text: write it with a decimal point, e.g. 1.0e-6, or as 0.000001)"


def _render(err: jsonschema.ValidationError) -> list[str]:
    """One line per problem, each starting with its JSON path."""
    path, value, rule = err.json_path, err.instance, err.validator
    if rule == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        out = []
        for key in (k for k in value if k not in allowed):
            hint = suggest_names(str(key), allowed) or f" (allowed: {', '.join(allowed)})"
            out.append(f"{path}.{key}: unknown key{hint}")
        return out
    if rule == "required":
        return [f"{path}: missing required key {k!r}" for k in err.validator_value if k not in value]
    if rule in ("oneOf", "anyOf"):
        by_branch: dict[int, list[jsonschema.ValidationError]] = {}
        for sub in err.context or ():
            by_branch.setdefault(sub.relative_schema_path[0], []).append(sub)
        fitting = [errs for errs in by_branch.values()
                   if not any(e.validator == "type" and e.json_path == path for e in errs)]
        if len(fitting) == 1:  # the instance has the type of exactly one branch: explain that branch
            return [line for e in fitting[0] for line in _render(e)]
        kinds = " or ".join(_branch_kind(b) for b in err.validator_value)
        return [f"{path}: expected {kinds}, got {_json_type(value)} {value!r}"]
    if rule == "type":
        return [f"{path}: expected {err.validator_value}, got {_json_type(value)} {value!r}{_yaml_number_hint(err)}"]
    if rule == "enum":
        return [f"{path}: must be one of {', '.join(map(str, err.validator_value))}; got {value!r}"]
    bounds = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}
    if rule in bounds:
        return [f"{path}: must be {bounds[rule]} {err.validator_value}, got {value!r}"]
    if rule == "minProperties":
        return [f"{path}: needs at least {err.validator_value} entr{'y' if err.validator_value == 1 else 'ies'}"]
    if rule == "minLength":
        return [f"{path}: must not be empty"]
    return [f"{path}: {err.message}"]


def schema_problems(instance: Any, schema_name: str) -> list[str]:
    """Every way ``instance`` breaks schema ``schema_name``, one line each with its JSON path."""
    import jsonschema  # here, not at load: importing it takes ~0.1 s that preset-only commands do not need

    validator = jsonschema.Draft202012Validator(shipped_schema(schema_name))
    errors = sorted(validator.iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])
    lines: list[str] = []
    for err in errors:
        lines += [line for line in _render(err) if line not in lines]
    return lines


# ---- models ------------------------------------------------------------------------------
def model_from_mapping(data: dict, *, origin: str = "model") -> ModelSpec:
    """A :class:`ModelSpec` from a model YAML's mapping, checked against ``model.schema.json``."""
    problems = nonfinite_problems(data) or schema_problems(data, "model.schema.json")
    problems = problems or model_limit_problems(data)
    if problems:
        raise InputError(problems, subject=origin)
    try:
        return ModelSpec.from_dict({k: v for k, v in data.items() if k != "source"})
    except InputError as err:
        raise InputError(err.problems, subject=origin) from None


def _looks_like_hf(path: Path, data: dict) -> bool:
    return path.name == "config.json" or "model_type" in data or "architectures" in data


def load_model(ref: str) -> ModelSpec:
    """The model ``ref`` names: a preset, a Hugging Face config.json (or its folder), or a model YAML."""
    ref = str(ref)
    if ref in model_preset_names():
        return load_model_preset(ref)
    try:
        path = Path(ref).expanduser()
    except RuntimeError:  # pathlib: "~name" of a user with no home directory here
        raise InputError([f"{ref[:80]!r}: {ref.split('/', 1)[0][:40]!r} names no user's home directory on this "
                          "machine; give the file's path without it (or with ~/ for your own)"],
                         subject="--model") from None
    try:
        is_dir = path.is_dir()
        exists = is_dir or path.exists() or path.is_symlink()
    except (OSError, ValueError) as err:  # a name too long, a NUL byte
        raise InputError([f"{ref[:80]!r}: not a usable file name ({getattr(err, 'strerror', None) or err})"],
                         subject="--model") from None
    if is_dir:
        if (path / "config.json").exists():
            path = path / "config.json"
        else:
            raise InputError([f"folder {ref!r} holds no config.json: give a Hugging Face config.json, a model YAML, "
                              f"or a preset name ({_PRESETS_HELP})"], subject="--model")
    elif not exists:
        hint = suggest_names(ref, model_preset_names())
        looks_like_path = "/" in ref or path.suffix in (".json", ".yaml", ".yml")
        what = "no such file" if looks_like_path else "neither a model preset nor an existing file"
        raise InputError([f"{ref!r}: {what}{hint}; {_PRESETS_HELP}, or give a Hugging Face config.json or a "
                          "model YAML (schemas/model.schema.json)"], subject="--model")
    origin = f"model file {str(path)!r}"
    text = read_text(path, subject="model file")
    if path.suffix == ".json":
        data = parse_json(text, subject=origin, nonfinite=True)  # as transformers writes them (read_hf_config)
        if not isinstance(data, dict):
            raise InputError([f"expected a JSON object, got {_json_type(data)}"], subject=origin)
        if _looks_like_hf(path, data):
            return model_from_hf_config(data, origin=f"Hugging Face config {str(path)!r}")
        require_no_problems(nonfinite_problems(data), subject=origin)
        return model_from_mapping(data, origin=origin)
    data = parse_yaml(text, subject=origin)
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise InputError([f"expected a mapping of keys to values, got {got}"], subject=origin)
    require_no_problems(nonfinite_problems(data), subject=origin)
    return model_from_mapping(data, origin=origin)


# ---- clusters ----------------------------------------------------------------------------
def _uneven_gpus(num_gpus: int, gpus_per_node: int) -> str:
    lower, upper = num_gpus // gpus_per_node * gpus_per_node, (num_gpus // gpus_per_node + 1) * gpus_per_node
    divisors = [d for d in range(gpus_per_node - 1, 1, -1) if num_gpus % d == 0][:3]
    fixes = [f"{lower} or {upper} GPUs ({lower // gpus_per_node} or {upper // gpus_per_node} full nodes)",
             f"fewer than {gpus_per_node} for a single node"]
    if divisors:
        fixes.append(f"a gpus_per_node that divides {num_gpus} (e.g. {', '.join(map(str, divisors))})")
    return f"num_gpus ({num_gpus}) is not a multiple of gpus_per_node ({gpus_per_node}): use {'; or '.join(fixes)}"


def _node_layout(settings: dict, gpus_per_node: int | None, problems: list[str]) -> tuple[int, int]:
    """(num_nodes, gpus_per_node) from num_gpus and/or num_nodes; appends to ``problems``."""
    num_gpus, num_nodes = settings.get("num_gpus"), settings.get("num_nodes")
    if gpus_per_node is None:
        if num_gpus is not None and num_nodes is None:
            return 1, num_gpus  # an inline GPU without gpus_per_node: one node of num_gpus
        problems.append("missing gpus_per_node (an inline GPU has no preset default): give it")
        return 1, 1
    if num_gpus is None:
        return num_nodes or 1, gpus_per_node
    if num_nodes is not None:
        if num_nodes * gpus_per_node != num_gpus:
            problems.append(f"num_gpus ({num_gpus}) != num_nodes ({num_nodes}) x gpus_per_node ({gpus_per_node}): "
                            "give one of num_gpus and num_nodes, or make them agree")
        return num_nodes, gpus_per_node
    if num_gpus < gpus_per_node:
        return 1, num_gpus  # one partly used node
    if num_gpus % gpus_per_node:
        problems.append(_uneven_gpus(num_gpus, gpus_per_node))
        return 1, gpus_per_node
    return num_gpus // gpus_per_node, gpus_per_node


def _resolve_gpu(gpu: Any, problems: list[str]) -> tuple[GPUSpec | None, dict]:
    """(GPUSpec, its preset's cluster defaults) for a preset name or an inline mapping."""
    try:
        if isinstance(gpu, str):
            return load_gpu_preset(gpu), cluster_defaults(gpu)
        gpu = dict(gpu)
        like = gpu.pop("kernels_like", None)
        if like is not None and "kernels" not in gpu:  # the named preset's kernel facts, chosen explicitly
            gpu["kernels"] = load_gpu_preset(like).kernels
        elif "kernels" not in gpu and isinstance(peaks := gpu.get("peak_tflops"), dict) and peaks and all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in peaks.values()):
            gpu["kernels_hint"] = nearest_gpu_preset(gpu["peak_tflops"], exclude=str(gpu.get("name", "")))
        return GPUSpec(**gpu), {}
    except InputError as err:
        problems += list(err.problems)
        return None, {}


def _plain_cluster_flags(settings: dict) -> bool:
    """Only a GPU preset name and GPU counts, of the types ``cluster.schema.json`` asks (a non-empty string,
    integers >= 1): the schema check finds nothing there, so it is skipped (importing jsonschema alone takes
    ~0.1 s of a preset-only ``estimate``)."""
    counts = [settings[k] for k in ("num_gpus", "gpus_per_node") if k in settings]
    return (set(settings) <= {"gpu", "num_gpus", "gpus_per_node"} and isinstance(settings.get("gpu", "x"), str)
            and settings.get("gpu", "x") != "" and all(type(v) is int and v >= 1 for v in counts))


def load_cluster(*, gpu: str | dict | None = None, num_gpus: int | None = None, gpus_per_node: int | None = None,
                 cluster_path: str | None = None, **overrides: Any) -> ClusterSpec:
    """A :class:`ClusterSpec` from flags, a cluster YAML, or both (flags win over the file).

    ``gpu`` is a GPU preset name or an inline mapping (name, memory_gib, peak_tflops,
    hbm_bandwidth_gb_per_s). ``num_gpus`` below ``gpus_per_node`` means one node of num_gpus
    GPUs; otherwise it must be a multiple of ``gpus_per_node`` (default: the preset's).
    ``overrides`` set other ClusterSpec fields (``intra_node_bandwidth_gb_per_s=...``); None
    values are ignored, so a CLI can pass every flag.
    """
    subject = "cluster" if cluster_path is None else f"cluster file {str(cluster_path)!r}"
    settings: dict = {} if cluster_path is None else read_yaml(cluster_path, subject=subject)
    problems = [f"unknown cluster setting {k!r}"
                f"{suggest_names(k, _CLUSTER_OVERRIDES) or ' (known: ' + ', '.join(_CLUSTER_OVERRIDES) + ')'}"
                for k in overrides if k not in _CLUSTER_OVERRIDES]
    flags = {"gpu": gpu, "num_gpus": num_gpus, "gpus_per_node": gpus_per_node,
             **{k: v for k, v in overrides.items() if k in _CLUSTER_OVERRIDES}}
    flags = {k: v for k, v in flags.items() if v is not None}
    if "num_gpus" in flags:
        settings.pop("num_nodes", None)  # --num-gpus replaces the file's node count
    settings.update(flags)
    if "gpu" not in settings:
        problems.append(f"no GPU given: pass a GPU preset ({', '.join(gpu_preset_names())}) or a cluster file "
                        "with a gpu: entry")
    shape_problems = [] if _plain_cluster_flags(settings) else [
        p for p in schema_problems(settings, "cluster.schema.json") if p != "$: missing required key 'gpu'"]
    problems += shape_problems
    if not shape_problems:
        shape_problems = nonfinite_problems(settings) + _cluster_limit_problems(settings)
        problems += shape_problems
    if shape_problems or "gpu" not in settings:
        raise InputError(problems, subject=subject)

    gpu_spec, defaults = _resolve_gpu(settings["gpu"], problems)
    num_nodes = per_node = 1
    if gpu_spec is not None:
        num_nodes, per_node = _node_layout(settings, settings.get("gpus_per_node", defaults.get("gpus_per_node")),
                                           problems)
    fields = {}
    for key in CLUSTER_DEFAULT_KEYS[1:]:
        value = settings.get(key, defaults.get(key))
        if value is not None:
            fields[key] = value
        elif gpu_spec is not None and key in ("intra_node_bandwidth_gb_per_s", "inter_node_bandwidth_gb_per_s"):
            problems.append(f"missing {key} (an inline GPU has no preset default): give it, per GPU, one direction")
    if problems:
        raise InputError(problems, subject=subject)
    fields.update({key: settings[key] for key in RELIABILITY_KEYS if settings.get(key) is not None})
    name = settings.get("name") or (Path(cluster_path).stem if cluster_path else "")
    try:
        return ClusterSpec(gpu=gpu_spec, num_nodes=num_nodes, gpus_per_node=per_node, name=name, **fields)
    except InputError as err:
        raise InputError(err.problems, subject=subject) from None
