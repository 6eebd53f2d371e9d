"""A problem found in a config file: where, how bad, and the fix; and what a file says of its job's sizes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Problem", "Severity", "problem_at", "JobSizes"]

Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    path: str
    """JSON path (``$.zero_optimization.stage``) or flag (``--async-save``) the problem is at."""
    severity: Severity
    message: str
    fix: str
    line: int | None = None
    """1-based line in the file, when known."""
    source: str = "autotune"
    """Which check found it: 'schema', 'deepspeed' (DeepSpeed's own parser), 'rules', 'megatron'."""

    def render(self) -> str:
        where = f"{self.path}" + (f" (line {self.line})" if self.line else "")
        return f"{self.severity}: {where}: {self.message} — fix: {self.fix}"

    def to_dict(self) -> dict:
        return {"path": self.path, "severity": self.severity, "message": self.message, "fix": self.fix,
                "line": self.line, "source": self.source}


def problem_at(parts: tuple[str, ...], lines: dict, *, message: str, fix: str,
               severity: Severity = "error", source: str = "rules") -> Problem:
    """A problem at the key ``parts`` of a parsed file, with the line of the nearest enclosing key that has one
    (``lines`` maps key tuples to 1-based lines, as the accelerate and torchtitan readers return them)."""
    where = parts
    while where and where not in lines:
        where = where[:-1]
    return Problem(path="$." + ".".join(parts) if parts else "$", severity=severity, message=message, fix=fix,
                   line=lines.get(where), source=source)


@dataclass(frozen=True, slots=True)
class JobSizes:
    """What a file says about the job it belongs to (None: it does not say)."""

    world_size: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
