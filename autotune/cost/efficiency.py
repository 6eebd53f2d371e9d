"""The step-time model's fitted parameters: few, shared by every GPU, precision and engine.

What each GPU's kernels and links reach is data, not fitted: ``GPUSpec.kernel_facts()`` (``gpus.yaml``,
measured GEMM, attention, HBM and NCCL figures with their sources; ``autotune.cost.kernels``). What is left
to fit is what no kernel benchmark shows, three numbers for every GPU (two refitted on the published runs):

* ``gemm_peak_fraction``: the share of the isolated-kernel rate a kernel keeps inside a training step
  (launch gaps, kernel tails, clocks under sustained load, data-loader and Python stalls).
* ``gemm_half_dim``: the narrow-GEMM curve, as a multiple of the GPU's machine balance (peak FLOP/s over
  HBM bytes/s): a GEMM dimension of ``gemm_half_dim x balance`` halves the rate (``autotune.cost.kernels``).
  Held, not refitted: the step-time runs no longer constrain it (``bench/accuracy_published.py`` FIT_FIELDS).
* ``overlap_cost``: the share of a collective hidden behind compute that still costs compute time (NCCL
  kernels take SMs and HBM bandwidth from the GEMMs they overlap).

``hbm_efficiency`` and ``link_efficiency`` scale the kernel facts (1 = as measured); ``autotune tune``'s
calibration on one machine fits them (and the three above) to that machine's trials.

The defaults (gemm_peak_fraction 0.7500, overlap_cost 0.2105) were fitted by
``python bench/accuracy_published.py --fit`` on every run with a throughput in
``autotune/data/published_runs/`` (both files: V100 / A100 / H100 / H100-500W, bf16 / fp16 / FP8, Megatron-LM,
Megatron-DeepSpeed, DeepSpeed ZeRO-3, FSDP / torchtitan / MosaicML; least squares on log tokens/s); the bench
also prints the leave-one-family-out errors, where each family is predicted from parameters fitted on the
others. A calibration file from ``autotune tune`` (same fields) replaces them for one machine.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace

from autotune.errors import InputError
from autotune.inputs import range_problem, read_json

__all__ = ["Efficiency", "DEFAULT_EFFICIENCY", "BOUNDS", "gemm_efficiency", "load_efficiency", "save_efficiency",
           "coordinate_fit"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Efficiency:
    gemm_peak_fraction: float = 0.7500
    gemm_half_dim: float = 0.131
    overlap_cost: float = 0.2105
    hbm_efficiency: float = 1.0
    link_efficiency: float = 1.0
    fitted_on: str = ("gemm_peak_fraction and overlap_cost: 72 published runs with a throughput (autotune/data/"
                      "published_runs, 14 families: V100 / A100 / H100 / H100-500W; Megatron-LM, Megatron-DeepSpeed, "
                      "DeepSpeed ZeRO-3, FSDP / torchtitan / MPT; bf16, fp16, FP8; Korthikanti Table 4's layer "
                      "timings among them); gemm_half_dim held from the earlier fit on 63 of them")

    def with_(self, **changes) -> Efficiency:
        return replace(self, **changes)


DEFAULT_EFFICIENCY = Efficiency()


_A100_BALANCE = 312e12 / 2039e9
"""FLOP/byte of an A100-80GB (bf16 peak over HBM bandwidth): the balance ``gemm_efficiency`` assumes."""

_RETIRED = frozenset({"intra_node_latency_s", "inter_node_latency_s"})
"""Keys of older calibration files whose facts now live in the GPU presets (``kernels:``); read and ignored."""


def gemm_efficiency(eff: Efficiency, m: float, k: float, n: float, balance: float = _A100_BALANCE) -> float:
    """Share of the reachable GEMM rate for a [m x k] @ [k x n] GEMM (each dimension after parallel splits)
    on a GPU of machine balance ``balance`` FLOP/byte."""
    half = eff.gemm_half_dim * balance
    return eff.gemm_peak_fraction * (m / (m + half)) * (k / (k + half)) * (n / (n + half))


BOUNDS: dict[str, tuple[float, float, str]] = {
    "gemm_peak_fraction": (1e-3, 1.0, "a fraction of the datasheet GEMM rate; below 0.1% is not a measurement"),
    "hbm_efficiency": (1e-3, 1.0, "a fraction of the datasheet HBM bandwidth; below 0.1% is not a measurement"),
    "link_efficiency": (1e-3, 1.0, "a fraction of the datasheet link bandwidth; below 0.1% is not a measurement"),
    "gemm_half_dim": (0.0, 1e4, "the GEMM dimension of half efficiency over the GPU's FLOP/byte balance; 0.131 "
                                "fitted, 10,000 would put it in the millions"),
    "overlap_cost": (0.0, 1.0, "the share of hidden communication time that still costs compute; 0.21 fitted"),
}
"""The physically meaningful range of each number of a calibration file, inclusive, and what it is: a value
outside it is refused by :func:`load_efficiency` (4.9e-324 as a fraction made a step time of infinity, then NaN)."""


def load_efficiency(path: str) -> Efficiency:
    """Read a calibration file written by :func:`save_efficiency` (or by ``autotune tune``)."""
    if not os.path.lexists(path):
        raise InputError([f"calibration file {path} does not exist: run `autotune tune --calibration {path}` "
                          "or drop the flag"], subject="calibration")
    data = read_json(path, subject="calibration file")  # a regular file, bounded, standard JSON
    if not isinstance(data, dict):
        raise InputError([f"{path}: expected a JSON object of efficiency parameters, got {type(data).__name__}"],
                         subject="calibration")
    data = {k: v for k, v in data.items() if k not in _RETIRED}
    known = {f.name for f in fields(Efficiency)}
    unknown = sorted(set(data) - known)
    problems = [f"unknown key {k!r} in {path}" for k in unknown]
    for key, value in data.items():
        if key == "fitted_on" and not isinstance(value, str):
            problems.append(f"fitted_on must be a string, got {value!r}")
        elif key in BOUNDS:
            lo, hi, what = BOUNDS[key]
            if range_problem(key, value, lo=lo, hi=hi):  # not a finite number in [lo, hi]
                kind = "a positive number" if lo > 0 else "a number"
                got = f"{value:g}" if isinstance(value, float) else repr(value)
                problems.append(f"{key} must be {kind} from {lo:g} to {hi:,g} ({what}), got {got}")
    if problems:
        problems.append(f"fix those values in {path} (or delete the file and run `autotune tune` again), or drop "
                        "--calibration to use the defaults")
        raise InputError(problems, subject="calibration")
    return Efficiency(**data)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_efficiency(eff: Efficiency, path: str) -> None:
    """Write atomically (temp file + rename): a crash never leaves half a calibration."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".calibration-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(asdict(eff), fh, indent=2)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600; a calibration is shared like any file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


