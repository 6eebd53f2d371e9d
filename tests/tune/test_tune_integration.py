"""`autotune tune` for real: tiny-gpt on 2 cpu ranks (gloo, real DeepSpeed), SQLite and PostgreSQL.

Space: ZeRO 0-3 x micro-batch 1,2,4 x recompute none/full (x the offload the planner keeps),
deepspeed, tp = pp = 1, seq 64, global batch 8 (mb 4 x dp 2 = 8), trials cut to 2 layers.
Failures are injected through the test-only hook AUTOTUNE_TUNE_TEST_OVERRIDES (see
autotune/tune/study.py): trial 1 gets a 2 s timeout (-> hung), trial 2 a 50 MB host-memory
limit (-> oom: python + torch alone exceed it), and the trial running when the tuner is killed
gets 500 steps, so that it is still running when the next tuner starts.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.trial import TrialState

pytestmark = pytest.mark.slow  # runs `autotune tune` (torchrun trials, PostgreSQL) in subprocesses
REPO = Path(__file__).resolve().parents[2]
BASE = ["--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64", "--global-batch", "8",
        "--tp", "1", "--pp", "1", "--cp", "1", "--engine", "deepspeed", "--recompute", "none,full", "--max-micro-batch", "4",
        "--num-layers", "2", "--trial-timeout", "180"]


def _tune(*args: str, env: dict | None = None) -> list[str]:
    return [sys.executable, "-m", "autotune", "tune", *BASE, *args]


def _env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def _counted(t) -> bool:
    return t.state != TrialState.RUNNING and t.user_attrs.get("status") not in ("interrupted", "duplicate")


def _trial_processes(record: dict) -> list[psutil.Process]:
    """The live processes of a trial's launch record (its pids and their process groups: torchrun starts
    each rank in a session of its own)."""
    groups = set(record["pgids"])
    out = []
    for p in psutil.process_iter():
        try:
            if (os.getpgid(p.pid) in groups or [p.pid, p.create_time()] in record["procs"]) \
                    and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            pass
    return out


def _end(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def _running_trial(url: str, name: str = "autotune"):
    """A RUNNING trial whose launch record is stored and whose processes are alive, else None."""
    try:
        trials = optuna.load_study(study_name=name, storage=url).get_trials()
    except Exception:  # noqa: BLE001 - the study is not created yet
        return None, []
    for t in trials:
        if t.state == TrialState.RUNNING and t.user_attrs.get("launch") and _trial_processes(t.user_attrs["launch"]):
            return t, trials
    return None, trials


def test_study_states_and_resume_after_sigkill(tmp_path):
    out = tmp_path / "out"
    url = f"sqlite:///{out / 'study.db'}"
    cmd = _tune("--trials", "8", "--top-k", "3", "--steps", "3", "--warmup-steps", "1", "--out", str(out),
                "--finalists", "0")
    overrides = json.dumps({"1": {"timeout_s": 2}, "2": {"host_memory_limit_bytes": 50_000_000},
                            "3": {"steps": 500}})
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(AUTOTUNE_TUNE_TEST_OVERRIDES=overrides), stdout=log,
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 400
    before: dict[int, tuple] = {}
    left: list[psutil.Process] = []
    try:
        while time.monotonic() < deadline:
            time.sleep(1)
            assert proc.poll() is None, (tmp_path / "first.log").read_text()
            running, trials = _running_trial(url)
            finished = [t for t in trials if t.state.is_finished()]
            if running is not None and len(finished) >= 3:
                before = {t.number: (t.state, t.value, t.user_attrs["plan_key"], t.user_attrs.get("status"))
                          for t in finished}
                record = running.user_attrs["launch"]
                break
        else:
            pytest.fail("the tuner did not finish 3 trials in time:\n" + (tmp_path / "first.log").read_text())
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # the tuner only: its trial runs on, in its own session
        proc.wait()
        log.close()
    try:
        left = _trial_processes(record)
        assert left, "the killed tuner's trial should still be running"
        s = optuna.load_study(study_name="autotune", storage=url)
        assert any(t.state == TrialState.RUNNING for t in s.trials)  # what the kill left behind
        assert before[1][3] == "hung" and before[1][0] == TrialState.FAIL
        assert before[2][3] == "oom" and before[2][0] == TrialState.FAIL
        assert before[0][0] == TrialState.COMPLETE

        done = subprocess.run(_tune("--trials", "8", "--top-k", "3", "--steps", "3", "--warmup-steps", "1", "--out",
                                    str(out), "--resume", "--json", "--finalists", "2", "--finalist-runs", "2"),
                              cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
        assert not [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], \
            "--resume left the killed tuner's trial running"
    finally:
        _end(left)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    trials = optuna.load_study(study_name="autotune", storage=url).get_trials()
    by_number = {t.number: t for t in trials}
    for number, (state, value, key, status) in before.items():  # nothing finished was lost or changed
        t = by_number[number]
        assert (t.state, t.value, t.user_attrs["plan_key"], t.user_attrs.get("status")) == (state, value, key, status)
    interrupted = [t for t in trials if t.user_attrs.get("status") == "interrupted"]
    assert len(interrupted) == 1 and interrupted[0].state == TrialState.FAIL
    assert "were still running and were ended" in interrupted[0].user_attrs["reason"]
    counted = [t for t in trials if _counted(t)]
    assert len(counted) == 8
    assert len({t.user_attrs["plan_key"] for t in counted}) == 8  # no plan ran twice
    assert not any(t.state == TrialState.RUNNING for t in trials)
    for t in trials:
        if t.state == TrialState.FAIL:
            assert t.user_attrs["reason"]
            if t.user_attrs["status"] != "interrupted":
                assert Path(t.user_attrs["log_path"]).is_file()
        if t.state == TrialState.COMPLETE:
            assert {"zero_stage", "micro_batch_size", "offload", "recompute"} <= set(t.params)
    assert doc["best"]["measurement"]["tokens_per_s"] > 0
    assert doc["states"]["complete"] >= 1 and doc["states"]["hung"] == 1 and doc["states"]["oom"] == 1
    # the winner: the better median of two finalists re-run twice each, alternately (when two plans completed;
    # the others may have been pruned as slow)
    if doc["states"]["complete"] >= 2:
        assert len(doc["finalists"]) == 2 and all(len(f["rerun_tokens_per_s"]) == 2 for f in doc["finalists"])
        assert doc["best"]["trial"] == doc["finalists"][0]["trial"]
        assert doc["finalists"][0]["median"] >= doc["finalists"][1]["median"]
        assert "spread" in done.stderr  # the finalists' table
    else:
        assert doc["finalists"] == []
    assert (Path(doc["winner_dir"]) / "plan.md").read_text().count("Measured") >= 1
    assert doc["calibration_path"] == str(out / "cal.json") and (out / "cal.json").is_file()  # by default
    assert (out / "history.png").is_file()


def test_sigterm_ends_every_trial_process(tmp_path):
    out = tmp_path / "out"
    url = f"sqlite:///{out / 'study.db'}"
    proc = subprocess.Popen(_tune("--trials", "2", "--steps", "2", "--warmup-steps", "1", "--out", str(out)),
                            cwd=REPO, env=_env(AUTOTUNE_TUNE_TEST_OVERRIDES=json.dumps({"0": {"steps": 500}})),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    running = None
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            running, _ = _running_trial(url)
            if running is not None and len(_trial_processes(running.user_attrs["launch"])) >= 3:
                break  # torchrun and its two ranks
        else:
            pytest.fail(proc.communicate(timeout=60)[0][-3000:])
        proc.send_signal(signal.SIGTERM)  # what timeout, kill and scancel send
        text = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    try:
        assert proc.returncode == 143, text[-3000:]
        assert "Traceback" not in text and "SIGTERM" in text
        assert not _trial_processes(running.user_attrs["launch"]), "a trial process outlived the tuner"
        t = optuna.load_study(study_name="autotune", storage=url).trials[running.number]
        assert t.state == TrialState.FAIL and t.user_attrs["status"] == "interrupted"
        assert "SIGTERM" in t.user_attrs["reason"]
    finally:
        _end(_trial_processes(running.user_attrs["launch"]))


# --------------------------------------------------------------------------------------------- PostgreSQL


def _pg_bin() -> Path | None:
    exe = shutil.which("pg_ctl")
    if exe:
        return Path(os.path.realpath(exe)).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def postgres_url():
    bindir = _pg_bin()
    if bindir is None:
        if os.environ.get("CI") == "true":
            pytest.fail("PostgreSQL binaries (pg_ctl, initdb) are missing: .ci/run installs them")
        pytest.skip("PostgreSQL binaries (pg_ctl, initdb) are not installed")
    root = Path(tempfile.mkdtemp(prefix="autotune-pg-", dir="/tmp"))
    data = root / "data"
    as_user: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root
        shutil.chown(root, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    run = lambda *a: subprocess.run(as_user + list(a), check=True, capture_output=True, text=True)  # noqa: E731
    run(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust")
    run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w", "-o",
        f"-c listen_addresses=127.0.0.1 -p {port} -k {root}", "start")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"  # the README's form (psycopg2 is installed)
    finally:
        subprocess.run(as_user + [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_two_workers_share_a_postgres_study(tmp_path, postgres_url):
    cmd = lambda name: _tune("--trials", "4", "--top-k", "2", "--steps", "2", "--warmup-steps", "1",  # noqa: E731
                             "--storage", postgres_url, "--study-name", "shared", "--worker",
                             "--out", str(tmp_path / name))
    procs = [subprocess.Popen(cmd(n), cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for n in ("a", "b")]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for p, text in zip(procs, outputs):
        assert p.returncode == 0, text[-3000:]
    from autotune.tune.storage import driver_url

    trials = optuna.load_study(study_name="shared", storage=driver_url(postgres_url)).get_trials()
    counted = [t for t in trials if _counted(t)]
    assert 4 <= len(counted) <= 5  # the budget; two workers asking at the same instant may add one
    keys = [t.user_attrs["plan_key"] for t in counted]
    assert len(set(keys)) == len(keys), "a plan ran twice"
    assert len({t.user_attrs["pid"] for t in counted}) == 2, "both workers ran trials"
    assert not any(t.state == TrialState.RUNNING for t in trials)


def test_study_measures_tensor_and_pipeline_parallel_plans(tmp_path):
    # tiny-llama (AutoTP builds a transformers Llama) on 2 gloo ranks: tp=2 (AutoTP), pp=2 (PipelineModule)
    # and dp=2, every plan measured (no pruning), each under the engine's own trainer or the builtin loop
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "autotune", "tune", "--model", "tiny-llama", "--gpu", "cpu",
                           "--num-gpus", "2", "--seq-len", "64", "--global-batch", "8", "--micro-batch", "2",
                           "--zero", "1", "--no-offload", "--recompute", "none", "--cp", "1", "--num-layers", "2",
                           "--trials", "3", "--top-k", "3", "--steps", "2", "--warmup-steps", "1",
                           "--prune-ratio", "0", "--finalists", "0", "--trial-timeout", "240", "--json",
                           "--out", str(out)], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = optuna.load_study(study_name="autotune", storage=f"sqlite:///{out / 'study.db'}").get_trials()
    measured = {(t.params["tp"], t.params["pp"]): t for t in trials if t.state == TrialState.COMPLETE}
    assert {(2, 1), (1, 2)} <= set(measured), [(t.params, t.user_attrs.get("reason")) for t in trials]
    for t in measured.values():
        assert t.value > 0 and t.user_attrs["measurement"]["step_time_s"] > 0
