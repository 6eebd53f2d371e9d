"""Removing the shared-memory segments DeepSpeed's CPU all-reduce leaves behind.

DeepSpeed's ``shm_comm`` op (ops/csrc/cpu/comm/shm.cpp, ``shm_initialize``) creates one POSIX shared-memory
segment per rank, ``/dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>`` (about 66 MiB each in
DeepSpeed 0.19), and never unlinks it when the process ends (``shared_close`` is not called at exit). On a
CPU trial machine each DeepSpeed trial therefore leaves world_size x 66 MiB in ``/dev/shm``, which is RAM:
a few hundred trials fill it and the next trial, or anything else on the machine, is killed for memory.

:func:`remove_leftovers` unlinks the segments that are no longer mapped by any live process and are older
than a short grace period (a rank of a trial still starting may not have mapped its own yet). A segment that
some process still maps (a trial running beside this one) is left alone.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "deepspeed_allreduce_buffer_"
GRACE_S = 5.0
"""A segment younger than this may belong to a rank that has created it and not yet mapped it."""


def _mapped_paths(prefix: str) -> set[str]:
    """Paths under /dev/shm starting with ``prefix`` that some live process maps."""
    mapped: set[str] = set()
    with contextlib.suppress(OSError):
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                at = line.find(str(SHM_DIR / prefix))
                if at >= 0:
                    mapped.add(line[at:].split(" (deleted)")[0].strip())
    return mapped


def _port(name: str) -> int | None:
    """The master port in a segment's name (``..._<addr>_<port>_<rank>``)."""
    parts = name.rsplit("_", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def leftover_segments(shm_dir: Path = SHM_DIR, now: float | None = None, ports: frozenset[int] = frozenset()
                      ) -> list[Path]:
    """DeepSpeed all-reduce segments of this user that no live process maps, older than :data:`GRACE_S`, or of any
    age where their master port is one of ``ports`` (a trial that has ended: none of its ranks is still starting)."""
    own = f"{PREFIX}{os.getuid()}_"
    try:
        names = [n for n in os.listdir(shm_dir) if n.startswith(own)]
    except OSError:  # no /dev/shm (not Linux): nothing DeepSpeed could have left
        return []
    if not names:
        return []
    now = time.time() if now is None else now
    mapped = _mapped_paths(own)
    found = []
    for name in names:
        path = shm_dir / name
        with contextlib.suppress(OSError):
            if str(path) not in mapped and (_port(name) in ports or now - path.stat().st_mtime > GRACE_S):
                found.append(path)
    return sorted(found)


def remove_leftovers(shm_dir: Path = SHM_DIR, ports: frozenset[int] = frozenset()) -> int:
    """Unlink :func:`leftover_segments`; returns the bytes freed."""
    freed = 0
    for path in leftover_segments(shm_dir, ports=ports):
        with contextlib.suppress(OSError):
            size = path.stat().st_size
            path.unlink()
            freed += size
    return freed
