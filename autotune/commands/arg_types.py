"""The types of the subcommands' flag values and the parser that reads its help lazily.

``positive_int`` / ``int_list`` / ``str_list`` parse a flag's text; :class:`HelpParser` and :class:`LazyChoices` keep
the presets and large choice lists out of start-up (they are read when the help is shown or a value is checked);
``json_text`` writes what ``--json`` prints.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

__all__ = ["positive_int", "json_text", "HelpParser", "LazyChoices", "preset_epilog", "int_list", "str_list"]


def positive_int(text: str) -> int:
    """An integer; its range is checked with every other problem (see :func:`flag_problems`)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text[:40]!r}") from None


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def json_text(doc: Any) -> str:
    """Standard JSON (RFC 8259): a NaN or infinite number (an unbounded time) is written as null."""
    return json.dumps(_finite(doc), indent=2, allow_nan=False)


class _PresetEpilog(str):
    """Stands for the preset list in a parser's epilog until its help is shown (reading the presets' YAML
    costs a tenth of a second that a command which prints no help does not need)."""


class HelpParser(argparse.ArgumentParser):
    """An ArgumentParser that reads what its help lists (the presets, choices given as :class:`LazyChoices`)
    only when it formats the help."""

    def format_help(self) -> str:
        if isinstance(self.epilog, _PresetEpilog):
            self.epilog = _preset_list()
        return super().format_help()


class LazyChoices:
    """A flag's choices imported from ``module.name`` on first use (a check or the help), not at start-up."""

    def attach(self, action: argparse.Action) -> argparse.Action:
        """Make these the choices (and the help's metavar) of a flag already added: argparse formats the choices
        of a flag as it is added, which would import them at start-up."""
        action.choices = action.metavar = self
        return action

    def __init__(self, module: str, name: str) -> None:
        self._where = (module, name)
        self._values: tuple | None = None

    def _get(self) -> tuple:
        if self._values is None:
            import importlib

            module, name = self._where
            self._values = tuple(getattr(importlib.import_module(module), name))
        return self._values

    def __contains__(self, value: object) -> bool:
        return value in self._get()

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __getitem__(self, index):
        return self._get()[index]

    def __str__(self) -> str:
        """What the help shows for the flag's value, ``{a,b,c}`` as argparse writes choices (see :meth:`attach`)."""
        return "{" + ",".join(str(v) for v in self._get()) + "}"


def _preset_list() -> str:
    try:
        from autotune.specs.presets import gpu_preset_names, model_preset_names

        return ("model presets: " + ", ".join(model_preset_names()) + "\n\ngpu presets: "
                + ", ".join(gpu_preset_names()))
    except Exception:  # presets unreadable: --help must still work
        return ""


def preset_epilog() -> str:
    """The epilog listing the model and GPU presets; read when the help is shown (see :class:`HelpParser`)."""
    return _PresetEpilog()


def int_list(choices):
    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(v) for v in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        bad = [v for v in values if v not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad} not among {list(choices)}")
        return values
    return parse


def str_list(choices):
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(v.strip() for v in text.split(",") if v.strip())
        bad = [v for v in values if v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(choices)} (comma-separated)")
        return values
    return parse
