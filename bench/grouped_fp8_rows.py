"""FP8 grouped GEMMs with few rows per expert: the cost model's rate against DeepGEMM's published H800 figures.

What is compared is the shape of the curve, not the absolute rate: each grouped GEMM's TFLOP/s over the dense GEMM's
with the same n and k at 4,096 rows (bench/data/deepgemm_h800_fp8.csv, DeepGEMM's own README), and the model's
grouped rate over its dense rate for the same shapes on h100-sxm-80gb (the H800's compute: only its NVLink is cut).
The model's routed experts run ``rows / (rows + half)`` of the dense rate (``autotune.cost.kernels``,
``GROUPED_ROWS_HALF_DIM``); ``half`` is the GPU's 16-bit machine balance times 0.92 at every precision, not the FP8
one (the column "FP8 balance" shows what that would give). Run: ``python bench/grouped_fp8_rows.py``.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.cost.efficiency import DEFAULT_EFFICIENCY  # noqa: E402
from autotune.cost.kernels import GROUPED_ROWS_HALF_DIM, rates  # noqa: E402
from autotune.specs.loading import load_cluster  # noqa: E402

DATA = ROOT / "bench" / "data" / "deepgemm_h800_fp8.csv"
GPU = "h100-sxm-80gb"


@dataclass(frozen=True)
class Shape:
    rows: int
    n: int
    k: int
    measured: float  # TFLOP/s over the dense 4,096-row GEMM's with the same n and k
    where: str


def read_shapes(path: Path = DATA) -> list[Shape]:
    """The grouped rows of the file, each as its rate relative to the dense row of the same n and k."""
    with path.open() as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    dense = {(int(r["n"]), int(r["k"])): float(r["tflops"]) for r in rows if r["kernel"] == "dense"}
    return [Shape(int(r["rows"]), int(r["n"]), int(r["k"]), float(r["tflops"]) / dense[int(r["n"]), int(r["k"])],
                  r["where"]) for r in rows if r["kernel"] != "dense"]


def model_ratio(rows: float, half: float, dense_half: float, dense_rows: float = 4096) -> float:
    """The model's grouped rate at ``rows`` per expert over its dense rate at ``dense_rows`` (k and n cancel)."""
    return (rows / (rows + half)) / (dense_rows / (dense_rows + dense_half))


def halves(gpu: str = GPU) -> tuple[float, float, float]:
    """(grouped half as the model uses it, grouped half from the FP8 balance, the dense curve's FP8 half)."""
    cluster = load_cluster(gpu=gpu, num_gpus=8, gpus_per_node=None, cluster_path=None)
    r = rates(cluster, "fp8", DEFAULT_EFFICIENCY, "fa3", "te-blockwise")
    fp8_balance = cluster.gpu.peak_flops_per_s("fp8") / (cluster.gpu.hbm_bandwidth_gb_per_s * 1e9)
    return r.grouped_half, GROUPED_ROWS_HALF_DIM * fp8_balance, r.linear_half


def main() -> int:
    used, fp8_balance_half, dense_half = halves()
    print(f"DeepGEMM FP8 grouped GEMMs on H800 over its dense 4,096-row GEMM of the same n, k; the model on {GPU} "
          f"(rows half-point {used:.0f} as used, {fp8_balance_half:.0f} from the FP8 balance)")
    print(f"{'rows':>6}{'n':>7}{'k':>7}{'DeepGEMM':>10}{'model':>8}{'FP8 balance':>13}  source")
    for s in read_shapes():
        print(f"{s.rows:>6}{s.n:>7}{s.k:>7}{s.measured:>10.2f}{model_ratio(s.rows, used, dense_half):>8.2f}"
              f"{model_ratio(s.rows, fp8_balance_half, dense_half):>13.2f}  deepseek-ai/DeepGEMM@55ab91f {s.where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
