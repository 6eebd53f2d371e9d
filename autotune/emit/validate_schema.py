"""Layer (a) of the DeepSpeed config linter: ``schemas/deepspeed_config.schema.json`` (types, enums, bounds,
unknown and deprecated keys), and the Hugging Face ``"auto"`` values, reported and substituted."""

from __future__ import annotations

import copy
import difflib
import json
import math
from typing import Any

import jsonschema

from autotune.emit.deepspeed import DEEPSPEED_VERSION, HF_AUTO_PATHS
from autotune.emit.problems import Problem
from autotune.emit.validate_json import BATCH_KEYS, Parts, get, is_int, json_path, line_of
from autotune.resources import schema as shipped_schema

__all__ = ["autos", "auto_problems", "substitute", "schema_problems", "close_key"]

_HF_FIX = "this is a Hugging Face Trainer config: validate with --hf"
# What "auto" stands for when checking an HF config (the values TrainingArguments would put there are unknown;
# these are valid placeholders). Batch sizes are derived from the world size instead.
_HF_PLACEHOLDERS = {"gradient_clipping": 1.0, "optimizer.params.lr": 3e-4, "optimizer.params.betas": [0.9, 0.95],
                    "optimizer.params.eps": 1e-8, "optimizer.params.weight_decay": 0.0,
                    "scheduler.params.warmup_min_lr": 0.0, "scheduler.params.warmup_max_lr": 3e-4,
                    "scheduler.params.warmup_num_steps": 100, "scheduler.params.total_num_steps": 1000,
                    "zero_optimization.reduce_bucket_size": 500_000_000,
                    "zero_optimization.stage3_prefetch_bucket_size": 50_000_000,
                    "zero_optimization.stage3_param_persistence_threshold": 100_000}



# ---- "auto" ------------------------------------------------------------------------------------
def _subschema(schema: dict, parts: Parts) -> dict | None:
    for p in parts:
        schema = schema.get("properties", {}).get(p) if isinstance(p, str) else schema.get("items")
        if schema is None:
            return None
    return schema


def autos(data: Any, schema: dict, parts: Parts = ()) -> list[Parts]:
    """Paths holding "auto" where DeepSpeed has no such value (pipeline.stages "auto" is DeepSpeed's own)."""
    if isinstance(data, dict):
        return [a for k, v in data.items() for a in autos(v, schema, parts + (k,))]
    if isinstance(data, list):
        return [a for i, v in enumerate(data) for a in autos(v, schema, parts + (i,))]
    if data != "auto":
        return []
    sub = _subschema(schema, parts)
    return [] if sub is not None and jsonschema.Draft202012Validator(sub).is_valid("auto") else [parts]


def auto_problems(autos: list[Parts], hf: bool, lines: dict) -> list[Problem]:
    out = []
    for parts in autos:
        dotted = ".".join(map(str, parts))
        if not hf:
            effect = ("raises TypeError on it" if len(parts) == 1 else
                      "passes the string to the constructor, which fails" if parts[0] in ("optimizer", "scheduler")
                      else "silently uses its default instead")
            out.append(Problem(path=json_path(parts), severity="error", line=line_of(lines, parts), source="schema",
                               message=f"'auto' is filled in only by the Hugging Face Trainer / accelerate; "
                                       f"DeepSpeed {effect}", fix=_HF_FIX))
        elif dotted == "bfloat16.enabled":  # the alias neither fills (transformers integrations/deepspeed.py,
            # accelerate utils/dataclasses.py fill bf16 only); DeepSpeed drops "auto" (runtime/config_utils.py)
            out.append(Problem(path=json_path(parts), severity="warning", line=line_of(lines, parts), source="schema",
                               message="neither the Trainer nor accelerate fills bfloat16.enabled (they fill bf16); "
                                       "DeepSpeed treats 'auto' as unset, so bf16 stays off and the job trains in "
                                       "fp32", fix='rename the block to "bf16"'))
        elif dotted not in HF_AUTO_PATHS:
            out.append(Problem(path=json_path(parts), severity="warning", line=line_of(lines, parts), source="schema",
                               message="the Trainer does not fill this 'auto' (accelerate's own DeepSpeed plugin may); "
                                       "left as is, DeepSpeed uses its default or raises",
                               fix="write the value"))
    return out


