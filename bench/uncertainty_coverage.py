"""Is the estimate's interval honest? Each shipped run (autotune/data/uncertainty_runs.json: the published runs and
NVIDIA's Blackwell rows, each error out of sample) is judged by the interval the *other* families' runs give a
plan of its kind (autotune/cost/uncertainty.py, ``exclude_families``), as a user's new model would be.

    PYTHONPATH=. python bench/uncertainty_coverage.py

``±median``: the interval `estimate` prints first, the median |error| of the runs most like the plan: a calibrated one
holds about half of them. ``±90%``: that interval times ``coverage_factor`` (the records' own nearest-rank 90th
percentile of |error| / interval), the wider bound `estimate` prints beside it; by construction it holds nine in
ten of all runs, and the table shows where it holds fewer (a family whose errors run past its neighbours').
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune.cost.uncertainty import (  # noqa: E402
    COVERAGE, NVIDIA_FAMILY_PREFIX, _records, coverage_factor, out_of_family_ratios)


def coverage_rows() -> list[tuple[str, str, float]]:
    """(source, family, |error| / out-of-family interval) of every shipped run."""
    return [(r.get("source", "published"), r["family"], ratio) for r, ratio in zip(_records(), out_of_family_ratios())]


def held(ratios: list[float], factor: float) -> float:
    """The share of runs whose |error| is within ``factor`` times their interval."""
    return sum(x <= factor for x in ratios) / len(ratios)


def main() -> int:
    rows = coverage_rows()
    factor = coverage_factor()
    print(f"each shipped run against the interval the other families give its kind of plan; the wide bound is "
          f"{factor:.2f} x the median interval (the records' {COVERAGE:.0%} quantile of |error| / interval)\n")
    print(f"{'runs':<52}{'n':>5}{'in ±median':>12}{'in ±90%':>10}")
    groups: dict[str, list[float]] = defaultdict(list)
    for source, family, ratio in rows:
        groups[f"all {source}"].append(ratio)
        groups[f"  {family.removeprefix(NVIDIA_FAMILY_PREFIX)}"].append(ratio)
    groups["all runs"] = [ratio for _, _, ratio in rows]
    for name in sorted(groups, key=lambda g: (g == "all runs", g.startswith("  "), g)):
        ratios = groups[name]
        print(f"{name[:51]:<52}{len(ratios):>5}{held(ratios, 1.0):>12.0%}{held(ratios, factor):>10.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
