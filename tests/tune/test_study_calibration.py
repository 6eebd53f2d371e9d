"""Calibration from a study's measurements: known efficiency parameters are recovered; a degenerate fit stays
within what a calibration file may hold."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from study_fakes import CLUSTER, MODEL, RANKED  # tests/tune/ is on sys.path

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
