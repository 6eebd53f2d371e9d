"""Reading a trial's log: new lines as they come, the phase the trial is in, and why it failed.

A trial's log holds the launcher's and every rank's stdout and stderr. torch 2.13's ranks prefix
their uncaught tracebacks with ``[rankN]:``; torchrun itself, when a rank fails, prints its own
traceback ending in ``ChildFailedError`` and a banner whose "Root Cause" names the failing rank
(both seen in a 2-rank gloo run of a script failing an assert on rank 1). :func:`first_error`
digs the failing rank's exception (type and message) out of that, not torchrun's banner.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LogReader", "tail", "first_error", "FailureInfo", "Phase", "PHASE_PREFIX"]

TAIL_LINES = 20
PHASE_PREFIX = "PHASE "
"""The built-in trainer (:mod:`autotune.train`) prints ``PHASE <words>`` when it enters a phase
(e.g. ``PHASE initialising the engine``)."""

_RANK_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:\s?")
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|Failure)|AssertionError|"
                       r"[A-Za-z_][\w.]*Error)(?::\s*(.*))?$")
_QUALIFIED = re.compile(r"^[A-Za-z_][\w.]*(?::\s|:$)")
_ROOT_CAUSE_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_ROOT_CAUSE_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_LAUNCHER_EXC = ("ChildFailedError", "SignalException")
_BUILD_RE = re.compile(r"Building extension module (\S+?)\.{0,3}$|Emitting ninja build file .*/([\w.-]+)/build\.ninja")
_ENGINE_RE = re.compile(r"DeepSpeed info: version=|\[deepspeed\].*initializ", re.IGNORECASE)


class LogReader:
    """Reads the lines a job has appended to its log so far (a partial last line waits)."""

    def __init__(self, path: Path, start: int = 0) -> None:
        """``start``: the byte offset to read from (the tuner's own header line before it is not the job's)."""
        self.f = open(path, "rb")
        self.f.seek(start)
        self.buf = b""

    def new_lines(self) -> list[str]:
        data = self.f.read()
        if not data:
            return []
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        return [ln.decode("utf-8", "replace").rstrip("\r") for ln in lines]

    def rest(self) -> list[str]:
        lines = self.new_lines()
        if self.buf:
            lines.append(self.buf.decode("utf-8", "replace"))
            self.buf = b""
        return lines

    def close(self) -> None:
        self.f.close()


def tail(path: Path, n: int = TAIL_LINES) -> str:
    """The last ``n`` non-empty lines of the log."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    lines = [ln for ln in lines if ln.strip()]
    return "\n".join(lines[-n:])


@dataclass(frozen=True, slots=True)
class FailureInfo:
    line: str
    """``ExceptionType: message`` of the failing rank (or the best line the log has)."""
    rank: int | None = None
    exitcode: int | None = None
    """The failing rank's exit code as the launcher reported it."""

    def describe(self) -> str:
        where = f"rank {self.rank}" if self.rank is not None else ""
        if self.exitcode is not None:
            where += (", " if where else "") + f"exit code {self.exitcode}"
        return f"{self.line} ({where})" if where else self.line


def _tracebacks(lines: list[str]) -> list[tuple[int | None, str]]:
    """(rank or None, exception line) of every Python traceback in the log, in order."""
    out: list[tuple[int | None, str]] = []
    inside: dict[int | None, bool] = {}
    for raw in lines:
        m = _RANK_PREFIX.match(raw)
        rank = int(m.group(1)) if m else None
        line = raw[m.end():] if m else raw
        if line.startswith("Traceback (most recent call last)"):
            inside[rank] = True
            continue
        if not inside.get(rank):
            continue
        if not line.strip() or line.startswith((" ", "\t")):
            continue  # a frame, its source line, or the ^^^ markers
        if line.startswith(("During handling of the above exception", "The above exception was the direct cause")):
            continue
        if not (_EXC_LINE.match(line.strip()) or _QUALIFIED.match(line)):
            continue  # another process's line interleaved into the traceback
        inside[rank] = False
        out.append((rank, line.strip()))
    return out


def _root_cause(lines: list[str]) -> tuple[int | None, int | None]:
    """torchrun's banner: (rank, exit code) of the "Root Cause (first observed failure)"."""
    for i, line in enumerate(lines):
        if line.startswith("Root Cause (first observed failure)"):
            rank = exitcode = None
            for nxt in lines[i + 1:i + 10]:
                if (m := _ROOT_CAUSE_RANK.match(nxt)) and rank is None:
                    rank = int(m.group(1))
                if (m := _ROOT_CAUSE_EXIT.match(nxt)) and exitcode is None:
                    exitcode = int(m.group(1))
            return rank, exitcode
    return None, None


def first_error(path: Path) -> FailureInfo:
    """The first real error of the failing rank: its exception line, not the launcher's banner."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return FailureInfo(line="")
    rank, exitcode = _root_cause(lines)
    for ln in lines:  # autotune.train's word for a plan its engine's trainer does not run
        body = _RANK_PREFIX.sub("", ln)
        if body.startswith("UNSUPPORTED "):
            return FailureInfo(line=f"not supported by the built-in trainer: {body[len('UNSUPPORTED '):].strip()}",
                               rank=rank, exitcode=exitcode)
    found = [(r, e) for r, e in _tracebacks(lines) if not any(x in e for x in _LAUNCHER_EXC)]
    pick = next(((r, e) for r, e in found if rank is not None and r == rank), None) or (found[0] if found else None)
    if pick is not None:
        return FailureInfo(line=pick[1], rank=pick[0] if pick[0] is not None else rank, exitcode=exitcode)
    # No traceback: an error-looking line (e.g. "error: unrecognized arguments", a signal), else the last line.
    plain = [_RANK_PREFIX.sub("", ln).strip() for ln in lines if ln.strip() and not ln.startswith("# autotune trial")]
    for ln in plain:
        if _EXC_LINE.match(ln) or re.search(r"\berror:|\bError\b|Signal \d+ \(SIG", ln):
            if not ln.startswith(("File ", "Traceback")) and not any(x in ln for x in _LAUNCHER_EXC):
                return FailureInfo(line=ln, rank=rank, exitcode=exitcode)
    return FailureInfo(line=plain[-1] if plain else "", rank=rank, exitcode=exitcode)


class Phase:
    """The phase of a running trial, from its log lines: launching, building ops, initialising, step k/N."""

    def __init__(self, total_steps: int) -> None:
        self.total = total_steps
        self.text = "launching"
        self.steps: list[float] = []

    def feed(self, line: str) -> bool:
        """Update from one log line; True when the phase text changed."""
        old = self.text
        body = _RANK_PREFIX.sub("", line)
        if body.startswith(PHASE_PREFIX):
            self.text = body[len(PHASE_PREFIX):].strip() or self.text
        elif m := _BUILD_RE.search(body):
            self.text = f"building op {m.group(1) or m.group(2)}"
        elif _ENGINE_RE.search(body) and not self.steps:
            self.text = "initialising the engine"
        return self.text != old

    def step(self, seconds: float) -> None:
        self.steps.append(seconds)
        last = ", ".join(f"{t:.2f}" for t in self.steps[-3:])
        self.text = f"step {len(self.steps)}/{self.total} ({last} s)"
