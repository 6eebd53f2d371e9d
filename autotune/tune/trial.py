"""One profiling trial: launch a short training job for a plan, watch it, and say how it went.

:func:`run_trial` validates the trial, writes the DeepSpeed config into the trial's folder, starts the
job (:mod:`autotune.tune.launch`) with stdout and stderr in ``workdir/trial.log``, and watches it
every ~0.2 s, reading the log as it grows (:mod:`autotune.tune.logs`):

- each ``STEP i seconds`` line (the builtin trainer) or each match of ``metric_pattern`` (a
  command workload) is passed to ``on_step(i, seconds)``; a True answer stops the job: "pruned";
- the phase (launching, building op X, initialising the engine, step k/N with step times) is
  passed to ``on_phase(text)`` when it changes; ``on_launch(record)`` gets the launched processes
  (host, pids, process groups, start times; again whenever new ones appear) so that a later
  ``--resume`` can end them;
- the resident memory of the whole process tree (psutil, children recursive) over
  ``host_memory_limit_bytes`` stops the job: "oom";
- past ``timeout_s`` the job is stopped (SIGTERM, SIGKILL 5 s later, to every process of the tree
  and of its process groups): "hung";
- a DeepSpeed op build lock that no process holds (:mod:`autotune.tune.ops`) stops the job at once:
  "crashed", the lock named in the reason (and cleared when it was ours) rather than a rank
  sleeping on it until the timeout;
- when the job ends, :func:`autotune.tune.judge.judge` gives the verdict.

Step numbers ``i`` count from 1 and include the warm-up: steps ``1..warmup_steps`` are warm-up.

Workloads:

- ``builtin``: every plan runs its engine's built-in trainer (:mod:`autotune.train`, the program the
  emitted launch scripts run) under the launcher: ``python -m autotune.train --plan WORKDIR/plan.json
  --steps N --warmup-steps W --seed 1234 --device cpu|cuda``, plus ``--deepspeed-config
  WORKDIR/ds_config.json`` (the trial's own config) for engines whose trainer takes one; it prints the
  PHASE / STEP / RESULT lines. A plan it cannot run (:func:`autotune.train.plan_problem`: a Megatron plan,
  whose pretrain_gpt.py needs CUDA, or one the engine's trainer refuses) is never launched: "crashed",
  "not launched: <why>".
- ``script``: the user's unchanged DeepSpeed script, run as ``torchrun --nproc_per_node N SCRIPT
  --deepspeed_config PATH ARGS...``; the config carries DeepSpeed's ``autotuning`` block, so the
  engine times the measured steps, writes ``workdir/metrics.json`` and ends the process itself.
- ``command``: a shell command template with ``{nproc}``, ``{ds_config}``, ``{workdir}``, ``{steps}`` (the
  warm-up and measured steps together: the command is ended once that many lines matched) and
  ``{megatron_args}`` (the plan's Megatron-LM arguments, training and logging ``{steps}`` iterations) whose log
  lines ``metric_pattern`` matches (the tuner's own first log line, the command, is not read); the plan as
  accelerate / torchtitan files and batch numbers too (:data:`autotune.tune.trialspec.COMMAND_PLACEHOLDERS`; a
  plan its placeholders cannot carry is "crashed", "not launched: plan ...: <why>").
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from autotune.emit.deepspeed import deepspeed_config
from autotune.emit.options import EmitOptions
from autotune.errors import InputError
from autotune.specs.hardware import ClusterSpec
from autotune.tune import ops, shm_leftovers
from autotune.tune.judge import judge
from autotune.tune.launch import Job, command_line, launch_record, trial_env, write_launch_record
from autotune.tune.logs import LogReader, Phase, tail
from autotune.tune.trialspec import (DS_CONFIG_NAME, LAUNCH_NAME, LOG_NAME, METRICS_NAME, RESULT_NAME,
                                     TRAIN_PLAN_NAME, Status, TrialResult, TrialSpec, Workload)

__all__ = ["Workload", "TrialSpec", "TrialResult", "run_trial", "trial_ds_config", "LOG_NAME", "DS_CONFIG_NAME",
           "METRICS_NAME", "LAUNCH_NAME", "TRAIN_PLAN_NAME"]

POLL_S = 0.2
LOCK_CHECK_S = 1.0
_STEPS_PER_PRINT = 1_000_000

_STEP_RE = re.compile(r"^STEP (\d+) ([0-9.eE+-]+)\s*$")
_RESULT_PREFIX = "RESULT "
_OOM_RE = re.compile(r"MemoryError|out of memory|Signal 9 \(SIGKILL\)", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------
# validation


def _machine_ranks(cluster: ClusterSpec) -> tuple[int, str]:
    """How many ranks this machine can run for ``cluster``, and what limits it."""
    if cluster.gpu.name == "cpu":
        cores = os.cpu_count() or 1
        return cores * 4, f"{cores} CPU cores x 4"
    try:
        import torch
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no usable torch means no GPU
        n = 0
    return n, f"{n} visible CUDA devices"


def _validate(spec: TrialSpec) -> None:
    problems: list[str] = []
    w, plan, cluster = spec.workload, spec.plan, spec.cluster
    if w.kind not in ("builtin", "script", "command"):
        problems.append(f"workload kind must be builtin, script or command, got {w.kind!r}")
    if w.kind == "script":
        if not w.script:
            problems.append("a script workload needs script (the path of the DeepSpeed training script)")
        elif not Path(w.script).is_file():
            problems.append(f"script {w.script!r} does not exist")
        else:
            # what `python -m py_compile` checks, without writing a .pyc next to the user's script
            try:
                compile(Path(w.script).read_bytes(), w.script, "exec")
            except (SyntaxError, ValueError) as e:
                problems.append(f"script {w.script!r} does not compile: {type(e).__name__}: {e}")
            except OSError as e:
                problems.append(f"script {w.script!r} cannot be read: {e}")
    if w.kind == "command":
        if not w.command:
            problems.append("a command workload needs command (a shell command template)")
        if w.metric_pattern is not None:
            try:
                rx = re.compile(w.metric_pattern)
            except re.error as e:
                problems.append(f"metric_pattern is not a valid regex: {e}")
            else:
                if not {"step_time_s", "tokens_per_s"} & set(rx.groupindex):
                    problems.append("metric_pattern needs a named group (?P<step_time_s>...) or (?P<tokens_per_s>...)")
    if spec.steps < 1:
        problems.append(f"steps must be >= 1, got {spec.steps}")
    if spec.warmup_steps < 0:
        problems.append(f"warmup_steps must be >= 0, got {spec.warmup_steps}")
    if not spec.timeout_s > 0:
        problems.append(f"timeout_s must be > 0, got {spec.timeout_s}")
    if spec.num_layers is not None and spec.num_layers < 1:
        problems.append(f"num_layers must be >= 1, got {spec.num_layers}")
    if plan.world_size != cluster.num_gpus:
        problems.append(f"the plan spans {plan.world_size} ranks (tp*pp*dp*cp) but the cluster has "
                        f"{cluster.num_gpus} GPUs")
    can, why = _machine_ranks(cluster)
    if plan.world_size > can and spec.launcher == "torchrun":  # others: checked by launchers.Launcher.problems
        problems.append(f"the trial needs {plan.world_size} ranks but this machine runs at most {can} ({why})")
    if problems:
        raise InputError(problems, subject="trial")


# ---------------------------------------------------------------------------------------------
# config and command lines


def trial_ds_config(spec: TrialSpec) -> dict:
    """The DeepSpeed config a trial runs: the plan's, quiet, with torch's Adam unless offloading."""
    model = spec.trial_model
    cfg = copy.deepcopy(deepspeed_config(model, spec.cluster, spec.plan,
                                         EmitOptions(steps_per_print=_STEPS_PER_PRINT, wall_clock_breakdown=False)))
    opt = cfg.get("optimizer")
    if opt and opt.get("type") in ("Adam", "AdamW") and spec.plan.offload_optimizer == "none":
        # torch.optim.AdamW: no JIT build of DeepSpeed's CPU FusedAdam (~70 s cold)
        opt.setdefault("params", {})["torch_adam"] = True
    if spec.workload.kind == "script":
        cfg["autotuning"] = {
            "enabled": True,
            "metric_path": str(Path(spec.workdir).resolve() / METRICS_NAME),
            "start_profile_step": spec.warmup_steps + 1,
            "end_profile_step": spec.warmup_steps + spec.steps,
            "metric": "throughput",
            "model_info": {"num_params": model.num_params},
        }
    return cfg


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


# ---------------------------------------------------------------------------------------------
# the trial


def _prepare(spec: TrialSpec) -> tuple[TrialSpec, Path, Path, Path]:
    workdir = Path(spec.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    spec = dataclasses.replace(spec, workdir=workdir)
    log_path, metrics_path = workdir / LOG_NAME, workdir / METRICS_NAME
    for stale in (log_path, metrics_path, workdir / RESULT_NAME, workdir / LAUNCH_NAME, workdir / TRAIN_PLAN_NAME):
        stale.unlink(missing_ok=True)
    ds_path = workdir / DS_CONFIG_NAME
    ds_path.write_text(json.dumps(trial_ds_config(spec), indent=2))
    return spec, log_path, metrics_path, ds_path


def run_trial(spec: TrialSpec, on_step: Callable[[int, float], bool] | None = None,
              on_phase: Callable[[str], None] | None = None,
              on_launch: Callable[[dict], None] | None = None) -> TrialResult:
    """Run one profiling trial (see the module docstring). Raises InputError before launching anything
    when the trial cannot run; every launched process is gone when this returns or raises."""
    _validate(spec)
    spec, log_path, metrics_path, ds_path = _prepare(spec)
    workdir, kind = spec.workdir, spec.workload.kind
    if kind in ("builtin", "command"):  # builtin: python -m autotune.train --plan WORKDIR/plan.json
        from autotune.train import plan_problem
        from autotune.tune.plan_files import trial_plan_problem  # a command's placeholders (the plan named)
        reason = plan_problem(spec.trial_model, spec.plan, full_layers=spec.model.num_layers) if kind == "builtin" \
            else trial_plan_problem(spec)
        if reason:
            log_path.write_text(f"not launched: {reason}\n")
            return _finish(spec, TrialResult(status="crashed", reason=f"not launched: {reason}", log_path=log_path))
    if kind == "builtin":
        from autotune.api import estimate
        from autotune.bundle.writer import engine_version_record
        (workdir / TRAIN_PLAN_NAME).write_text(json.dumps(
            estimate(spec.trial_model, spec.cluster, spec.plan).to_dict()
            | {"engine_version": engine_version_record(spec.plan, spec.emit_options or EmitOptions())}, indent=2))

    argv = command_line(spec, ds_path)
    repo_root = str(Path(__file__).resolve().parents[2])  # so `-m autotune...` imports this checkout
    env = trial_env(repo_root)
    ext_root = ops.extensions_root(env)
    log_path.write_text(f"# autotune trial: {shlex.join(argv)}\n")
    header_end = log_path.stat().st_size  # the command line (a --command's may match its own metric pattern)
    cwd = workdir if kind != "builtin" else Path(repo_root)

    pattern = re.compile(spec.workload.metric_pattern) if kind == "command" and spec.workload.metric_pattern else None
    started_epoch = time.time()
    job = Job(argv, log_path, cwd, env)
    try:
        record = launch_record(job)
        write_launch_record(workdir / LAUNCH_NAME, record)
        if on_launch is not None:
            on_launch(record)  # the study's storage: a Ctrl-C often lands in this write
    except BaseException:
        # Before the trial loop's own cleanup is in place (seen in CI: Ctrl-C during on_launch left the SLURM
        # supervisor, and its job, running until the job's time limit): nothing of the trial may outlive it.
        job.kill()
        job.close()
        _after_stop(spec)
        raise
    reader = LogReader(log_path, start=header_end)
    phase = Phase(spec.warmup_steps + spec.steps)
    steps: list[float] = []          # STEP times, or metric-line step times (warm-up included)
    tokens_metrics: list[float] = []  # command: tokens_per_s values
    result_json: dict | None = None
    oom_in_log = False
    start = time.monotonic()
    next_lock_check = start + LOCK_CHECK_S
    stop: tuple[Status, str] | None = None
    seen_rss = 0

    def show(text: str | None = None) -> None:
        if text is not None:
            phase.text = text
        if on_phase is not None:
            on_phase(phase.text)

    def handle(line: str) -> Status | None:
        nonlocal result_json, oom_in_log
        if _OOM_RE.search(line):
            oom_in_log = True
        if line.startswith(_RESULT_PREFIX) and kind == "builtin":
            with contextlib.suppress(ValueError):
                result_json = json.loads(line[len(_RESULT_PREFIX):])
            return None
        if phase.feed(line):
            show()
        t = None
        if kind == "builtin":
            m = _STEP_RE.match(line)
            if m:
                t = float(m.group(2))
        elif pattern is not None:
            m = pattern.search(line)
            if m:
                g = m.groupdict()
                if g.get("step_time_s") is not None:
                    with contextlib.suppress(ValueError):
                        t = float(g["step_time_s"])
                elif g.get("tokens_per_s") is not None:
                    with contextlib.suppress(ValueError):
                        tok = float(g["tokens_per_s"])
                        tokens_metrics.append(tok)
                        t = spec.plan.tokens_per_step / tok if tok > 0 else None
        if t is not None:
            steps.append(t)
            phase.step(t)
            show()
            if on_step is not None and on_step(len(steps), t):
                return "pruned"
        return None

    def check_locks() -> tuple[Status, str] | None:
        building = ops.live_builds(ext_root, [p.pid for p in job.tree()])
        if building and not phase.steps:
            show(f"building op {', '.join(building)}")
        # Only locks taken since this trial began: an older dead lock of an op the study needs was
        # found before the study (ops.ensure_ops); one of an op it does not need blocks nobody.
        for lock in ops.dead_locks(ext_root, ours_since=started_epoch):
            if lock.ours:
                ops.clear_lock(lock)
                return "crashed", (f"{lock.describe()}: the ranks would wait on it forever; cleared it, the next "
                                   "trial builds the op again")
        return None

    try:
        show()
        while True:
            rc = job.proc.poll()
            for line in reader.new_lines():
                if handle(line) == "pruned":
                    stop = ("pruned", f"pruned by on_step after step {len(steps)} ({steps[-1]:.4g} s)")
                    break
            if stop:
                break
            wanted = spec.warmup_steps + spec.steps
            if kind == "command" and pattern is not None and len(steps) >= wanted:
                # a command that trains on: its measured steps are in; it is ended, not timed out as "hung"
                job.kill()
                _after_stop(spec)
                return _finish(spec, judge(spec, 0, log_path, metrics_path, steps[:wanted], tokens_metrics[:wanted],
                                           result_json, oom_in_log, job.peak_proc_rss or seen_rss, []))
            if rc is not None:
                for line in reader.rest():
                    handle(line)
                break
            rss = job.tree_rss()
            seen_rss = max(seen_rss, rss)
            now = time.monotonic()
            if spec.host_memory_limit_bytes is not None and rss > spec.host_memory_limit_bytes:
                stop = ("oom", f"the trial's processes used {_gib(rss)} resident memory, over the "
                               f"{_gib(spec.host_memory_limit_bytes)} limit")
                break
            if now >= next_lock_check:
                next_lock_check = now + LOCK_CHECK_S
                fresh = launch_record(job)
                if fresh["procs"] != record["procs"]:  # ranks started (each in a session of its own)
                    record = fresh
                    write_launch_record(workdir / LAUNCH_NAME, record)
                    if on_launch is not None:
                        on_launch(record)
                stop = check_locks() if ext_root.is_dir() else None
                if stop:
                    break
            if now - start > spec.timeout_s:
                stop = ("hung", f"no result within the {spec.timeout_s:g} s timeout (phase: {phase.text})")
                break
            time.sleep(POLL_S)
        if stop:
            left = job.kill()
            _after_stop(spec)
            status, reason = stop
            if left:
                reason += f"; processes {left} survived SIGKILL"
            if status == "hung":
                for lock in ops.dead_locks(ext_root, ours_since=started_epoch) if ext_root.is_dir() else []:
                    if lock.ours:  # a rank killed mid-build: its lock would block the next trial
                        ops.clear_lock(lock)
                        reason += f"; {lock.describe()} (cleared)"
                last = tail(log_path, 3)
                if last:
                    reason += f"; last log lines: {last[-300:]!r}"
            reason += f"; log: {log_path}"
            return _finish(spec, TrialResult(status=status, reason=reason, log_path=log_path,
                                             step_times_s=tuple(steps[spec.warmup_steps:]),
                                             peak_memory_bytes=job.peak_proc_rss or seen_rss or None,
                                             returncode=job.proc.poll()))
        rc = job.proc.wait()
        left = job.kill() if job.survivors() else []  # a rank the launcher left behind
        return _finish(spec, judge(spec, rc, log_path, metrics_path, steps, tokens_metrics, result_json,
                                   oom_in_log, job.peak_proc_rss or seen_rss, left))
    finally:
        # KeyboardInterrupt, SIGTERM or any error: nothing of the trial may outlive run_trial
        if job.proc.poll() is None or job.survivors():
            job.kill()
            _after_stop(spec)
        reader.close()
        job.close()
        # DeepSpeed's CPU all-reduce never unlinks its /dev/shm segments; this trial's (its master port) at any age
        shm_leftovers.remove_leftovers(ports=_master_ports(argv))


def _master_ports(argv: list[str]) -> frozenset[int]:
    """The master port a trial's launcher was given (``--master_port N``), where it names one."""
    return frozenset(int(v) for flag, v in zip(argv, argv[1:]) if flag == "--master_port" and v.isdigit())


def _after_stop(spec: TrialSpec) -> None:
    if spec.launcher != "torchrun":  # what the launcher started elsewhere (a SLURM job whose id was never learned)
        from autotune.tune import launchers
        launchers.after_stop(spec)


def _finish(spec: TrialSpec, result: TrialResult) -> TrialResult:
    if spec.launcher != "torchrun":  # SLURM's word on how the step ended (time limit, scancel)
        from autotune.tune import launchers
        result = launchers.review(spec, result)
    with contextlib.suppress(OSError):
        (Path(spec.workdir) / RESULT_NAME).write_text(json.dumps(result.to_attrs(), indent=2))
    return result
