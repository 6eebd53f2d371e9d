"""Profiling trials for real: tiny-gpt under DeepSpeed on 2 gloo ranks, a user's script, shell commands.

Each DeepSpeed trial takes ~10-20 s on 2 cores (imports, deepspeed.initialize, a few bf16 steps).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest
from trial_fixtures import SEQ, plan, spec, cluster, model  # noqa: F401 - fixtures; tests/tune/ on sys.path

from autotune.errors import InputError
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.tune.trial import TrialResult, Workload, run_trial, trial_ds_config

FIXTURES = Path(__file__).parent / "fixtures"


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

