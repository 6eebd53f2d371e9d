"""`autotune tune` for real: tiny-gpt on 2 cpu ranks (gloo, real DeepSpeed), SQLite and PostgreSQL.

Space: ZeRO 0-3 x micro-batch 1,2,4 x recompute none/full (x the offload the planner keeps),
deepspeed, tp = pp = 1, seq 64, global batch 8 (mb 4 x dp 2 = 8), trials cut to 2 layers.
Failures are injected through the test-only hook AUTOTUNE_TUNE_TEST_OVERRIDES (see
autotune/tune/study.py): trial 1 gets a 2 s timeout (-> hung), trial 2 a 50 MB host-memory
limit (-> oom: python + torch alone exceed it).
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

REPO = Path(__file__).resolve().parents[2]
BASE = ["--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64", "--global-batch", "8",
        "--tp", "1", "--pp", "1", "--framework", "deepspeed", "--recompute", "none,full", "--max-micro-batch", "4",
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


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the tuner, then the trial processes it leaves behind (they run in their own session)."""
    parent = psutil.Process(proc.pid)
    children = parent.children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def test_study_states_and_resume_after_sigkill(tmp_path):
    out = tmp_path / "out"
    url = f"sqlite:///{out / 'study.db'}"
    cmd = _tune("--trials", "8", "--top-k", "3", "--steps", "3", "--warmup-steps", "1", "--out", str(out))
    overrides = json.dumps({"1": {"timeout_s": 2}, "2": {"host_memory_limit_bytes": 50_000_000}})
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(AUTOTUNE_TUNE_TEST_OVERRIDES=overrides), stdout=log,
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 400
    before: dict[int, tuple] = {}
    try:
        while time.monotonic() < deadline:
            time.sleep(1)
            assert proc.poll() is None, (tmp_path / "first.log").read_text()
            if not (out / "study.db").exists():
                continue
            try:
                trials = optuna.load_study(study_name="autotune", storage=url).get_trials()
            except Exception:  # noqa: BLE001 - the study is not created yet
                continue
            finished = [t for t in trials if t.state.is_finished()]
            if len(finished) >= 3 and any(t.state == TrialState.RUNNING for t in trials):
                before = {t.number: (t.state, t.value, t.params["plan_key"], t.user_attrs.get("status"))
                          for t in finished}
                break
        else:
            pytest.fail("the tuner did not finish 3 trials in time:\n" + (tmp_path / "first.log").read_text())
    finally:
        _kill_tree(proc)
        log.close()

    s = optuna.load_study(study_name="autotune", storage=url)
    assert any(t.state == TrialState.RUNNING for t in s.trials)  # what the kill left behind
    assert before[1][3] == "hung" and before[1][0] == TrialState.FAIL
    assert before[2][3] == "oom" and before[2][0] == TrialState.FAIL
    assert before[0][0] == TrialState.COMPLETE

    done = subprocess.run(_tune("--trials", "8", "--top-k", "3", "--steps", "3", "--warmup-steps", "1", "--out",
                                str(out), "--resume", "--json", "--calibration", str(out / "cal.json")),
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    trials = optuna.load_study(study_name="autotune", storage=url).get_trials()
    by_number = {t.number: t for t in trials}
    for number, (state, value, key, status) in before.items():  # nothing finished was lost or changed
        t = by_number[number]
        assert (t.state, t.value, t.params["plan_key"], t.user_attrs.get("status")) == (state, value, key, status)
    interrupted = [t for t in trials if t.user_attrs.get("status") == "interrupted"]
    assert len(interrupted) == 1 and interrupted[0].state == TrialState.FAIL
    counted = [t for t in trials if _counted(t)]
    assert len(counted) == 8
    assert len({t.params["plan_key"] for t in counted}) == 8  # no plan ran twice
    assert not any(t.state == TrialState.RUNNING for t in trials)
    for t in trials:
        if t.state == TrialState.FAIL:
            assert t.user_attrs["reason"]
            if t.user_attrs["status"] != "interrupted":
                assert Path(t.user_attrs["log_path"]).is_file()
    assert doc["best"]["measurement"]["tokens_per_s"] > 0
    assert doc["states"]["complete"] >= 1 and doc["states"]["hung"] == 1 and doc["states"]["oom"] == 1
    assert (Path(doc["winner_dir"]) / "plan.md").read_text().count("Measured") >= 1
    assert (out / "cal.json").is_file() and (out / "history.png").is_file()


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
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
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
    trials = optuna.load_study(study_name="shared", storage=postgres_url).get_trials()
    counted = [t for t in trials if _counted(t)]
    assert 4 <= len(counted) <= 5  # the budget; two workers asking at the same instant may add one
    keys = [t.params["plan_key"] for t in counted]
    assert len(set(keys)) == len(keys), "a plan ran twice"
    assert len({t.user_attrs["pid"] for t in counted}) == 2, "both workers ran trials"
    assert not any(t.state == TrialState.RUNNING for t in trials)
