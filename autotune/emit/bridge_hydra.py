"""Megatron-Bridge overrides as Hydra-style ``key=value`` arguments, the trailing arguments of Bridge's
scripts/training/run_recipe.py (Hydra's override grammar: null, true/false, numbers, [lists], {mappings}, quoted
strings; a ``_target_`` mapping stays one value, instantiated by Bridge)."""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["bridge_hydra_args"]


def _flatten(tree: Mapping, prefix: str = "") -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for key, value in tree.items():
        if isinstance(value, Mapping) and "_target_" not in value:  # a _target_ mapping: one value, instantiated
            out += _flatten(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


_PLAIN = re.compile(r"[A-Za-z_./-][A-Za-z0-9_./-]*\Z")


def _hydra_value(value: object) -> str:
    """A value in Hydra's override grammar: null, true/false, numbers, [lists], {mappings}, plain or quoted
    strings."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_hydra_value(v)}" for k, v in value.items()) + "}"  # YAML reads it too
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in ("null", "true", "false", "nan", "inf"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def bridge_hydra_args(overrides: Mapping) -> list[str]:
    """The overrides as Hydra-style ``key=value`` arguments (run_recipe.py's trailing arguments)."""
    return [f"{key}={_hydra_value(value)}" for key, value in _flatten(overrides)]
