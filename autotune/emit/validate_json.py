"""Reading a DeepSpeed JSON config for the linter: the data, the line of every key, keys given twice.

Also the small helpers every layer of :mod:`autotune.emit.validate` shares (JSON paths, lookups).
"""

from __future__ import annotations

import bisect
import copy
import json
import math
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
    NaN / Infinity, a number too large for a 64-bit float (``1e400`` reads as infinity) and an integer beyond a
    64-bit one are problems at their line, and left out of the data checked further.
    """
    if isinstance(config, dict):
        data = _mark_unusable(copy.deepcopy(config))
        return data, {}, [Problem(path=json_path(parts), severity="error", source="json", message=value.message(),
                                  fix=value.fix) for parts, value in _drop_non_finite(data)]
    path = Path(config)

    text = read_text(path, subject="DeepSpeed config")  # regular files only, bounded, UTF-8 (BOM dropped)
    if text_depth_problem(text):
        raise InputError([f"{str(path)!r}: {text_depth_problem(text)}"], subject="DeepSpeed config")
    if not text.strip().startswith("{"):
        raise InputError([f"{str(path)!r} is not a DeepSpeed JSON config: "
                          f"{'it is empty' if not text.strip() else 'it does not start with {'}"],
                         subject="DeepSpeed config")
    try:
        data = json.loads(text, parse_constant=_NonFinite, parse_float=_float, parse_int=_int)
    except json.JSONDecodeError as err:
        # DeepSpeed itself reads hjson (comments, trailing commas), but the HF Trainer, accelerate and
        # Megatron-DeepSpeed json.load the file: not JSON is unusable input, as a list or an empty file is.
        raise InputError([f"{str(path)!r} is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}; "
                          "fix the JSON there (json.load-based launchers such as the HF Trainer, accelerate and "
                          "Megatron-DeepSpeed cannot read it)"], subject="DeepSpeed config") from None
    except (RecursionError, ValueError) as err:  # too deep, or an integer of more than 4300 digits
        why = ("an integer of more than 4,300 digits" if "digits" in str(err) else f"{type(err).__name__}: {err}")
        raise InputError([f"{str(path)!r} is not a usable JSON config: {why}; write a number DeepSpeed can hold"],
                         subject="DeepSpeed config") from None
    if not isinstance(data, dict):
        raise InputError([f"{str(path)!r} is not a DeepSpeed JSON config: it holds a {type(data).__name__}, not an "
                          "object"], subject="DeepSpeed config")
    lines, twice = _key_lines(text)
    problems = [Problem(path=json_path(p), severity="error", line=lines[p], source="json",
                        message="key given twice: DeepSpeed's reader raises on duplicate keys (config_utils.py:205)",
                        fix="keep one of them") for p in twice]
    for parts, value in _drop_non_finite(data):
        problems.append(Problem(path=json_path(parts), severity="error", line=line_of(lines, parts), source="json",
                                message=value.message(), fix=value.fix))
    return data, lines, problems


class _NonFinite(str):
    """Where the file said NaN / Infinity / -Infinity (removed from the data after being reported)."""

    fix = "write a finite number"

    def message(self) -> str:
        return (f"{self} is not JSON (Python's json module writes it, json.load-based readers and DeepSpeed's hjson "
                "reader differ on it)")


class _OutOfRange(_NonFinite):
    """A number no reader can hold: a float beyond 1.8e308 (``1e400`` reads as infinity), an integer beyond
    a 64-bit one (DeepSpeed, torch and NCCL hold counts and sizes in 64 bits); reported, then removed."""

    fix = "write a number DeepSpeed can hold"

    def message(self) -> str:
        shown = self if len(self) <= 24 else f"{self[:12]}...{self[-4:]} ({len(self)} characters)"
        if any(c in self for c in ".eE"):
            return f"{shown} is beyond the largest 64-bit float (1.8e308): json.load reads it as infinity"
        return f"{shown} is beyond a 64-bit integer (+-9.2e18): DeepSpeed and torch cannot hold it"


_INT64_MAX = 2**63 - 1


def _float(text: str) -> float | _OutOfRange:
    value = float(text)
    return value if math.isfinite(value) else _OutOfRange(text)


def _int(text: str) -> int | _OutOfRange:
    value = int(text)
    return value if -_INT64_MAX - 1 <= value <= _INT64_MAX else _OutOfRange(text)


def _mark_unusable(data: Any) -> Any:
    """A config given as a dict: its NaN / infinite floats and integers beyond 64 bits marked, as the file reader
    marks them."""
    if isinstance(data, dict | list):
        for key, value in list(data.items()) if isinstance(data, dict) else list(enumerate(data)):
            if isinstance(value, float) and not math.isfinite(value):
                data[key] = _NonFinite({"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[str(value)])
            elif isinstance(value, int) and not isinstance(value, bool) and not -_INT64_MAX - 1 <= value <= _INT64_MAX:
                data[key] = _OutOfRange(str(value) if value.bit_length() < 14000 else f"{'-' * (value < 0)}1e4000")
            else:
                _mark_unusable(value)
    return data


def _drop_non_finite(data: Any, parts: Parts = ()) -> list[tuple[Parts, _NonFinite]]:
    found: list[tuple[Parts, _NonFinite]] = []
    items = list(data.items()) if isinstance(data, dict) else list(enumerate(data)) if isinstance(data, list) else []
    for key, value in items:
        if isinstance(value, _NonFinite):
            found.append((parts + (key,), value))
        elif isinstance(value, (dict, list)):
            found += _drop_non_finite(value, parts + (key,))
    # last first, list indices as numbers (a string order would delete [10] after [2] had shifted it)
    for key in sorted((p[-1] for p, _ in found if p[:-1] == parts),
                      key=lambda k: (0, k, "") if isinstance(k, int) else (1, 0, str(k)), reverse=True):
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

