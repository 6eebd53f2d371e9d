"""Reading a DeepSpeed JSON config for the linter: the data, the line of every key, keys given twice.

Also the small helpers every layer of :mod:`autotune.emit.validate` shares (JSON paths, lookups).
"""

from __future__ import annotations

import bisect
import copy
import json
import re
from pathlib import Path
from typing import Any

from autotune.emit.problems import Problem
from autotune.errors import InputError
from autotune.inputs import read_text, text_depth_problem

__all__ = ["Parts", "BATCH_KEYS", "json_path", "has_errors", "read_deepspeed_config", "line_of", "get", "is_int"]

Parts = tuple  # a JSON path as keys and indices
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


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

    Not JSON (malformed, not an object, too deep) is unusable input: InputError naming the line and column.
    NaN / Infinity are problems at their line, and left out of the data checked further.
    """
    if isinstance(config, dict):
        return copy.deepcopy(config), {}, []
    path = Path(config)

    text = read_text(path, subject="DeepSpeed config")  # regular files only, bounded, UTF-8 (BOM dropped)
    if text_depth_problem(text):
        raise InputError([f"{str(path)!r}: {text_depth_problem(text)}"], subject="DeepSpeed config")
    if not text.strip().startswith("{"):
        raise InputError([f"{str(path)!r} is not a DeepSpeed JSON config: "
                          f"{'it is empty' if not text.strip() else 'it does not start with {'}"],
                         subject="DeepSpeed config")
    try:
        data = json.loads(text, parse_constant=lambda name: _NonFinite(name))
    except json.JSONDecodeError as err:
        # DeepSpeed itself reads hjson (comments, trailing commas), but the HF Trainer, accelerate and
        # Megatron-DeepSpeed json.load the file: not JSON is unusable input, as a list or an empty file is.
        raise InputError([f"{str(path)!r} is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}; "
                          "fix the JSON there (json.load-based launchers such as the HF Trainer, accelerate and "
                          "Megatron-DeepSpeed cannot read it)"], subject="DeepSpeed config") from None
    except (RecursionError, ValueError) as err:  # too deep, or an integer of more than 4300 digits
        raise InputError([f"{str(path)!r} is not a usable JSON config: {type(err).__name__}: {err}"],
                         subject="DeepSpeed config") from None
    if not isinstance(data, dict):
        raise InputError([f"{str(path)!r} is not a DeepSpeed JSON config: it holds a {type(data).__name__}, not an "
                          "object"], subject="DeepSpeed config")
    lines, twice = _key_lines(text)
    problems = [Problem(path=json_path(p), severity="error", line=lines[p], source="json",
                        message="key given twice: DeepSpeed's reader raises on duplicate keys (config_utils.py:205)",
                        fix="keep one of them") for p in twice]
    for parts, name in _drop_non_finite(data):
        problems.append(Problem(path=json_path(parts), severity="error", line=line_of(lines, parts), source="json",
                                message=f"{name} is not JSON (Python's json module writes it, json.load-based "
                                        "readers and DeepSpeed's hjson reader differ on it)",
                                fix="write a finite number"))
    return data, lines, problems


class _NonFinite(str):
    """Where the file said NaN / Infinity / -Infinity (removed from the data after being reported)."""


def _drop_non_finite(data: Any, parts: Parts = ()) -> list[tuple[Parts, str]]:
    found: list[tuple[Parts, str]] = []
    items = list(data.items()) if isinstance(data, dict) else list(enumerate(data)) if isinstance(data, list) else []
    for key, value in items:
        if isinstance(value, _NonFinite):
            found.append((parts + (key,), str(value)))
        elif isinstance(value, (dict, list)):
            found += _drop_non_finite(value, parts + (key,))
    for key in sorted((p[-1] for p, _ in found if p[:-1] == parts), key=str, reverse=True):
        del data[key]
    return found


def line_of(lines: dict[Parts, int], parts: Parts) -> int | None:
    while parts and parts not in lines:
        parts = parts[:-1]
    return lines.get(parts)


def get(data: Any, parts: Parts, default: Any = None) -> Any:
    for p in parts:
        if isinstance(data, dict) and p in data:
            data = data[p]
        elif isinstance(data, list) and isinstance(p, int) and p < len(data):
            data = data[p]
        else:
            return default
    return data


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer()