_FRACTIONS = frozenset({"gemm_peak_fraction", "hbm_efficiency", "link_efficiency"})
"""Efficiency fields that are fractions of a datasheet number (at most 1)."""


def coordinate_fit(loss: Callable[[Efficiency], float], start: Efficiency, fields: tuple[str, ...],
                   max_rounds: int = 60) -> Efficiency:
    """Minimise ``loss`` over ``fields`` of an Efficiency by coordinate search with shrinking steps.

    Each field moves by +-25% of its start value; when no move helps, steps halve, until they are
    below 0.1% of the value. Fractions stay in (0, 1], the rest positive, each within :data:`BOUNDS`. Used by the published-run
    fit (``bench/accuracy_published.py --fit``) and by ``autotune tune``'s calibration on trial measurements.
    """
    best = start
    best_loss = loss(best)
    steps = {name: 0.25 * getattr(start, name) for name in fields}
    for _ in range(max_rounds):
        improved = False
        for name in fields:
            for sign in (1, -1):
                value = getattr(best, name) + sign * steps[name]
                lo, hi, _ = BOUNDS.get(name, (0.0, float("inf"), ""))
                if value <= 0 or not lo <= value <= hi or (name in _FRACTIONS and value > 1):
                    continue  # what load_efficiency would refuse is never the fit
                candidate = best.with_(**{name: value})
                candidate_loss = loss(candidate)
                if candidate_loss < best_loss:
                    best, best_loss, improved = candidate, candidate_loss, True
        if not improved:
            steps = {k: v / 2 for k, v in steps.items()}
            if all(v < 1e-3 * max(getattr(best, k), 1e-9) for k, v in steps.items()):
                break
    return best
