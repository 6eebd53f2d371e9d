"""Lint a DeepSpeed config for a world size, reporting every problem at once.

Three layers, each problem with its JSON path (and line, for a file):

(a) ``schemas/deepspeed_config.schema.json``: types, enums, bounds; unknown keys are errors in the
    blocks DeepSpeed rejects them in and warnings where DeepSpeed ignores them silently
    (``x-unknown-keys: warn``); deprecated keys are warnings.
(b) DeepSpeed's own parser, ``deepspeed.runtime.config.DeepSpeedConfig``, in-process, for the
    data-parallel size world / (tp x pp x cp). It raises on the first problem, so each problem it
    finds is repaired in a copy and the parser runs again, until it accepts the config.
(c) Cross-field rules DeepSpeed checks late (at ``deepspeed.initialize`` or in the engine) or never:
    the batch triple, ZeRO-2/3 with pipeline parallelism, offload prerequisites, removed keys, ...

``"auto"`` is a Hugging Face Trainer / accelerate value: an error for DeepSpeed proper, and with
``hf=True`` replaced first as the integration would (``autotune.emit.deepspeed.HF_AUTO_PATHS``).
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import difflib
import functools
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import jsonschema

from autotune import resources
from autotune.emit.deepspeed import DEEPSPEED_VERSION, HF_AUTO_PATHS
from autotune.emit.problems import Problem
from autotune.errors import InputError

__all__ = ["validate_deepspeed_config", "memory_problems", "read_deepspeed_config", "resolved_config", "has_errors",
           "json_path"]

Parts = tuple  # a JSON path as keys and indices
_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
# Optimizers ZeRO runs without zero_allow_untested_optimizer (zero/utils.py:45, by config name after
# config.py:519 lower-cases DeepSpeed's own names); torch's Adam/AdamW/Adagrad map onto these.
_ZERO_TESTED_OPTIMIZERS = frozenset({"adam", "adamw", "adagrad", "lion", "muon"})
_DS_OPTIMIZERS = frozenset({"adam", "adamw", "adagrad", "lamb", "lion", "muon", "muadam", "muadamw", "musgd"})
_DS_SCHEDULERS = frozenset({"LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"})
# pydantic model (ValidationError.title) -> its block in the config.
_MODEL_BLOCKS = {"DeepSpeedZeroConfig": ("zero_optimization",), "DeepSpeedFP16Config": ("fp16",),
                 "DeepSpeedBF16Config": ("bf16",), "TPTrainingConfig": ("tensor_parallel",),
                 "CommsLoggerConfig": ("comms_logger",), "DeepSpeedMonitorConfig": (), "CompileConfig": ("compile",),
                 "HybridEngineConfig": ("hybrid_engine",), "DeepSpeedThroughputTimerConfig": ("timers", "throughput")}
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


def json_path(parts: Parts) -> str:
    """``$.zero_optimization.offload_param.device``, ``$.optimizer.params.betas[0]``."""
    out = "$"
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) else f"[{p!r}]"
    return out


def has_errors(problems: list[Problem]) -> bool:
    return any(p.severity == "error" for p in problems)


# ---- reading ---------------------------------------------------------------------------------
def _key_lines(text: str) -> tuple[dict[Parts, int], list[Parts]]:
    """1-based line of every key (and array item) in valid JSON ``text``, and the keys given twice."""
    newlines = [i for i, c in enumerate(text) if c == "\n"]
    line = lambda i: 1 + bisect.bisect_left(newlines, i)  # noqa: E731
    ws, decoder, lines, twice = re.compile(r"[ \t\n\r]*"), json.JSONDecoder(), {}, []

    def value(i: int, parts: Parts) -> int:
        i = ws.match(text, i).end()
        if text[i] not in "{[":
            return decoder.raw_decode(text, i)[1]
        close, index = ("}" if text[i] == "{" else "]"), 0
        i = ws.match(text, i + 1).end()
        while text[i] != close:
            if close == "}":
                key, after = json.decoder.scanstring(text, i + 1)
                child = parts + (key,)
                if child in lines:
                    twice.append(child)
                lines[child] = line(i)
                i = ws.match(text, after).end() + 1  # past ':'
            else:
                child, index = parts + (index,), index + 1
                lines[child] = line(ws.match(text, i).end())
            i = ws.match(text, value(i, child)).end()
            if text[i] == ",":
                i = ws.match(text, i + 1).end()
        return i + 1

    value(0, ())
    return lines, twice


def read_deepspeed_config(config: dict | str | Path) -> tuple[dict | None, dict[Parts, int], list[Problem]]:
    """(config, line of each key, problems reading it). InputError when the file is unusable.

    Malformed JSON is a problem at its line and column, not an exception; DeepSpeed itself reads
    files with hjson (comments, unquoted keys), so hjson that is not JSON is checked on, with an error.
    """
    if isinstance(config, dict):
        return copy.deepcopy(config), {}, []
    path = Path(config)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        reason = "not a text file" if isinstance(err, UnicodeDecodeError) else (err.strerror or str(err))
        raise InputError([f"cannot read {str(path)!r}: {reason}"], subject="DeepSpeed config") from None
    if not text.strip().startswith("{"):
        raise InputError([f"{str(path)!r} is not a DeepSpeed JSON config: "
                          f"{'it is empty' if not text.strip() else 'it does not start with {'}"],
                         subject="DeepSpeed config")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        problem = Problem(path="$", severity="error", line=err.lineno, source="json",
                          message=f"not valid JSON: {err.msg} at line {err.lineno} column {err.colno}",
                          fix="fix the JSON there (json.load-based launchers such as the HF Trainer and "
                              "Megatron-DeepSpeed cannot read the file)")
        import hjson  # DeepSpeed's own reader (runtime/config.py:441)

        try:
            data = json.loads(json.dumps(hjson.loads(text)))
        except (hjson.HjsonDecodeError, ValueError, TypeError):
            return None, {}, [problem]
        return (data, {}, [problem]) if isinstance(data, dict) else (None, {}, [problem])
    lines, twice = _key_lines(text)
    problems = [Problem(path=json_path(p), severity="error", line=lines[p], source="json",
                        message="key given twice: DeepSpeed's reader raises on duplicate keys (config_utils.py:205)",
                        fix="keep one of them") for p in twice]
    return data, lines, problems


def _line(lines: dict[Parts, int], parts: Parts) -> int | None:
    while parts and parts not in lines:
        parts = parts[:-1]
    return lines.get(parts)


def _get(data: Any, parts: Parts, default: Any = None) -> Any:
    for p in parts:
        if isinstance(data, dict) and p in data:
            data = data[p]
        elif isinstance(data, list) and isinstance(p, int) and p < len(data):
            data = data[p]
        else:
            return default
    return data


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer()


# ---- "auto" ------------------------------------------------------------------------------------
def _subschema(schema: dict, parts: Parts) -> dict | None:
    for p in parts:
        schema = schema.get("properties", {}).get(p) if isinstance(p, str) else schema.get("items")
        if schema is None:
            return None
    return schema


def _autos(data: Any, schema: dict, parts: Parts = ()) -> list[Parts]:
    """Paths holding "auto" where DeepSpeed has no such value (pipeline.stages "auto" is DeepSpeed's own)."""
    if isinstance(data, dict):
        return [a for k, v in data.items() for a in _autos(v, schema, parts + (k,))]
    if isinstance(data, list):
        return [a for i, v in enumerate(data) for a in _autos(v, schema, parts + (i,))]
    if data != "auto":
        return []
    sub = _subschema(schema, parts)
    return [] if sub is not None and jsonschema.Draft202012Validator(sub).is_valid("auto") else [parts]


def _auto_problems(autos: list[Parts], hf: bool, lines: dict) -> list[Problem]:
    out = []
    for parts in autos:
        dotted = ".".join(map(str, parts))
        if not hf:
            effect = ("raises TypeError on it" if len(parts) == 1 else
                      "passes the string to the constructor, which fails" if parts[0] in ("optimizer", "scheduler")
                      else "silently uses its default instead")
            out.append(Problem(path=json_path(parts), severity="error", line=_line(lines, parts), source="schema",
                               message=f"'auto' is filled in only by the Hugging Face Trainer / accelerate; "
                                       f"DeepSpeed {effect}", fix=_HF_FIX))
        elif dotted not in HF_AUTO_PATHS:
            out.append(Problem(path=json_path(parts), severity="warning", line=_line(lines, parts), source="schema",
                               message="the Trainer does not fill this 'auto' (accelerate's own DeepSpeed plugin may); "
                                       "left as is, DeepSpeed uses its default or raises",
                               fix="write the value"))
    return out


def _substitute(data: dict, autos: list[Parts], dp: int) -> dict:
    """``data`` with every "auto" replaced as the HF integration would, batch sizes consistent with ``dp``."""
    out = copy.deepcopy(data)
    for parts in autos:
        dotted = ".".join(map(str, parts))
        parent = _get(out, parts[:-1])
        if dotted in _HF_PLACEHOLDERS:
            parent[parts[-1]] = copy.deepcopy(_HF_PLACEHOLDERS[dotted])
        elif dotted in ("fp16.enabled", "bf16.enabled"):
            other = "bf16" if dotted.startswith("fp16") else "fp16"
            # One of them: bf16, unless the config says fp16 outright (or bf16 is off).
            parent[parts[-1]] = (_get(out, ("bf16", "enabled")) is False if other == "bf16"
                                 else _get(out, ("fp16", "enabled")) is not True)
        elif dotted not in _BATCH_KEYS:
            del parent[parts[-1]]
    t, m, g = (out.get(k) for k in _BATCH_KEYS)
    if m == "auto":
        m = out["train_micro_batch_size_per_gpu"] = (t // (g * dp) if _is_int(t) and _is_int(g) and g > 0
                                                      and t % (g * dp) == 0 else 1)
    if g == "auto":
        g = out["gradient_accumulation_steps"] = (t // (m * dp) if _is_int(t) and _is_int(m) and m > 0
                                                   and t % (m * dp) == 0 else 1)
    if t == "auto":
        out["train_batch_size"] = (m if _is_int(m) else 1) * (g if _is_int(g) else 1) * dp
    return out


# ---- (a) schema ----------------------------------------------------------------------------------
def _close(name: str, known) -> str | None:
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
            near = _close(key, known)
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
        where = dict(path=json_path(parts + (key,)), severity="warning", line=_line(lines, parts + (key,)),
                     source="schema")
        if sub is None and schema.get("x-unknown-keys") == "warn":
            near = _close(key, [k for k, s in known.items() if "x-removed-in" not in s])
            out.append(Problem(**where, message=f"unknown key {key!r}: DeepSpeed {DEEPSPEED_VERSION} ignores it "
                                                "silently, so it has no effect",
                               fix=f"did you mean {near}? rename it" if near else "remove it"))
        elif sub is not None and sub.get("deprecated"):
            out.append(Problem(**where, message=f"{key!r} is deprecated in DeepSpeed {DEEPSPEED_VERSION}",
                               fix=f"use {sub.get('x-use', 'its replacement')} instead"))
        if sub is not None:
            _walk_known_keys(sub, value, parts + (key,), lines, out)


def _schema_problems(data: dict, lines: dict) -> list[Problem]:
    schema = resources.schema("deepspeed_config.schema.json")
    validator = jsonschema.Draft202012Validator(schema)
    out: list[Problem] = []
    for err in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]):
        for parts, message, fix in _schema_error(err):
            if not any(p.path == json_path(parts) and p.message == message for p in out):
                out.append(Problem(path=json_path(parts), severity="error", message=message, fix=fix,
                                   line=_line(lines, parts), source="schema"))
    _walk_known_keys(schema, data, (), lines, out)
    return out


