"""Runs one trial under SLURM and watches it: ``python -m autotune.tune.slurm_step PARAMS_JSON -- PROGRAM...``.

The trial's runner starts this module as the trial's process (:class:`autotune.tune.launchers.Slurm`
builds the call). It starts the ranks as one SLURM step:

- inside an allocation (``mode`` "step"): ``srun --nodes N --ntasks T --ntasks-per-node P
  --kill-on-bad-exit=1 --time M --output DIR/rank-%t.log ...``;
- outside any (``mode`` "job"): ``sbatch --parsable`` of a batch job running that ``srun``, then
  ``scontrol show job`` every second until it ends (job output in ``DIR/job.log``; the trial folder must
  be on a filesystem the nodes share).

Each task is one rank: a one-line shell maps SLURM's task variables to what torch.distributed reads
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR = the step's first node, MASTER_PORT)
and execs the program. While the step runs, the tasks' own log files (SLURM writes them, ``%t`` is the
task id) are copied line by line to stdout, i.e. into the trial's ``trial.log``, where the runner
reads step times and errors as it does under torchrun. srun's per-task exit messages
(``srun: error: NODE: task 1: Exited with exit code 1``) and slurmstepd's ``*** STEP ... CANCELLED AT
... [DUE TO TIME LIMIT] ***`` give each task's state and how the step ended; both go to
``DIR/slurm.json`` (read by :meth:`autotune.tune.launchers.Slurm.review`).

SIGTERM / SIGINT / SIGHUP (the runner stopping the trial, Ctrl-C, ``--resume`` ending a dead tuner's
trial): the step (``scancel JOB.STEP``, found by its unique name with ``squeue --steps``) or the job
(``scancel JOBID``) is cancelled by :mod:`autotune.tune.slurm_cancel`, started at once in a session of its own
and retrying until SLURM lists it as ended, so every rank on every node ends; then this exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["slurm_argv", "parse_srun_line", "RANK_ENV_SH", "main"]

POLL_S = 0.2
JOB_POLL_S = 1.0
ENDED_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE"}
"""squeue(1) JOB STATE CODES that are final."""
CANCEL_WAIT_S = 3.0
RECORD_NAME = "slurm.json"  # = launchers.SLURM_RECORD_NAME (not imported: this runs before anything else)

RANK_ENV_SH = ('export RANK="$SLURM_PROCID" WORLD_SIZE="$SLURM_NTASKS" LOCAL_RANK="$SLURM_LOCALID" '
               'LOCAL_WORLD_SIZE="${SLURM_NTASKS_PER_NODE%%(*}" GROUP_RANK="$SLURM_NODEID" '
               'MASTER_ADDR="$(scontrol show hostnames "$SLURM_STEP_NODELIST" | head -n 1)"; exec "$@"')
"""One task = one rank: SLURM's task variables as torch.distributed's env:// names (torchrun sets the same)."""

_TASK_MSG = re.compile(r"srun: error: (?P<node>\S+): tasks? (?P<tasks>[\d,\-]+): (?P<state>.+?)\s*$")
_CANCELLED = re.compile(r"\*\*\* (?P<what>STEP|JOB) (?P<id>\S+) ON \S+ CANCELLED AT \S+(?P<why> DUE TO TIME LIMIT)?")


