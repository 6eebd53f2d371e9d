"""The study's storage: claims of one plan by two workers, stale trials of dead tuners, storage URLs (SQLite,
PostgreSQL drivers), three processes creating one SQLite study at once."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState
from study_fakes import KEYS, FakeRunner, run  # tests/tune/ is on sys.path

from autotune.errors import InputError
from autotune.tune import study as study_mod
from autotune.tune.sampler import PARAM

def test_claim_conflict_gives_up_later_trial(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    s = optuna.create_study(storage=url, study_name="c", direction="maximize")
    dist = {PARAM: CategoricalDistribution(sorted(KEYS))}
    s.enqueue_trial({PARAM: KEYS[0]})
    s.enqueue_trial({PARAM: KEYS[0]})
    a, b = s.ask(dist), s.ask(dist)  # two workers that picked the same plan at the same instant
    assert study_mod.claim_conflict(s, a.number, KEYS[0]) is None
    assert study_mod.claim_conflict(s, b.number, KEYS[0]) == a.number


def test_a_worker_starting_up_leaves_a_trial_being_claimed_alone(tmp_path, monkeypatch):
    """A worker's start-up cleanup (fail_stale_trials) ran while another worker on this host was writing its new
    trial's attributes one by one; it took the trial, host written and pid not yet, for one whose tuner had died,
    and failed it under the live worker (UpdateFinishedTrialError in CI's PostgreSQL + SLURM test)."""
    import socket

    from autotune.tune import storage

    s = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s", direction="maximize")
    claiming, dead, gone_before_pid = s.ask(), s.ask(), s.ask()
    s._storage.set_trial_user_attr(claiming._trial_id, "host", socket.gethostname())  # pid not written yet
    s._storage.set_trial_user_attr(dead._trial_id, "host", socket.gethostname())
    s._storage.set_trial_user_attr(dead._trial_id, "pid", 2**22 + 12345)  # no such process
    assert storage.fail_stale_trials(s, all_running=False) == [dead.number]
    assert s._storage.get_trial(claiming._trial_id).state == TrialState.RUNNING
    # a trial with no pid long after it started: its tuner died before writing it
    monkeypatch.setattr(storage, "CLAIM_GRACE_S", -1.0)
    s._storage.set_trial_user_attr(gone_before_pid._trial_id, "host", socket.gethostname())
    assert set(storage.fail_stale_trials(s, all_running=False)) == {claiming.number, gone_before_pid.number}
    # the tuner writes its pid before its host, so a trial being claimed has no host of this machine yet
    written: list[str] = []
    real = optuna.trial.Trial.set_user_attr
    monkeypatch.setattr(optuna.trial.Trial, "set_user_attr",
                        lambda self, key, value: (written.append(key), real(self, key, value))[1])
    run(tmp_path / "t", monkeypatch, FakeRunner(), trials=1, top_k=1)
    assert written.index("pid") < written.index("host"), written


def test_bad_storage_url_is_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot open the storage"):
        study_mod.open_storage("postgresql://nobody@127.0.0.1:1/none")
    with pytest.raises(InputError, match="cannot open the storage"):
        study_mod.open_storage(f"sqlite:///{tmp_path}/no/such/dir/x.db")


@pytest.mark.slow
def test_three_processes_open_one_new_sqlite_study(tmp_path):
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'race.db'}"
    code = ("import sys, time; from autotune.tune.storage import open_storage, open_study; "
            "t = float(sys.argv[2]); time.sleep(max(0, t - time.time())); s = open_storage(sys.argv[1]); "
            "st = open_study(s, sys.argv[1], 'race', sampler=None, pruner=None, must_be_new=False); "
            "st.enqueue_trial({}); print('ok', len(st.trials))")
    start = str(__import__("time").time() + 4)  # after every interpreter has imported optuna
    procs = [subprocess.Popen([sys.executable, "-c", code, url, start], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and "IntegrityError" not in err, err[-2000:]
        assert out.startswith("ok")
    assert len(optuna.load_study(study_name="race", storage=url).trials) == 3


def test_postgresql_url_uses_the_installed_driver():
    import importlib.util

    from autotune.tune.storage import driver_url

    url = driver_url("postgresql://u@127.0.0.1:5432/db")
    if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
        assert url == "postgresql+psycopg2://u@127.0.0.1:5432/db"
    assert driver_url("postgresql+psycopg2://u@h/db") == "postgresql+psycopg2://u@h/db"
    assert driver_url("sqlite:///x.db") == "sqlite:///x.db"