# ---- DeepSpeed itself -------------------------------------------------------------------------
@functools.cache
def _deepspeed():
    """(deepspeed.runtime.config, deepspeed.comm, DeepSpeed's logger), imported once without printing on stdout."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):  # the accelerator notice goes to DeepSpeed's stdout logger
        import deepspeed.comm as dist
        from deepspeed.runtime import config as ds_config
        from deepspeed.utils import logger
    for handler in logger.handlers:
        if getattr(handler, "stream", None) is buf:
            handler.setStream(sys.stdout)
    return ds_config, dist, logger


def _removed_keys() -> tuple[dict[str, str], dict[str, str]]:
    """Keys the installed DeepSpeed raises DeepSpeedConfigError for (top level, zero_optimization), with its reason."""
    ds_config = _deepspeed()[0]  # the installed version's own lists; 0.19.8's when it has none
    top = getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", None) or dict.fromkeys(
        ("nebula", "compression_training", "amp", "quantize_training", "sparse_gradients", "eigenvalue",
         "sparse_attention", "elasticity", "graph_harvesting", "curriculum_learning", "progressive_layer_drop"),
        f"removed in DeepSpeed {DEEPSPEED_VERSION}")
    zero = getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", None) or dict.fromkeys(
        ("mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param"),
        f"removed in DeepSpeed {DEEPSPEED_VERSION}")
    return dict(top), dict(zero)


def _explain(err: BaseException) -> list[tuple[Parts, str]]:
    """Where in the config DeepSpeed's exception points, and its message."""
    from pydantic import ValidationError

    if isinstance(err, ValidationError):
        prefix = _MODEL_BLOCKS.get(err.title, ())
        out = []
        for e in err.errors():
            msg = re.sub(r"^(Value error|Assertion failed), ", "", e["msg"])
            out.append((prefix + tuple(e["loc"]), f"{msg} (got {e.get('input')!r})" if e["loc"] else msg))
        return out
    message = str(err).strip() or type(err).__name__
    top, zero = _removed_keys()
    for parts, pattern in [((k,), f"'{k}'") for k in top] + [(("zero_optimization", k), f"'zero_optimization.{k}'")
                                                             for k in zero]:
        if pattern in message:
            return [(parts, message)]
    for parts, needle in ((("train_batch_size",), "batch"), (("train_batch_size",), "Gradient accumulation"),
                          (("bf16", "enabled"), "bfloat16 and fp16"),
                          (("checkpoint", "tag_validation"), "tag_validation"),
                          (("checkpoint", "parallel_write", "pipeline_stage"), "parallel_write"),
                          (("data_types", "keep_in_fp32_modules"), "keep_in_fp32_modules"),
                          (("communication_data_type",), "communication_data_type"),
                          (("gradient_allreduce_op",), "gradient_allreduce_op")):
        if needle in message:
            return [(parts, message)]
    return [((), f"{type(err).__name__}: {message}")]


