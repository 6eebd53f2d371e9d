"""Copies of a frozen, slotted dataclass with a few fields changed, without its ``__init__``.

The constructor of a frozen dataclass takes every field by name and stores each through ``object.__setattr__``
(its own ``__setattr__`` refuses); the planner makes ~10^4 plans that differ from one it has in a few fields. A
copier fills an instance of a twin class (the same slots, none of its own, plain attribute stores) in
straight-line code, as ``dataclasses`` writes ``__init__``, then makes it an instance of the class itself
(``__class__`` assignment, which Python allows between classes of one layout): an ordinary instance, equal, hashed,
frozen and pickled as one the constructor builds, in a third of the time. ``__post_init__`` does not run: the
caller checks the changed values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

__all__ = ["copier"]


def copier(cls: type, changed: tuple[str, ...]) -> Callable:
    """``copy(instance, *values)``: a ``cls`` with the fields ``changed`` (in that order) set to the values and every
    other field the instance's."""
    names = [f.name for f in fields(cls)]
    assert set(changed) <= set(names), f"not fields of {cls.__name__}: {set(changed) - set(names)}"
    twin = type(f"_Unfrozen{cls.__name__}", (cls,), {"__slots__": (), "__setattr__": object.__setattr__})
    body = "".join(f"    new.{n} = {n}\n" if n in changed else f"    new.{n} = src.{n}\n" for n in names)
    source = (f"def copy_{cls.__name__}(src, {', '.join(changed)}):\n    new = _new(_twin)\n{body}"
              f"    new.__class__ = _cls\n    return new\n")
    namespace = {"_new": object.__new__, "_twin": twin, "_cls": cls}
    exec(source, namespace)
    return namespace[f"copy_{cls.__name__}"]
