"""User-facing errors: every problem at once, each with the way out.

The CLI turns an :class:`InputError` into a message on stderr and exit code 2; library
callers catch it as a ``ValueError``. Internal invariants use ``assert`` instead.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

__all__ = ["InputError", "suggest_names", "require_no_problems"]


class InputError(ValueError):
    """Bad user input. ``problems`` lists every violated rule, each naming the fix."""

    def __init__(self, problems: Sequence[str], *, subject: str = "input") -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        self.subject = subject
        assert self.problems, "InputError needs at least one problem"
        super().__init__(self.render())

    def render(self) -> str:
        if len(self.problems) == 1:
            return f"invalid {self.subject}: {self.problems[0]}"
        lines = [f"invalid {self.subject} ({len(self.problems)} problems):"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


def require_no_problems(problems: Iterable[str], *, subject: str) -> None:
    """Raise :class:`InputError` naming every problem, if there are any."""
    found = list(problems)
    if found:
        raise InputError(found, subject=subject)


def suggest_names(name: str, known: Iterable[str], limit: int = 3) -> str:
    """A 'did you mean' phrase with the nearest known names (empty when none is close)."""
    known = sorted(known)
    close = difflib.get_close_matches(name.lower(), known, n=limit, cutoff=0.5)
    if not close:
        close = [k for k in known if name.lower().split("-")[0] in k][:limit]
    return f" (did you mean {', '.join(close)}?)" if close else ""
