"""The tuning study without real trials: run_trial is replaced by a table keyed by plan.

Space: tiny-gpt on 2 cpu ranks, seq 64, global batch 8, deepspeed, tp = pp = 1,
ZeRO 0-3 x micro-batch 1,2,4 x recompute none/full x offload (what the planner keeps).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from autotune.cost.efficiency import DEFAULT_EFFICIENCY
from autotune.errors import InputError
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster, load_model
from autotune.tune import study as study_mod
from autotune.tune import trial as trial_mod
from autotune.tune.calibrate import FIT_FIELDS, StepMeasurement, calibrate, predict_step_time_s
from autotune.tune.sampler import DIMENSIONS, PARAM, PlanSampler, plan_key, plan_region, trial_key

MODEL = load_model("tiny-gpt")
CLUSTER = load_cluster(gpu="cpu", num_gpus=2)
CONSTRAINTS = SearchConstraints(tp=1, pp=1, cp=1, engines=("deepspeed",), recompute=("none", "full"),
                                max_micro_batch_size=4)
SEQ, GB = 64, 8
RANKED = search_plans(MODEL, CLUSTER, seq_len=SEQ, global_batch_size=GB, constraints=CONSTRAINTS, top_k=3).in_order
KEYS = [plan_key(e.plan) for e in RANKED]
DIST = CategoricalDistribution(sorted(KEYS))


def fake_step_time(plan) -> float:
    # Deterministic "measurement": bigger micro-batches amortise, recompute costs 30%, offload 20%.
    return 0.1 * (1 + 1 / plan.micro_batch_size) * (1.3 if plan.recompute == "full" else 1.0) * (
        1.2 if plan.offload_optimizer != "none" else 1.0) * (1 + 0.05 * plan.zero_stage)


class FakeRunner:
    """run_trial stand-in: outcome by (zero, micro-batch, recompute, offload); records each call."""

    def __init__(self, outcomes: dict | None = None, default: str = "completed") -> None:
        self.outcomes = outcomes or {}
        self.default = default
        self.calls: list[str] = []

    def __call__(self, spec, on_step=None, on_phase=None, on_launch=None):
        p = spec.plan
        self.calls.append(plan_key(p))
        status = self.outcomes.get((p.zero_stage, p.micro_batch_size, p.recompute, p.offload_optimizer), self.default)
        spec.workdir.mkdir(parents=True, exist_ok=True)
        log = spec.workdir / "trial.log"
        log.write_text(f"fake {status}\n")
        t = fake_step_time(p)
        if status == "pruned":
            t *= 10
        if on_step is not None:
            for i in range(1, spec.warmup_steps + spec.steps + 1):
                if on_step(i, t):
                    return trial_mod.TrialResult(status="pruned", reason="pruned at step %d" % i, log_path=log)
        if status == "completed" or status == "pruned":
            tokens = p.global_batch_size * p.seq_len / t
            return trial_mod.TrialResult(status="completed", reason="", log_path=log, step_time_s=t,
                                         tokens_per_s=tokens, tflops_per_gpu=0.01, peak_memory_bytes=10**8,
                                         step_times_s=(t,) * spec.steps, returncode=0)
        reason = {"oom": "host memory 1.2 GiB over the limit 1.0 GiB", "crashed": "exit code 1: RuntimeError: boom",
                  "hung": "no progress within the 1 s timeout; killed"}[status]
        return trial_mod.TrialResult(status=status, reason=reason, log_path=log, returncode=1)


def run(tmp_path: Path, monkeypatch, runner: FakeRunner, **kw):
    monkeypatch.setattr(trial_mod, "run_trial", runner)
    # The fake runner starts no DeepSpeed: no op to build (a fresh machine would JIT-build two for minutes).
    monkeypatch.setattr(study_mod.ops, "ensure_ops", lambda names, **_: {name: "cached" for name in names})
    args = dict(seq_len=SEQ, global_batch=GB, constraints=CONSTRAINTS, workload=trial_mod.Workload(kind="builtin"),
                out_dir=tmp_path / "out", trials=4, top_k=3, steps=2, warmup_steps=1, finalists=0)
    args.update(kw)
    return study_mod.tune(MODEL, CLUSTER, **args)


def test_planner_top_k_first_in_planner_order(tmp_path, monkeypatch):
    runner = FakeRunner()
    run(tmp_path, monkeypatch, runner, trials=3, top_k=3)
    assert runner.calls == KEYS[:3]


@pytest.mark.slow  # 13 s: every feasible plan through the sampler
def test_sampler_never_proposes_infeasible_or_duplicate(tmp_path, monkeypatch):
    runner = FakeRunner()
    # ask for more trials than candidates: the study stops when every plan is measured
    result = run(tmp_path, monkeypatch, runner, trials=len(KEYS) + 5, top_k=2)
    assert sorted(runner.calls) == sorted(KEYS)  # every feasible plan once, nothing else
    assert len(set(runner.calls)) == len(runner.calls)
    # the fake's slow plans (> 1.5x the best step time) are pruned, the rest complete
    assert set(result.state_counts) <= {"complete", "pruned"}
    assert sum(result.state_counts.values()) == len(KEYS)
    assert result.best.value == max(t.value for t in result.trials if t.value is not None)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(KEYS) - 1),
                          st.sampled_from(["complete", "fail", "pruned", "running", "interrupted"])), max_size=40))
def test_sampler_next_key_is_a_free_candidate(claims):
    sampler = PlanSampler(KEYS, top_k=3, regions={k: plan_region(e.plan) for k, e in zip(KEYS, RANKED)})
    state = {"complete": TrialState.COMPLETE, "fail": TrialState.FAIL, "pruned": TrialState.PRUNED,
             "running": TrialState.RUNNING, "interrupted": TrialState.FAIL}
    trials = []
    for n, (i, kind) in enumerate(claims):
        attrs = {"status": "interrupted"} if kind == "interrupted" else {}
        trials.append(optuna.trial.FrozenTrial(
            number=n, state=state[kind], value=1.0 if kind == "complete" else None, datetime_start=None,
            datetime_complete=None, params={PARAM: KEYS[i]}, distributions={PARAM: DIST}, user_attrs=attrs,
            system_attrs={}, intermediate_values={}, trial_id=n))
    held = {KEYS[i] for i, kind in claims if kind != "interrupted"}
    key = sampler.next_key(trials)
    if len(held) == len(KEYS):
        assert key is None
    else:
        assert key in KEYS and key not in held
        untried_top = [k for k in KEYS[:3] if k not in held]
        if untried_top:
            assert key == untried_top[0]  # planner order first


def test_every_failure_state_recorded_and_study_goes_on(tmp_path, monkeypatch):
    plans = [e.plan for e in RANKED]
    outcome_of = {}
    for status, plan in zip(("oom", "crashed", "hung"), plans[:3]):
        outcome_of[(plan.zero_stage, plan.micro_batch_size, plan.recompute, plan.offload_optimizer)] = status
    runner = FakeRunner(outcome_of)
    result = run(tmp_path, monkeypatch, runner, trials=6, top_k=3)
    by_status = {t.user_attrs.get("status"): t for t in result.trials}
    for status in ("oom", "crashed", "hung"):
        t = by_status[status]
        assert t.state == TrialState.FAIL
        assert t.user_attrs["reason"]
        assert Path(t.user_attrs["log_path"]).is_file()
        assert t.user_attrs["plan"]
    completed = [t for t in result.trials if t.state == TrialState.COMPLETE]
    assert completed and all(t.number > 2 for t in completed)  # the study went on after three failures
    for t in completed:
        assert set(t.user_attrs["measurement"]) >= {"step_time_s", "tokens_per_s", "peak_memory_bytes"}
        assert t.user_attrs["predicted"]["step_time_s"] > 0


def test_slow_trial_is_pruned(tmp_path, monkeypatch):
    slow = RANKED[1].plan
    runner = FakeRunner({(slow.zero_stage, slow.micro_batch_size, slow.recompute, slow.offload_optimizer): "pruned"})
    result = run(tmp_path, monkeypatch, runner, trials=3, top_k=3)
    assert result.trials[1].state == TrialState.PRUNED
    assert result.trials[1].intermediate_values  # reported step times


def test_all_fail_says_why_and_cli_exits_1(tmp_path, monkeypatch, capsys):
    runner = FakeRunner(default="crashed")
    result = run(tmp_path, monkeypatch, runner, trials=3)
    assert result.best is None
    assert "no trial completed" in result.failure_summary and "RuntimeError: boom" in result.failure_summary

    from autotune.cli import main

    rc = main(["tune", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64",
               "--global-batch", "8", "--tp", "1", "--pp", "1", "--recompute", "none,full", "--max-micro-batch", "4",
               "--trials", "2", "--out", str(tmp_path / "cli"), "--json"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "RuntimeError: boom" in err
    # the records are kept
    s = optuna.load_study(study_name="autotune", storage=f"sqlite:///{tmp_path / 'cli' / 'study.db'}")
    assert len(s.trials) == 2


def test_resume_after_kill(tmp_path, monkeypatch):
    runner = FakeRunner()
    first = run(tmp_path, monkeypatch, runner, trials=2, top_k=3)
    finished = {t.number: (trial_key(t), t.value) for t in first.trials}
    # Simulate a tuner killed with SIGKILL mid-trial: a trial left RUNNING with the 3rd plan.
    url = f"sqlite:///{(tmp_path / 'out' / 'study.db').resolve()}"
    s = optuna.load_study(study_name="autotune", storage=url)
    t = s.ask()
    s2 = optuna.load_study(study_name="autotune", storage=url)
    stuck = s2._storage.get_trial(t._trial_id)
    assert stuck.state == TrialState.RUNNING
    s2._storage.set_trial_user_attr(t._trial_id, PARAM, KEYS[2])  # the next planned plan
    s2._storage.set_trial_user_attr(t._trial_id, "host", "elsewhere")
    s2._storage.set_trial_user_attr(t._trial_id, "pid", 1)
    stuck_key = KEYS[2]

    with pytest.raises(InputError):  # an existing study needs --resume or --worker
        run(tmp_path, monkeypatch, FakeRunner(), trials=4)
    runner2 = FakeRunner()
    second = run(tmp_path, monkeypatch, runner2, trials=4, top_k=3, resume=True)
    trials = {t.number: t for t in second.trials}
    assert trials[t.number].state == TrialState.FAIL
    assert trials[t.number].user_attrs["status"] == "interrupted"
    for number, (key, value) in finished.items():  # nothing finished was lost or rerun
        assert trial_key(trials[number]) == key and trials[number].value == value
        assert key not in runner2.calls
    counted = [x for x in second.trials if x.user_attrs.get("status") != "interrupted"]
    assert len(counted) == 4
    assert len({trial_key(x) for x in counted}) == 4
    assert stuck_key in KEYS  # the interrupted plan is free again (it may be picked)


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


def test_cli_bad_input_exits_2(tmp_path, capsys):
    from autotune.cli import main

    base = ["tune", "--model", "tiny-gpt", "--gpu", "cpu", "--seq-len", "64", "--out", str(tmp_path / "o")]
    assert main(base + ["--num-gpus", "2", "--workload", "script", "--script", str(tmp_path / "nope.py")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.py"
    bad.write_text("def broken(:\n")
    assert main(base + ["--num-gpus", "2", "--workload", "script", "--script", str(bad)]) == 2
    assert "does not compile" in capsys.readouterr().err
    assert main(base + ["--num-gpus", "100000"]) == 2
    assert "CPU ranks" in capsys.readouterr().err
    assert main(base + ["--num-gpus", "2", "--storage", "postgresql://x@127.0.0.1:1/db"]) == 2
    assert "cannot open the storage" in capsys.readouterr().err


def test_calibration_recovers_known_efficiency(tmp_path):
    # Synthetic measurements from known parameters (hbm_efficiency kept at its default: on
    # tiny-gpt memory-bound kernels are ~1% of a step, too little to identify it).
    true = DEFAULT_EFFICIENCY.with_(gemm_peak_fraction=0.3, gemm_half_dim=150.0)
    ms = []
    for i, e in enumerate(RANKED):
        probe = StepMeasurement(model=MODEL, cluster=CLUSTER, plan=e.plan, step_time_s=1.0)
        ms.append(dataclasses.replace(probe, step_time_s=predict_step_time_s(probe, true), label=str(i)))
    path = tmp_path / "cal.json"
    report = calibrate(ms, DEFAULT_EFFICIENCY, str(path))
    assert report.median_error_before > 0.5 and report.median_error_after < 0.02
    for name in ("gemm_peak_fraction", "gemm_half_dim"):
        assert math.isclose(getattr(report.after, name), getattr(true, name), rel_tol=0.10), name
    from autotune.cost.efficiency import load_efficiency

    assert load_efficiency(str(path)) == report.after  # estimate/plan can read it back
    assert set(json.loads(path.read_text())) >= set(FIT_FIELDS)


def test_ctrl_c_marks_trial_interrupted_and_study_resumes(tmp_path, monkeypatch):
    class Interrupting(FakeRunner):
        def __call__(self, spec, on_step=None, **kw):
            if len(self.calls) == 1:  # second trial: Ctrl-C (run_trial has killed its processes)
                self.calls.append(plan_key(spec.plan))
                raise KeyboardInterrupt
            return super().__call__(spec, on_step, **kw)

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, monkeypatch, Interrupting(), trials=3)
    url = f"sqlite:///{(tmp_path / 'out' / 'study.db').resolve()}"
    t1 = optuna.load_study(study_name="autotune", storage=url).trials[1]
    assert t1.state == TrialState.FAIL and t1.user_attrs["status"] == "interrupted"
    runner = FakeRunner()
    result = run(tmp_path, monkeypatch, runner, trials=3, resume=True)
    # Three trials end (the fake runner's slow plans are pruned: which ones run depends on the planner's order) and
    # the interrupted one stays recorded as such.
    assert result.state_counts["interrupted"] == 1 and set(result.state_counts) <= {"complete", "pruned", "interrupted"}
    assert result.state_counts.get("complete", 0) + result.state_counts.get("pruned", 0) == 3
    assert trial_key(t1) in runner.calls  # the interrupted plan is measured again


def test_each_dimension_is_an_optuna_parameter(tmp_path, monkeypatch):
    result = run(tmp_path, monkeypatch, FakeRunner(), trials=6, top_k=3, prune_ratio=None)
    done = [t for t in result.trials if t.state == TrialState.COMPLETE]
    assert len(done) == 6
    for t in done:
        assert set(t.params) == set(DIMENSIONS)
        plan = next(e.plan for e in RANKED if plan_key(e.plan) == trial_key(t))
        assert t.params["zero_stage"] == plan.zero_stage and t.params["micro_batch_size"] == plan.micro_batch_size
        assert t.params["recompute"] == plan.recompute and t.params["engine"] == plan.engine
        assert t.user_attrs[PARAM] == t.system_attrs[PARAM] == trial_key(t)
    # what optuna-dashboard's importance view computes
    study = optuna.load_study(study_name="autotune", storage=f"sqlite:///{(tmp_path / 'out' / 'study.db').resolve()}")
    importances = optuna.importance.get_param_importances(
        study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    assert set(importances) <= set(DIMENSIONS) and "micro_batch_size" in importances
    assert result.calibration_path == str(tmp_path / "out" / "cal.json")
    assert (tmp_path / "out" / "cal.json").is_file()  # written by default


def test_finalists_rerun_alternately_and_winner_on_median(tmp_path, monkeypatch):
    class Lucky(FakeRunner):
        """The planner's first plan is measured 2x too fast once (a lucky trial); its re-runs are honest."""

        def __call__(self, spec, on_step=None, **kw):
            r = super().__call__(spec, on_step, **kw)
            if self.calls.count(KEYS[0]) == 1 and plan_key(spec.plan) == KEYS[0] and r.tokens_per_s:
                r = dataclasses.replace(r, tokens_per_s=r.tokens_per_s * 2, step_time_s=r.step_time_s / 2)
            return r

    runner = Lucky()
    result = run(tmp_path, monkeypatch, runner, trials=4, top_k=4, prune_ratio=None, finalists=3, finalist_runs=2)
    singles = sorted((t for t in result.trials if t.state == TrialState.COMPLETE), key=lambda t: -t.value)
    assert trial_key(singles[0]) == KEYS[0]  # the lucky measurement is the best single trial
    finalist_keys = [trial_key(t) for t in singles[:3]]
    assert runner.calls[4:] == finalist_keys * 2  # interleaved: A B C A B C
    assert len(result.finalists) == 3
    for f in result.finalists:
        assert len(f.runs_tokens_per_s) == 2 and f.median == pytest.approx(f.measured[0])
        assert f.spread == pytest.approx(0.0)
    honest = {k: next(e.plan for e in RANKED if plan_key(e.plan) == k) for k in finalist_keys}
    want = min(finalist_keys, key=lambda k: fake_step_time(honest[k]))
    assert trial_key(result.best) == want  # the best median of honest re-runs, not the lucky single trial
    # resumed: the re-runs are recorded in the study, not repeated
    again = FakeRunner()
    resumed = run(tmp_path, monkeypatch, again, trials=4, top_k=4, prune_ratio=None, finalists=3, finalist_runs=2,
                  resume=True)
    assert again.calls == [] and trial_key(resumed.best) == trial_key(result.best)


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