def _repair(cfg: dict, parts: Parts) -> bool:
    """Undo the problem at ``parts`` in ``cfg`` so DeepSpeed's parser can go on; False if it cannot."""
    if parts == ("train_batch_size",):  # keep micro-batch and accumulation; DeepSpeed derives the rest
        changed = cfg.pop("train_batch_size", None) is not None
        for key in _BATCH_KEYS[1:]:
            if not (_is_int(cfg.get(key)) and cfg[key] > 0):
                cfg[key], changed = 1, True
        return changed
    if parts == ("bf16", "enabled") and isinstance(cfg.get("fp16"), dict):
        cfg["fp16"]["enabled"] = False
        return True
    parent = _get(cfg, parts[:-1]) if parts else None
    if isinstance(parent, dict) and parts[-1] in parent:
        del parent[parts[-1]]
        return True
    return False


def _deepspeed_problems(cfg: dict, dp: int, found: list[Problem], lines: dict) -> list[Problem]:
    ds_config, dist, logger = _deepspeed()
    work, out = copy.deepcopy(cfg), []
    batch_paths = {json_path((k,)) for k in _BATCH_KEYS}
    reported = {p.path for p in found if p.severity == "error"}
    for _ in range(16):
        saved = dist.get_world_size, dist.get_rank, logger.disabled
        dist.get_world_size, dist.get_rank = (lambda group=None: dp), (lambda group=None: 0)
        logger.disabled = True  # DeepSpeed logs to stdout, which is --json's
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                ds_config.DeepSpeedConfig(copy.deepcopy(work))
            return out
        except Exception as err:  # noqa: BLE001 - every exception DeepSpeed raises is a finding, reported below
            explained = _explain(err)
        finally:
            dist.get_world_size, dist.get_rank, logger.disabled = saved
        progress = False
        for parts, message in explained:
            path = json_path(parts)
            duplicate = path in reported or (path in batch_paths and reported & batch_paths)
            if not duplicate:
                out.append(Problem(path=path, severity="error", message=message, line=_line(lines, parts),
                                   source="deepspeed",
                                   fix="change the value so that DeepSpeed's parser (DeepSpeedConfig) accepts it"))
                reported.add(path)
            progress = _repair(work, parts) or progress
        if not progress:
            return out
    return out


