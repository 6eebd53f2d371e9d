"""One profiling trial: launch a short training job for a plan, watch it, and say how it went.

:func:`run_trial` validates the trial, writes the DeepSpeed config into the trial's folder, starts the
job in its own session (``start_new_session=True``) with stdout and stderr in ``workdir/trial.log``,
and watches it every ~0.2 s:

- each ``STEP i seconds`` line (the builtin workload) or each match of ``metric_pattern`` (a
  command workload) is passed to ``on_step(i, seconds)``; a True answer stops the job: "pruned";
- the resident memory of the whole process tree (psutil, children recursive) over
  ``host_memory_limit_bytes`` stops the job: "oom";
- past ``timeout_s`` the job is stopped (SIGTERM, SIGKILL 5 s later, to every process of the tree
  and of its process groups): "hung";
- a ``RESULT {json}`` line (builtin), a DeepSpeed autotuning metric file (script) or the metric
  lines (command) make it "completed", whatever the exit code (gloo jobs sometimes abort at exit);
- otherwise a nonzero exit is "crashed" (the exit code and the log's last lines in ``reason``), or
  "oom" when the log shows a MemoryError / "out of memory" / a SIGKILLed rank.

Step numbers ``i`` count from 1 and include the warm-up: steps ``1..warmup_steps`` are warm-up.

Workloads:

- ``builtin``: :mod:`autotune.tune.workload_builtin` (the project's transformer under DeepSpeed).
- ``script``: the user's unchanged DeepSpeed script, run as ``torchrun --nproc_per_node N SCRIPT
  --deepspeed_config PATH ARGS...``; the config carries DeepSpeed's ``autotuning`` block, so the
  engine times the measured steps, writes ``workdir/metrics.json`` and ends the process itself.
- ``command``: a shell command template with ``{nproc}``, ``{ds_config}``, ``{workdir}`` (and
  ``{megatron_args}``: the plan's Megatron-LM arguments) whose log lines ``metric_pattern`` matches.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

from autotune.cost.flops import step_flops
from autotune.emit.deepspeed import deepspeed_config
from autotune.emit.options import EmitOptions
from autotune.errors import InputError
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["Workload", "TrialSpec", "TrialResult", "run_trial", "trial_ds_config", "LOG_NAME", "DS_CONFIG_NAME",
           "METRICS_NAME", "SPEC_NAME"]

LOG_NAME = "trial.log"
DS_CONFIG_NAME = "ds_config.json"
METRICS_NAME = "metrics.json"
SPEC_NAME = "trial_spec.json"
RESULT_NAME = "result.json"

POLL_S = 0.2
KILL_GRACE_S = 5.0
TAIL_LINES = 20
_STEPS_PER_PRINT = 1_000_000

Status = Literal["completed", "pruned", "oom", "crashed", "hung"]

_STEP_RE = re.compile(r"^STEP (\d+) ([0-9.eE+-]+)\s*$")
_RESULT_PREFIX = "RESULT "
_OOM_RE = re.compile(r"MemoryError|out of memory|Signal 9 \(SIGKILL\)", re.IGNORECASE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """What a trial runs."""

    kind: Literal["builtin", "script", "command"]
    script: str | None = None
    """script: the user's unchanged DeepSpeed script (it gets ``--deepspeed_config PATH``)."""
    script_args: tuple[str, ...] = ()
    command: str | None = None
    """command: a template, e.g. ``torchrun --nproc_per_node {nproc} pretrain_gpt.py {megatron_args}``."""
    metric_pattern: str | None = None
    """command: regex with a named group ``step_time_s`` (or ``tokens_per_s``) matched on each log line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialSpec:
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    workload: Workload
    workdir: Path
    """This trial's folder: ds_config.json, trial.log, result.json."""
    steps: int = 6
    """Measured optimizer steps (after the warm-up)."""
    warmup_steps: int = 2
    timeout_s: float = 300.0
    host_memory_limit_bytes: int | None = None
    """The trial is stopped (status "oom") when its process tree's resident memory exceeds this."""
    num_layers: int | None = None
    """builtin: run this many layers instead of the model's, to keep trials short."""

    @property
    def trial_model(self) -> ModelSpec:
        """The model the trial really runs (the layer count cut to ``num_layers`` for builtin runs)."""
        if self.num_layers is not None and self.workload.kind == "builtin" and self.num_layers != self.model.num_layers:
            return dataclasses.replace(self.model, num_layers=self.num_layers)
        return self.model


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialResult:
    status: Status
    reason: str
    """A sentence: why (e.g. "exit code 1: RuntimeError: ... (last log lines)")."""
    log_path: Path
    step_time_s: float | None = None
    """Median over the measured steps (after warm-up)."""
    tokens_per_s: float | None = None
    tflops_per_gpu: float | None = None
    """Model FLOPs (recompute excluded) per step / step time / world size, in TFLOP/s."""
    peak_memory_bytes: int | None = None
    """CPU: peak RSS of the busiest rank; GPU: torch.cuda.max_memory_allocated of the busiest rank."""
    step_times_s: tuple[float, ...] = ()
    """Measured step times (warm-up excluded)."""
    returncode: int | None = None

    def to_attrs(self) -> dict:
        """A JSON-safe dict (Optuna user attributes)."""
        def num(x):
            return x if x is None or math.isfinite(x) else None
        return {
            "status": self.status,
            "reason": self.reason,
            "log_path": str(self.log_path),
            "step_time_s": num(self.step_time_s),
            "tokens_per_s": num(self.tokens_per_s),
            "tflops_per_gpu": num(self.tflops_per_gpu),
            "peak_memory_bytes": self.peak_memory_bytes,
            "step_times_s": [num(t) for t in self.step_times_s],
            "returncode": self.returncode,
        }


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
    if plan.world_size > can:
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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(_free_port())]


