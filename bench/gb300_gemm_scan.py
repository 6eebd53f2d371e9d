"""Can one GB300 GEMM rate explain NVIDIA's GB300 rows? A scan of the preset's GEMM fractions, family by family.

The same plan on GB300 NVL72 and on GB200 NVL72 runs 1.21x faster as NVIDIA measured it and 1.08x as predicted
(bench/nvidia_gpu_pairs.py), and the GB300 rows lean slow. GB300's GEMM fractions are the one estimate in its preset
(GB200's measured ones under its power limit, autotune/presets/gpus.yaml). This bench scales them by m = 1.00 ...
1.25 (every precision alike; each m in a child process, so no cached estimate crosses over), estimates every row of
bench/accuracy_nvidia_recipes.py at each m, and asks which m each criterion picks:

* pairs: the median of the GB300/GB200 pairs' predicted-over-measured ratio at 1;
* rows: the median signed error of the GB300 rows at 0;
* rows, leave one family out: m picked on the other families' GB300 rows, the family's own error at that m.

A single GEMM rate explains the gap only if the criteria agree and the held-out families improve. Run:
``PYTHONPATH=. python bench/gb300_gemm_scan.py`` (~1 min).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from nvidia_gpu_pairs import gpu_pairs, ratio_errors  # noqa: E402  the pairs the accuracy bench prints

FACTORS = tuple(round(1.0 + 0.01 * i, 2) for i in range(26))

CHILD = r"""
import json, sys
sys.path.insert(0, "bench")
from autotune.specs import presets
fractions = presets._gpu_presets()["gb300"]["kernels"]["gemm_fraction"]
for key in fractions:
    fractions[key] *= float(sys.argv[1])
import accuracy_nvidia_recipes as bench
out = []
for row in bench.load_rows():
    case = bench.express(row)
    if not case.reason:
        bench.estimate_case(case)
    if case.predicted is not None:
        out.append([row["system"], case.family, case.measured, case.predicted, row])
print(json.dumps(out))
"""


def estimates(factor: float) -> list[list]:
    """[system, family, measured, predicted, CSV row] of every estimated row with GB300's GEMM fractions x factor."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", CHILD, str(factor)], cwd=ROOT, env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def gb300_errors(rows: list[list], family: str | None = None, without: str | None = None) -> list[float]:
    """log(predicted / measured) of the GB300 rows (of one family, or without one)."""
    return [math.log(p / m) for s, f, m, p, _ in rows
            if s == "DGX-GB300" and (family is None or f == family) and (without is None or f != without)]


def pair_errors(rows: list[list]) -> list[float]:
    """log(predicted ratio / measured ratio) of each GB300/GB200 pair (the same plan on both:
    ``nvidia_gpu_pairs.gpu_pairs``)."""
    cases = [SimpleNamespace(row=row, measured=m, predicted=p) for _, _, m, p, row in rows]
    pairs = [(a, b) for a, b in gpu_pairs(cases) if a.row["system"] == "DGX-GB300"]
    return [math.log(predicted / measured) for measured, predicted in ratio_errors(pairs)]


def pick(scan: dict[float, list[list]], errors) -> float:
    """The factor whose median error is nearest 0."""
    return min(scan, key=lambda f: abs(statistics.median(errors(scan[f]))))


def median_abs(values: list[float]) -> float:
    return 100 * statistics.median(abs(v) for v in values)


def main() -> int:
    scan = {f: estimates(f) for f in FACTORS}
    base = scan[1.0]
    by_pairs, by_rows = pick(scan, pair_errors), pick(scan, gb300_errors)
    edge = " (the scan's edge)" if by_pairs == FACTORS[-1] else ""
    print(f"GB300 GEMM fractions x m, m = {FACTORS[0]}-{FACTORS[-1]}; {len(pair_errors(base))} GB300/GB200 pairs, "
          f"{len(gb300_errors(base))} GB300 rows")
    print(f"m the pairs pick: {by_pairs}{edge}; m the GB300 rows pick: {by_rows}")
    print(f"\n{'family (GB300 rows)':<22}{'rows':>5}{'|err| m=1':>11}{'m, held out':>13}{'|err| there':>13}")
    for family in sorted({r[1] for r in base if r[0] == "DGX-GB300"}):
        held = pick(scan, lambda rows: gb300_errors(rows, without=family))
        print(f"{family:<22}{len(gb300_errors(base, family)):>5}{median_abs(gb300_errors(base, family)):>10.1f}%"
              f"{held:>13.2f}{median_abs(gb300_errors(scan[held], family)):>12.1f}%")
    print(f"\n{'m':>5}{'GB300 |err|':>13}{'signed':>9}{'all rows |err|':>16}{'pairs ratio err':>17}")
    for f in (1.0, 1.05, 1.1, by_rows, 1.15, 1.2, FACTORS[-1]):
        rows = scan[f]
        every = [math.log(p / m) for _, _, m, p, _ in rows]
        print(f"{f:>5.2f}{median_abs(gb300_errors(rows)):>12.1f}%{100 * statistics.median(gb300_errors(rows)):>8.1f}%"
              f"{median_abs(every):>15.1f}%{100 * statistics.median(pair_errors(rows)):>16.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