# ---- (c) cross-field rules -------------------------------------------------------------------
def _batch_problems(cfg: dict, dp: int, sizes: str, bad) -> None:
    t, m, g = (cfg.get(k) for k in _BATCH_KEYS)
    if any(v is not None and not (_is_int(v) and v > 0) for v in (t, m, g)):
        return  # the schema reports the value itself
    t, m, g = (None if v is None else int(v) for v in (t, m, g))
    if t is None and m is None:
        bad(("train_batch_size",), "neither train_batch_size nor train_micro_batch_size_per_gpu is given: DeepSpeed "
                                   "asserts (config.py:650)",
            f"give train_micro_batch_size_per_gpu and gradient_accumulation_steps; train_batch_size is their product "
            f"x {dp} ({sizes})")
        return
    if t is None:
        return  # DeepSpeed derives train_batch_size = micro x accumulation x dp
    # DeepSpeed's derivation of what is missing (config.py:607-650), then its assert (config.py:602).
    derived = {k for k, v in zip(_BATCH_KEYS[1:], (m, g)) if v is None}
    if m is None:
        g = g or 1
        m = t // dp // g
    elif g is None:
        g = t // m // dp
    if m > 0 and g > 0 and t == m * g * dp:
        return
    keep_m, keep_g = max(1, m), max(1, g)
    fixes = [f"train_batch_size {keep_m * keep_g * dp} (= micro-batch {keep_m} x accumulation {keep_g} x dp {dp})"]
    if t % (keep_m * dp) == 0:
        fixes.append(f"gradient_accumulation_steps {t // (keep_m * dp)} (keeps train_batch_size {t})")
    elif t % dp == 0:
        fixes.append(f"train_micro_batch_size_per_gpu {t // dp} and gradient_accumulation_steps 1")
    note = f" ({', '.join(sorted(derived))} derived by DeepSpeed)" if derived else ""
    bad(("train_batch_size",), f"train_batch_size {t} != micro-batch {m} x gradient accumulation {g} x data-parallel "
                               f"size {dp} = {m * g * dp}{note}; {sizes}",
        "for this world size set " + ", or ".join(fixes))


