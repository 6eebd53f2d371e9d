"""`autotune tune --launcher slurm|deepspeed` for real: a single-node SLURM (slurmctld + slurmd, started by
``slurm_cluster``), the DeepSpeed launcher without ssh, and bad input found before any trial.

Space as in test_tune_integration: tiny-gpt cut to 2 layers on 2 gloo ranks, seq 64, global batch 8, tp = pp = 1,
ZeRO 0-3 x micro-batch 1, 2, 4 (x offload where the planner keeps it): more plans than any test runs.
Long-running trials are made with the test-only hook AUTOTUNE_TUNE_TEST_OVERRIDES (``steps`` 100000).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.trial import TrialState
from slurm_cluster import slurm_cluster  # noqa: F401 - the session fixture
from test_tune_integration import postgres_url  # noqa: F401 - the PostgreSQL fixture

from autotune.cli import main
from autotune.tune import shm_leftovers
from autotune.tune.storage import open_storage

REPO = Path(__file__).resolve().parents[2]
BASE = ["--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64", "--global-batch", "8",
        "--tp", "1", "--pp", "1", "--recompute", "none", "--max-micro-batch", "4", "--num-layers", "2",
        "--steps", "2", "--warmup-steps", "1", "--finalists", "0", "--no-offload"]
LONG = 100_000  # steps: a trial that runs until something ends it


def _tune(*args: str) -> list[str]:
    return [sys.executable, "-m", "autotune", "tune", *BASE, *args]


def _env(cluster, **extra) -> dict:
    env = cluster.env
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def _ranks_of(out: Path) -> list[psutil.Process]:
    """Rank processes still running a trial of ``out`` (their argv names the trial's plan.json)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "autotune.train" in cmd and str(out) in cmd:
            found.append(p)
    return found


def _wait_running(cluster, out: Path, trial: int, timeout_s: float = 240) -> str:
    """The SLURM job id of trial ``trial`` once its tasks have started (SLURM opened their log files)."""
    deadline = time.monotonic() + timeout_s
    rank0 = out / "trials" / f"{trial:04d}" / "rank-0.log"
    while time.monotonic() < deadline:
        jobs = cluster.run("squeue", "--noheader", "--format=%i %j", check=False).stdout.split("\n")
        ids = [j.split()[0] for j in jobs if len(j.split()) == 2 and j.split()[1].startswith(f"autotune-{trial:04d}-")]
        if ids and rank0.is_file():
            return ids[0]
        time.sleep(0.5)
    pytest.fail(f"trial {trial} did not start a step within {timeout_s:g} s\n{cluster.log_tail()}")


@pytest.mark.slow
def test_time_limit_scancel_and_ctrl_c_one_sbatch_job_per_trial(tmp_path, slurm_cluster):  # noqa: F811
    """Outside any allocation each trial is an `sbatch --wait` job: trial 0 runs past its SLURM time limit
    (trial timeout 110 s -> --time 1 min: SLURM ends it after 60-90 s, before the tuner's own 110 s clock),
    trial 1 is cancelled with scancel, Ctrl-C during trial 2 cancels its job and leaves no trial RUNNING."""
    out = tmp_path / "out"
    overrides = json.dumps({"0": {"timeout_s": 110, "steps": LONG}, "1": {"steps": LONG}, "2": {"steps": LONG}})
    env = _env(slurm_cluster, AUTOTUNE_TUNE_TEST_OVERRIDES=overrides)
    log = open(tmp_path / "tune.log", "w")
    # As a terminal's foreground job: SIGINT at its default, whatever this test inherited (a shell's background job,
    # as CI may start the suite, ignores SIGINT, and a Python started so never raises KeyboardInterrupt).
    proc = subprocess.Popen(_tune("--trials", "3", "--top-k", "3", "--launcher", "slurm", "--out", str(out)),
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        slurm_cluster.run("scancel", _wait_running(slurm_cluster, out, 1, timeout_s=400))
        job2 = _wait_running(slurm_cluster, out, 2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=180) == 130, (tmp_path / "tune.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    def job2_state() -> str | None:  # squeue's compact state, None once the job has left the queue
        rows = (line.split() for line in slurm_cluster.run("squeue", "-h", "-o", "%i %t").stdout.splitlines())
        return next((row[1] for row in rows if len(row) == 2 and row[0] == job2), None)

    # Ctrl-C: the job is cancelled and every rank ends. SLURM may still list it as completing (CG: its epilog and
    # node cleanup, slower on a loaded machine); it must not be running or pending any more.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (job2_state() is not None or _ranks_of(out)):
        time.sleep(0.5)
    assert job2_state() in (None, "CG"), job2_state()
    assert not _ranks_of(out), "ranks outlived Ctrl-C"

    trials = optuna.load_study(study_name="autotune", storage=f"sqlite:///{out / 'study.db'}").get_trials()
    by = {t.number: t for t in trials}
    t0, t1, t2 = by[0].user_attrs, by[1].user_attrs, by[2].user_attrs
    assert t0["status"] == "hung" and "time limit (1 min)" in t0["reason"], t0["reason"]
    assert "DUE TO TIME LIMIT" in t0["reason"]
    assert t1["status"] == "crashed" and "cancelled" in t1["reason"], t1["reason"]
    assert t2["status"] == "interrupted" and by[2].state == TrialState.FAIL
    for n in (0, 1):
        assert by[n].state == TrialState.FAIL
        record = json.loads((out / "trials" / f"{n:04d}" / "slurm.json").read_text())
        assert record["kind"] == "job" and record["id"]
        folder = out / "trials" / f"{n:04d}"  # SLURM's own per-task logs (srun --output rank-%t.log)
        assert (folder / "rank-0.log").is_file() and (folder / "rank-1.log").is_file()
    assert "STEP " in (out / "trials" / "0000" / "rank-0.log").read_text()  # it ran until SLURM stopped it
    assert set(json.loads((out / "trials" / "0000" / "slurm.json").read_text())["tasks"]) == {"0", "1"}
    # resumable: nothing left RUNNING (the PostgreSQL test below runs trials to completion under SLURM)
    assert not [t for t in trials if t.state == TrialState.RUNNING]


@pytest.mark.slow
def test_postgres_workers_one_per_slurm_job(tmp_path, slurm_cluster, postgres_url):  # noqa: F811
    """Two tuner workers, each the batch script of its own 2-task SLURM job, share one PostgreSQL study;
    every trial is an srun step (2 tasks) inside its worker's allocation and completes with a measurement."""
    jobs = []
    for name in ("a", "b"):
        cmd = _tune("--trials", "3", "--top-k", "2", "--storage", postgres_url, "--study-name", "shared", "--worker",
                    "--launcher", "slurm", "--out", str(tmp_path / name))
        script = f"{shlex.join(cmd)} > {shlex.quote(str(tmp_path / (name + '.out')))}"
        jobs.append(subprocess.Popen(["sbatch", "--wait", "--nodes=1", "--ntasks=2", f"--job-name=worker-{name}",
                                      f"--output={tmp_path / (name + '.log')}", f"--chdir={REPO}", "--wrap", script],
                                     env=_env(slurm_cluster), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True))
    for name, job in zip(("a", "b"), jobs):
        text = job.communicate(timeout=600)[0]
        assert job.returncode == 0, text + (tmp_path / f"{name}.log").read_text()[-3000:]
    trials = optuna.load_study(study_name="shared", storage=open_storage(postgres_url)).get_trials()
    counted = [t for t in trials if t.state != TrialState.RUNNING
               and t.user_attrs.get("status") not in ("interrupted", "duplicate")]
    assert 3 <= len(counted) <= 4  # the budget; two workers asking at the same instant may add one
    keys = [t.user_attrs.get("plan_key") or t.params.get("plan_key") for t in counted]
    assert len(set(keys)) == len(keys), "a plan ran twice"
    assert len({t.user_attrs["pid"] for t in counted}) == 2, "both workers ran trials"
    allocations = set()
    for t in counted:  # a slow step may be pruned (the slow-step pruner), nothing fails
        assert t.state in (TrialState.COMPLETE, TrialState.PRUNED), t.user_attrs.get("reason")
        folder = Path(t.user_attrs["log_path"]).parent
        record = json.loads((folder / "slurm.json").read_text())
        assert record["kind"] == "step"
        allocations.add(record["allocation"])
        assert "STEP " in (folder / "rank-0.log").read_text() and (folder / "rank-1.log").is_file()
        if t.state == TrialState.COMPLETE:
            assert t.user_attrs["measurement"]["tokens_per_s"] > 0 and record["tasks"] == {}  # no task failed
    assert any(t.state == TrialState.COMPLETE for t in counted)
    assert len(allocations) == 2, "each worker's trials ran in its own SLURM job"


@pytest.mark.slow
def test_deepspeed_launcher_one_node_without_ssh(tmp_path, monkeypatch):
    """A hostfile naming only this machine: DeepSpeed's runner with --no_ssh (ssh is never tried)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    shim = tmp_path / "bin"  # an ssh that fails loudly, first on PATH: any ssh attempt fails the trial
    shim.mkdir()
    (shim / "ssh").write_text("#!/bin/sh\necho 'ssh was called' >&2\nexit 255\n")
    (shim / "ssh").chmod(0o755)
    env = dict(os.environ, PATH=f"{shim}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO))
    shm_before = set(os.listdir(shm_leftovers.SHM_DIR)) if shm_leftovers.SHM_DIR.is_dir() else set()
    done = subprocess.run(_tune("--trials", "1", "--top-k", "1", "--launcher", "deepspeed", "--hostfile",
                                str(hostfile), "--out", str(tmp_path / "out"), "--json"),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["best"]["measurement"]["tokens_per_s"] > 0
    log = (tmp_path / "out" / "trials" / "0000" / "trial.log").read_text()
    assert "deepspeed.launcher.runner" in log.splitlines()[0] and "--no_ssh" in log.splitlines()[0]
    assert "ssh was called" not in log
    # DeepSpeed's runner sets LOCAL_SIZE, so each rank made a /dev/shm all-reduce segment and unlinked none
    assert "deepspeed_shm_comm_op built successfully" in log
    made = set(os.listdir(shm_leftovers.SHM_DIR)) - shm_before if shm_leftovers.SHM_DIR.is_dir() else set()
    assert not [n for n in made if n.startswith(shm_leftovers.PREFIX)], "the trial's segments were left in /dev/shm"


def test_bad_launcher_input_exits_2_before_any_trial(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    base = [arg for arg in BASE] + ["--trials", "1", "--out", str(out)]
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    assert main(["tune", *base, "--launcher", "slurm"]) == 2
    err = capsys.readouterr().err
    assert "not inside a SLURM allocation" in err and "sbatch is not on PATH" in err
    monkeypatch.undo()

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a.invalid slots=1\nnode-b.invalid slots=1\n")  # .invalid never resolves (RFC 2606)
    assert main(["tune", *base, "--launcher", "deepspeed", "--hostfile", str(hostfile)]) == 2
    err = capsys.readouterr().err
    assert "node-a.invalid, node-b.invalid do not resolve" in err

    hostfile.write_text("localhost slots=4\n")
    assert main(["tune", *base, "--launcher", "deepspeed", "--hostfile", str(hostfile)]) == 2
    assert "gives 4 slots" in capsys.readouterr().err
    assert main(["tune", *base, "--hostfile", str(hostfile)]) == 2
    assert "are for --launcher deepspeed, not torchrun" in capsys.readouterr().err
    assert not (out / "trials").exists()
