"""Compare the step-time model with measurements, and fit its efficiency parameters to them.

Measurements come from published runs (``autotune/data/published_runs/published_runs_dev.yaml``:
Narayanan et al. 2021 Table 1, Korthikanti et al. 2022 Table 5) or from ``autotune tune``
trials. A measurement is a plan with a measured throughput in a stated FLOP convention
(model or hardware TFLOP/s per GPU); the fit minimises the squared log error over all of
them, so no single run can be matched by a per-run constant.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from autotune.cost.efficiency import DEFAULT_EFFICIENCY, Efficiency
from autotune.cost.memory import estimate_memory
from autotune.cost.step_time import StepTimeEstimate, TimeSettings, estimate_step_time
from autotune.errors import InputError
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import cluster_defaults, load_gpu_preset

__all__ = ["Measurement", "published_measurements", "predict", "prediction_errors", "fit_efficiency",
           "reference_dir", "coordinate_fit"]

_GPU_NAMES = {"A100-SXM-80GB": "a100-80gb", "A100-SXM-40GB": "a100-40gb", "H100-SXM": "h100-sxm-80gb"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """One measured run: the configuration, and what it achieved."""

    run_id: str
    model: ModelSpec
    cluster: ClusterSpec
    candidates: tuple[ParallelPlan, ...]
    """The plan, or, where the source leaves a setting out (micro-batch, vpp), every valid
    choice of it; the prediction takes the fastest that fits, as the authors tuned theirs."""
    tflops_per_gpu: float
    kind: str
    """'model' (forward + backward FLOPs) or 'hardware' (plus recompute)."""
    note: str = ""


def reference_dir() -> Path:
    """The published-runs folder: $AUTOTUNE_REFERENCE_DIR, else the copy shipped in autotune/data/published_runs."""
    env = os.environ.get("AUTOTUNE_REFERENCE_DIR")
    path = Path(env) if env else Path(__file__).resolve().parent / "data" / "published_runs"
    if not (path / "published_runs_dev.yaml").is_file():
        raise InputError([f"published runs not found in {path}: set AUTOTUNE_REFERENCE_DIR to the folder holding "
                          "published_runs_dev.yaml"], subject="reference data")
    return path


def _gpt(entry: dict) -> ModelSpec:
    m = entry["model"]
    # Megatron GPT of the papers: learned positions, LayerNorm, GeLU, biases, tied embeddings, dropout 0.1.
    return ModelSpec(name=m.get("name") or entry["id"], num_layers=m["layers"], hidden_size=m["hidden"],
                     num_attention_heads=m["heads"], ffn_hidden_size=m.get("ffn_hidden", 4 * m["hidden"]),
                     vocab_size=m["vocab"], max_position_embeddings=m["seq_len"], linear_bias=True,
                     tied_embeddings=True, dropout=0.1)


def _int_or_none(value) -> int | None:
    return value if isinstance(value, int) else None


def _candidates(model: ModelSpec, entry: dict, num_gpus: int) -> tuple[ParallelPlan, ...]:
    p = entry["parallel"]
    tp, pp = p["tp"], p.get("pp", 1)
    dp = _int_or_none(p.get("dp")) or num_gpus // (tp * pp)
    gb = p.get("global_batch")
    recompute = p["recompute"]
    micro_batches = [p["micro_batch"]] if _int_or_none(p.get("micro_batch")) else [1, 2, 4, 8, 16]
    vpps = [p["vpp"]] if _int_or_none(p.get("vpp")) else [v for v in (1, 2, 3, 4, 6, 8)
                                                          if (model.num_layers // pp) % v == 0]
    out = []
    for mb in micro_batches:
        if gb % (mb * dp):
            continue
        for vpp in vpps:
            if vpp > 1 and pp == 1:
                continue
            plan = ParallelPlan(
                tp=tp, pp=pp, vpp=vpp, dp=dp, micro_batch_size=mb, global_batch_size=gb,
                grad_accum_steps=gb // (mb * dp), seq_len=model.max_position_embeddings, recompute=recompute,
                sequence_parallel=bool(p.get("sequence_parallel")), precision="fp16", engine="megatron",
                zero_stage=0, flash_attention=False,
                # 2021-22 Megatron: no overlap of the gradient all-reduce with backprop (Korthikanti Sec. 6.3).
                overlap_comm=False)
            if plan.interleaved and plan.num_microbatches % pp:
                continue
            out.append(plan)
    return tuple(out)


def published_measurements(path: Path | None = None) -> list[tuple[Measurement | None, str, str]]:
    """Every entry of the published runs as (measurement or None, run id, why skipped)."""
    path = path or reference_dir() / "published_runs_dev.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    out: list[tuple[Measurement | None, str, str]] = []
    for entry in data["runs"]:
        rid = entry["id"]
        measured = entry.get("measured", {})
        rc = str(entry["parallel"].get("recompute"))
        if measured.get("scope") == "per_layer":
            out.append((None, rid, "single-layer timing (Table 4), not a training step"))
            continue
        if rc not in ("none", "selective", "full"):
            out.append((None, rid, f"recompute '{rc}' is not a plan setting"))
            continue
        if entry["parallel"].get("global_batch") is None:
            out.append((None, rid, "global batch not stated"))
            continue
        hw = entry["hardware"]
        gpu_name = _GPU_NAMES[hw["gpu"]]
        num_gpus = hw["total_gpus"]
        defaults = cluster_defaults(gpu_name)
        per_node = hw.get("gpus_per_node", defaults["gpus_per_node"])
        cluster = ClusterSpec(gpu=load_gpu_preset(gpu_name), num_nodes=max(1, num_gpus // per_node),
                              gpus_per_node=min(per_node, num_gpus),
                              **{k: v for k, v in defaults.items() if k != "gpus_per_node"})
        model = _gpt(entry)
        if "tflops_per_gpu" in measured:
            tflops, kind = float(measured["tflops_per_gpu"]), measured["tflops_per_gpu_kind"]
        elif "iteration_time_s" in measured:
            from autotune.cost.flops import step_flops

            gb = entry["parallel"]["global_batch"]
            flops = step_flops(model, model.max_position_embeddings, gb * model.max_position_embeddings, "none")
            tflops, kind = flops.model / measured["iteration_time_s"] / num_gpus / 1e12, "model"
        elif "mfu" in measured:
            tflops, kind = measured["mfu"] / 100 * hw["peak_tflops"], "model"
        else:
            out.append((None, rid, "no throughput measured"))
            continue
        cands = _candidates(model, entry, num_gpus)
        if not cands:
            out.append((None, rid, "no valid plan for the stated configuration"))
            continue
        out.append((Measurement(run_id=rid, model=model, cluster=cluster, candidates=cands, tflops_per_gpu=tflops,
                                kind=kind), rid, ""))
    return out


def predict(m: Measurement, eff: Efficiency = DEFAULT_EFFICIENCY) -> tuple[float, ParallelPlan, StepTimeEstimate]:
    """Predicted TFLOP/s per GPU in the measurement's convention, for its best fitting candidate."""
    settings = TimeSettings(efficiency=eff)
    best = None
    for plan in m.candidates:
        fits = estimate_memory(m.model, m.cluster, plan).fits
        est = estimate_step_time(m.model, m.cluster, plan, settings)
        value = est.hardware_tflops_per_gpu if m.kind == "hardware" else est.model_tflops_per_gpu
        key = (fits, value)
        if best is None or key > best[0]:
            best = (key, value, plan, est)
    assert best is not None
    return best[1], best[2], best[3]


