"""Reading what users hand us: regular files only, bounded, UTF-8, shallow, finite.

Every file input of the tool (model, cluster, recipe, plan JSON, calibration, ...) goes through
:func:`read_text`, then :func:`parse_json`, :func:`parse_yaml` or :func:`parse_toml`. Each failure is an
:class:`~autotune.errors.InputError` naming the file and the fix, never a traceback or a hang:

- only regular files are read: a FIFO would block ``open()`` forever, a device (``/dev/zero``)
  never ends, a folder cannot be read; each is refused by name (opened with ``O_NONBLOCK``,
  then ``fstat``-ed);
- at most :data:`MAX_INPUT_BYTES` are read (the largest file we write, a ``plan --json`` of
  many candidates, is a few hundred KB);
- bytes that are not UTF-8 are reported with their offset;
- nesting deeper than :data:`MAX_DEPTH` is refused before anything recurses on it (our deepest
  format, a DeepSpeed config, nests 4 levels; TOML, whose standard-library parser recurses, is refused
  when it recurses too deep);
- an integer of more than 4300 digits (Python's limit on converting text to an integer) is refused;
- YAML anchors/aliases (which let a 1 KB file expand to gigabytes), non-scalar mapping keys
  (``? [a, b]``) and keys given twice are refused; JSON ``NaN``/``Infinity`` are refused, and
  :func:`nonfinite_problems` finds YAML's ``.inf``/``.nan``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import stat
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import InputError

__all__ = ["write_problem", "out_folder_problem", "MAX_INPUT_BYTES", "MAX_DEPTH", "read_text", "parse_json", "parse_yaml", "parse_toml", "read_json",
           "nonfinite_problems", "depth_problem", "text_depth_problem", "range_problem",
           "path_problem"]

MAX_INPUT_BYTES = 16 * 2**20
MAX_DEPTH = 32

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _os_problem(err: OSError) -> str:
    if err.errno == errno.ENAMETOOLONG:
        return "the file name is longer than the file system allows"
    if err.errno == errno.ENOENT:
        return "no such file"
    if err.errno == errno.EACCES:
        return "permission denied (make it readable)"
    if err.errno == errno.ELOOP:
        return "too many levels of symbolic links"
    if err.errno == errno.ENOTDIR:
        return "a part of the path before the file name is a file, not a folder: check the path"
    return f"cannot read it: {err.strerror or err}"


def read_text(path: str | os.PathLike, *, subject: str, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of regular file ``path`` (a leading BOM dropped); InputError otherwise."""
    name = _named(subject, path)
    if "\0" in str(path):
        raise InputError(["the file name contains a NUL byte"], subject=name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        if err.errno == errno.EISDIR:
            raise InputError(["is a folder, not a file: give the file itself"], subject=name) from None
        raise InputError([_os_problem(err)], subject=name) from None
    try:
        mode = os.fstat(fd).st_mode
        for test, what in _KINDS:
            if test(mode):
                raise InputError([f"is {what}, not a regular file: give a regular file"], subject=name)
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise InputError([_os_problem(err)], subject=name) from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise InputError([f"larger than {max_bytes // 2**20} MiB: not a file of this kind"], subject=name)
    raw = b"".join(chunks)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InputError([f"not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}): save it as UTF-8"],
                         subject=name) from None


def _named(subject: str, path: str | os.PathLike) -> str:
    """``subject`` with the file's name, unless it already has it (a name of thousands of characters cut)."""
    name = str(path)
    if name in subject:
        return subject
    shown = repr(name) if len(name) <= 200 else f"{name[:80]!r}...{name[-40:]!r} ({len(name):,} characters)"
    return f"{subject} {shown}"


def depth_problem(data: Any, *, limit: int = MAX_DEPTH) -> str | None:
    """'nested N levels deep' when ``data`` nests deeper than ``limit`` (walked without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list | tuple):
            if depth > limit:
                return f"nested more than {limit} levels deep: not a file of this kind"
            items = value.values() if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in items if isinstance(v, dict | list | tuple))
    return None


_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def text_depth_problem(text: str, *, limit: int = MAX_DEPTH) -> str | None:
    """:func:`depth_problem` on JSON-like text before parsing it (brackets inside strings skipped)."""
    depth = 0
    for match in _STRING_OR_BRACKET.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > limit:
                return f"nested more than {limit} levels deep: not a file of this kind"
        elif token in "]}":
            depth -= 1
    return None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number (write a finite number, or null)")


def parse_json(text: str, *, subject: str, nonfinite: bool = False) -> Any:
    """Standard JSON only: no NaN/Infinity (``nonfinite``: read as floats, as Python's json module and so
    transformers' config loader do), nesting at most MAX_DEPTH."""
    try:
        data = json.loads(text, parse_constant=float if nonfinite else _no_constant)
    except json.JSONDecodeError as err:
        raise InputError([f"not valid JSON: {err.msg} at line {err.lineno} column {err.colno}"],
                         subject=subject) from None
    except RecursionError:
        raise InputError([f"nested more than {MAX_DEPTH} levels deep: not a file of this kind"],
                         subject=subject) from None
    except ValueError as err:  # NaN/Infinity, or an integer of more than 4300 digits
        raise InputError([f"not valid JSON: {err}"], subject=subject) from None
    problem = depth_problem(data)
    if problem:
        raise InputError([problem], subject=subject)
    return data


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping (PyYAML keeps the last silently); with ``repeated``
    set (a list), it keeps the last value, as PyYAML does, and records (key, line) there."""

    repeated: list[tuple[str, int]] | None = None


def _no_duplicate_keys(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, str | int | float | bool) and key is not None:
            raise yaml.constructor.ConstructorError(None, None, f"a mapping key must be a plain value, got "
                                                    f"{type(key).__name__}", key_node.start_mark)
        if key in seen and loader.repeated is None:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice", key_node.start_mark)
        if key in seen:
            loader.repeated.append((str(key), key_node.start_mark.line + 1))
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicate_keys)


def _load(text: str, repeated: list[tuple[str, int]] | None) -> Any:
    loader = _StrictLoader(text)
    loader.repeated = repeated
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _yaml_shape_problem(text: str) -> str | None:
    """Depth, aliases and collection keys, found on the event stream (PyYAML's parser does not recurse)."""
    stack: list[list] = []  # [is_mapping, items seen]
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            where = event.start_mark
            return f"YAML anchors and aliases are not supported (line {where.line + 1}): write the values out"
        if isinstance(event, yaml.CollectionStartEvent):
            if stack and stack[-1][0] and stack[-1][1] % 2 == 0:
                return (f"a mapping key must be a plain value, not a list or mapping (line "
                        f"{event.start_mark.line + 1})")
            if stack:
                stack[-1][1] += 1
            if len(stack) >= MAX_DEPTH:
                return f"nested more than {MAX_DEPTH} levels deep: not a file of this kind"
            stack.append([isinstance(event, yaml.MappingStartEvent), 0])
        elif isinstance(event, yaml.CollectionEndEvent):
            stack.pop()
        elif isinstance(event, yaml.ScalarEvent) and stack:
            stack[-1][1] += 1
    return None


def parse_yaml(text: str, *, subject: str, repeated: list[tuple[str, int]] | None = None) -> Any:
    """The value of a YAML (or JSON) document; InputError if malformed, aliased, too deep, keys repeated. With
    ``repeated`` (a list) a key given twice keeps its last value, as PyYAML's safe_load does, and (key, line) is added
    to it: for a file whose own program reads it so (accelerate's loader)."""
    try:
        problem = _yaml_shape_problem(text)
        data = None if problem else _load(text, repeated)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise InputError([f"not valid YAML: {problem}{where}"], subject=subject) from None
    except (ValueError, OverflowError, RecursionError) as err:  # e.g. an impossible date 2024-13-45
        raise InputError([f"not valid YAML: {err}"], subject=subject) from None
    if problem:
        raise InputError([problem], subject=subject)
    return data


def parse_toml(text: str, *, subject: str) -> dict:
    """The table of a TOML document; InputError if malformed, nested too deep, or an integer too long."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InputError([f"not valid TOML: {err}"], subject=subject) from None
    except RecursionError:  # tomllib recurses on nested arrays and inline tables
        raise InputError([f"nested more than {MAX_DEPTH} levels deep: not a file of this kind"],
                         subject=subject) from None
    except ValueError as err:  # an integer of more than 4300 digits
        problem = ("an integer of more than 4,300 digits: not a value of this kind" if "digits" in str(err)
                   else f"not valid TOML: {err}")
        raise InputError([problem], subject=subject) from None
    problem = depth_problem(data)
    if problem:
        raise InputError([problem], subject=subject)
    return data


def read_json(path: str | os.PathLike, *, subject: str) -> Any:
    """:func:`read_text` then :func:`parse_json`, errors naming the file."""
    return parse_json(read_text(path, subject=subject), subject=_named(subject, path))


def nonfinite_problems(data: Any, where: str = "$") -> list[str]:
    """One line per NaN or infinite number in ``data`` (YAML's .inf/.nan, Python floats), with its path."""
    out, stack = [], [(data, where)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            out.append(f"{path}: must be a finite number, got {value}")
        elif isinstance(value, dict):
            stack.extend((v, f"{path}.{k}") for k, v in value.items())
        elif isinstance(value, list | tuple):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
    return sorted(out)


def range_problem(name: str, value: Any, *, lo: float, hi: float, lo_open: bool = False,
                  why_hi: str = "") -> str | None:
    """'NAME must be ...' when ``value`` is not a finite number in [lo, hi] ((lo, hi] with ``lo_open``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{name} must be a number, got {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{name} must be a finite number, got {value}"
    low_bad = value <= lo if lo_open else value < lo
    if low_bad or value > hi:
        bound = f"> {_num(lo)}" if lo_open else f">= {_num(lo)}"
        hint = f" ({why_hi})" if why_hi else ""
        return f"{name} must be {bound} and <= {_num(hi)}{hint}, got {_num(value)}"
    return None


def _num(x: float) -> str:
    if isinstance(x, int) or (float(x).is_integer() and abs(x) < 1e15):
        return f"{int(x):,}" if abs(x) < 10**30 else f"{x:.3g}"
    return f"{x:g}"


def path_problem(path: str, *, flag: str) -> str | None:
    """A problem with an output path before anything is written (NUL byte, component too long)."""
    if "\0" in path:
        return f"{flag} {path!r}: the name contains a NUL byte"
    try:
        limit = os.pathconf(Path(path).parent if str(Path(path).parent) else ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for part in Path(path).parts:
        if len(os.fsencode(part)) > limit:
            return f"{flag} {path[:60]!r}...: a name of {len(os.fsencode(part))} bytes; this file system allows {limit}"
    return None


def write_problem(folder: str | Path) -> str | None:
    """Why a file cannot be created in ``folder`` (a real write, removed at once; ``os.access`` passes /proc), or
    None."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".autotune-write-test-"):
            return None
    except OSError as err:
        return err.strerror or str(err)


def out_folder_problem(out: str) -> str | None:
    """Why ``--out`` cannot hold the study (None when it can): it is created if missing, then must be a folder
    this process can write in (a file, /proc, a symbolic-link loop or a read-only file system cannot)."""
    path = Path(out)
    made: list[Path] = []  # the folders this check creates, removed again after it (the study makes them)
    try:
        for folder in [*reversed(path.parents), path]:
            if not os.path.lexists(folder):
                folder.mkdir()
                made.append(folder)
        if not path.is_dir():
            return f"--out {out!r} is a file, not a folder: give a folder (it is created if missing)"
        with tempfile.NamedTemporaryFile(dir=path, prefix=".autotune-write-check-"):
            pass
    except FileExistsError:
        return f"--out {out!r} is a file, not a folder: give a folder (it is created if missing)"
    except OSError as err:
        why = err.strerror or str(err)
        hint = " (a read-only file system)" if err.errno == errno.EROFS else ""
        return (f"--out {out[:80]!r}{'...' if len(out) > 80 else ''} cannot hold the study: {why}{hint}; give a "
                "folder you can write in")
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
    return None
