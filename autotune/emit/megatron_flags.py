"""The argparse flag tables of Megatron-core (one per modelled release) and Megatron-DeepSpeed, shipped as JSON facts.

``megatron_flags_core_v0.NN.json``: ``megatron/training/arguments.py``'s parser (``parse_args``) of each modelled
Megatron-core release: NVIDIA/Megatron-LM tags core_v0.16.1, core_v0.17.1, core_v0.18.2, and the megatron-core
0.19.2 wheel (its arguments.py is core_v0.19.0's); each file names its source. ``megatron_deepspeed_flags.json``:
deepspeedai/Megatron-DeepSpeed ``megatron/arguments.py`` at 4efb479 plus ``deepspeed.add_config_arguments``. All
written by ``scripts/extract_flag_table.py``. Each record: the option strings, dest, default, type, choices,
argparse action, nargs.
"""

from __future__ import annotations

import ast
import functools
import importlib.resources
import json
import re
from dataclasses import dataclass

__all__ = ["FlagSpec", "megatron_flag_table", "packaged_flag_table", "megatron_deepspeed_flag_table", "is_flag",
           "megatron_flags_file", "megatron_table_source", "releases_with_flag", "MEGATRON_CORE_RELEASES",
           "MEGATRON_DEEPSPEED_FLAGS_FILE", "layer_pattern"]

MEGATRON_CORE_RELEASES = ("0.16", "0.17", "0.18", "0.19")
"""The Megatron-core releases with a flag table here, oldest first (the newest is the default)."""
MEGATRON_DEEPSPEED_FLAGS_FILE = "megatron_deepspeed_flags.json"
_NUMBER = re.compile(r"^-\d|^-\.\d")


def is_flag(token: str) -> bool:
    """``--foo`` / ``-x``, not a negative number."""
    return token.startswith("-") and len(token) > 1 and not _NUMBER.match(token)


@dataclass(frozen=True, slots=True)
class FlagSpec:
    """One Megatron-LM argparse option, as a ``megatron_flags_core_v0.*.json`` table records it."""

    names: tuple[str, ...]
    dest: str
    default: str
    type: str
    choices: tuple[str, ...] | None
    action: str
    nargs: str | None

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def is_switch(self) -> bool:
        """Takes no value (store_true / store_false / BooleanOptionalAction)."""
        return self.action != "_StoreAction"

    def value_problem(self, value: str) -> str | None:
        """Why ``value`` is not accepted by this flag, or None."""
        if self.type == "int":
            try:
                as_int = int(value)
            except ValueError:
                return f"expects an integer, got {value!r}"
            if self.choices and str(as_int) not in self.choices:
                return f"expects one of {', '.join(self.choices)}, got {value!r}"
            return None
        if self.type == "float":
            try:
                float(value)
            except ValueError:
                return f"expects a number, got {value!r}"
            return None
        if self.type == "moe_freq_type":
            return None if _moe_freq_ok(value) else (
                f"expects an integer N or a layer pattern such as '([0]*3+[1]*58)', got {value!r}")
        if self.type == "enum_type_handler" and self.choices:
            # Megatron parses these with Enum[name]; the table lists members as 'AttnBackend.flash'.
            names = [c.rsplit(".", 1)[-1] for c in self.choices if "." in c]
            if names and value not in names:
                return f"expects one of {', '.join(names)}, got {value!r}"
            return None
        if self.choices and value not in self.choices:
            return f"expects one of {', '.join(self.choices)}, got {value!r}"
        return None


def _moe_freq_ok(text: str) -> bool:
    """Megatron's moe_freq_type: an int, or a list expression of 0/1 built with [], +, * and ints."""
    try:
        layer_pattern(text)
        return True
    except ValueError:
        return False


def layer_pattern(text: str) -> int | list[int]:
    """A per-layer flag value as Megatron's moe_freq_type / window_attn_skip_freq take it: an int, or a list
    expression of ints built with [], + and * (e.g. "([0]*3+[1]*58)"), evaluated without ``eval``; ValueError for
    anything else (a repeat count is capped at 10^6)."""
    text = str(text).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return _list_expression(ast.parse(text, mode="eval").body)
    except (SyntaxError, RecursionError, MemoryError):
        raise ValueError(f"not an int or a list expression: {text!r}") from None


def _list_expression(node: ast.AST) -> list[int]:
    if isinstance(node, ast.List | ast.Tuple):
        return [_int_constant(e) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _list_expression(node.left) + _list_expression(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        times, items = (node.right, node.left) if isinstance(node.right, ast.Constant) else (node.left, node.right)
        count = _int_constant(times)
        if count > 10**6:
            raise ValueError("repeat count over 10^6")
        return _list_expression(items) * count
    raise ValueError("not a list expression")


def _int_constant(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    raise ValueError("not an int")


def _read_flags_json(filename: str) -> dict:
    """A flag table shipped in this package (``autotune/emit/*.json``)."""
    packaged = importlib.resources.files("autotune.emit") / filename
    return json.loads(packaged.read_text(encoding="utf-8"))


def packaged_flag_table(filename: str) -> dict[str, FlagSpec]:
    """Every option string of a flag table shipped in ``autotune/emit`` (a release's parser, a script's own flags)
    -> its :class:`FlagSpec`."""
    return _table(filename)


def _table(filename: str) -> dict[str, FlagSpec]:
    table: dict[str, FlagSpec] = {}
    for entry in _read_flags_json(filename)["flags"]:
        nargs = entry["nargs"]
        spec = FlagSpec(names=tuple(entry["flags"]), dest=entry["dest"], default=str(entry["default"]),
                        type=str(entry["type"]), choices=tuple(entry["choices"]) if entry["choices"] else None,
                        action=entry["action"], nargs=None if nargs is None or nargs == "0" else str(nargs))
        for name in spec.names:
            table[name] = spec
    return table


def megatron_flags_file(release: str | None = None) -> str:
    """The packaged flag table of a Megatron-core release ("0.19"; None: the newest)."""
    release = release or MEGATRON_CORE_RELEASES[-1]
    if release not in MEGATRON_CORE_RELEASES:
        raise ValueError(f"no Megatron-core {release} flag table (tables: {', '.join(MEGATRON_CORE_RELEASES)})")
    return f"megatron_flags_core_v{release}.json"


@functools.cache
def megatron_flag_table(release: str | None = None) -> dict[str, FlagSpec]:
    """Every option string (aliases included) of a Megatron-core release's parser -> its :class:`FlagSpec`
    (None: the newest release modelled)."""
    return _table(megatron_flags_file(release))


@functools.cache
def megatron_table_source(release: str | None = None) -> str:
    """Where a release's table comes from (repository and commit, or package version), as its file says."""
    return str(_read_flags_json(megatron_flags_file(release))["source"])


def releases_with_flag(flag: str) -> tuple[str, ...]:
    """The modelled Megatron-core releases whose parser has ``flag`` (oldest first)."""
    return tuple(r for r in MEGATRON_CORE_RELEASES if flag in megatron_flag_table(r))


@functools.cache
def megatron_deepspeed_flag_table() -> dict[str, FlagSpec]:
    """Every Megatron-DeepSpeed option string (with DeepSpeed's ``--deepspeed*`` options) -> its :class:`FlagSpec`."""
    return _table(MEGATRON_DEEPSPEED_FLAGS_FILE)

