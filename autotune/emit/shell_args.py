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

__all__ = ["parse_shell_args", "read_megatron_args_file", "read_megatron_args_file_with_env"]

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


def _logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        if raw.endswith("\\") and not raw.lstrip().startswith("#"):
            current += raw[:-1] + " "
            continue
        lines.append(current + raw)
        current = ""
    if current:
        lines.append(current)
    return lines


def parse_shell_args(text: str) -> tuple[list[str], dict[str, str]]:
    """Arguments and exported variables of a shell file of Megatron arguments (no shell is run).

    Understood: ``--flag value`` lines with ``\\`` continuations; bash arrays ``ARGS=( ... )`` as in
    Megatron's examples; a launch line (``torchrun ... pretrain_gpt.py ARGS``: the tokens after the
    ``.py``); ``export X=Y``. Plain ``X=Y`` assignments substitute ``$X``/``${X}`` in later tokens;
    array references (``${ARGS[@]}``) are skipped (their contents were read where defined). Comments and
    other commands are ignored.
    """
    argv: list[str] = []
    env: dict[str, str] = {}
    variables: dict[str, str] = {}
    arrays: set[str] = set()
    in_array = False

    def expand(token: str) -> str:
        return _VAR.sub(lambda m: variables.get(m.group(1) or m.group(2), m.group(0)), token)

    for line in _logical_lines(text):
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            tokens = line.split()
        if not tokens:
            continue
        if in_array:
            if ")" in tokens:
                argv += [expand(t) for t in tokens[:tokens.index(")")]]
                in_array = False
            else:
                argv += [expand(t) for t in tokens]
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
            body = [t for t in body if t]
            if body and body[-1].endswith(")"):
                body[-1] = body[-1][:-1]
                argv += [expand(t) for t in body if t]
            else:
                argv += [expand(t) for t in body]
                in_array = True
            continue
        if m and len(tokens) == 1:
            variables[m.group(1)] = expand(m.group(2))
            continue
        if is_flag(tokens[0]):
            rest = tokens
        elif tokens[0].rsplit("/", 1)[-1] in _LAUNCHERS:
            scripts = [i for i, t in enumerate(tokens) if t.endswith(".py")]
            if not scripts:
                continue
            rest = tokens[scripts[0] + 1:]
        else:
            continue
        argv += [expand(t) for t in _until_control(rest) if not _is_array_ref(t, arrays)]
    return argv, env


def read_megatron_args_file_with_env(path: str | Path) -> tuple[list[str], dict[str, str]]:
    """(arguments, exported variables) of a shell file: see :func:`parse_shell_args`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError([f"cannot read {str(path)!r}: {exc.strerror}"], subject="Megatron arguments file") from None
    return parse_shell_args(text)


def read_megatron_args_file(path: str | Path) -> list[str]:
    """The Megatron arguments in a shell file (exports: :func:`read_megatron_args_file_with_env`)."""
    return read_megatron_args_file_with_env(path)[0]