def _rule_problems(cfg: dict, *, world: int, tp: int, pp: int, cp: int, dp: int, lines: dict) -> list[Problem]:
    import torch

    out: list[Problem] = []

    def bad(parts: Parts, message: str, fix: str, severity: str = "error") -> None:
        out.append(Problem(path=json_path(parts), severity=severity, message=message, fix=fix,
                           line=_line(lines, parts), source="rules"))

    _batch_problems(cfg, dp, f"dp = world {world} / (tp {tp} x pp {pp} x cp {cp})", bad)
    zero = cfg.get("zero_optimization")
    if zero is True:
        bad(("zero_optimization",), "the boolean form is deprecated (it means ZeRO stage 1)",
            'write "zero_optimization": {"stage": 1}', "warning")
    stage = 1 if zero is True else _get(zero, ("stage",), 0)
    zero = zero if isinstance(zero, dict) else {}
    stage = int(stage) if _is_int(stage) else 0
    if stage >= 2 and pp > 1:
        bad(("zero_optimization", "stage"), f"ZeRO-{stage} is incompatible with pipeline parallelism (pp {pp}): "
                                            "DeepSpeed's PipelineEngine asserts ZeRO stage < 2 (pipe/engine.py:76)",
            "use ZeRO-1 with pp > 1, or pp 1 with ZeRO-2/3")
    elif stage >= 2 and "pipeline" in cfg:
        bad(("pipeline",), f"a pipeline block with ZeRO-{stage}: if the model is a PipelineModule, DeepSpeed's "
                           "PipelineEngine asserts ZeRO stage < 2 (pipe/engine.py:76)",
            "remove the pipeline block if the model is not a PipelineModule; otherwise use ZeRO-0/1", "warning")
    devices = {}
    for name in ("offload_optimizer", "offload_param"):
        block = zero.get(name)
        devices[name] = block.get("device", "none") if isinstance(block, dict) else "none"
        if devices[name] in ("none", None):
            continue
        if name == "offload_param" and stage != 3:
            bad(("zero_optimization", name), f"offload_param needs ZeRO-3; at stage {stage} DeepSpeed ignores it",
                "set zero_optimization.stage to 3, or remove offload_param")
        if name == "offload_optimizer" and stage == 0:
            bad(("zero_optimization", name), "offload_optimizer needs ZeRO stage 1, 2 or 3; stage 0 ignores it",
                "set zero_optimization.stage to 1 or more, or remove offload_optimizer")
        if devices[name] == "nvme" and not block.get("nvme_path"):
            bad(("zero_optimization", name, "nvme_path"), f"{name} to nvme needs nvme_path: DeepSpeed fails when it "
                                                          "builds the swapper (partition_parameters.py:1225)",
                "set nvme_path to a folder on a local NVMe drive")
    if devices["offload_optimizer"] not in ("none", None) and "optimizer" not in cfg \
            and cfg.get("zero_force_ds_cpu_optimizer", True) is not False:
        bad(("zero_optimization", "offload_optimizer"),
            "ZeRO-Offload with no optimizer block: the optimizer passed to deepspeed.initialize must be "
            "DeepSpeedCPUAdam (or DeepSpeedCPULion), else DeepSpeed raises ZeRORuntimeException (engine.py:2345)",
            "add an optimizer block (AdamW), pass DeepSpeedCPUAdam, or set zero_force_ds_cpu_optimizer: false",
            "warning")
    for key in ("bf16", "bfloat16"):
        if _get(cfg, ("fp16", "enabled")) is True and _get(cfg, (key, "enabled")) is True:
            bad((key, "enabled"), "fp16 and bf16 are both enabled: DeepSpeed asserts 'bfloat16 and fp16 modes cannot "
                                  "be simultaneously enabled' (config.py:511)",
                "enable one of them: bf16 on Ampere or newer GPUs, fp16 on older ones")
    top, zero_removed = _removed_keys()
    fix = f"delete it: DeepSpeed {DEEPSPEED_VERSION} raises DeepSpeedConfigError on it"
    for key in (k for k in cfg if k in top):
        bad((key,), top[key], fix)
    for key in (k for k in zero if k in zero_removed):
        bad(("zero_optimization", key), zero_removed[key], fix)
    opt = cfg.get("optimizer") if isinstance(cfg.get("optimizer"), dict) else {}
    params, name = opt.get("params"), opt.get("type")
    if isinstance(params, dict) and "max_grad_norm" in params:
        bad(("optimizer", "params", "max_grad_norm"), "max_grad_norm is not an optimizer parameter: DeepSpeed raises "
                                                      "ValueError at deepspeed.initialize (engine.py:2481)",
            f"delete it and set the top-level gradient_clipping: {params['max_grad_norm']}")
    if isinstance(name, str) and name:
        torch_names = [n for n in dir(torch.optim) if isinstance(getattr(torch.optim, n), type)]
        if name.lower() not in _DS_OPTIMIZERS and name not in torch_names:
            near = _close(name, sorted(_DS_OPTIMIZERS) + torch_names)
            bad(("optimizer", "type"), f"unknown optimizer {name!r}: neither a DeepSpeed optimizer nor a torch.optim "
                                       "class, so deepspeed.initialize fails (engine.py:2545)",
                f"did you mean {near}?" if near else "use AdamW")
        elif stage > 0 and name.lower() not in _ZERO_TESTED_OPTIMIZERS \
                and cfg.get("zero_allow_untested_optimizer") is not True:
            bad(("optimizer", "type"), f"ZeRO has not been tested with {name!r}: deepspeed.initialize asserts "
                                       "(engine.py:2298)", 'add "zero_allow_untested_optimizer": true, or use AdamW')
    sched = _get(cfg, ("scheduler", "type"))
    if isinstance(sched, str) and sched and sched not in _DS_SCHEDULERS \
            and not isinstance(getattr(torch.optim.lr_scheduler, sched, None), type):
        near = _close(sched, _DS_SCHEDULERS)
        bad(("scheduler", "type"), f"unknown scheduler {sched!r}: neither a DeepSpeed nor a torch.optim.lr_scheduler "
                                   "scheduler; deepspeed.initialize asserts (engine.py:1929)",
            f"did you mean {near}?" if near else "use WarmupCosineLR")
    autotp = _get(cfg, ("tensor_parallel", "autotp_size"))
    if _is_int(autotp) and autotp > 1 and autotp != tp:
        bad(("tensor_parallel", "autotp_size"), f"autotp_size {autotp} but the job's tp is {tp}",
            "make tensor_parallel.autotp_size equal to the tensor-parallel size")
    return out