def substitute(data: dict, autos: list[Parts], dp: int) -> dict:
    """``data`` with every "auto" replaced as the HF integration would, batch sizes consistent with ``dp``."""
    out = copy.deepcopy(data)
    for parts in autos:
        dotted = ".".join(map(str, parts))
        parent = get(out, parts[:-1])
        if dotted in _HF_PLACEHOLDERS:
            parent[parts[-1]] = copy.deepcopy(_HF_PLACEHOLDERS[dotted])
        elif dotted in ("fp16.enabled", "bf16.enabled"):
            other = "bf16" if dotted.startswith("fp16") else "fp16"
            # One of them: bf16, unless the config says fp16 outright (or bf16 is off).
            parent[parts[-1]] = (get(out, ("bf16", "enabled")) is False if other == "bf16"
                                 else get(out, ("fp16", "enabled")) is not True)
        elif dotted not in BATCH_KEYS:
            del parent[parts[-1]]
    t, m, g = (out.get(k) for k in BATCH_KEYS)
    if m == "auto":
        m = out["train_micro_batch_size_per_gpu"] = (t // (g * dp) if is_int(t) and is_int(g) and g > 0
                                                      and t % (g * dp) == 0 else 1)
    if g == "auto":
        g = out["gradient_accumulation_steps"] = (t // (m * dp) if is_int(t) and is_int(m) and m > 0
                                                   and t % (m * dp) == 0 else 1)
    if t == "auto":
        out["train_batch_size"] = (m if is_int(m) else 1) * (g if is_int(g) else 1) * dp
    return out


# ---- (a) schema ----------------------------------------------------------------------------------
def close_key(name: str, known) -> str | None:
    found = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return found[0] if found else None


def _schema_error(err: jsonschema.ValidationError) -> list[tuple[Parts, str, str]]:
    parts, value, rule = tuple(err.absolute_path), err.instance, err.validator
    if rule == "not" and "x-removed-in" in err.schema:
        return []  # a removed key: the rules report it with the installed DeepSpeed's own reason
    if rule == "additionalProperties":
        known = err.schema.get("properties", {})
        out = []
        for key in (k for k in value if k not in known):
            near = close_key(key, known)
            out.append((parts + (key,), f"unknown key {key!r}: DeepSpeed {DEEPSPEED_VERSION} rejects it "
                                        "(pydantic: Extra inputs are not permitted)",
                        f"did you mean {near!r}? rename it" if near else "remove it"))
        return out
    if rule == "required":
        return [(parts + (k,), f"missing required key {k!r}", f"add {k!r}") for k in err.validator_value
                if k not in value]
    if rule == "type":
        want = err.validator_value
        fix = (f"write an integer, e.g. {round(value)}" if "integer" in want and isinstance(value, float)
               and math.isfinite(value)
               else f"write a {' or '.join(want) if isinstance(want, list) else want}")
        return [(parts, f"expected {want}, got {type(value).__name__} {value!r}", fix)]
    if rule in ("enum", "const"):
        allowed = err.validator_value if rule == "enum" else [err.validator_value]
        return [(parts, f"{value!r} is not one of {allowed}", f"use one of {', '.join(map(json.dumps, allowed))}")]
    bounds = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}
    if rule in bounds:
        return [(parts, f"must be {bounds[rule]} {err.validator_value}, got {value!r}",
                 f"use a value {bounds[rule]} {err.validator_value}")]
    if rule == "pattern":
        return [(parts, f"{value!r} is not allowed: {err.schema.get('description', err.message)}",
                 "use one of the values named")]
    return [(parts, err.message, "see the DeepSpeed config documentation for this key")]


def _walk_known_keys(schema: dict, data: Any, parts: Parts, lines: dict, out: list[Problem]) -> None:
    """Warnings: unknown keys where DeepSpeed ignores them silently, deprecated keys."""
    if not isinstance(data, dict):
        return
    known = schema.get("properties", {})
    for key, value in data.items():
        sub = known.get(key)
        where = dict(path=json_path(parts + (key,)), severity="warning", line=line_of(lines, parts + (key,)),
                     source="schema")
        if sub is None and schema.get("x-unknown-keys") == "warn":
            near = close_key(key, [k for k, s in known.items() if "x-removed-in" not in s])
            out.append(Problem(**where, message=f"unknown key {key!r}: DeepSpeed {DEEPSPEED_VERSION} ignores it "
                                                "silently, so it has no effect",
                               fix=f"did you mean {near}? rename it" if near else "remove it"))
        elif sub is not None and sub.get("deprecated"):
            out.append(Problem(**where, message=f"{key!r} is deprecated in DeepSpeed {DEEPSPEED_VERSION}",
                               fix=f"use {sub.get('x-use', 'its replacement')} instead"))
        if sub is not None:
            _walk_known_keys(sub, value, parts + (key,), lines, out)


def schema_problems(data: dict, lines: dict) -> list[Problem]:
    schema = shipped_schema("deepspeed_config.schema.json")
    validator = jsonschema.Draft202012Validator(schema)
    out: list[Problem] = []
    for err in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]):
        for parts, message, fix in _schema_error(err):
            if not any(p.path == json_path(parts) and p.message == message for p in out):
                out.append(Problem(path=json_path(parts), severity="error", message=message, fix=fix,
                                   line=line_of(lines, parts), source="schema"))
    _walk_known_keys(schema, data, (), lines, out)
    return out