def prediction_errors(measurements: Iterable[Measurement], eff: Efficiency = DEFAULT_EFFICIENCY) -> list[float]:
    """Signed relative errors (predicted / measured - 1)."""
    return [predict(m, eff)[0] / m.tflops_per_gpu - 1 for m in measurements]


def _loss(measurements: Sequence[Measurement], eff: Efficiency) -> float:
    return statistics.fmean(math.log(predict(m, eff)[0] / m.tflops_per_gpu) ** 2 for m in measurements)


_FRACTIONS = frozenset({"gemm_peak_fraction", "hbm_efficiency", "link_efficiency"})
"""Efficiency fields that are fractions of a datasheet number (at most 1)."""


def coordinate_fit(loss: Callable[[Efficiency], float], start: Efficiency, fields: tuple[str, ...],
                   max_rounds: int = 60) -> Efficiency:
    """Minimise ``loss`` over ``fields`` of an Efficiency by coordinate search with shrinking steps.

    Each field moves by +-25% of its start value; when no move helps, steps halve, until they are
    below 0.1% of the value. Fractions stay in (0, 1], the rest positive. Shared by the published-run
    fit below and by ``autotune tune``'s calibration on trial measurements.
    """
    best = start
    best_loss = loss(best)
    steps = {name: 0.25 * getattr(start, name) for name in fields}
    for _ in range(max_rounds):
        improved = False
        for name in fields:
            for sign in (1, -1):
                value = getattr(best, name) + sign * steps[name]
                if value <= 0 or (name in _FRACTIONS and value > 1):
                    continue
                candidate = best.with_(**{name: value})
                candidate_loss = loss(candidate)
                if candidate_loss < best_loss:
                    best, best_loss, improved = candidate, candidate_loss, True
        if not improved:
            steps = {k: v / 2 for k, v in steps.items()}
            if all(v < 1e-3 * max(getattr(best, k), 1e-9) for k, v in steps.items()):
                break
    return best


def fit_efficiency(measurements: Sequence[Measurement], start: Efficiency = DEFAULT_EFFICIENCY,
                   fields: tuple[str, ...] = ("gemm_peak_fraction", "gemm_half_dim")) -> Efficiency:
    """Least squares on log throughput over ``fields`` (coordinate search with shrinking steps)."""
    return coordinate_fit(lambda eff: _loss(measurements, eff), start, fields)