# ---- the entry point -------------------------------------------------------------------------
def _data_parallel_size(world_size: int, tp: int, pp: int, cp: int) -> int:
    problems = [f"{n} must be a positive integer, got {v!r}" for n, v in
                (("world_size", world_size), ("tp", tp), ("pp", pp), ("cp", cp)) if not (_is_int(v) and v >= 1)]
    if not problems and world_size % (tp * pp * cp):
        problems.append(f"world size {world_size} is not divisible by tp x pp x cp = {tp} x {pp} x {cp}: "
                        f"choose sizes whose product divides {world_size}")
    if problems:
        raise InputError(problems, subject="validate request")
    return world_size // (tp * pp * cp)


def _effective_tp(data: dict, tp: int) -> int:
    """With tp left at 1, an AutoTP config's own autotp_size is the tensor-parallel size."""
    autotp = _get(data, ("tensor_parallel", "autotp_size"))
    return int(autotp) if tp == 1 and _is_int(autotp) and autotp > 1 else tp


def resolved_config(data: dict, *, world_size: int, tp: int = 1, pp: int = 1, cp: int = 1) -> dict:
    """``data`` with each Hugging Face "auto" replaced as the integration would (batch sizes for the world size)."""
    dp = _data_parallel_size(world_size, _effective_tp(data, tp), pp, cp)
    return _substitute(data, _autos(data, resources.schema("deepspeed_config.schema.json")), dp)


