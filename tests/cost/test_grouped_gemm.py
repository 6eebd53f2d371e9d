"""The routed experts' grouped GEMM has its own curve over the rows per expert (``Rates.grouped_s``,
``GROUPED_ROWS_HALF_DIM``), measured with ``torch._grouped_mm`` on one H200 (bench/data/h200_kernels.json)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from autotune.cost.efficiency import DEFAULT_EFFICIENCY
from autotune.cost.kernels import GROUPED_ROWS_HALF_DIM, rates
from autotune.specs.loading import load_cluster

H200 = load_cluster(gpu="h200", num_gpus=1)
KERNELS = json.loads((Path(__file__).resolve().parents[2] / "bench" / "data" / "h200_kernels.json").read_text())
ISOLATED = rates(H200, "bf16", DEFAULT_EFFICIENCY.with_(gemm_peak_fraction=1.0), "fa2", None)


def _ratios(grouped: bool) -> dict[int, float]:
    """Median model/measured rate by rows per expert, over the measured expert shapes."""
    by_rows: dict[int, list[float]] = {}
    for g in KERNELS["grouped_gemm"]:
        if "tflops" not in g:
            continue
        flops = 2 * g["experts"] * g["rows"] * g["k"] * g["n"]
        fn = ISOLATED.grouped_s if grouped else ISOLATED.linear_s
        by_rows.setdefault(g["rows"], []).append(flops / fn(flops, g["rows"], g["k"], g["n"]) / (g["tflops"] * 1e12))
    return {rows: statistics.median(v) for rows, v in sorted(by_rows.items())}


def test_the_rows_curve_flattens_the_measured_ratio():
    """From 128 to 4,096 rows per expert the model/measured ratio stays within 20% of its median (the dense curve
    left it between 1.20 and 1.94), near the dense GEMMs' own 1.11."""
    ratios = {rows: r for rows, r in _ratios(grouped=True).items() if rows >= 128}
    mid = statistics.median(ratios.values())
    assert 0.95 < mid < 1.2
    assert all(abs(r / mid - 1) < 0.2 for r in ratios.values()), ratios
    dense = {rows: r for rows, r in _ratios(grouped=False).items() if rows >= 128}
    assert max(dense.values()) / min(dense.values()) > 1.5  # what the own curve fixes


@pytest.mark.parametrize("rows", [256, 2048])
def test_grouped_is_dense_with_the_rows_half_moved(rows):
    half = GROUPED_ROWS_HALF_DIM * 989e12 / 4800e9
    k, n = 2048, 1536
    slower = ISOLATED.grouped_s(1.0, rows, k, n) / ISOLATED.linear_s(1.0, rows, k, n)
    assert slower == pytest.approx((rows + half) / (rows + ISOLATED.linear_half), rel=1e-9)
    assert slower > 1
