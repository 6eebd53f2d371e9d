"""DeepSpeed's CPU all-reduce segments in /dev/shm: removed once no process maps them, kept while one does."""

from __future__ import annotations

import mmap
import os
import time

import pytest

from autotune.tune import shm_leftovers

pytestmark = pytest.mark.skipif(not shm_leftovers.SHM_DIR.is_dir(), reason="no /dev/shm on this system")


def _segment(tag: str, age_s: float):
    path = shm_leftovers.SHM_DIR / f"{shm_leftovers.PREFIX}{os.getuid()}_127.0.0.1_{os.getpid()}{tag}_0"
    path.write_bytes(b"\0" * mmap.PAGESIZE)
    old = time.time() - age_s
    os.utime(path, (old, old))
    return path


def test_an_unmapped_old_segment_is_removed_and_its_bytes_counted():
    path = _segment("a", age_s=60)
    try:
        assert path in shm_leftovers.leftover_segments()
        assert shm_leftovers.remove_leftovers() >= mmap.PAGESIZE
        assert not path.exists()
    finally:
        path.unlink(missing_ok=True)


def test_a_segment_a_live_process_maps_is_kept_until_it_is_unmapped():
    path = _segment("b", age_s=60)
    try:
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), mmap.PAGESIZE) as m:
            m[0] = 1
            assert path not in shm_leftovers.leftover_segments()
            shm_leftovers.remove_leftovers()
            assert path.exists()
        later = time.time() + shm_leftovers.GRACE_S + 1  # the write through the mapping made it fresh
        assert path in shm_leftovers.leftover_segments(now=later)
    finally:
        path.unlink(missing_ok=True)


def test_a_fresh_segment_is_kept_for_the_grace_period():
    path = _segment("c", age_s=0)
    try:
        assert path not in shm_leftovers.leftover_segments()
        later = time.time() + shm_leftovers.GRACE_S + 1
        assert path in shm_leftovers.leftover_segments(now=later)
    finally:
        path.unlink(missing_ok=True)


def test_other_files_in_dev_shm_are_never_touched(tmp_path):
    other = tmp_path / "PostgreSQL.123"
    other.write_bytes(b"x")
    os.utime(other, (0, 0))
    foreign = tmp_path / f"{shm_leftovers.PREFIX}{os.getuid() + 1}_127.0.0.1_1_0"  # another user's
    foreign.write_bytes(b"x")
    os.utime(foreign, (0, 0))
    assert shm_leftovers.leftover_segments(tmp_path) == []
    assert shm_leftovers.remove_leftovers(tmp_path) == 0
    assert other.exists() and foreign.exists()


def test_a_fresh_segment_is_kept_unless_its_trial_has_ended():
    """Inside the grace period a segment may be a starting rank's; a trial that has ended names its master port, and
    its own segments go at any age (a quick trial ends within the grace period)."""
    port = 40000 + os.getpid() % 20000
    path = shm_leftovers.SHM_DIR / f"{shm_leftovers.PREFIX}{os.getuid()}_127.0.0.1_{port}_0"
    path.write_bytes(b"\0" * mmap.PAGESIZE)
    try:
        assert path not in shm_leftovers.leftover_segments()
        assert path not in shm_leftovers.leftover_segments(ports=frozenset({port + 1}))
        assert shm_leftovers.remove_leftovers(ports=frozenset({port})) >= mmap.PAGESIZE
        assert not path.exists()
    finally:
        path.unlink(missing_ok=True)
