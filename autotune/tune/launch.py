"""Starting a trial's processes and ending every one of them.

The job runs in its own session (``start_new_session=True``: its process group id is the root's
pid), stdout and stderr into ``trial.log``. :class:`Job` remembers every descendant it has seen, so
ranks re-parented after their launcher died are still found; :meth:`Job.kill` sends SIGTERM to all
of them and their process groups, SIGKILL after a grace period.

:func:`launch_record` is what the tuner stores for a running trial (host, pid, pgid, the root's
start time); :func:`end_recorded` ends such a group later, from another tuner process (``--resume``
after the first tuner was SIGKILLed), only when the recorded start time still matches, so a reused
pid is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from autotune.errors import InputError
from autotune.tune.trialspec import COMMAND_PLACEHOLDERS, TRAIN_PLAN_NAME, TrialSpec, placeholder_list

__all__ = ["Job", "command_line", "command_values", "command_template_problem", "trial_emit_options", "PLAN_CARRIERS",
           "trial_env", "launch_record", "write_launch_record", "recorded_processes", "end_recorded", "KILL_GRACE_S"]

KILL_GRACE_S = 5.0
START_TIME_SLACK_S = 0.05
"""psutil's create_time comes from /proc's jiffies: equal starts may differ by a tick."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(_free_port())]


def _launcher_prefix(spec: TrialSpec) -> list[str]:
    """The argv that starts ``world_size`` ranks of a Python program (the program's argv follows)."""
    if spec.launcher == "torchrun":
        return _torchrun(spec.plan.world_size)
    from autotune.tune import launchers  # --launcher deepspeed / slurm

    return launchers.launch_argv(spec)


def command_line(spec: TrialSpec, ds_path: Path) -> list[str]:
    """The trial's argv: the engine's built-in trainer (builtin) or the user's script under the launcher, or
    the shell command (command).

    builtin: ``python -m autotune.train --plan WORKDIR/plan.json ...`` (run_trial writes plan.json), the
    entry point the emitted launch scripts use, with ``--deepspeed-config`` the trial's ``ds_path`` where the
    engine's trainer takes a DeepSpeed config.
    """
    w = spec.workload
    if w.kind == "builtin":
        from autotune.engines import engine_for

        extra = ["--deepspeed-config", str(ds_path)] if engine_for(spec.plan).trainer_takes_deepspeed_config else []
        return _launcher_prefix(spec) + [
            "-m", "autotune.train", "--plan", str(Path(spec.workdir) / TRAIN_PLAN_NAME), "--steps", str(spec.steps),
            "--warmup-steps", str(spec.warmup_steps), "--seed", "1234",
            "--device", "cpu" if spec.cluster.gpu.name == "cpu" else "cuda", *extra]
    if w.kind == "script":
        return _launcher_prefix(spec) + [str(Path(w.script).resolve()), "--deepspeed_config", str(ds_path),
                                         *w.script_args]
    try:
        text = w.command.format(**command_values(spec, ds_path))
    except (KeyError, IndexError, ValueError) as e:
        raise InputError([f"command template {w.command!r} cannot be filled ({e!r}); the placeholders are "
                          f"{placeholder_list()} (write {{{{ }}}} for braces)"], subject="trial") from None
    return ["bash", "-c", text]


def trial_emit_options(spec: TrialSpec):
    """The emit options of a command trial's files: the study's releases, the trial's steps and warm-up, a log line
    per step."""
    import dataclasses

    from autotune.emit.options import EmitOptions

    total, options = spec.warmup_steps + spec.steps, spec.emit_options or EmitOptions()
    schedule = dataclasses.replace(options.optimizer, train_steps=total, warmup_steps=spec.warmup_steps)
    return dataclasses.replace(options, optimizer=schedule, steps_per_print=1)