@pytest.mark.parametrize("flags, says", [
    (["--trials", "0"], "--trials must be >= 1"), (["--trials", "-1"], "--trials must be >= 1"),
    (["--timeout", "-1"], "--timeout must be > 0"), (["--steps", "0"], "--steps must be >= 1"),
    (["--trial-timeout", "0"], "--trial-timeout must be > 0"), (["--num-layers", "0"], "--num-layers must be >= 1"),
    (["--num-layers", str(10**12)], "tiny-gpt has 4 layers"),
    (["--workload", "command", "--command", "true", "--metric-pattern", "(x"], "not a valid regex"),
    (["--calibration", "/nope/dir/cal.json"], "'/nope/dir' does not exist"),
    (["--max-micro-batch", "0"], "--max-micro-batch must be >= 1"),
    (["--out", "FILE"], "is a file, not a folder"), (["--finalist-runs", "1"], "--finalist-runs must be >= 2"),
])
def test_every_tune_flag_checked_before_the_study(tmp_path, capsys, flags, says):
    from autotune.cli import main

    afile = tmp_path / "afile"
    afile.write_text("x")
    out = ["--out", str(tmp_path / "o")] if "--out" not in flags else []
    flags = [str(afile) if f == "FILE" else f for f in flags]
    rc = main(["tune", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64", *out, *flags])
    assert rc == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()  # no study was created


@pytest.mark.parametrize("scale", [1e-6, 1e6], ids=["impossibly-fast", "impossibly-slow"])
def test_a_degenerate_calibration_stays_within_what_a_calibration_file_may_hold(tmp_path, scale):
    # Measurements a million times off the model push the fit to the edge of the range; what it writes must
    # still load (load_efficiency refuses values outside cost.efficiency.BOUNDS; the fit used to clip at e^30).
    from autotune.cost.efficiency import BOUNDS, load_efficiency

    ms = []
    for i, e in enumerate(RANKED[:4]):
        probe = StepMeasurement(model=MODEL, cluster=CLUSTER, plan=e.plan, step_time_s=1.0)
        ms.append(dataclasses.replace(probe, step_time_s=predict_step_time_s(probe, DEFAULT_EFFICIENCY) * scale,
                                      label=str(i)))
    path = tmp_path / "cal.json"
    report = calibrate(ms, DEFAULT_EFFICIENCY, str(path))
    for name, (lo, hi, _) in BOUNDS.items():
        assert lo <= getattr(report.after, name) <= hi, name
    assert load_efficiency(str(path)) == report.after
