"""How far an estimate can be trusted: an interval from the model's own out-of-sample errors.

Every published run the cost model is checked on (autotune/data/published_runs) was also predicted with the
shared parameters fitted on the *other* families only (leave-one-family-out, ``bench/accuracy_published.py``).
NVIDIA's Megatron-Bridge Blackwell recipes (bench/data/nvidia_recipes_blackwell.csv, dense and MoE) are estimated
by ``bench/accuracy_nvidia_recipes.py`` with no parameter fitted on any of them, so each of their errors is out of
sample too. Those signed errors, with what kind of plan each run was and where it comes from (``source``:
"published" or "nvidia"), are shipped in ``autotune/data/uncertainty_runs.json`` (written by
``bench/uncertainty_table.py --write``; tests check it still matches the runs).

For a plan, the runs most like it are found by what drives the model's error: the engine (4 points), the GPU
generation (2), a mixture-of-experts model or not (2), the precision (1), and one point each for tensor, pipeline
and context parallelism, ZeRO-3 / FSDP sharding and offload agreeing (:data:`WEIGHTS`). The runs at the best score,
widened one score level at a time until at least :data:`MIN_RUNS` of :data:`MIN_FAMILIES` families or more are
in, give the interval: the median of their absolute errors (a 50% interval: about half of such runs came out closer than this). ``exclude_families`` leaves
families' runs out (a check of a family's own plans is then judged by the other families' errors). The planner
treats plans within each other's intervals as ties (:mod:`autotune.search.ties`). Judged out of their family (each
run by the interval the other families' runs give its kind of plan, :func:`out_of_family_ratios`), the median
interval holds 46% of the shipped runs; :attr:`Uncertainty.relative_90` widens it by the factor that held nine in ten
of them (:func:`coverage_factor`; bench/uncertainty_coverage.py prints both by source and family).

The published runs' peak-memory errors (where a run published its peak; NVIDIA's table gives none) give the memory
model's p90 |error| (:func:`shipped_memory_error_p90`): how close to capacity a predicted peak may come before the
prediction alone no longer says the plan fits (the planner's tie-break ranks such plans after those with headroom).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from functools import lru_cache

from autotune.resources import data_path
from autotune.specs.hardware import ClusterSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["Uncertainty", "uncertainty_of", "plan_kind", "gpu_generation", "MIN_RUNS", "RUNS_FILE",
           "MIN_FAMILIES", "memory_error_p90", "shipped_memory_error_p90", "SOURCE_NAMES", "NVIDIA_FAMILY_PREFIX",
           "COVERAGE", "coverage_factor", "out_of_family_ratios"]

RUNS_FILE = "data/uncertainty_runs.json"
MIN_RUNS = 6
MIN_FAMILIES = 2
"""Families the chosen runs must span: one family's runs share its systematic error (one model, one code base, one
set of measurements), so alone they are one sample of the model's error, however many runs it has (all of NVIDIA's
MoE bf16 rows are GPT-OSS's, 27% off: alone they would give every MoE bf16 plan, on any GPU, a +-30% interval)."""
WEIGHTS = {"engine": 4, "generation": 2, "moe": 2, "precision": 1, "tp": 1, "pp": 1, "cp": 1, "sharded": 1,
           "offload": 1}
SOURCE_NAMES = {"published": "published runs", "nvidia": "NVIDIA's Blackwell recipes"}
"""The shipped records' ``source`` values, as the interval's basis names them."""
NVIDIA_FAMILY_PREFIX = "NVIDIA Megatron-Bridge "
"""An NVIDIA record's family: this and the model family of NVIDIA's table (never a published-runs family)."""
_GENERATIONS = (("v100", "volta"), ("a100", "ampere"), ("a10", "ampere"), ("h100", "hopper"), ("h200", "hopper"),
                ("gh200", "hopper"), ("b200", "blackwell"), ("b300", "blackwell"), ("gb200", "blackwell"),
                ("gb300", "blackwell"), ("mi300", "cdna3"), ("mi250", "cdna2"), ("l40", "ada"), ("cpu", "cpu"))


def gpu_generation(name: str, peak_bf16_tflops: float | None = None) -> str:
    """The architecture generation of a GPU preset name; an inline GPU by its 16-bit peak."""
    low = name.lower()
    for prefix, generation in _GENERATIONS:
        if low.startswith(prefix):
            return generation
    if peak_bf16_tflops is None:
        return "other"
    # An inline GPU: the generation whose presets' dense 16-bit peaks bracket it (V100 125, A100 312, H100 989,
    # B200 2,250 TFLOP/s).
    return ("volta" if peak_bf16_tflops < 200 else "ampere" if peak_bf16_tflops < 600
            else "hopper" if peak_bf16_tflops < 1600 else "blackwell")


def plan_kind(plan: ParallelPlan, cluster: ClusterSpec, *, moe: bool) -> dict:
    """What of a plan the interval is looked up by (``moe``: the plan's model is a mixture of experts; the plan
    alone does not say: an MoE model may run with ep 1)."""
    peak = cluster.gpu.peak_tflops.get("bf16") or cluster.gpu.peak_tflops.get("fp16")
    return {"engine": plan.engine, "generation": gpu_generation(cluster.gpu.name, peak), "moe": bool(moe),
            "precision": plan.precision, "tp": plan.tp > 1, "pp": plan.pp > 1, "cp": plan.cp > 1,
            "sharded": plan.zero_stage >= 3,
            "offload": plan.offload_optimizer != "none" or plan.offload_param != "none"}


