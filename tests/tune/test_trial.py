"""Profiling trials for real: tiny-gpt under DeepSpeed on 2 gloo ranks, a user's script, shell commands.

Each DeepSpeed trial takes ~10-20 s on 2 cores (imports, deepspeed.initialize, a few bf16 steps).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from autotune.errors import InputError
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset
from autotune.tune.trial import TrialResult, TrialSpec, Workload, run_trial, trial_ds_config

FIXTURES = Path(__file__).parent / "fixtures"
SEQ = 64


@pytest.fixture(scope="module")
def model():
    return load_model_preset("tiny-gpt")


@pytest.fixture(scope="module")
def cluster():
    return load_cluster(gpu="cpu", num_gpus=2)


def plan(**kw) -> ParallelPlan:
    kw.setdefault("zero_stage", 1)
    dp = 2 // (kw.get("tp", 1) * kw.get("pp", 1) * kw.get("cp", 1))
    return ParallelPlan(dp=dp, global_batch_size=4, micro_batch_size=1, grad_accum_steps=4 // dp, seq_len=SEQ, **kw)


def spec(model, cluster, tmp_path, workload, **kw) -> TrialSpec:
    kw.setdefault("steps", 3)
    kw.setdefault("warmup_steps", 1)
    kw.setdefault("timeout_s", 180.0)
    return TrialSpec(model=model, cluster=cluster, plan=kw.pop("plan", None) or plan(), workload=workload,
                     workdir=tmp_path / "trial", **kw)


def group_members(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (psutil.Error, OSError):
            pass
    return out


class Before(set):
    """The pids alive before the test, and the test's folder (other sessions' trials run on this machine too)."""

    marker = ""


def assert_nothing_left(before: Before) -> None:
    """No process started during the trial is still alive (children of ours or orphans of the trial)."""
    me = psutil.Process()
    kids = [p for p in me.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    assert not kids, f"processes left behind: {[(p.pid, p.cmdline()) for p in kids]}"
    new = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.pid in before:
            continue
        cmd = " ".join(p.info["cmdline"] or ())
        if before.marker in cmd and ("autotune.train" in cmd or "_train.py" in cmd or "torch.distributed.run" in cmd):
            new.append((p.pid, cmd))
    assert not new, f"trial processes survived: {new}"


@pytest.fixture
def pids_before(tmp_path):
    before = Before(p.pid for p in psutil.process_iter())
    before.marker = str(tmp_path)
    return before


# ---------------------------------------------------------------------------------------------
# builtin workload: the engine's trainer, python -m autotune.train --plan WORKDIR/plan.json


@pytest.mark.slow
def test_completed_zero1_trial(model, cluster, tmp_path, pids_before):
    seen: list[tuple[int, float]] = []
    phases: list[str] = []
    launches: list[dict] = []
    s = spec(model, cluster, tmp_path, Workload(kind="builtin"))
    t0 = time.monotonic()
    r = run_trial(s, on_step=lambda i, t: seen.append((i, t)) and False, on_phase=phases.append,
                  on_launch=launches.append)
    wall = time.monotonic() - t0
    assert r.status == "completed", r.reason
    assert len(r.step_times_s) == 3 and all(t > 0 for t in r.step_times_s)
    assert r.step_time_s is not None and r.step_time_s > 0
    assert r.step_time_s == sorted(r.step_times_s)[1]  # median of 3
    assert [i for i, _ in seen] == [1, 2, 3, 4]  # warm-up step 1 included
    assert tuple(t for _, t in seen[1:]) == pytest.approx(r.step_times_s, rel=1e-4)
    assert r.tokens_per_s == pytest.approx(4 * SEQ / r.step_time_s)
    assert r.tflops_per_gpu is not None and r.tflops_per_gpu > 0
    assert r.peak_memory_bytes is not None and r.peak_memory_bytes > 50 * 2**20
    # the files of the trial
    ds = json.loads((s.workdir / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 1 and ds["optimizer"]["params"]["torch_adam"] is True
    assert ds["train_batch_size"] == 4 and ds["gradient_accumulation_steps"] == 2
    attrs = json.loads((s.workdir / "result.json").read_text())
    assert attrs == json.loads(json.dumps(r.to_attrs())) and attrs["status"] == "completed"
    assert "RESULT " in r.log_path.read_text()
    # the phases the progress line shows, in order
    assert phases[0] == "launching"
    assert "initialising the engine" in phases
    assert phases.index("initialising the engine") < phases.index(next(p for p in phases if p.startswith("step 1/4")))
    assert phases[-1].startswith("step 4/4 (")
    assert launches and launches[0]["pgid"] == launches[0]["pid"] and launches[0]["start_time"] > 0
    # The record is sent again (and launch.json rewritten) once the ranks, each in a session of its own, start.
    assert json.loads((s.workdir / "launch.json").read_text()) == launches[-1]
    assert {pid for pid, _ in launches[0]["procs"]} <= {pid for pid, _ in launches[-1]["procs"]}
    assert_nothing_left(pids_before)
    print(f"\ncompleted ZeRO-1 trial: median step {r.step_time_s:.3f} s, {r.tokens_per_s:.0f} tokens/s, "
          f"peak RSS {r.peak_memory_bytes / 2**20:.0f} MiB, wall {wall:.1f} s")


@pytest.mark.slow
def test_pruned_after_first_step(model, cluster, tmp_path, pids_before):
    calls = []

    def prune(i, t):
        calls.append(i)
        return True

    r = run_trial(spec(model, cluster, tmp_path, Workload(kind="builtin"), steps=20), on_step=prune)
    assert r.status == "pruned", r.reason
    assert calls == [1]
    assert "RESULT " not in r.log_path.read_text()
    assert_nothing_left(pids_before)


@pytest.mark.slow
def test_host_memory_limit_gives_oom(model, cluster, tmp_path, pids_before):
    r = run_trial(spec(model, cluster, tmp_path, Workload(kind="builtin"), host_memory_limit_bytes=200 * 10**6))
    assert r.status == "oom", r.reason
    assert "GiB" in r.reason and "limit" in r.reason
    assert_nothing_left(pids_before)


@pytest.mark.slow
def test_pipeline_plan_runs_under_the_engines_trainer(model, cluster, tmp_path, pids_before):
    # pp = 2: DeepSpeed's PipelineModule through python -m autotune.train, judged like any builtin trial
    phases: list[str] = []
    s = spec(model, cluster, tmp_path, Workload(kind="builtin"), plan=plan(pp=2, zero_stage=1), steps=2)
    r = run_trial(s, on_phase=phases.append)
    assert r.status == "completed", r.reason
    assert "-m autotune.train --plan" in r.log_path.read_text().splitlines()[0]
    assert len(r.step_times_s) == 2 and r.tokens_per_s and r.tokens_per_s > 0
    assert "initialising the engine" in phases
    assert_nothing_left(pids_before)


def test_plan_the_trainer_cannot_run_is_a_clear_crash(model, cluster, tmp_path):
    # AutoTP builds a transformers Llama; tiny-gpt (GELU, biases) is not one: said before launching anything
    r = run_trial(spec(model, cluster, tmp_path, Workload(kind="builtin"), plan=plan(tp=2, zero_stage=1)))
    assert r.status == "crashed" and r.reason.startswith("not launched: AutoTP") and "Llama-style" in r.reason


# ---------------------------------------------------------------------------------------------
# script and command workloads


@pytest.mark.slow
def test_script_workload_uses_deepspeed_metric_file(model, cluster, tmp_path, pids_before):
    w = Workload(kind="script", script=str(FIXTURES / "user_train.py"), script_args=("--seq-len", str(SEQ)))
    s = spec(model, cluster, tmp_path, w)
    cfg = trial_ds_config(s)
    assert cfg["autotuning"]["start_profile_step"] == 2 and cfg["autotuning"]["end_profile_step"] == 4
    r = run_trial(s)
    assert r.status == "completed", r.reason
    metrics = json.loads((s.workdir / "metrics.json").read_text())
    assert r.step_time_s == pytest.approx(4 / metrics["throughput"])
    assert r.step_time_s == pytest.approx(metrics["latency"] / 1e6, rel=1e-6)  # DeepSpeed's "ms" are microseconds
    assert 0 < r.step_time_s < 10
    assert r.tokens_per_s == pytest.approx(metrics["throughput"] * SEQ)
    assert r.peak_memory_bytes and r.peak_memory_bytes > 0
    assert_nothing_left(pids_before)


@pytest.mark.slow
def test_failing_rank_reason_is_its_exception(model, cluster, tmp_path, pids_before):
    # torchrun's own traceback and ChildFailedError banner come last; the reason is rank 1's assert
    w = Workload(kind="script", script=str(FIXTURES / "failing_train.py"))
    r = run_trial(spec(model, cluster, tmp_path, w, timeout_s=120.0))
    assert r.status == "crashed", r.reason
    first = r.reason.splitlines()[0]
    assert "AssertionError: loss scale collapsed to 0.0 on rank 1" in first
    assert "(rank 1, exit code 1)" in first
    assert f"log: {r.log_path}" in first
    assert "ChildFailedError" in r.log_path.read_text() and "ChildFailedError" not in first
    assert_nothing_left(pids_before)


@pytest.mark.slow
def test_dead_build_lock_stops_the_trial_at_once(model, cluster, tmp_path, monkeypatch):
    # A rank killed mid-build leaves torch's lock behind; the next ranks would sleep on it until the timeout.
    root = tmp_path / "ext"
    (root / "old_op").mkdir(parents=True)
    foreign = root / "old_op" / "lock"
    foreign.touch()
    old = time.time() - 3600
    os.utime(foreign, (old, old))  # left an hour ago by someone else: reported, never removed
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    cmd = "mkdir -p {workdir}/../ext/fake_op && touch {workdir}/../ext/fake_op/lock && echo built && sleep 60"
    t0 = time.monotonic()
    r = run_trial(spec(model, cluster, tmp_path, Workload(kind="command", command=cmd), timeout_s=60.0))
    assert time.monotonic() - t0 < 20
    assert r.status == "crashed", r.reason
    assert f"{root / 'fake_op' / 'lock'} has no live owner" in r.reason and "cleared it" in r.reason
    assert not (root / "fake_op" / "lock").exists()
    assert foreign.exists() and "old_op" not in r.reason
    # the foreign one is what a study needing the op refuses to start on, naming it and the fix
    from autotune.tune.ops import OpsError, dead_locks, ensure_ops

    [lock] = dead_locks(root)
    assert not lock.ours and f"rm {foreign}" in lock.why
    with pytest.raises(OpsError, match="not created by autotune"):
        ensure_ops(["old_op"], env={"TORCH_EXTENSIONS_DIR": str(root)})


@pytest.mark.slow
def test_warm_ops_check_builds_nothing():
    from autotune.tune.ops import SHM_COMM, ensure_ops

    ensure_ops([SHM_COMM])  # builds it on a fresh machine (~30-60 s), once
    state = ensure_ops([SHM_COMM])  # (its time is not asserted: timings drift with the host's load)
    assert state[SHM_COMM] in ("cached",) or state[SHM_COMM].startswith("incompatible")


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


@pytest.mark.slow
def test_keyboard_interrupt_kills_the_job(model, cluster, tmp_path, pids_before):
    def interrupt(i, t):
        raise KeyboardInterrupt

    cmd = "for i in 1 2 3; do echo \"took 0.1 s\"; done; sleep 60"
    with pytest.raises(KeyboardInterrupt):
        run_trial(spec(model, cluster, tmp_path, Workload(kind="command", command=cmd,
                                                          metric_pattern=r"took (?P<step_time_s>[0-9.]+) s")),
                  on_step=interrupt)
    assert not [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_keyboard_interrupt_while_the_launch_is_recorded_kills_the_job(model, cluster, tmp_path, monkeypatch):
    """Ctrl-C landing in on_launch (the study's storage write, before the trial loop): seen in CI, the launched
    processes (there a SLURM supervisor and its job) ran on; now they are ended and the launcher told."""
    from autotune.tune import trial as trial_module

    told = []
    monkeypatch.setattr(trial_module, "_after_stop", lambda s: told.append(s.workdir))

    def interrupt(record):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_trial(spec(model, cluster, tmp_path, Workload(kind="command", command="sleep 60")), on_launch=interrupt)
    assert not [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    assert told, "the launcher was not asked to end what it started elsewhere"


# ---------------------------------------------------------------------------------------------
# bad input: nothing is launched


def test_bad_input_raises_before_launching(model, cluster, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        run_trial(spec(model, cluster, tmp_path, Workload(kind="script", script=str(tmp_path / "missing.py"))))
    assert not (tmp_path / "trial").exists()

    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n")
    with pytest.raises(InputError, match="does not compile"):
        run_trial(spec(model, cluster, tmp_path, Workload(kind="script", script=str(bad))))

    with pytest.raises(InputError, match="cluster has 4"):
        run_trial(spec(model, load_cluster(gpu="cpu", num_gpus=4), tmp_path, Workload(kind="builtin")))

    many = (os.cpu_count() or 1) * 4 * 2
    with pytest.raises(InputError, match="this machine runs at most"):
        run_trial(spec(model, load_cluster(gpu="cpu", num_gpus=many), tmp_path, Workload(kind="builtin"),
                       plan=ParallelPlan(dp=many, global_batch_size=many, seq_len=SEQ)))

    with pytest.raises(InputError, match="named group"):
        run_trial(spec(model, cluster, tmp_path, Workload(kind="command", command="true", metric_pattern="x")))
    assert not (tmp_path / "trial").exists()


def test_to_attrs_is_json_safe(tmp_path):
    r = TrialResult(status="crashed", reason="x", log_path=tmp_path / "l", step_time_s=float("nan"),
                    step_times_s=(1.0, float("inf")))
    attrs = r.to_attrs()
    assert json.loads(json.dumps(attrs, allow_nan=False)) == attrs
    assert attrs["step_time_s"] is None and attrs["step_times_s"] == [1.0, None]


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
