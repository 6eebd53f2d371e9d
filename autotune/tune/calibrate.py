"""Fit the step-time model's efficiency parameters to what trials measured on this machine.

Least squares on log step time (so a 2x error counts the same on a fast and a slow plan) over
``gemm_peak_fraction``, ``gemm_half_dim`` and ``hbm_efficiency``, by the same coordinate search
as the published-run fit (:func:`autotune.cost.efficiency.coordinate_fit`). Link efficiency and
latencies are kept: on the ``cpu`` preset the link bandwidth is a fixed nominal value, and a
handful of single-node trials cannot separate it from compute. With fewer than three
measurements only ``gemm_peak_fraction`` is fitted (one number per measurement at most).

The result is written with :func:`autotune.cost.efficiency.save_efficiency` (atomic), a file
``load_efficiency`` reads back, so ``estimate`` and ``plan`` can reuse it on the same hardware.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from autotune.cost.efficiency import BOUNDS, coordinate_fit
from autotune.cost.efficiency import DEFAULT_EFFICIENCY, Efficiency, save_efficiency
from autotune.cost.step_time import TimeSettings, estimate_step_time
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["StepMeasurement", "FIT_FIELDS", "predict_step_time_s", "fit_step_times", "CalibrationReport",
           "calibrate", "format_report", "trial_prediction"]

FIT_FIELDS = ("gemm_peak_fraction", "gemm_half_dim", "hbm_efficiency")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepMeasurement:
    """One completed trial: the plan on the model it actually ran, and its measured step time."""

    model: ModelSpec
    """The model as the trial ran it (with the trial's layer count when it was cut)."""
    cluster: ClusterSpec
    plan: ParallelPlan
    step_time_s: float
    label: str = ""


def predict_step_time_s(m: StepMeasurement, eff: Efficiency) -> float:
    return estimate_step_time(m.model, m.cluster, m.plan, TimeSettings(efficiency=eff)).step_time_s


def trial_prediction(est, run_model: ModelSpec, eff: Efficiency) -> dict:
    """A trial's recorded prediction (user attribute ``predicted``): of ``run_model``, the model the trial runs,
    so that it stands beside what the trial measures (the calibration's "before" column, at ``eff``). ``est``
    (an :class:`autotune.cost.estimate.Estimate`) is the whole model's; where the trial runs a cut of it
    (``tune --num-layers``), that prediction is kept under ``whole_model``."""
    def numbers(e) -> dict:
        return {"step_time_s": e.time.step_time_s, "tokens_per_s": e.time.tokens_per_s,
                "peak_memory_bytes": e.memory.total, "num_layers": e.model.num_layers}

    if run_model == est.model:
        return numbers(est)
    from autotune.cost.estimate import estimate

    cut = estimate(run_model, est.cluster, est.plan, time_settings=TimeSettings(efficiency=eff))
    return numbers(cut) | {"whole_model": numbers(est)}


def _loss(measurements: Sequence[StepMeasurement], eff: Efficiency) -> float:
    return statistics.fmean(math.log(predict_step_time_s(m, eff) / m.step_time_s) ** 2 for m in measurements)


def fit_step_times(measurements: Sequence[StepMeasurement], start: Efficiency = DEFAULT_EFFICIENCY,
                   fields: tuple[str, ...] | None = None) -> Efficiency:
    """The efficiency that minimises the squared log error of the predicted step times."""
    if not measurements:
        return start
    if fields is None:
        fields = FIT_FIELDS if len(measurements) >= 3 else ("gemm_peak_fraction",)
    fitted = coordinate_fit(lambda eff: _loss(measurements, eff), start, fields)
    # gemm_peak_fraction and gemm_half_dim trade off along a narrow valley that coordinate moves
    # crawl along; a few Levenberg-Marquardt steps on the same residuals walk down it.
    fitted = _levenberg_marquardt(measurements, fitted, fields)
    return replace(fitted, fitted_on=f"autotune tune: {len(measurements)} trial measurements "
                                     f"(log step time least squares over {', '.join(fields)})")


def _residuals(measurements: Sequence[StepMeasurement], eff: Efficiency) -> list[float]:
    return [math.log(predict_step_time_s(m, eff) / m.step_time_s) for m in measurements]


def _levenberg_marquardt(measurements: Sequence[StepMeasurement], start: Efficiency, fields: tuple[str, ...],
                         iterations: int = 30) -> Efficiency:
    """Minimise the log residuals over log(field) with a damped Gauss-Newton step (numeric Jacobian)."""
    import numpy as np

    def eff_at(x) -> Efficiency:
        values = {f: float(math.exp(v)) for f, v in zip(fields, x)}
        for f, v in values.items():  # within what a calibration file may hold (load_efficiency refuses the rest)
            if f in BOUNDS:
                lo, hi, _ = BOUNDS[f]
                values[f] = min(max(v, lo if lo > 0 else 1e-9), hi)
        return start.with_(**values)

    x = np.array([math.log(getattr(start, f)) for f in fields])
    r = np.array(_residuals(measurements, eff_at(x)))
    damping = 1e-3
    for _ in range(iterations):
        jac = np.empty((len(r), len(fields)))
        for j in range(len(fields)):
            dx = np.zeros_like(x)
            dx[j] = 1e-4
            jac[:, j] = (np.array(_residuals(measurements, eff_at(x + dx))) - r) / 1e-4
        a = jac.T @ jac
        g = jac.T @ r
        improved = False
        for _ in range(8):
            step = np.linalg.solve(a + damping * np.diag(np.diag(a) + 1e-12), -g)
            trial = np.clip(x + step, -30.0, 30.0)
            for j, f in enumerate(fields):
                if f in ("gemm_peak_fraction", "hbm_efficiency"):
                    trial[j] = min(trial[j], 0.0)  # a fraction of the datasheet: at most 1
            r_new = np.array(_residuals(measurements, eff_at(trial)))
            if r_new @ r_new < r @ r:
                x, r, damping, improved = trial, r_new, damping / 3, True
                break
            damping *= 10
        if not improved or float(np.abs(step).max()) < 1e-6:
            break
    return eff_at(x)


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationReport:
    before: Efficiency
    after: Efficiency
    rows: tuple[tuple[str, float, float, float], ...]
    """(label, measured s, predicted before s, predicted after s) per measurement."""

    @property
    def median_error_before(self) -> float:
        return statistics.median(abs(b / m - 1) for _, m, b, _ in self.rows) if self.rows else 0.0

    @property
    def median_error_after(self) -> float:
        return statistics.median(abs(a / m - 1) for _, m, _, a in self.rows) if self.rows else 0.0

    def to_dict(self) -> dict:
        return {"before": {f: getattr(self.before, f) for f in FIT_FIELDS},
                "after": {f: getattr(self.after, f) for f in FIT_FIELDS},
                "median_error_before": self.median_error_before, "median_error_after": self.median_error_after,
                "rows": [{"trial": label, "measured_step_time_s": m, "predicted_before_s": b,
                          "predicted_after_s": a} for label, m, b, a in self.rows]}


def calibrate(measurements: Sequence[StepMeasurement], start: Efficiency = DEFAULT_EFFICIENCY,
              path: str | None = None) -> CalibrationReport:
    """Fit, compare before/after, and save to ``path`` (atomically) when given."""
    after = fit_step_times(measurements, start)
    rows = tuple((m.label, m.step_time_s, predict_step_time_s(m, start), predict_step_time_s(m, after))
                 for m in measurements)
    if path:
        save_efficiency(after, path)
    return CalibrationReport(before=start, after=after, rows=rows)


def format_report(report: CalibrationReport) -> str:
    """Predicted vs measured step time, before and after the fit, one line per trial."""
    lines = [f"{'trial':<8}{'measured s':>12}{'before s':>12}{'err':>8}{'after s':>12}{'err':>8}"]
    for label, m, b, a in report.rows:
        lines.append(f"{label:<8}{m:>12.4f}{b:>12.4f}{b / m - 1:>+8.0%}{a:>12.4f}{a / m - 1:>+8.0%}")
    lines.append(f"median |error|: {report.median_error_before:.1%} before, {report.median_error_after:.1%} after; "
                 + ", ".join(f"{f} {getattr(report.before, f):.4g} -> {getattr(report.after, f):.4g}"
                             for f in FIT_FIELDS))
    return "\n".join(lines)
