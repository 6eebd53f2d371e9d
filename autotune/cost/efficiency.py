"""How close kernels get to the datasheet: the step-time model's only fitted parameters.

Two parameters are fitted (``bench/accuracy_published.py`` refits and prints them):

* ``gemm_peak_fraction``: the fraction of dense peak a large, well-shaped GEMM reaches in a
  full training step (cuBLAS on A100/H100 reaches 70-85% in isolation; launch gaps, kernel
  tails and clock throttling lower it in a real step). Needed because datasheet peaks are not
  reachable; one number per run would be a fudge factor, one per kernel class is physics.
* ``gemm_half_dim``: the GEMM dimension at which efficiency halves, applied to each of
  the three GEMM dimensions after tensor parallelism (``d / (d + half)``): narrow
  matrices (small hidden size, high TP) run slower. Needed because it is what makes
  TP = 8 on a 1.7B model a bad idea, which no single peak fraction can express.

Everything else is a documented constant, not fitted: memory-bound (elementwise) kernels
reach ``hbm_efficiency`` of the HBM bandwidth (STREAM-like kernels reach ~80-90%), NCCL
collectives reach ``link_efficiency`` of the link bandwidth (nccl-tests bus bandwidth on
NVLink/IB is ~80% of line rate), with a per-hop ``latency_s``.

The defaults below were fitted on the 19 end-to-end entries of
``autotune/data/published_runs/published_runs_dev.yaml`` (Narayanan et al. 2021 Table 1 and
Korthikanti et al. 2022 Table 5 and Sec. 6.3, A100-80GB) by ``bench/accuracy_published.py --fit``
(least squares on log TFLOP/s; before the fit, with 0.668 / 68 guessed from cuBLAS numbers,
the median error was 8.4% and the worst 15.8%).
A calibration file from ``autotune tune`` (same fields) replaces them for one machine.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, fields, replace

from autotune.errors import InputError

__all__ = ["Efficiency", "DEFAULT_EFFICIENCY", "gemm_efficiency", "load_efficiency", "save_efficiency"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Efficiency:
    gemm_peak_fraction: float = 0.738
    gemm_half_dim: float = 57.6
    hbm_efficiency: float = 0.8
    link_efficiency: float = 0.8
    intra_node_latency_s: float = 3e-6
    inter_node_latency_s: float = 8e-6
    fitted_on: str = "published_runs_dev.yaml: Narayanan 2021 Table 1 (10 runs) + Korthikanti 2022 (9 runs)"

    def with_(self, **changes) -> Efficiency:
        return replace(self, **changes)


DEFAULT_EFFICIENCY = Efficiency()


def gemm_efficiency(eff: Efficiency, m: float, k: float, n: float) -> float:
    """Fraction of peak for a [m x k] @ [k x n] GEMM (each dimension after parallel splits)."""
    half = eff.gemm_half_dim
    return eff.gemm_peak_fraction * (m / (m + half)) * (k / (k + half)) * (n / (n + half))


def load_efficiency(path: str) -> Efficiency:
    """Read a calibration file written by :func:`save_efficiency` (or by ``autotune tune``)."""
    from autotune.inputs import read_json

    if not os.path.lexists(path):
        raise InputError([f"calibration file {path} does not exist: run `autotune tune --calibration {path}` "
                          "or drop the flag"], subject="calibration")
    data = read_json(path, subject="calibration file")  # a regular file, bounded, standard JSON
    if not isinstance(data, dict):
        raise InputError([f"{path}: expected a JSON object of efficiency parameters, got {type(data).__name__}"],
                         subject="calibration")
    known = {f.name for f in fields(Efficiency)}
    unknown = sorted(set(data) - known)
    problems = [f"unknown key {k!r} in {path}" for k in unknown]
    for key, value in data.items():
        if key == "fitted_on" and not isinstance(value, str):
            problems.append(f"fitted_on must be a string, got {value!r}")
        elif key in known and key != "fitted_on" and not (
                isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 1e6):
            problems.append(f"{key} must be a positive number below 1e6, got {value!r}")
    if problems:
        raise InputError(problems, subject="calibration")
    return Efficiency(**data)


def save_efficiency(eff: Efficiency, path: str) -> None:
    """Write atomically (temp file + rename): a crash never leaves half a calibration."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".calibration-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(asdict(eff), fh, indent=2)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