def command_values(spec: TrialSpec, ds_path: Path) -> dict[str, object]:
    """What a command template's placeholders (:data:`COMMAND_PLACEHOLDERS`) become for the trial.

    ``{steps}`` is every step the trial runs, warm-up included: the tuner reads that many metric lines and ends
    the command once they are in. ``{megatron_args}`` train that many iterations too and log each one
    (``--log-interval 1``: a line per 10 iterations would time ten steps a line, and ten times the steps asked).
    ``{accelerate_config}`` / ``{torchtitan_config}`` are written into the trial's folder here
    (:mod:`autotune.tune.plan_files`; InputError when they cannot carry the plan)."""
    from autotune.tune.plan_files import PLAN_FILE_PLACEHOLDERS, named_placeholders, plan_files

    plan, total, named = spec.plan, spec.warmup_steps + spec.steps, named_placeholders(spec.workload.command)
    values: dict[str, object] = {"nproc": plan.world_size, "ds_config": shlex.quote(str(ds_path)),
                                 "workdir": shlex.quote(str(spec.workdir)), "steps": total,
                                 "micro_batch": plan.micro_batch_size, "grad_accum": plan.grad_accum_steps}
    if "megatron_args" in named:
        from autotune.emit.megatron import megatron_args

        values["megatron_args"] = shlex.join(megatron_args(spec.trial_model, spec.cluster, plan,
                                                           trial_emit_options(spec)))
    workdir = Path(spec.workdir).resolve()
    for name in named & set(PLAN_FILE_PLACEHOLDERS):
        files = plan_files(name, spec.trial_model, spec.cluster, plan, trial_emit_options(spec), workdir)
        for filename, text in files.items():
            (workdir / filename).write_text(text)
        values[name] = shlex.quote(str(workdir / next(iter(files))))
    assert set(values) <= set(COMMAND_PLACEHOLDERS), values
    return values


PLAN_CARRIERS = ("ds_config", "megatron_args", "accelerate_config", "torchtitan_config", "workdir")
"""The placeholders that bring the trial's plan to the program (a command must name one)."""


def command_template_problem(command: str) -> str | None:
    """Why ``--command``'s template cannot be filled (checked before the study: a trial would fail on it), or None."""
    try:
        command.format(**{name: 1 if name in ("nproc", "steps", "micro_batch", "grad_accum") else "x"
                          for name in COMMAND_PLACEHOLDERS})
    except (KeyError, IndexError, ValueError) as e:
        return (f"--command {command!r} cannot be filled ({e!r}): the placeholders are {placeholder_list()} "
                "(write {{ }} for literal braces)")
    from autotune.tune.plan_files import named_placeholders

    if not named_placeholders(command) & set(PLAN_CARRIERS):
        carriers = ", ".join("{" + name + "}" for name in PLAN_CARRIERS)
        return (f"--command {command!r} names none of {carriers}: every trial would run the same program whatever "
                "plan it measures, each set against that plan's prediction ({micro_batch} and {grad_accum} give its "
                "batch alone); pass the plan with {ds_config} (its DeepSpeed config), {megatron_args} (its "
                "Megatron-LM arguments), {accelerate_config} (accelerate launch --config_file) or "
                "{torchtitan_config}, or read WORKDIR/ds_config.json with {workdir}")
    return None