@dataclass(frozen=True, slots=True)
class Uncertainty:
    """The relative half-width of a throughput (or step-time) estimate, and what it rests on."""

    relative: float
    """Median |leave-one-family-out error| of the runs nearest the plan."""
    runs: int
    families: tuple[str, ...]
    score: int
    """How alike those runs are to the plan (of :data:`WEIGHTS`' total)."""
    sources: tuple[str, ...] = ("published",)
    """Where those runs come from (:data:`SOURCE_NAMES`): "published" (autotune/data/published_runs), "nvidia"
    (NVIDIA's Blackwell recipes)."""

    def bounds(self, value: float) -> tuple[float, float]:
        return value * (1 - self.relative), value * (1 + self.relative)

    @property
    def relative_90(self) -> float:
        """The half-width that held nine in ten of the shipped runs out of their family: ``relative`` times
        :func:`coverage_factor` (a 50% interval widened as far as the records say it must be)."""
        return self.relative * coverage_factor()

    def basis(self) -> str:
        names = [f.removeprefix(NVIDIA_FAMILY_PREFIX) for f in self.families[:3]]  # the source says whose
        shown = ", ".join(names) + (f" +{len(self.families) - 3} more" if len(self.families) > 3 else "")
        where = " and ".join(SOURCE_NAMES[s] for s in self.sources)
        return f"median leave-one-family-out error of the {self.runs} runs most like this plan ({where}: {shown})"

    def to_dict(self) -> dict:
        return {"relative": self.relative, "relative_90": self.relative_90, "runs": self.runs,
                "families": list(self.families),
                "sources": list(self.sources), "similarity": self.score, "of": sum(WEIGHTS.values()),
                "basis": self.basis()}


@lru_cache(maxsize=1)
def _records() -> tuple[dict, ...]:
    return tuple(json.loads(data_path("autotune", RUNS_FILE).read_text(encoding="utf-8"))["runs"])


def _score(kind: dict, record: dict) -> int:
    return sum(w for key, w in WEIGHTS.items() if record[key] == kind[key])


@lru_cache(maxsize=4096)
def _lookup(key: tuple, exclude_families: frozenset[str] = frozenset()) -> Uncertainty:
    kind = dict(key)
    scored = sorted(((_score(kind, r), r) for r in _records() if r["family"] not in exclude_families),
                    key=lambda s: -s[0])
    best = scored[0][0]
    floor = best
    while floor > 0 and (sum(1 for s, _ in scored if s >= floor) < MIN_RUNS
                         or len({r["family"] for s, r in scored if s >= floor}) < MIN_FAMILIES):
        floor -= 1
    chosen = [r for s, r in scored if s >= floor]
    families = tuple(dict.fromkeys(r["family"] for r in chosen))
    sources = tuple(s for s in SOURCE_NAMES if any(r.get("source", "published") == s for r in chosen))
    return Uncertainty(relative=statistics.median(abs(r["lofo_error"]) for r in chosen), runs=len(chosen),
                       families=families, score=floor, sources=sources)


def uncertainty_of(plan: ParallelPlan, cluster: ClusterSpec, *, moe: bool,
                   exclude_families: frozenset[str] = frozenset()) -> Uncertainty:
    """The interval of ``plan``'s throughput on ``cluster`` (``moe``: its model is a mixture of experts), from the
    shipped runs less those of ``exclude_families`` (cached by the plan's kind)."""
    return _lookup(tuple(sorted(plan_kind(plan, cluster, moe=moe).items())), frozenset(exclude_families))


COVERAGE = 0.9
"""The share of out-of-family errors :attr:`Uncertainty.relative_90` is widened to hold."""


def out_of_family_ratios() -> list[float]:
    """For every shipped run, its |error| over the interval the other families' runs give a plan of its kind: what
    the interval would have said of the run had its family not been shipped (``exclude_families``). A calibrated
    50% interval puts half of them at or below 1."""
    out = []
    for record in _records():
        interval = _lookup(tuple(sorted((k, record[k]) for k in WEIGHTS)), frozenset({record["family"]}))
        out.append(abs(record["lofo_error"]) / interval.relative if interval.relative > 0 else math.inf)
    return out


@lru_cache(maxsize=1)
def coverage_factor() -> float:
    """How many times the median interval holds :data:`COVERAGE` of the shipped runs out of their family: the
    nearest-rank quantile of :func:`out_of_family_ratios` (3.2 on the records of 2026-12: errors have heavy tails, so
    nine in ten is far wider than twice the median)."""
    ordered = sorted(out_of_family_ratios())
    return ordered[min(len(ordered) - 1, math.ceil(COVERAGE * len(ordered)) - 1)]


def memory_error_p90(errors: list[float]) -> float:
    """The 90th percentile of |error| (nearest rank), as bench/accuracy_published.py's p90 columns."""
    ordered = sorted(abs(e) for e in errors)
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


@lru_cache(maxsize=1)
def shipped_memory_error_p90() -> float:
    """The p90 |predicted / published peak memory - 1| of the shipped runs (``memory_error`` in :data:`RUNS_FILE`);
    0 for a table written before it held them (no margin: the fit test alone)."""
    errors = [r["memory_error"] for r in _records() if r.get("memory_error") is not None]  # published runs only
    return memory_error_p90(errors) if errors else 0.0