def _command_line(spec: TrialSpec, ds_path: Path) -> list[str]:
    w, nproc = spec.workload, spec.plan.world_size
    if w.kind == "builtin":
        return _torchrun(nproc) + ["-m", "autotune.tune.workload_builtin", "--spec", str(spec.workdir / SPEC_NAME)]
    if w.kind == "script":
        return _torchrun(nproc) + [str(Path(w.script).resolve()), "--deepspeed_config", str(ds_path),
                                   *w.script_args]
    values = {"nproc": nproc, "ds_config": shlex.quote(str(ds_path)), "workdir": shlex.quote(str(spec.workdir))}
    if "{megatron_args}" in w.command:
        from autotune.emit.megatron import megatron_args
        values["megatron_args"] = shlex.join(megatron_args(spec.model, spec.cluster, spec.plan))
    try:
        text = w.command.format(**values)
    except (KeyError, IndexError, ValueError) as e:
        raise InputError([f"command template {w.command!r} cannot be filled ({e!r}); the placeholders are "
                          "{nproc}, {ds_config}, {workdir}, {megatron_args} (write {{ }} for braces)"],
                         subject="trial") from None
    return ["bash", "-c", text]


# ---------------------------------------------------------------------------------------------
# process control


class _Job:
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
        live = []
        for pid, p in list(self.known.items()):
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    live.append(p)
            except psutil.Error:
                pass
        return live

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

    def _group_members(self, pgids: set[int]) -> list[psutil.Process]:
        out = []
        for p in psutil.process_iter():
            try:
                if os.getpgid(p.pid) in pgids and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except (psutil.Error, OSError):
                pass
        return out

    def survivors(self) -> list[psutil.Process]:
        alive = {p.pid: p for p in self.tree()}
        for p in self._group_members({self.pgid}):
            alive.setdefault(p.pid, p)
        return list(alive.values())

    def kill(self) -> list[int]:
        """SIGTERM every process of the job (and its process groups), SIGKILL what is left after the grace
        period; returns the pids still alive afterwards (should be empty)."""
        self.tree()  # record the descendants before the root goes and they are re-parented
        procs = self.survivors()
        groups = {self.pgid}
        for p in procs:
            with contextlib.suppress(OSError):
                groups.add(os.getpgid(p.pid))
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
                self._reap()
                procs = [p for p in procs if _alive(p)] + [p for p in self._group_members(groups) if p not in procs]
                if not procs:
                    break
                time.sleep(0.05)
            if not procs:
                break
        self._reap()
        return [p.pid for p in self.survivors()]

    def _reap(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.poll()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.log_file.close()


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class _LogReader:
    """Reads the lines a job has appended to its log so far (a partial last line waits)."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "rb")
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


def _tail(path: Path, n: int = TAIL_LINES) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    lines = [ln for ln in lines if ln.strip()]
    return "\n".join(lines[-n:])


def _error_line(tail: str) -> str:
    """The most telling line of a log tail: the last exception line, else the last line."""
    lines = tail.splitlines()
    for ln in reversed(lines):
        if re.search(r"(Error|Exception|error:)", ln) and not ln.lstrip().startswith("File "):
            return ln.strip()
    return lines[-1].strip() if lines else ""


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


# ---------------------------------------------------------------------------------------------
# the trial


def run_trial(spec: TrialSpec, on_step: Callable[[int, float], bool] | None = None) -> TrialResult:
    """Run one profiling trial (see the module docstring). Raises InputError before launching anything
    when the trial cannot run; every launched process is gone when this returns or raises."""
    _validate(spec)
    workdir = Path(spec.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    spec = dataclasses.replace(spec, workdir=workdir)
    log_path = workdir / LOG_NAME
    metrics_path = workdir / METRICS_NAME
    for stale in (log_path, metrics_path, workdir / RESULT_NAME):
        stale.unlink(missing_ok=True)
    ds_path = workdir / DS_CONFIG_NAME
    ds_path.write_text(json.dumps(trial_ds_config(spec), indent=2))
    kind = spec.workload.kind

    if kind == "builtin":
        from autotune.tune.workload_builtin import unsupported_reason
        reason = unsupported_reason(spec.plan)
        if reason:
            log_path.write_text(f"not launched: {reason}\n")
            return _finish(spec, TrialResult(status="crashed", reason=f"not launched: {reason}", log_path=log_path))
        (workdir / SPEC_NAME).write_text(json.dumps({
            "model": spec.trial_model.to_dict(), "plan": spec.plan.to_dict(), "ds_config_path": str(ds_path),
            "steps": spec.steps, "warmup_steps": spec.warmup_steps, "seed": 1234,
            "device": "cpu" if spec.cluster.gpu.name == "cpu" else "cuda"}, indent=2))

    argv = _command_line(spec, ds_path)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    repo_root = str(Path(__file__).resolve().parents[2])  # so `-m autotune...` imports this checkout
    env["PYTHONPATH"] = repo_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log_path.write_text(f"# autotune trial: {shlex.join(argv)}\n")
    cwd = workdir if kind != "builtin" else Path(repo_root)

    pattern = re.compile(spec.workload.metric_pattern) if kind == "command" and spec.workload.metric_pattern else None
    job = _Job(argv, log_path, cwd, env)
    reader = _LogReader(log_path)
    steps: list[float] = []          # STEP times, or metric-line step times (warm-up included)
    tokens_metrics: list[float] = []  # command: tokens_per_s values
    result_json: dict | None = None
    oom_in_log = False
    start = time.monotonic()
    stop: tuple[Status, str] | None = None
    seen_rss = 0

    def handle(line: str) -> Status | None:
        nonlocal result_json, oom_in_log
        if _OOM_RE.search(line):
            oom_in_log = True
        if line.startswith(_RESULT_PREFIX) and kind == "builtin":
            with contextlib.suppress(ValueError):
                result_json = json.loads(line[len(_RESULT_PREFIX):])
            return None
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
                        tokens_per_step = spec.plan.tokens_per_step
                        t = tokens_per_step / tok if tok > 0 else None
        if t is not None:
            steps.append(t)
            if on_step is not None and on_step(len(steps), t):
                return "pruned"
        return None

    try:
        while True:
            rc = job.proc.poll()
            for line in reader.new_lines():
                if handle(line) == "pruned":
                    stop = ("pruned", f"pruned by on_step after step {len(steps)} ({steps[-1]:.4g} s)")
                    break
            if stop:
                break
            if rc is not None:
                for line in reader.rest():
                    handle(line)
                break
            rss = job.tree_rss()
            seen_rss = max(seen_rss, rss)
            if spec.host_memory_limit_bytes is not None and rss > spec.host_memory_limit_bytes:
                stop = ("oom", f"the trial's processes used {_gib(rss)} resident memory, over the "
                               f"{_gib(spec.host_memory_limit_bytes)} limit")
                break
            if time.monotonic() - start > spec.timeout_s:
                stop = ("hung", f"no result within the {spec.timeout_s:g} s timeout")
                break
            time.sleep(POLL_S)
        if stop:
            left = job.kill()
            status, reason = stop
            if left:
                reason += f"; processes {left} survived SIGKILL"
            tail = _tail(log_path, 5)
            if status == "hung" and tail:
                reason += f" (last log lines: {tail[-400:]!r})"
            return _finish(spec, TrialResult(status=status, reason=reason, log_path=log_path,
                                             step_times_s=tuple(steps[spec.warmup_steps:]),
                                             peak_memory_bytes=job.peak_proc_rss or seen_rss or None, returncode=job.proc.poll()))
        rc = job.proc.wait()
        left = job.kill() if job.survivors() else []  # a rank the launcher left behind
        return _finish(spec, _judge(spec, rc, log_path, metrics_path, steps, tokens_metrics, result_json,
                                    oom_in_log, job.peak_proc_rss or seen_rss, left))
    finally:
        # KeyboardInterrupt or any error: nothing of the trial may outlive run_trial
        if job.proc.poll() is None or job.survivors():
            job.kill()
        reader.close()
        job.close()


def _metrics(spec: TrialSpec, step_time: float | None, tokens_per_s: float | None) -> dict:
    out: dict = {"step_time_s": step_time, "tokens_per_s": tokens_per_s}
    if step_time and step_time > 0:
        if tokens_per_s is None:
            out["tokens_per_s"] = spec.plan.tokens_per_step / step_time
        flops = step_flops(spec.trial_model, spec.plan.seq_len, spec.plan.tokens_per_step, spec.plan.recompute).model
        out["tflops_per_gpu"] = flops / step_time / spec.plan.world_size / 1e12
    return out


def _judge(spec: TrialSpec, rc: int, log_path: Path, metrics_path: Path, steps: list[float],
           tokens_metrics: list[float], result_json: dict | None, oom_in_log: bool, seen_rss: int,
           left: list[int]) -> TrialResult:
    kind = spec.workload.kind
    note = f" (exit code {rc}, ignored: the result was complete)" if rc else ""
    if left:
        note += f"; processes {left} survived SIGKILL"
    if kind == "builtin" and result_json is not None:
        measured = tuple(float(t) for t in result_json.get("measured_step_times_s") or ())
        median = statistics.median(measured) if measured else None
        peaks = [p for p in result_json.get("peak_memory_bytes_per_rank") or () if p is not None]
        m = _metrics(spec, median, None)
        return TrialResult(status="completed", reason=f"ran {len(measured)} measured steps{note}", log_path=log_path,
                           step_times_s=measured, peak_memory_bytes=max(peaks) if peaks else None,
                           returncode=rc, **m)
    if kind == "script" and metrics_path.is_file():
        try:
            data = json.loads(metrics_path.read_text())
            latency_ms = float(data["latency"])  # see below: really microseconds
        except (ValueError, KeyError, TypeError) as e:
            return TrialResult(status="crashed", reason=f"DeepSpeed's metric file {metrics_path} is unreadable: {e}",
                               log_path=log_path, returncode=rc)
        # DeepSpeed 0.19.8 names it ms but its timers' means are already ms x 1000 (timer.py get_mean),
        # so "latency" is in microseconds per step; "throughput" = train_batch_size * 1e6 / latency is
        # right in samples/s. The step time is taken from the throughput (unit-safe), else latency / 1e6.
        throughput = float(data.get("throughput") or 0.0)
        if throughput > 0:
            step_time = spec.plan.global_batch_size / throughput
        else:
            step_time = latency_ms / 1e6
        tokens = spec.plan.tokens_per_step / step_time if step_time > 0 else None
        m = _metrics(spec, step_time, tokens)
        return TrialResult(status="completed",
                           reason=f"DeepSpeed autotuning measured steps {spec.warmup_steps + 1}.."
                                  f"{spec.warmup_steps + spec.steps}{note}",
                           log_path=log_path, step_times_s=(step_time,), peak_memory_bytes=seen_rss or None,
                           returncode=rc, **m)
    if kind == "command" and rc == 0 and (spec.workload.metric_pattern is None or len(steps) > spec.warmup_steps):
        measured = tuple(steps[spec.warmup_steps:])
        median = statistics.median(measured) if measured else None
        tokens = statistics.median(tokens_metrics[spec.warmup_steps:]) if tokens_metrics[spec.warmup_steps:] else None
        m = _metrics(spec, median, tokens) if median else {}
        why = f"{len(measured)} measured steps from the log" if measured else "exit code 0 (no metric pattern)"
        return TrialResult(status="completed", reason=why, log_path=log_path, step_times_s=measured,
                           peak_memory_bytes=seen_rss or None, returncode=rc, **m)
    tail = _tail(log_path)
    if oom_in_log:
        return TrialResult(status="oom", reason=f"out of memory (exit code {rc}): {_error_line(tail)}\n"
                                                f"last log lines:\n{tail}", log_path=log_path, returncode=rc,
                           peak_memory_bytes=seen_rss or None)
    if rc == 0:
        what = {"builtin": "no RESULT line", "script": f"no DeepSpeed metric file {metrics_path.name}",
                "command": f"only {len(steps)} metric lines for {spec.warmup_steps} warm-up + {spec.steps} steps"}[kind]
        reason = f"exit code 0 but {what}"
    else:
        reason = f"exit code {rc}: {_error_line(tail)}"
    return TrialResult(status="crashed", reason=f"{reason}\nlast log lines:\n{tail}", log_path=log_path,
                       returncode=rc, step_times_s=tuple(steps[spec.warmup_steps:]))


def _finish(spec: TrialSpec, result: TrialResult) -> TrialResult:
    with contextlib.suppress(OSError):
        (Path(spec.workdir) / RESULT_NAME).write_text(json.dumps(result.to_attrs(), indent=2))
    return result