def _tasks(spec: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5] (srun's task ranges)."""
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit():
            out += list(range(int(lo), int(hi) + 1)) if hi.isdigit() else [int(lo)]
    return out


def parse_srun_line(line: str) -> tuple[str, object] | None:
    """('tasks', {task: state}) for srun's per-task exit message, ('ended', (how, line)) for a cancel."""
    m = _TASK_MSG.search(line)
    if m:
        return "tasks", {t: m.group("state") for t in _tasks(m.group("tasks"))}
    m = _CANCELLED.search(line)
    if m:
        return "ended", ("time limit" if m.group("why") else "cancelled", line.strip())
    return None


def _srun(p: dict, program: list[str]) -> list[str]:
    workdir = Path(p["workdir"])
    argv = ["srun", f"--job-name={p['name']}", f"--nodes={p['nodes']}", f"--ntasks={p['ntasks']}",
            f"--ntasks-per-node={p['tasks_per_node']}", "--kill-on-bad-exit=1", f"--time={p['time_limit_min']}",
            f"--output={workdir / 'rank-%t.log'}", "--input=none", f"--chdir={Path.cwd()}"]
    if p.get("gpus_per_node"):
        argv.append(f"--gpus-per-node={p['gpus_per_node']}")
    if p.get("overlap"):
        argv.append("--overlap")  # the tuner itself runs as a step of this allocation
    return argv + ["bash", "-c", RANK_ENV_SH, "autotune-rank", *program]


def slurm_argv(p: dict, program: list[str]) -> list[str]:
    """The command that runs ``program`` as the trial's SLURM step (srun) or submits it as a job (sbatch)."""
    step = _srun(p, program)
    if p["mode"] == "step":
        return step
    workdir = Path(p["workdir"])
    return ["sbatch", "--parsable", f"--job-name={p['name']}", f"--nodes={p['nodes']}",
            f"--ntasks={p['ntasks']}", f"--ntasks-per-node={p['tasks_per_node']}", f"--time={p['time_limit_min']}",
            f"--output={workdir / 'job.log'}", f"--chdir={Path.cwd()}", "--wrap", shlex.join(step)]


class _Follower:
    """Copies the complete new lines of the tasks' log files (and the job's) to our stdout."""

    def __init__(self, workdir: Path, names: list[str], out, on_line) -> None:
        self.paths = [workdir / n for n in names]
        self.pos = {p: 0 for p in self.paths}
        self.buf = {p: b"" for p in self.paths}
        self.out, self.on_line = out, on_line

    def poll(self, final: bool = False) -> None:
        for p in self.paths:
            try:
                with open(p, "rb") as f:
                    f.seek(self.pos[p])
                    data = f.read()
            except OSError:
                continue
            self.pos[p] += len(data)
            *lines, self.buf[p] = (self.buf[p] + data).split(b"\n")
            if final and self.buf[p]:
                lines.append(self.buf[p])
                self.buf[p] = b""
            for raw in lines:
                text = raw.decode("utf-8", "replace")
                self.on_line(text)
                self.out.write(text + "\n")
            self.out.flush()


class _BatchJob:
    """A submitted batch job, polled with ``scontrol show job`` (``sbatch --wait`` polls at 2, 4, 8, 16, 32 s
    intervals: seen here, a 14 s job was noticed 28 s late)."""

    def __init__(self, job_id: str) -> None:
        self.id, self.state, self.exit_code = job_id, "PENDING", "0:0"
        self.next_poll = 0.0

    def poll(self) -> int | None:
        """The job's exit status once it has ended (None while it runs)."""
        if time.monotonic() < self.next_poll:
            return None
        self.next_poll = time.monotonic() + JOB_POLL_S
        try:
            out = subprocess.run(["scontrol", "--oneliner", "show", "job", self.id], capture_output=True, text=True,
                                 timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        fields = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
        if not fields:  # purged after MinJobAge: ended long ago, state unknown
            return 1 if self.state not in ("COMPLETED",) else 0
        self.state, self.exit_code = fields.get("JobState", self.state), fields.get("ExitCode", self.exit_code)
        if self.state not in ENDED_STATES:
            return None
        code, _, sig = self.exit_code.partition(":")
        rc = int(code) if code.isdigit() else 1
        if not rc and sig.isdigit() and int(sig):
            rc = 128 + int(sig)
        return rc if rc or self.state == "COMPLETED" else 1


class _Step:
    """The srun step (or the sbatch submission): its output forwarded and read for task states."""

    def __init__(self, cmd: list[str], on_text) -> None:
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.thread = threading.Thread(target=self._pump, args=(on_text,), daemon=True)
        self.thread.start()

    def _pump(self, on_text) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            on_text(raw.decode("utf-8", "replace").rstrip("\n"))

    def finish(self) -> int:
        rc = self.proc.wait()
        self.thread.join(timeout=2)
        return rc if rc >= 0 else 128 - rc


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m autotune.tune.slurm_step PARAMS_JSON -- PROGRAM...", file=sys.stderr)
        return 2
    p, program = json.loads(argv[0]), argv[2:]
    workdir, job_mode = Path(p["workdir"]), p["mode"] == "job"
    os.environ["MASTER_PORT"] = str(p["master_port"])  # srun and sbatch pass our environment to the tasks
    record: dict = {"kind": p["mode"], "name": p["name"], "id": None, "time_limit_min": p["time_limit_min"],
                    "allocation": None if job_mode else os.environ.get("SLURM_JOB_ID"),
                    "tasks": {}, "ended": None, "line": "", "stopped_by_tuner": False}
    lock = threading.Lock()

    def save() -> None:
        with lock, contextlib.suppress(OSError):
            (workdir / RECORD_NAME).write_text(json.dumps(record, indent=2))

    def on_line(line: str) -> None:
        hit = parse_srun_line(line)
        with lock:
            if hit is not None and hit[0] == "tasks":
                record["tasks"].update({str(t): s for t, s in hit[1].items()})  # type: ignore[union-attr]
            elif hit is not None and record["ended"] is None:
                record["ended"], record["line"] = hit[1]  # type: ignore[misc]

    def on_text(line: str) -> None:  # srun's / sbatch's own output
        if job_mode and record["id"] is None and line.strip().split(";")[0].isdigit():
            record["id"] = line.strip().split(";")[0]
        on_line(line)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    cmd = slurm_argv(p, program)
    print(f"# autotune slurm {p['mode']}: {shlex.join(cmd)}", flush=True)
    for stale in [*workdir.glob("rank-*.log"), workdir / "job.log"]:
        stale.unlink(missing_ok=True)
    stop = threading.Event()
    cancels: list[subprocess.Popen] = []

    def start_cancel() -> None:
        """The canceller, in a session of its own, at once: the tuner SIGKILLs our process group a few seconds
        after its SIGTERM, and it retries scancel until SLURM says the job (or step) has ended."""
        if cancels or (job_mode and record["id"] is None):
            return
        alloc = [record["allocation"]] if record["allocation"] else []
        what = ["job", record["id"]] if job_mode else ["step", p["name"], *alloc]
        cancels.append(subprocess.Popen([sys.executable, "-m", "autotune.tune.slurm_cancel", *what],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        stdin=subprocess.DEVNULL, start_new_session=True))

    def on_stop(*_) -> None:
        stop.set()
        start_cancel()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_stop)
    step = _Step(cmd, on_text)
    job: _BatchJob | None = None
    if job_mode:  # sbatch returns once the job is queued
        rc = step.finish()
        if rc or record["id"] is None:
            print(f"error: sbatch failed (exit code {rc})", flush=True)
            return rc or 1
        job = _BatchJob(record["id"])
        if stop.is_set():  # stopped while sbatch was submitting: the id is known only now
            start_cancel()
    names = [f"rank-{t}.log" for t in range(p["ntasks"])] + (["job.log"] if job_mode else [])
    follower = _Follower(workdir, names, sys.stdout, on_line)
    save()
    rc = None
    while rc is None and not stop.is_set():
        follower.poll()
        rc = job.poll() if job is not None else step.proc.poll()
        time.sleep(POLL_S)
    if stop.is_set() and rc is None:
        record["stopped_by_tuner"] = True
        start_cancel()
        print(f"# autotune slurm: stopped; scancel {record['id'] if job_mode else p['name']} (retried until SLURM "
              "lists it as ended)", flush=True)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while rc is None and time.monotonic() < deadline:
            time.sleep(0.1)
            rc = job.poll() if job is not None else step.proc.poll()
        if job is None and step.proc.poll() is None:
            step.proc.kill()
    rc = step.finish() if job is None else (rc if rc is not None else 143)
    follower.poll(final=True)
    if job is not None and record["ended"] is None and job.state in ("TIMEOUT", "CANCELLED"):
        record["ended"] = "time limit" if job.state == "TIMEOUT" else "cancelled"
        record["line"] = f"JobState={job.state} ExitCode={job.exit_code}"
    save()
    if record["ended"]:
        print(f"error: SLURM {p['mode']} {record['id'] or p['name']} ended: {record['line']}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