def validate_deepspeed_config(config: dict | str | Path, *, world_size: int, tp: int = 1, pp: int = 1, cp: int = 1,
                              hf: bool = False) -> list[Problem]:
    """Every problem of a DeepSpeed config (a dict or a JSON file) for ``world_size`` ranks.

    DeepSpeed's data-parallel size is world / (tp x pp x cp); with ``tp`` 1 and an AutoTP config
    (``tensor_parallel.autotp_size``), that size is the TP degree. ``hf``: the config is for the
    Hugging Face Trainer / accelerate, whose ``"auto"`` values are filled in before checking.
    Raises InputError for an unusable file or sizes; malformed JSON is a problem with its line.
    """
    data, lines, problems = read_deepspeed_config(config)
    if data is None:
        return problems
    tp = _effective_tp(data, tp)
    dp = _data_parallel_size(world_size, tp, pp, cp)
    autos = _autos(data, resources.schema("deepspeed_config.schema.json"))
    problems += _auto_problems(autos, hf, lines)
    checked = _substitute(data, autos, dp)
    problems += _schema_problems(checked, lines)
    problems += _rule_problems(checked, world=world_size, tp=tp, pp=pp, cp=cp, dp=dp, lines=lines)
    problems += _deepspeed_problems(checked, dp, problems, lines)
    return problems


