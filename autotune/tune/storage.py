"""The study's storage: opening it (several processes at once), and what a killed tuner left in it.

Opening: SQLAlchemy 2.1 maps ``postgresql://`` to psycopg 3; this project installs psycopg2, so a
plain ``postgresql://`` URL is rewritten to ``postgresql+psycopg2://`` when psycopg 3 is absent.
Several processes creating one new study at once race on creating Optuna's tables (SQLite:
``UNIQUE constraint failed: alembic_version.version_num``; PostgreSQL: a duplicate key): for an
SQLite file an exclusive ``flock`` on ``<db>.lock`` serialises the creation; for every URL the
loser of a race retries.

A tuner killed with SIGKILL leaves its trial RUNNING in the study and the trial's processes
running (they run in their own session). :func:`fail_stale_trials` ends those processes first (from
the launch record the trial stored: host, pgid, pid, start time; checked by start time, see
:func:`autotune.tune.launch.end_recorded`), then marks the trials FAIL "interrupted".
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import importlib.util
import json
import os
import socket
import re
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import psutil
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import InputError
from autotune.tune.launch import end_recorded
from autotune.tune.trialspec import LAUNCH_NAME

__all__ = ["driver_url", "open_storage", "open_study", "fail_stale_trials", "mark_interrupted", "LAUNCH_ATTR"]

LAUNCH_ATTR = "launch"
"""User attribute of a running trial: its launch record (host, pid, pgid, start_time)."""
_RACE = ("duplicate key", "already exists", "UniqueViolation", "UNIQUE constraint failed", "IntegrityError",
         "database is locked")


def driver_url(url: str) -> str:
    """``postgresql://`` -> ``postgresql+psycopg2://`` when only psycopg2 is installed (SQLAlchemy 2.1's
    default PostgreSQL driver is psycopg 3)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix) and importlib.util.find_spec("psycopg") is None \
                and importlib.util.find_spec("psycopg2") is not None:
            return "postgresql+psycopg2://" + url[len(prefix):]
    return url


def _sqlite_path(url: str) -> Path | None:
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return Path(url[len("sqlite:///"):])
    return None


@contextlib.contextmanager
def _creation_lock(url: str) -> Iterator[None]:
    """For an SQLite file: an exclusive flock beside it while the tables and the study are created."""
    path = _sqlite_path(url)
    if path is None or not path.parent.is_dir():
        yield
        return
    with open(f"{path}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _raced(err: Exception) -> bool:
    text = f"{type(err).__name__}: {err}"
    return any(r in text for r in _RACE)


def _open(url: str) -> optuna.storages.BaseStorage:
    if url.startswith("sqlite"):
        return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
    if "://" in url and not url.startswith(("http", "grpc")):
        return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
    return optuna.storages.get_storage(url)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def shown_url(url: str) -> str:
    """``url`` with its password, if any, replaced by *** (an error message or log is not the place for it)."""
    return re.sub(r"^([A-Za-z0-9+.-]+://[^:/@]+):[^@/]*@", r"\1:***@", url)


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An Optuna storage for ``url``; InputError with a clear message when it cannot be opened."""
    url = driver_url(url)
    for attempt in range(8):
        try:
            with _creation_lock(url):
                return _open(url)
        except Exception as err:  # SQLAlchemy OperationalError, ArgumentError, ImportError of the driver
            if attempt < 7 and _raced(err):
                time.sleep(0.2 + 0.3 * attempt)
                continue
            hint = ("; check the URL (sqlite:///PATH/study.db or postgresql://USER@HOST/DB) and that its server "
                    "runs, or leave --storage out for OUT/study.db")
            if "Failed to import DB access module" in str(err) or isinstance(err, ImportError):
                hint = " (install its driver: pip install psycopg2-binary for PostgreSQL)"
            raise InputError([f"cannot open the storage {shown_url(url)!r}: "
                              f"{_first_line(err).replace(url, shown_url(url))}{hint}"],
                             subject="storage") from None
    raise AssertionError("unreachable")


def open_study(storage, url: str, name: str, *, sampler, pruner, must_be_new: bool) -> optuna.Study:
    """Create the study, or load it; InputError when ``must_be_new`` and it exists."""
    url = driver_url(url)
    for attempt in range(8):
        try:
            with _creation_lock(url):
                exists = any(s.study_name == name for s in optuna.study.get_all_study_summaries(storage))
                if exists and must_be_new:
                    raise InputError([f"study {name!r} already exists in {shown_url(url)}: pass --resume to continue it, "
                                      "--worker to join it, or another --study-name"], subject="storage")
                return optuna.create_study(storage=storage, study_name=name, direction="maximize", sampler=sampler,
                                           pruner=pruner, load_if_exists=True)
        except InputError:
            raise
        except Exception as err:
            if attempt < 7 and _raced(err):
                time.sleep(0.2 + 0.3 * attempt)
                continue
            raise InputError([f"cannot create or load study {name!r} in {shown_url(url)}: "
                              f"{_first_line(err).replace(url, shown_url(url))}"],
                             subject="storage") from None
    raise AssertionError("unreachable")


def mark_interrupted(study: optuna.Study, t: FrozenTrial, reason: str) -> None:
    storage, tid = study._storage, t._trial_id
    try:
        storage.set_trial_user_attr(tid, "status", "interrupted")
        storage.set_trial_user_attr(tid, "reason", reason)
        storage.set_trial_state_values(tid, TrialState.FAIL)
    except (RuntimeError, ValueError):
        pass  # finished meanwhile (another worker got there first)


def _launch_record(t: FrozenTrial, out_dir: Path | None) -> dict | None:
    record = t.user_attrs.get(LAUNCH_ATTR)
    if isinstance(record, dict):
        return record
    if out_dir is not None:  # killed between the launch and storing its record: the trial folder has it
        with contextlib.suppress(OSError, ValueError):
            return json.loads((out_dir / "trials" / f"{t.number:04d}" / LAUNCH_NAME).read_text())
    return None


CLAIM_GRACE_S = 300.0
"""A RUNNING trial of this host with no tuner pid is stale only once older than this (a worker may be claiming it)."""


def fail_stale_trials(study: optuna.Study, *, all_running: bool, out_dir: str | Path | None = None) -> list[int]:
    """End the processes of trials left RUNNING by a dead tuner, then mark the trials FAIL 'interrupted'.

    ``all_running`` (``--resume``): every RUNNING trial is stale; otherwise (``--worker``) only those
    whose tuner process on this host is gone. Returns the trial numbers marked.
    """
    host = socket.gethostname()
    out = Path(out_dir) if out_dir is not None else None
    marked = []
    now = datetime.datetime.now()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid = t.user_attrs.get("pid")
        # No pid yet: a trial another worker is claiming this instant (its attributes are written one by one),
        # unless it is older than any claim takes: then its tuner died before writing it.
        unclaimed_long = pid is None and t.datetime_start is not None and \
            (now - t.datetime_start).total_seconds() > CLAIM_GRACE_S
        dead_here = t.user_attrs.get("host") == host and (unclaimed_long or (pid is not None and (
            not psutil.pid_exists(pid) or pid == os.getpid())))
        if not (all_running or dead_here):
            continue
        ended = []
        record = _launch_record(t, out)
        if record is not None:
            ended = end_recorded(record)
        reason = "interrupted: the tuner stopped while the trial ran (resumed later)"
        if ended:
            reason += f"; its processes {ended} were still running and were ended"
        mark_interrupted(study, t, reason)
        marked.append(t.number)
    return marked
