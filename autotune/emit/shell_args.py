"""Reading a shell file of Megatron arguments without running a shell.

Understood: ``--flag value`` lines with ``\\`` continuations, bash arrays (``ARGS=( ... )``, the form of
Megatron's examples and of ``autotune emit``), a launch line (``torchrun ... pretrain_gpt.py ARGS``), ``export``
and plain assignments. Everything else is ignored.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from autotune.emit.megatron_flags import is_flag
from autotune.errors import InputError
from autotune.inputs import read_text

__all__ = ["parse_shell_args", "parse_shell_args_with_lines", "read_megatron_args_file",
           "read_megatron_args_file_with_env", "read_megatron_args_file_with_lines", "MAX_ARGS_FILE_BYTES"]

_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_ARRAY_REF = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\])?\}?$")
_LAUNCHERS = ("torchrun", "python", "python3", "deepspeed", "srun")


_SHELL_CONTROL = re.compile(r"^(\|\|?|&&?|;|\d*[<>].*)$")


def _is_array_ref(token: str, arrays: set[str]) -> bool:
    if token in ("$@", "$*"):
        return True
    m = _ARRAY_REF.match(token)
    return bool(m) and (m.group(2) is not None or m.group(1) in arrays)


def _until_control(tokens: list[str]) -> list[str]:
    """Tokens up to the first pipe, list operator or redirection (``| tee log``, ``2>&1``, ``&& echo``)."""
    for i, token in enumerate(tokens):
        if _SHELL_CONTROL.match(token):
            return tokens[:i]
    return tokens


MAX_ARGS_FILE_BYTES = 1 << 20
"""A Megatron argument file is a few KB; Megatron's own examples are under 10 KB."""
MAX_LINE_CHARS = 1 << 16
"""shlex is pure Python: a longer logical line is refused instead of tokenized for seconds."""


def _logical_lines(text: str) -> list[tuple[int, list[str]]]:
    """(1-based first line, its physical lines) of each logical line (backslash continuations joined)."""
    out: list[tuple[int, list[str]]] = []
    current: list[str] = []
    start = 1
    for number, raw in enumerate(text.splitlines(), start=1):
        if not current:
            start = number
        if raw.endswith("\\") and not raw.lstrip().startswith("#"):
            current.append(raw[:-1])
            continue
        current.append(raw)
        out.append((start, current))
        current = []
    if current:
        out.append((start, current))
    return out


def _split(start: int, parts: list[str]) -> tuple[list[str], list[int]]:
    """Tokens of one logical line and each token's physical line (whole-line split if a quote spans lines)."""
    if sum(len(p) for p in parts) > MAX_LINE_CHARS:
        raise InputError([f"line {start} is longer than {MAX_LINE_CHARS} characters: not a Megatron arguments line"],
                         subject="Megatron arguments file")
    tokens: list[str] = []
    lines: list[int] = []
    try:
        for offset, part in enumerate(parts):
            got = shlex.split(part, comments=True)
            tokens += got
            lines += [start + offset] * len(got)
        return tokens, lines
    except ValueError:
        pass
    joined = " ".join(parts)
    try:
        tokens = shlex.split(joined, comments=True)
    except ValueError:
        tokens = joined.split()
    return tokens, [start] * len(tokens)


def parse_shell_args_with_lines(text: str) -> tuple[list[str], list[int], dict[str, str]]:
    """(arguments, each argument's 1-based line, exported variables) of a shell file of Megatron
    arguments (no shell is run): see :func:`parse_shell_args`."""
    argv: list[str] = []
    where: list[int] = []
    env: dict[str, str] = {}
    variables: dict[str, str] = {}
    arrays: set[str] = set()
    in_array = False

    def expand(token: str) -> str:
        return _VAR.sub(lambda m: variables.get(m.group(1) or m.group(2), m.group(0)), token) if "$" in token \
            else token

    def take(tokens: list[str], lines: list[int]) -> None:
        argv.extend(expand(t) for t in tokens)
        where.extend(lines)

    for start, parts in _logical_lines(text):
        tokens, lines = _split(start, parts)
        if not tokens:
            continue
        if in_array:
            if ")" in tokens:
                end = tokens.index(")")
                take(tokens[:end], lines[:end])
                in_array = False
            else:
                take(tokens, lines)
            continue
        if tokens[0] == "export":
            for item in tokens[1:]:
                m = _ASSIGN.match(item)
                if m:
                    env[m.group(1)] = variables[m.group(1)] = expand(m.group(2))
            continue
        m = _ASSIGN.match(tokens[0])
        if m and m.group(2).startswith("("):
            arrays.add(m.group(1))
            body = [m.group(2)[1:]] + tokens[1:] if m.group(2) != "(" else tokens[1:]
            body_lines = lines if m.group(2) != "(" else lines[1:]
            kept = [(t, n) for t, n in zip(body, body_lines) if t]
            if kept and kept[-1][0].endswith(")"):
                kept[-1] = (kept[-1][0][:-1], kept[-1][1])
                kept = [(t, n) for t, n in kept if t]
            else:
                in_array = True
            take([t for t, _ in kept], [n for _, n in kept])
            continue
        if m and len(tokens) == 1:
            variables[m.group(1)] = expand(m.group(2))
            continue
        if is_flag(tokens[0]):
            first = 0
        elif tokens[0].rsplit("/", 1)[-1] in _LAUNCHERS:
            scripts = [i for i, t in enumerate(tokens) if t.endswith(".py")]
            if not scripts:
                continue
            first = scripts[0] + 1
        else:
            continue
        rest = _until_control(tokens[first:])
        kept = [(t, n) for t, n in zip(rest, lines[first:]) if not _is_array_ref(t, arrays)]
        take([t for t, _ in kept], [n for _, n in kept])
    return argv, where, env


def parse_shell_args(text: str) -> tuple[list[str], dict[str, str]]:
    """Arguments and exported variables of a shell file of Megatron arguments (no shell is run).

    Understood: ``--flag value`` lines with ``\\`` continuations; bash arrays ``ARGS=( ... )`` as in
    Megatron's examples; a launch line (``torchrun ... pretrain_gpt.py ARGS``: the tokens after the
    ``.py``); ``export X=Y``. Plain ``X=Y`` assignments substitute ``$X``/``${X}`` in later tokens;
    array references (``${ARGS[@]}``) are skipped (their contents were read where defined). Comments and
    other commands are ignored.
    """
    argv, _, env = parse_shell_args_with_lines(text)
    return argv, env


def read_megatron_args_file_with_lines(path: str | Path) -> tuple[list[str], list[int], dict[str, str]]:
    """(arguments, their lines, exported variables) of a shell file of at most 1 MiB."""
    text = read_text(path, subject="Megatron arguments file", max_bytes=MAX_ARGS_FILE_BYTES)
    return parse_shell_args_with_lines(text)


def read_megatron_args_file_with_env(path: str | Path) -> tuple[list[str], dict[str, str]]:
    """(arguments, exported variables) of a shell file: see :func:`parse_shell_args`."""
    argv, _, env = read_megatron_args_file_with_lines(path)
    return argv, env


def read_megatron_args_file(path: str | Path) -> list[str]:
    """The Megatron arguments in a shell file (exports: :func:`read_megatron_args_file_with_env`)."""
    return read_megatron_args_file_with_lines(path)[0]
