"""Fit the ledger's one shared caching-allocator parameter (``MemorySettings.fragmentation_fraction``) on every
published run with a peak memory, and print the per-run errors at the fitted and the shipped value.

    python bench/fit_fragmentation.py

Each run is estimated on the plan ``predict_run`` picks with the shipped settings; its published peak is the
allocator's reserved bytes (torchtitan: ``max_memory_reserved``) or the device total (BLOOM: nvidia-smi), and
both include the reserve, so ``reserved = allocated * (1 + f)`` is fitted on all of them at once: the ``f`` of a
grid (0 to 0.30 by 0.005) with the smallest median |error|, ties to the smaller p90.
"""

from __future__ import annotations

import math
import statistics
import sys

from autotune.cost.memory import estimate_memory
from autotune.cost.published_runs import predict_run, published_runs
from autotune.specs.settings import MemorySettings

GIB = 2**30


def _peak(run, plan, fraction: float) -> float:
    mem = estimate_memory(run.model, run.cluster, plan,
                          MemorySettings(**run.memory_overrides, fragmentation_fraction=fraction))
    return mem.reserved if run.memory_method == "allocator_reserved" else mem.total


def _stats(errors: list[float]) -> tuple[float, float]:
    a = sorted(abs(e) for e in errors)
    return statistics.median(a), a[min(len(a) - 1, math.ceil(0.9 * len(a)) - 1)]


def main() -> int:
    runs = [r for r in published_runs() if not r.skipped and r.peak_memory_gib and r.tokens_per_s_per_gpu]
    plans = {r.run_id: predict_run(r)[1] for r in runs}

    def errors(fraction: float) -> list[float]:
        return [_peak(r, plans[r.run_id], fraction) / (r.peak_memory_gib * GIB) - 1 for r in runs]

    grid = [i * 0.005 for i in range(61)]
    best = min(grid, key=lambda f: (*_stats(errors(f)), f))
    shipped = MemorySettings().fragmentation_fraction
    print(f"fitted on {len(runs)} runs with a published peak memory and a throughput: "
          + ", ".join(sorted({r.family for r in runs})))
    print(f"{'run':<50}{'published GiB':>14}{'f=' + format(shipped, '.3f'):>10}{'f=' + format(best, '.3f'):>10}")
    for r, e_ship, e_best in zip(runs, errors(shipped), errors(best), strict=True):
        print(f"{r.run_id:<50}{r.peak_memory_gib:>14.1f}{e_ship:>+10.1%}{e_best:>+10.1%}")
    for name, f in (("shipped", shipped), ("fitted", best)):
        med, p90 = _stats(errors(f))
        print(f"{name:<8} fragmentation_fraction {f:.3f}: median |error| {med:.1%}, p90 {p90:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
