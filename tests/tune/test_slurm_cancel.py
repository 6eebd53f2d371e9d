"""`python -m autotune.tune.slurm_cancel` against a real single-node SLURM: it retries until the job has ended.

The trial's supervisor starts it when the trial is stopped. The case it exists for: slurmctld is too busy to
answer (here: frozen with SIGSTOP), so a single scancel fails; the canceller must keep at it and cancel the job
once slurmctld answers again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import slurm_cluster  # noqa: F401 - the session fixture

REPO = Path(__file__).resolve().parents[2]
FROZEN_S = 25  # longer than scancel's own wait for slurmctld (MessageTimeout, 10 s by default)


def _env(cluster) -> dict:
    env = cluster.env
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _state(cluster, job_id: str) -> str:
    out = cluster.run("scontrol", "--oneliner", "show", "job", job_id).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv).get("JobState", "")


def _submit_sleeper(cluster, tmp_path: Path, name: str = "autotune-cancel-test") -> str:
    job_id = cluster.run("sbatch", "--parsable", f"--job-name={name}", "--nodes=1", "--ntasks=1",
                         f"--output={tmp_path / 'job.log'}", f"--chdir={tmp_path}", "--wrap", "sleep 600"
                         ).stdout.strip().split(";")[0]
    deadline = time.monotonic() + 120
    while _state(cluster, job_id) != "RUNNING":
        assert time.monotonic() < deadline, f"job {job_id} never ran: {_state(cluster, job_id)}\n{cluster.log_tail()}"
        time.sleep(0.5)
    return job_id


@pytest.mark.slow
def test_cancel_outlasts_a_frozen_slurmctld(tmp_path, slurm_cluster):  # noqa: F811
    job_id = _submit_sleeper(slurm_cluster, tmp_path)
    ctld = slurm_cluster.pids["slurmctld"]
    os.kill(ctld, signal.SIGSTOP)
    try:
        # What a single attempt gets while slurmctld does not answer: scancel fails (or is still waiting).
        try:
            once = subprocess.run(["scancel", job_id], env=slurm_cluster.env, capture_output=True, text=True,
                                  timeout=FROZEN_S - 5)
            single_failed = once.returncode != 0
        except subprocess.TimeoutExpired:
            single_failed = True
        canceller = subprocess.Popen([sys.executable, "-m", "autotune.tune.slurm_cancel", "job", job_id],
                                     env=_env(slurm_cluster), cwd=tmp_path, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        time.sleep(5)
        assert canceller.poll() is None, "the canceller gave up while slurmctld was frozen"
    finally:
        os.kill(ctld, signal.SIGCONT)
    assert single_failed, "a single scancel reached a frozen slurmctld: this test no longer shows the retry"
    assert canceller.wait(timeout=180) == 0, canceller.stdout.read() if canceller.stdout else ""
    assert _state(slurm_cluster, job_id) in ("CANCELLED", "COMPLETING"), slurm_cluster.log_tail()


@pytest.mark.slow
def test_the_tuner_cancels_a_job_its_supervisor_never_learned_the_id_of(tmp_path, slurm_cluster, monkeypatch):  # noqa: F811
    """A trial's supervisor SIGKILLed while ``sbatch --wait`` was submitting (slower than the tuner's kill grace on a
    busy slurmctld) leaves a job nobody knows the id of; after stopping a trial the tuner cancels the trial's job by
    its unique name (``Slurm.after_stop`` -> ``slurm_cancel named``). Seen in CI: the job still RUNNING after Ctrl-C."""
    from autotune.specs.loading import load_cluster
    from autotune.specs.plan import ParallelPlan
    from autotune.specs.presets import load_model_preset
    from autotune.tune import launchers
    from autotune.tune.trial import TrialSpec, Workload

    spec = TrialSpec(model=load_model_preset("tiny-gpt"), cluster=load_cluster(gpu="cpu", num_gpus=2),
                     plan=ParallelPlan(dp=2, global_batch_size=2, seq_len=64), workload=Workload(kind="builtin"),
                     workdir=tmp_path / "trials" / "0002", launcher="slurm")
    job_id = _submit_sleeper(slurm_cluster, tmp_path, launchers.slurm_job_name(spec.workdir))  # as if sbatch got it in
    for key, value in _env(slurm_cluster).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)  # outside an allocation: one sbatch job per trial
    launchers.after_stop(spec)
    deadline = time.monotonic() + 120
    while _state(slurm_cluster, job_id) not in ("CANCELLED", "COMPLETING"):
        assert time.monotonic() < deadline, f"job {job_id}: {_state(slurm_cluster, job_id)}\n{slurm_cluster.log_tail()}"
        time.sleep(0.5)


def test_bad_arguments_exit_2():
    done = subprocess.run([sys.executable, "-m", "autotune.tune.slurm_cancel", "jobs"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage:" in done.stderr
