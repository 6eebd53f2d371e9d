"""Splitting an argument list as argparse would, against a shipped flag table (Megatron-LM's or
Megatron-DeepSpeed's), with each flag's line in the file it came from; value rules shared by both.

The engine-specific rules live in :mod:`autotune.emit.megatron_lint` and
:mod:`autotune.emit.megatron_deepspeed_lint`.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.emit.megatron_flags import FlagSpec, is_flag
from autotune.emit.problems import Problem, Severity

__all__ = ["Given", "ParsedArgs", "tokenize", "duplicate_problems", "value_problems", "nearest_flag",
           "filled_at_launch", "LEFT_TO_LAUNCH"]

_MAX_NAME_FOR_SUGGESTION = 100  # difflib is quadratic: no suggestion for a "flag" longer than this

LEFT_TO_LAUNCH = re.compile(r"\$(\{\w+(\[[@*]\])?\}|[0-9]|[A-Za-z_]\w*)")
"""A word that is one variable (or array) the file does not set: bash_reader keeps it as written."""
_SUBSTITUTION = ("$(", "`")  # a command substitution the shell runs at launch: bash_reader keeps it unrun


def filled_at_launch(word: str) -> bool:
    """Whether bash_reader left ``word`` to the launch: a command substitution, or one variable the file does not
    set (a script argument, the run's environment)."""
    return word.startswith(_SUBSTITUTION) or LEFT_TO_LAUNCH.fullmatch(word) is not None


@dataclass(frozen=True, slots=True)
class Given:
    flag: str
    """Canonical name (first alias)."""
    written: str
    values: tuple[str, ...]
    line: int | None = None
    """1-based line of the flag in its file, when known."""


def nearest_flag(name: str, table: Mapping[str, FlagSpec]) -> str | None:
    if len(name) > _MAX_NAME_FOR_SUGGESTION:
        return None
    close = difflib.get_close_matches(name, [k for k in table if k.startswith("--")], n=1, cutoff=0.6)
    return close[0] if close else None


def tokenize(argv: Sequence[str], table: Mapping[str, FlagSpec], *, engine: str, table_file: str,
             lines: Sequence[int] | None = None) -> tuple[list[Given], list[Problem]]:
    """Split argv into flags with their values as argparse would (allow_abbrev=False).

    ``engine`` names the parser in messages ("Megatron-LM"); ``lines[i]`` is argv[i]'s line in its file.
    """
    given: list[Given] = []
    problems: list[Problem] = []

    def line_of(index: int) -> int | None:
        return lines[index] if lines is not None and index < len(lines) else None

    def problem(path: str, message: str, fix: str, at: int, severity: Severity = "error") -> None:
        problems.append(Problem(path=path, severity=severity, message=message, fix=fix, line=line_of(at),
                                source="rules"))

    i = 0
    while i < len(argv):
        token, at = argv[i], i
        i += 1
        if LEFT_TO_LAUNCH.fullmatch(token):  # `${EXTRA_ARGS}`, unset in the file: bash expands it at launch
            problem(token, f"{token} is a variable the file leaves to its launch (a script argument or the "
                    "environment): the words it gives are not checked", "validate the arguments it is given too", at,
                    "warning")
            continue
        if not is_flag(token):
            shown = token if len(token) <= 60 else token[:57] + "..."
            problem(shown, f"unexpected argument {shown!r}", "remove it, or put it after the flag it belongs to", at)
            continue
        name, eq, inline = token.partition("=")
        spec = table.get(name)
        values: list[str] = [inline] if eq else []
        if spec is None:
            while not eq and i < len(argv) and not is_flag(argv[i]):
                values.append(argv[i])
                i += 1
            near = nearest_flag(name, table)
            shown = name if len(name) <= 60 else name[:57] + "..."
            problem(shown, f"unrecognized argument {shown} ({engine}'s parser exits here)",
                    f"did you mean {near}?" if near else f"see {table_file} for the flags that exist", at)
            continue
        if spec.is_switch:
            if eq:
                problem(name, f"{name} takes no value", f"write {name} alone", at)
            given.append(Given(spec.name, name, (), line_of(at)))
            continue
        nargs = spec.nargs
        if not eq:
            limit = 1 if nargs is None else (int(nargs) if nargs.isdigit() else len(argv))
            while len(values) < limit and i < len(argv) and not is_flag(argv[i]):
                values.append(argv[i])
                i += 1
        need = 1 if nargs in (None, "+") else (int(nargs) if nargs.isdigit() else 0)
        if len(values) < need:
            problem(name, f"{name} expects {'at least ' if nargs == '+' else ''}{need} value{'s' if need > 1 else ''}",
                    f"give {name} its value", at)
            continue
        for value in values:
            if value.startswith(_SUBSTITUTION):
                if spec.type in ("int", "float") or spec.choices:  # else any text is taken: nothing to check
                    problem(name, f"{name} is {value[:60]!r}, the output of a command run at launch: not checked",
                            "write the value itself if autotune should check it", at, "warning")
                continue
            if LEFT_TO_LAUNCH.fullmatch(value):  # `--lr $3`: bash_reader keeps a variable the file does not set
                # as written: the script's argument or the run's environment
                if spec.type in ("int", "float") or spec.choices:
                    problem(name, f"{name} is {value!r}, which the file leaves to its launch (a script argument or "
                                  "the environment): not checked", "write the value itself if autotune should check it",
                            at, "warning")
                continue
            why = spec.value_problem(value)
            if why:
                problem(name, f"{name} {why}", f"use a value {name} accepts", at)
        given.append(Given(spec.name, name, tuple(values), line_of(at)))
    return given, problems


class ParsedArgs:
    """The last value of each flag given (argparse keeps the last), with the table's defaults."""

    def __init__(self, given: list[Given], table: Mapping[str, FlagSpec]) -> None:
        self._last = {g.flag: g for g in given}
        self._table = table

    def has(self, flag: str) -> bool:
        return flag in self._last

    def line(self, flag: str) -> int | None:
        g = self._last.get(flag)
        return g.line if g is not None else None

    def value(self, flag: str) -> str | None:
        g = self._last.get(flag)
        if g is not None:
            return g.values[-1] if g.values else None
        spec = self._table.get(flag)
        if spec is None:
            return None
        return None if spec.default == "None" else spec.default.strip("'")

    def integer(self, flag: str) -> int | None:
        try:
            return int(self.value(flag))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None

    def number(self, flag: str) -> float | None:
        try:
            return float(self.value(flag))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None


def duplicate_problems(given: list[Given], table: Mapping[str, FlagSpec]) -> list[Problem]:
    counts: dict[str, list[Given]] = {}
    for g in given:
        counts.setdefault(g.flag, []).append(g)
    return [Problem(path=flag, severity="warning", message=f"{flag} is given {len(gs)} times; the last wins",
                    fix="keep one", line=gs[-1].line, source="rules")
            for flag, gs in counts.items() if len(gs) > 1 and not table[flag].is_switch]


# Counts and sizes that argparse takes as any int but that only make sense >= 1 (both parsers).
_POSITIVE_INTS = (
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
    "--num-key-value-heads", "--kv-channels", "--seq-length", "--max-position-embeddings", "--micro-batch-size",
    "--global-batch-size", "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
    "--context-parallel-size", "--expert-model-parallel-size", "--expert-tensor-parallel-size",
    "--ds-sequence-parallel-size", "--vocab-size", "--num-experts", "--moe-router-topk", "--topk",
    "--train-iters", "--log-interval", "--save-interval", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--num-layers-per-virtual-pipeline-stage", "--recompute-num-layers",
    "--checkpoint-num-layers", "--moe-ffn-hidden-size",
)


def value_problems(a: ParsedArgs, table: Mapping[str, FlagSpec]) -> list[Problem]:
    """Values the parsers take but training cannot use: NaN/Infinity anywhere, counts < 1, a learning
    rate that is not finite and positive, Adam betas outside [0, 1), a non-positive epsilon."""
    out: list[Problem] = []

    def bad(flag: str, message: str, fix: str, severity: Severity = "error") -> None:
        out.append(Problem(path=flag, severity=severity, message=message, fix=fix, line=a.line(flag), source="rules"))

    for flag, spec in table.items():
        if flag != spec.name or not a.has(flag):
            continue
        value = a.value(flag)
        if spec.type == "float" and value is not None:
            try:
                number = float(value)
            except ValueError:
                continue  # the tokenizer reported it
            if not math.isfinite(number):
                bad(flag, f"{flag} is {value}: Python's float() accepts it, training turns it into NaN losses",
                    f"give {flag} a finite number")
    for flag in _POSITIVE_INTS:
        n = a.integer(flag) if a.has(flag) else None
        if n is not None and n < 1:
            bad(flag, f"{flag} must be >= 1, got {n} (argparse accepts any integer)", f"give {flag} a positive count")
    lr = a.number("--lr") if a.has("--lr") else None
    if lr is not None and math.isfinite(lr) and lr <= 0:
        bad("--lr", f"--lr must be > 0, got {a.value('--lr')}: nothing would train", "use e.g. --lr 3e-4")
    min_lr = a.number("--min-lr") if a.has("--min-lr") else None
    if min_lr is not None and math.isfinite(min_lr) and min_lr < 0:
        bad("--min-lr", f"--min-lr must be >= 0, got {a.value('--min-lr')}", "use 0 or a fraction of --lr")
    for flag in ("--adam-beta1", "--adam-beta2"):
        beta = a.number(flag) if a.has(flag) else None
        if beta is not None and math.isfinite(beta) and not 0 <= beta < 1:
            bad(flag, f"{flag} must be in [0, 1), got {a.value(flag)} (torch.optim.AdamW raises ValueError)",
                "use 0.9 for beta1, 0.95 or 0.999 for beta2")
    eps = a.number("--adam-eps") if a.has("--adam-eps") else None
    if eps is not None and math.isfinite(eps) and eps <= 0:
        bad("--adam-eps", f"--adam-eps must be > 0, got {a.value('--adam-eps')}", "use 1e-8")
    return out