def memory_problems(config: dict | str | Path, *, model, cluster, tp: int = 1, pp: int = 1, cp: int = 1,
                    seq_len: int = 4096, recompute: str | None = None) -> list[Problem]:
    """Whether the plan the config implies fits ``cluster``'s GPUs (and hosts), by the memory ledger.

    The world size is the cluster's GPU count. Call it on a config without errors (see
    :func:`validate_deepspeed_config`); "auto" values are resolved as for ``hf=True``.
    """
    from autotune.cost.memory import estimate_memory
    from autotune.emit.deepspeed import plan_from_deepspeed_config
    from autotune.report import gib

    data, _, read_problems = read_deepspeed_config(config)
    if data is None:
        return read_problems
    data = resolved_config(data, world_size=cluster.num_gpus, tp=tp, pp=pp, cp=cp)
    try:
        plan, settings = plan_from_deepspeed_config(data, model, cluster, tp=tp, pp=pp, cp=cp, seq_len=seq_len,
                                                    recompute=recompute)
    except InputError as err:
        return [Problem(path="$", severity="error", source="memory", message=f"the plan this config implies for "
                        f"{model.name} is invalid: {p}",
                        fix="change the config, or the --tp/--pp/--cp/--gpu it is checked for") for p in err.problems]
    mem = estimate_memory(model, cluster, plan, settings)
    where = f"{model.name} on {cluster.num_gpus} x {cluster.gpu.name}, seq_len {seq_len}, recompute {plan.recompute}"
    out = []
    if not mem.fits_gpu:
        terms = ", ".join(f"{k} {gib(v)}" for k, v in mem.terms().items() if v)
        out.append(Problem(path="$.zero_optimization", severity="error", source="memory",
                           message=f"does not fit in GPU memory: {where} needs {gib(mem.total)} GiB per GPU "
                                   f"(pipeline stage {mem.stage}: {terms}) of {gib(mem.capacity)} GiB",
                           fix="raise the ZeRO stage, offload the optimizer (or parameters), recompute activations "
                               "(--recompute full), or lower train_micro_batch_size_per_gpu; `autotune plan` "
                               "searches them all"))
    if not mem.fits_host:
        out.append(Problem(path="$.zero_optimization", severity="error", source="memory",
                           message=f"offloaded states need {gib(mem.host_per_node)} GiB of host memory per node, the "
                                   f"nodes have {gib(mem.host_capacity_per_node)} GiB ({where})",
                           fix="offload to nvme, or spread over more nodes"))
    return out