def trial_env(repo_root: str) -> dict[str, str]:
    """The environment of a trial: ours, unbuffered, one thread per rank unless told, this checkout importable."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = repo_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _group_members(pgids: set[int]) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) in pgids and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            pass
    return out


def _terminate(procs: list[psutil.Process], groups: set[int], reap=lambda: None) -> list[psutil.Process]:
    """SIGTERM ``procs`` and ``groups``, SIGKILL what is left after the grace period; returns the survivors."""
    groups = set(groups)
    groups.discard(os.getpgrp())  # never our own group
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for g in groups:
            with contextlib.suppress(OSError):
                os.killpg(g, sig)
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
        deadline = time.monotonic() + (KILL_GRACE_S if sig == signal.SIGTERM else 2.0)
        while time.monotonic() < deadline:
            reap()
            procs = [p for p in procs if _alive(p)] + [p for p in _group_members(groups) if p not in procs]
            if not procs:
                return []
            time.sleep(0.05)
    reap()
    return [p for p in procs if _alive(p)]


class Job:
    """A launched process, its session, and every descendant seen while it ran."""

    def __init__(self, argv: list[str], log_path: Path, cwd: Path, env: dict[str, str]) -> None:
        self.log_file = open(log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=self.log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=str(cwd), env=env, start_new_session=True)
        self.pgid = self.proc.pid
        self.known: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            self.known[self.proc.pid] = psutil.Process(self.proc.pid)
        self.peak_tree_rss = 0
        self.peak_proc_rss = 0

    def tree(self) -> list[psutil.Process]:
        """The live processes of the job: the root, its descendants, and any seen before (orphans)."""
        with contextlib.suppress(psutil.Error):
            root = self.known.get(self.proc.pid) or psutil.Process(self.proc.pid)
            for p in root.children(recursive=True):
                self.known.setdefault(p.pid, p)
        return [p for p in list(self.known.values()) if _alive(p)]

    def tree_rss(self) -> int:
        """Resident bytes of the whole tree now; also records the largest single process (a rank)."""
        total = 0
        for p in self.tree():
            with contextlib.suppress(psutil.Error):
                rss = p.memory_info().rss
                total += rss
                if p.pid != self.proc.pid:
                    self.peak_proc_rss = max(self.peak_proc_rss, rss)
        self.peak_tree_rss = max(self.peak_tree_rss, total)
        return total

    def survivors(self) -> list[psutil.Process]:
        alive = {p.pid: p for p in self.tree()}
        for p in _group_members({self.pgid}):
            alive.setdefault(p.pid, p)
        return list(alive.values())

    def kill(self) -> list[int]:
        """End every process of the job (and its process groups); returns the pids still alive (should be none)."""
        self.tree()  # record the descendants before the root goes and they are re-parented
        procs = self.survivors()
        groups = {self.pgid}
        for p in procs:
            with contextlib.suppress(OSError):
                groups.add(os.getpgid(p.pid))
        _terminate(procs, groups, self._reap)
        return [p.pid for p in self.survivors()]

    def _reap(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.poll()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.log_file.close()


def launch_record(job: Job) -> dict:
    """What identifies the job's processes later, from another process: host, the root's pid, pgid and start
    time, and every process of the tree seen so far with its start time and process group (torchrun starts
    each rank in a session of its own: torch/distributed/elastic/multiprocessing/subprocess_handler)."""
    procs, pgids = [], {job.pgid}
    for p in job.tree():
        with contextlib.suppress(psutil.Error, OSError):
            procs.append([p.pid, p.create_time()])
            pgids.add(os.getpgid(p.pid))
    start = next((t for pid, t in procs if pid == job.proc.pid), None)
    return {"host": socket.gethostname(), "pid": job.proc.pid, "pgid": job.pgid, "start_time": start,
            "tuner_pid": os.getpid(), "procs": sorted(procs), "pgids": sorted(pgids - {os.getpgrp()})}


def write_launch_record(path: Path, record: dict) -> None:
    with contextlib.suppress(OSError):
        path.write_text(json.dumps(record))


def _matches(pid: int, start: float) -> psutil.Process | None:
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(pid)
        if abs(p.create_time() - start) <= START_TIME_SLACK_S and _alive(p):
            return p
    return None


def recorded_processes(record: dict) -> list[psutil.Process]:
    """The live processes of a recorded job: each recorded process whose start time still matches, and the
    members of its process groups started no earlier than the job (a group whose id now leads an unrelated,
    older group is left alone)."""
    if not isinstance(record, dict) or record.get("host") != socket.gethostname():
        return []
    start = record.get("start_time")
    if not isinstance(start, (int, float)):
        return []
    ours: dict[int, psutil.Process] = {}
    for item in record.get("procs") or ([[record.get("pid"), start]] if isinstance(record.get("pid"), int) else []):
        with contextlib.suppress(TypeError, ValueError):
            if (p := _matches(int(item[0]), float(item[1]))) is not None:
                ours[p.pid] = p
    started = dict((int(pid), float(t)) for pid, t in record.get("procs") or [] if isinstance(pid, int))
    for g in record.get("pgids") or [record.get("pgid")]:
        if not isinstance(g, int) or g in (0, 1, os.getpgrp()):
            continue
        with contextlib.suppress(psutil.Error):
            leader = psutil.Process(g)
            if g in started and abs(leader.create_time() - started[g]) > START_TIME_SLACK_S:
                continue  # the group's id now leads another, unrelated group
        for p in _group_members({g}):
            with contextlib.suppress(psutil.Error):
                if p.create_time() >= start - START_TIME_SLACK_S:
                    ours.setdefault(p.pid, p)
    ours.pop(os.getpid(), None)
    return list(ours.values())


def end_recorded(record: dict) -> list[int]:
    """End the processes of a recorded job that a dead tuner left running (see :func:`recorded_processes`);
    returns the pids ended. Each is signalled by pid, not by group id (that may have been reused)."""
    procs = recorded_processes(record)
    if procs:
        _terminate(procs, set())
    return sorted(p.pid for p in procs)
