"""Instances of a frozen, slotted dataclass made without its ``__init__``: copies with a few fields changed
(``copier``) and new ones from every field's value in order (``builder``).

The constructor of a frozen dataclass takes every field by name and stores each through ``object.__setattr__``
(its own ``__setattr__`` refuses); the planner makes ~10^4 plans that differ from one it has in a few fields, and
~10^4 ledgers and step times. A copier or builder stores each field through its slot's descriptor (the
``__set__`` of the class's member descriptor, what ``object.__setattr__`` ends in, bound once), in straight-line
code as ``dataclasses`` writes ``__init__``, on an instance ``object.__new__`` made: an ordinary instance, equal,
hashed, frozen and pickled as one the constructor builds, in a third to a half of the time (keyword matching and
the per-field attribute lookups are what it skips). ``__post_init__`` does not run: the caller checks the values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

__all__ = ["builder", "copier"]


def _setters(cls: type) -> tuple[list[str], dict[str, Callable]]:
    """The field names of ``cls`` in order and {``_set_NAME``: the ``__set__`` of its slot's descriptor}."""
    names = [f.name for f in fields(cls)]
    assert "__slots__" in cls.__dict__, f"{cls.__name__} is not a slotted dataclass"
    return names, {f"_set_{n}": cls.__dict__[n].__set__ for n in names}


def copier(cls: type, changed: tuple[str, ...]) -> Callable:
    """``copy(instance, *values)``: a ``cls`` with the fields ``changed`` (in that order) set to the values and every
    other field the instance's."""
    names, setters = _setters(cls)
    assert set(changed) <= set(names), f"not fields of {cls.__name__}: {set(changed) - set(names)}"
    body = "".join(f"    _set_{n}(new, {n if n in changed else 'src.' + n})\n" for n in names)
    source = f"def copy_{cls.__name__}(src, {', '.join(changed)}):\n    new = _new(_cls)\n{body}    return new\n"
    namespace = {"_new": object.__new__, "_cls": cls, **setters}
    exec(source, namespace)
    return namespace[f"copy_{cls.__name__}"]


def builder(cls: type) -> Callable:
    """``build(*values)``: a ``cls`` with every field set to the value in its place, in the fields' order (all of
    them: a field added to the class makes every call that does not pass it a TypeError, not a shifted value)."""
    names, setters = _setters(cls)
    body = "".join(f"    _set_{n}(new, {n})\n" for n in names)
    source = f"def build_{cls.__name__}({', '.join(names)}):\n    new = _new(_cls)\n{body}    return new\n"
    namespace = {"_new": object.__new__, "_cls": cls, **setters}
    exec(source, namespace)
    return namespace[f"build_{cls.__name__}"]
