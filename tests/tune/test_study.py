"""The tuning study without real trials (tests/tune/study_fakes.py): planner order first, the sampler, every failure
state, pruning, resume after a kill or Ctrl-C, Optuna parameters, finalists re-run. Storage is in
test_study_storage.py, flag checks in test_study_input_checks.py, calibration in test_study_calibration.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.trial import TrialState
from study_fakes import (CONSTRAINTS, DIST, KEYS, RANKED, SEQ, FakeRunner,  # tests/tune/ is on sys.path
                         fake_step_time, run)

from autotune.errors import InputError
from autotune.tune.sampler import DIMENSIONS, PARAM, PlanSampler, plan_key, plan_region, trial_key

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
    result = run(tmp_path, monkeypatch, runner, trials=3, top_k=3, steps=3)
    assert result.trials[1].state == TrialState.PRUNED
    assert result.trials[1].intermediate_values  # reported step times


def test_a_trial_is_not_pruned_at_its_last_step(tmp_path, monkeypatch):
    """Two measured steps at least before pruning, and none after the last: with --steps 2 the pruner fired only
    at the last step, discarding a finished measurement (its RESULT already printed) from the table and the fit."""
    slow = RANKED[1].plan
    runner = FakeRunner({(slow.zero_stage, slow.micro_batch_size, slow.recompute, slow.offload_optimizer): "pruned"})
    result = run(tmp_path, monkeypatch, runner, trials=3, top_k=3, steps=2)
    assert result.trials[1].state == TrialState.COMPLETE and result.trials[1].value


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


@pytest.mark.parametrize("change, said", [({"seq_len": SEQ * 2}, "seq_len"), ({"num_layers": 1}, "num_layers"),
                                          ({"steps": 3}, "steps"),
                                          ({"constraints": dataclasses.replace(CONSTRAINTS, recompute=("none",))},
                                           "search")])
def test_resume_refuses_another_job(change, said, tmp_path, monkeypatch):
    """A --resume asking another shape, search or workload crashed (a trial's plan not among this search's) or
    reported the other job's measurement as this one's; it is refused, naming what changed."""
    run(tmp_path, monkeypatch, FakeRunner(), trials=2)
    runner = FakeRunner()
    with pytest.raises(InputError) as err:
        run(tmp_path, monkeypatch, runner, trials=3, resume=True, **change)
    assert said in str(err.value) and "measures another job" in str(err.value) and runner.calls == []
    assert len(run(tmp_path, monkeypatch, FakeRunner(), trials=3, resume=True).trials) == 3  # the same job goes on
