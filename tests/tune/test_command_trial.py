"""Profiling trials of a shell command (``Workload(kind="command")``): hangs and crashes, the metric lines it
prints, the steps it runs and the placeholders its template fills. The builtin and script workloads:
tests/tune/test_trial.py."""

from __future__ import annotations

import os
import sys
import time

import psutil
import pytest
from trial_fixtures import SEQ, spec, cluster, model  # noqa: F401 - fixtures; tests/tune/ on sys.path

from autotune.tune.trial import Workload, run_trial


def group_members(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (psutil.Error, OSError):
            pass
    return out


@pytest.mark.slow
def test_hung_command_is_killed(model, cluster, tmp_path):
    s = spec(model, cluster, tmp_path, Workload(kind="command", command="echo started {nproc}; sleep 60 & wait"),
             timeout_s=3.0)
    t0 = time.monotonic()
    r = run_trial(s)
    assert r.status == "hung", r.reason
    assert time.monotonic() - t0 < 15
    assert "3 s timeout" in r.reason
    assert "started 2" in r.log_path.read_text()
    assert not [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_hung_group_is_gone(model, cluster, tmp_path, monkeypatch):
    import subprocess

    import autotune.tune.launch as launch_mod

    started = []
    real_popen = subprocess.Popen

    def spy(*a, **kw):
        p = real_popen(*a, **kw)
        started.append(p.pid)
        return p

    monkeypatch.setattr(launch_mod.subprocess, "Popen", spy)
    r = run_trial(spec(model, cluster, tmp_path, Workload(kind="command", command="sleep 60"), timeout_s=3.0))
    assert r.status == "hung"
    assert started and not group_members(started[0])
    assert not psutil.pid_exists(started[0]) or psutil.Process(started[0]).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
def test_crashed_command(model, cluster, tmp_path):
    cmd = f"{sys.executable} -c \"import sys; print('boom'); sys.exit(3)\""
    r = run_trial(spec(model, cluster, tmp_path, Workload(kind="command", command=cmd)))
    assert r.status == "crashed" and r.returncode == 3
    assert "exit code 3" in r.reason and "boom" in r.reason


@pytest.mark.slow
def test_command_metric_pattern(model, cluster, tmp_path):
    cmd = "for t in 0.5 0.25 0.2 0.3; do echo \"iteration took $t s\"; done"
    seen = []
    r = run_trial(spec(model, cluster, tmp_path, Workload(kind="command", command=cmd,
                                                          metric_pattern=r"took (?P<step_time_s>[0-9.]+) s")),
                  on_step=lambda i, t: seen.append((i, t)) and False)
    assert r.status == "completed", r.reason
    assert seen == [(1, 0.5), (2, 0.25), (3, 0.2), (4, 0.3)]
    assert r.step_times_s == (0.25, 0.2, 0.3) and r.step_time_s == 0.25
    assert r.tokens_per_s == pytest.approx(4 * SEQ / 0.25)


@pytest.mark.slow
def test_memory_error_in_log_is_oom(model, cluster, tmp_path):
    cmd = f"{sys.executable} -c \"raise MemoryError('no room')\""
    r = run_trial(spec(model, cluster, tmp_path, Workload(kind="command", command=cmd)))
    assert r.status == "oom" and "MemoryError" in r.reason


def test_a_command_that_trains_on_is_ended_after_its_measured_steps(model, cluster, tmp_path):
    """--steps for a command: the warm-up and measured metric lines in, the command is ended and the trial
    completed (it ran to the timeout and was thrown away as 'hung', its measurements with it)."""
    cmd = "for i in $(seq 1000); do echo \"iteration took 0.05 s\"; sleep 0.05; done"
    started = time.monotonic()
    r = run_trial(spec(model, cluster, tmp_path, Workload(kind="command", command=cmd,
                                                          metric_pattern=r"took (?P<step_time_s>[0-9.]+) s"),
                       timeout_s=30.0))
    assert r.status == "completed", r.reason
    assert r.step_times_s == (0.05, 0.05, 0.05) and time.monotonic() - started < 20


def test_a_commands_steps_placeholder_is_the_steps_the_trial_runs(model, cluster, tmp_path):
    """{steps} in a --command: the warm-up and measured steps, so the user's program trains exactly as long as the
    trial reads it (there was no such placeholder: the template failed to fill, or the program ran its own length)."""
    cmd = "for i in $(seq {steps}); do echo \"iteration took 0.05 s\"; done"
    r = run_trial(spec(model, cluster, tmp_path, Workload(kind="command", command=cmd,
                                                          metric_pattern=r"took (?P<step_time_s>[0-9.]+) s"),
                       steps=3, warmup_steps=1, timeout_s=30.0))
    assert r.status == "completed", r.reason
    assert r.step_times_s == (0.05, 0.05, 0.05) and "of the 3 asked" not in r.reason
    assert "seq 4)" in (tmp_path / "trial" / "trial.log").read_text().splitlines()[0]


def test_a_command_that_ends_before_its_steps_says_so(model, cluster, tmp_path):
    """A command that prints fewer metric lines than the warm-up and --steps is measured on what it printed, and
    the reason says it measured fewer steps than asked and how to pass the count. (The tuner's own first log line,
    the command, held 'took 0.05 s' too and was read as the first step.)"""
    cmd = "for i in 1 2 3; do echo \"iteration took 0.05 s\"; done"
    r = run_trial(spec(model, cluster, tmp_path, Workload(kind="command", command=cmd,
                                                          metric_pattern=r"took (?P<step_time_s>[0-9.]+) s"),
                       steps=3, warmup_steps=1, timeout_s=30.0))
    assert r.status == "completed" and r.step_times_s == (0.05, 0.05)
    assert "of the 3 asked" in r.reason and "{steps} (4)" in r.reason, r.reason


def test_megatron_args_of_a_command_trial_train_and_log_the_trials_steps(model, cluster, tmp_path):
    """{megatron_args} trained the emitted job's 100,000 iterations with a metric line every 10: each line the mean
    of ten steps, the trial's warm-up and measured lines ten times the steps asked."""
    from autotune.tune.launch import command_values

    s = spec(model, cluster, tmp_path, Workload(kind="command", command="run {megatron_args} --x {steps}"),
             steps=3, warmup_steps=1)
    values = command_values(s, tmp_path / "ds_config.json")
    args = values["megatron_args"].split()
    assert values["steps"] == 4
    for flag, want in (("--train-iters", "4"), ("--log-interval", "1"), ("--lr-warmup-iters", "1"),
                       ("--micro-batch-size", "1"), ("--num-layers", str(model.num_layers))):
        assert args[args.index(flag) + 1] == want, flag


def test_the_command_placeholders_are_named_when_one_is_unknown():
    from autotune.tune.launch import command_template_problem

    assert command_template_problem("train.sh --iters {steps} --ranks {nproc} --out {workdir}") is None
    # a program the plan never reaches measures one thing for every plan
    said = command_template_problem("torchrun --nproc_per_node {nproc} train.py --iters {steps}")
    assert "names none of {ds_config}, {megatron_args}, {accelerate_config}, {torchtitan_config}, {workdir}" in said
    assert "pass the plan with" in said
    said = command_template_problem("train.sh {nosuch}")
    assert "KeyError('nosuch')" in said and "{nproc}, {ds_config}, {workdir}, {steps}, {megatron_args}" in said
