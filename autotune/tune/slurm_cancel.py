"""Cancels a trial's SLURM job or step until SLURM says it took.

``python -m autotune.tune.slurm_cancel job JOBID``, ``... step NAME [ALLOCATION]`` or ``... named NAME`` (every job
of that name: the tuner's own last word on a trial it stopped, for a job whose id its supervisor never learned).

:mod:`autotune.tune.slurm_step` starts this in a session of its own the moment the trial is stopped (the
tuner's Ctrl-C, its timeout, ``--resume``). A single ``scancel`` was not enough on a loaded machine:
- the tuner SIGKILLs the trial's process group a few seconds after its SIGTERM, and the supervisor may not
  have reached its ``scancel`` by then (it can be inside a 10 s ``scontrol`` poll);
- a busy ``slurmctld`` can drop the request (``scancel`` exits non-zero with a socket time-out).
So this repeats ``scancel`` until ``scontrol`` lists the job as ended or completing (or no longer knows
it), for at most :data:`RETRY_S` seconds. A step is found by its unique name with ``squeue --steps``.
"""

from __future__ import annotations

import subprocess
import sys
import time

__all__ = ["main", "RETRY_S"]

RETRY_S = 300.0
PAUSE_S = 1.0
CALL_TIMEOUT_S = 30
STEP_WATCH_S = 10.0
"""A step is watched at least this long: srun may still be registering it when the trial is stopped."""
DONE_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
               "BOOT_FAIL", "DEADLINE", "COMPLETING"}
"""scontrol's JobState values after which no rank of the job runs any more (COMPLETING: the epilog)."""


def _run(argv: list[str]) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=CALL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None


def job_done(job_id: str) -> bool:
    """True once SLURM lists the job as ended or completing, or no longer knows it; False while it runs or
    while slurmctld does not answer."""
    done = _run(["scontrol", "--oneliner", "show", "job", job_id])
    if done is None:
        return False
    if done.returncode != 0:
        return "invalid job id" in (done.stderr or "").lower()  # purged after MinJobAge
    fields = dict(kv.split("=", 1) for kv in done.stdout.split() if "=" in kv)
    return fields.get("JobState") in DONE_STATES


def step_ids(name: str, allocation: str | None) -> list[str] | None:
    """The ids of the steps named ``name`` (None when squeue does not answer)."""
    argv = ["squeue", "--noheader", "--steps", "--format=%i %j"] + ([f"--jobs={allocation}"] if allocation else [])
    done = _run(argv)
    if done is None or done.returncode != 0:
        return None
    return [row[0] for row in (line.split() for line in done.stdout.splitlines()) if len(row) >= 2 and row[1] == name]


def job_ids(name: str) -> list[str] | None:
    """The ids of the jobs named ``name`` (None when squeue does not answer)."""
    done = _run(["squeue", "--noheader", "--format=%i %j", f"--name={name}"])
    if done is None or done.returncode != 0:
        return None
    return [row[0] for row in (line.split() for line in done.stdout.splitlines()) if len(row) >= 2 and row[1] == name]


def cancel_named(name: str, deadline: float) -> bool:
    """Cancel every job named ``name`` until none runs; watched at least STEP_WATCH_S (an ``sbatch`` killed with
    its supervisor may have been accepted a moment later)."""
    watch_until = time.monotonic() + STEP_WATCH_S
    while time.monotonic() < deadline:
        ids = job_ids(name)
        live = [job_id for job_id in ids or [] if not job_done(job_id)]
        if ids is not None and not live and time.monotonic() >= watch_until:
            return True
        for job_id in live:
            _run(["scancel", job_id])
        time.sleep(PAUSE_S)
    return False


def cancel_job(job_id: str, deadline: float) -> bool:
    while time.monotonic() < deadline:
        _run(["scancel", job_id])
        if job_done(job_id):
            return True
        time.sleep(PAUSE_S)
    return False


def cancel_step(name: str, allocation: str | None, deadline: float) -> bool:
    watch_until = time.monotonic() + STEP_WATCH_S
    while time.monotonic() < deadline:
        ids = step_ids(name, allocation)
        if ids == [] and time.monotonic() >= watch_until:  # none left, and none was still being created
            return True
        for step_id in ids or []:
            _run(["scancel", step_id])
        time.sleep(PAUSE_S)
    return False


def main(argv: list[str]) -> int:
    deadline = time.monotonic() + RETRY_S
    if len(argv) == 2 and argv[0] == "job":
        return 0 if cancel_job(argv[1], deadline) else 1
    if len(argv) in (2, 3) and argv[0] == "step":
        return 0 if cancel_step(argv[1], argv[2] if len(argv) == 3 else None, deadline) else 1
    if len(argv) == 2 and argv[0] == "named":
        return 0 if cancel_named(argv[1], deadline) else 1
    print("usage: python -m autotune.tune.slurm_cancel job JOBID | step NAME [ALLOCATION] | named NAME",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
