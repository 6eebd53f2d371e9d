"""Instances of a frozen, slotted dataclass made without its ``__init__``: copies with a few fields changed
(``copier``) and new ones from every field's value in order (``builder``).

The constructor of a frozen dataclass takes every field by name and stores each through ``object.__setattr__``
(its own ``__setattr__`` refuses); the planner makes ~10^4 plans that differ from one it has in a few fields, and
~10^4 ledgers and step times. A copier or builder fills an instance of a twin class (a plain class with the same
slots and nothing else, so each store is the interpreter's own slot store) in straight-line code, as
``dataclasses`` writes ``__init__``, then makes it an instance of the class itself (``__class__`` assignment, which
Python allows between classes of one layout): an ordinary instance, equal, hashed, frozen and pickled as one the
constructor builds, in a quarter of the time (keyword matching and the per-field ``object.__setattr__`` calls are
what it skips). ``__post_init__`` does not run: the caller checks the values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

__all__ = ["builder", "copier"]


def _twin(cls: type) -> tuple[list[str], type]:
    """The field names of ``cls`` in order, and a plain class of its layout (its slots, an ``object`` base)."""
    names = [f.name for f in fields(cls)]
    slots = cls.__dict__.get("__slots__")
    assert slots is not None and cls.__bases__ == (object,), f"{cls.__name__} is not a slotted dataclass on object"
    return names, type(f"_Unfrozen{cls.__name__}", (), {"__slots__": slots})


def copier(cls: type, changed: tuple[str, ...]) -> Callable:
    """``copy(instance, *values)``: a ``cls`` with the fields ``changed`` (in that order) set to the values and every
    other field the instance's."""
    names, twin = _twin(cls)
    assert set(changed) <= set(names), f"not fields of {cls.__name__}: {set(changed) - set(names)}"
    values = [n if n in changed else f"src.{n}" for n in names]
    return _compile(cls, twin, f"copy_{cls.__name__}", ["src", *changed], names, values)


def builder(cls: type) -> Callable:
    """``build(*values)``: a ``cls`` with every field set to the value in its place, in the fields' order (all of
    them: a field added to the class makes every call that does not pass it a TypeError, not a shifted value)."""
    names, twin = _twin(cls)
    return _compile(cls, twin, f"build_{cls.__name__}", names, names, names)


def _compile(cls: type, twin: type, name: str, params: list[str], names: list[str], values: list[str]) -> Callable:
    """A function ``name(*params)`` that fills a ``twin`` instance's fields ``names`` with the expressions
    ``values`` in straight-line code and makes it a ``cls`` (module docstring)."""
    body = "".join(f"    new.{n} = {v}\n" for n, v in zip(names, values, strict=True))
    source = (f"def {name}({', '.join(params)}):\n    new = _new(_twin)\n{body}"
              f"    new.__class__ = _cls\n    return new\n")
    namespace = {"_new": object.__new__, "_twin": twin, "_cls": cls}
    exec(source, namespace)
    return namespace[name]
