"""A finished trial's verdict: completed (with its measurement), oom or crashed, and why.

- a ``RESULT {json}`` line (builtin), a DeepSpeed autotuning metric file (script) or enough metric
  lines (command) make it "completed", whatever the exit code (gloo jobs that skip
  ``destroy_process_group`` sometimes abort at exit, after their last line);
- otherwise "oom" when the log shows a MemoryError / "out of memory" / a SIGKILLed rank, else
  "crashed"; the reason names the failing rank's first exception (:func:`autotune.tune.logs.first_error`)
  and the log's path.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from autotune.cost.flops import step_flops
from autotune.tune.logs import first_error, tail
from autotune.tune.trialspec import TrialResult, TrialSpec

__all__ = ["metrics", "judge"]


def metrics(spec: TrialSpec, step_time: float | None, tokens_per_s: float | None) -> dict:
    out: dict = {"step_time_s": step_time, "tokens_per_s": tokens_per_s}
    if step_time and step_time > 0:
        if tokens_per_s is None:
            out["tokens_per_s"] = spec.plan.tokens_per_step / step_time
        flops = step_flops(spec.trial_model, spec.plan.seq_len, spec.plan.tokens_per_step, spec.plan.recompute).model
        out["tflops_per_gpu"] = flops / step_time / spec.plan.world_size / 1e12
    return out


def judge(spec: TrialSpec, rc: int, log_path: Path, metrics_path: Path, steps: list[float],
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
        m = metrics(spec, median, None)
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
        m = metrics(spec, step_time, tokens)
        return TrialResult(status="completed",
                           # DeepSpeed 0.19.8 writes the metric after step end_profile_step + 1 from timers its
                           # step() resets every step while autotuning (engine.py: flops_profiler_enabled is on,
                           # timers.log resets them): one step's time, that step's
                           reason=f"DeepSpeed's autotuning metric: step {spec.warmup_steps + spec.steps + 1} alone "
                                  f"(DeepSpeed times the one step before it exits){note}",
                           log_path=log_path, step_times_s=(step_time,), peak_memory_bytes=seen_rss or None,
                           returncode=rc, **m)
    if kind == "command" and rc == 0 and (spec.workload.metric_pattern is None or len(steps) > spec.warmup_steps):
        measured = tuple(steps[spec.warmup_steps:])
        median = statistics.median(measured) if measured else None
        tokens = statistics.median(tokens_metrics[spec.warmup_steps:]) if tokens_metrics[spec.warmup_steps:] else None
        m = metrics(spec, median, tokens) if median else {}
        why = f"{len(measured)} measured steps from the log" if measured else "exit code 0 (no metric pattern)"
        if measured and len(measured) < spec.steps:  # it ended early: fewer steps than asked, said
            why += (f", of the {spec.steps} asked: the command ended after {len(steps)} metric lines "
                    f"({spec.warmup_steps} warm-up); pass it {{steps}} ({spec.warmup_steps + spec.steps}) as its step "
                    "count")
        return TrialResult(status="completed", reason=why, log_path=log_path, step_times_s=measured,
                           peak_memory_bytes=seen_rss or None, returncode=rc, **m)
    tail_text = tail(log_path)
    err = first_error(log_path)
    if oom_in_log:
        return TrialResult(status="oom", reason=f"out of memory (exit code {rc}): {err.describe()}; log: {log_path}",
                           log_path=log_path, returncode=rc, peak_memory_bytes=seen_rss or None)
    if rc == 0:
        what = {"builtin": "no RESULT line", "script": f"no DeepSpeed metric file {metrics_path.name}",
                "command": f"only {len(steps)} metric lines for {spec.warmup_steps} warm-up + {spec.steps} steps"}[kind]
        reason = f"exit code 0 but {what}" + (f"; last log line: {err.line}" if err.line else "")
    else:
        reason = f"exit code {rc}: {err.describe() if err.line else '(empty log)'}"
    return TrialResult(status="crashed", reason=f"{reason}; log: {log_path}\nlast log lines:\n{tail_text}",
                       log_path=log_path, returncode=rc, step_times_s=tuple(steps[spec.warmup_steps:]))
