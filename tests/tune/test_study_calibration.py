"""Calibration from a study's measurements: known efficiency parameters are recovered; a degenerate fit stays
within what a calibration file may hold."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from optuna.trial import TrialState
from study_fakes import CLUSTER, MODEL, RANKED, FakeRunner, run  # tests/tune/ is on sys.path

from autotune.cost.efficiency import DEFAULT_EFFICIENCY
from autotune.tune.calibrate import FIT_FIELDS, StepMeasurement, calibrate, predict_step_time_s

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


def _predicted_by_trial(result, model):
    out = {}
    for t in result.trials:
        plan = result.candidates[t.user_attrs["plan_key"]].plan
        probe = StepMeasurement(model=model, cluster=CLUSTER, plan=plan, step_time_s=1.0)
        out[t.number] = (t.user_attrs["predicted"], predict_step_time_s(probe, DEFAULT_EFFICIENCY),
                         result.candidates[t.user_attrs["plan_key"]])
    return out


def test_a_cut_trials_prediction_is_of_the_model_it_ran(tmp_path, monkeypatch):
    """tune --num-layers: the table's "pred s" was the whole model's step time beside the cut model's measured
    one (and --json's predicted the same); it is the cut model's, as the calibration's, with the whole model's
    kept beside it and the table saying so."""
    from autotune.tune.progress import summary_table

    result = run(tmp_path, monkeypatch, FakeRunner(), trials=3, num_layers=1)
    cut = dataclasses.replace(MODEL, num_layers=1)
    for number, (pred, want, est) in _predicted_by_trial(result, cut).items():
        assert pred["step_time_s"] == pytest.approx(want) and pred["num_layers"] == 1
        assert pred["step_time_s"] < 0.9 * est.time.step_time_s  # one layer of four: not the whole model's
        assert pred["whole_model"] == {"step_time_s": est.time.step_time_s, "tokens_per_s": est.time.tokens_per_s,
                                       "peak_memory_bytes": est.memory.total, "num_layers": MODEL.num_layers}
    before = {label: b for label, _, b, _ in result.calibration.rows}
    done = [t for t in result.trials if t.state == TrialState.COMPLETE]
    assert done and all(before[f"#{t.number}"] == pytest.approx(t.user_attrs["predicted"]["step_time_s"])
                        for t in done)
    table = summary_table(result.trials)
    row = next(r for r in table.splitlines() if r.startswith(f"{done[0].number:>4}  "))
    assert f"{done[0].user_attrs['predicted']['step_time_s']:.4f}" in row
    assert "predicted for the model the trials ran (1 of its 4 layers, tune --num-layers)" in table


def test_a_whole_model_trials_prediction_is_the_planners(tmp_path, monkeypatch):
    """Without --num-layers (and for a command, whose model the tuner cannot cut): the planner's estimate."""
    from autotune.tune import trial as trial_mod
    from autotune.tune.progress import summary_table

    command = trial_mod.Workload(kind="command", command="true", metric_pattern=r"(?P<step_time_s>[0-9.]+)")
    for kw in ({}, {"num_layers": 1, "workload": command}):
        result = run(tmp_path / str(len(kw)), monkeypatch, FakeRunner(), trials=2, **kw)
        for number, (pred, want, est) in _predicted_by_trial(result, MODEL).items():
            assert pred == {"step_time_s": est.time.step_time_s, "tokens_per_s": est.time.tokens_per_s,
                            "peak_memory_bytes": est.memory.total, "num_layers": MODEL.num_layers}
            assert pred["step_time_s"] == pytest.approx(want)
        assert result.calibration.rows and all(b == pytest.approx(result.trials[int(label[1:])].user_attrs[
            "predicted"]["step_time_s"]) for label, _, b, _ in result.calibration.rows)
        assert "tune --num-layers" not in summary_table(result.trials)
