"""`autotune emit`'s output folder: whether ``--out`` may be replaced, and the temporary folders an interrupted
emit left beside it (:func:`autotune.bundle.writer.write_bundle` writes into ``.NAME.tmp-*`` and swaps it in,
setting a replaced folder aside as ``.NAME.old-*``)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

__all__ = ["out_problems", "clean_leftovers", "report_leftovers"]

_LEFTOVER_AGE_S = 60.0  # younger temporary folders may belong to an emit still running


def out_problems(out: str) -> list[str]:
    """Why ``--out`` cannot be the job folder (before anything is written)."""
    from autotune.inputs import path_problem

    problem = path_problem(out, flag="--out")
    if problem:
        return [problem]
    path = Path(out)
    if not path.name or path.name in (".", ".."):
        return [f"--out {out!r}: name a new folder (e.g. job/), not . or .."]
    if path.is_symlink() and not path.exists():
        return [f"--out {out!r} is a symbolic link to {os.readlink(path)!r}, which does not exist: remove the link "
                "or give another folder"]
    try:
        target, here = path.resolve(), Path.cwd().resolve()
    except (OSError, RuntimeError) as err:
        return [f"--out {out!r}: {getattr(err, 'strerror', None) or err}"]
    if target == here or target in here.parents:
        return [f"--out {out!r} is the current folder or one above it: it cannot be replaced; give a new folder"]
    return []


def clean_leftovers(out: str) -> list[str]:
    """Remove the temporary folders an interrupted emit left beside ``out``; lines saying what was done.

    ``.NAME.tmp-*`` holds only files emit wrote: removed once a minute old. ``.NAME.old-*`` is an aside copy of
    a replaced folder (``emit --force``), which may hold the user's own files: never removed, only named,
    with the way to put it back when ``out`` is missing.
    """
    path = Path(out)
    parent = path.parent if str(path.parent) else Path(".")
    notes = []
    try:
        found = [p for pattern in (f".{path.name}.tmp-*", f".{path.name}.old-*") for p in parent.glob(pattern)]
    except OSError:
        return notes
    for leftover in sorted(found):
        try:
            if not leftover.is_dir() or leftover.is_symlink():
                continue
            if leftover.name.startswith(f".{path.name}.old-"):
                inside = leftover / path.name
                back = (f"; {out} itself is missing: `mv {inside} {out}` puts it back"
                        if inside.is_dir() and not os.path.lexists(path) else "")
                notes.append(f"kept {inside if inside.is_dir() else leftover}: an earlier `emit --force` set the "
                             f"previous {path.name} aside there (or, if it stopped before the swap, the files it was "
                             f"writing){back}; emit never deletes it: take what you need, then remove {leftover}")
                continue
            if time.time() - leftover.stat().st_mtime < _LEFTOVER_AGE_S:
                notes.append(f"{leftover}: a temporary folder of another emit (under a minute old), left alone")
                continue
            shutil.rmtree(leftover)
            notes.append(f"removed {leftover}, left by an interrupted emit")
        except OSError as err:
            notes.append(f"{leftover}: left by an interrupted emit; cannot remove it ({err.strerror})")
    return notes


def report_leftovers(out: str) -> None:
    for note in clean_leftovers(out):
        print(f"autotune emit: {note}", file=sys.stderr)
