"""Planner speed: the whole plan space of llama3-405b on 16,384 H100s and of a 70B on 1,024.

    python bench/search_speed.py

Every dimension is searched (engine, tp, cp, pp, vpp, ZeRO 0-3, optimizer and parameter
offload, bf16 and fp8, recompute none/selective/full, micro-batch 1-16). Target: < 2 s each
on a 2-core machine. Each case runs three times in a fresh process state; the best and the
median are printed (the first run includes filling the per-layer caches).
"""

from __future__ import annotations

import statistics
import sys
import time

from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

CASES = (
    ("llama3-405b", "h100-sxm-80gb", 16384, 8192, 2048),
    ("llama3-70b", "h100-sxm-80gb", 1024, 8192, 1024),
    ("llama3-70b", "h100-sxm-80gb", 128, 8192, 1024),
)
FULL_SPACE = SearchConstraints(precisions=("bf16", "fp8"), allow_offload=True)


def clear_caches() -> None:
    """Empty every functools cache of the cost model, so each timed search starts cold."""
    import importlib
    import pkgutil

    import autotune.cost

    for info in pkgutil.iter_modules(autotune.cost.__path__):
        module = importlib.import_module(f"autotune.cost.{info.name}")
        for obj in vars(module).values():
            if callable(getattr(obj, "cache_clear", None)):
                obj.cache_clear()


def main() -> int:
    print(f"{'model':<14}{'GPUs':>7}{'seq':>6}{'batch':>7}{'enumerated':>12}{'feasible':>10}"
          f"{'plans/s':>11}{'best s':>8}{'median s':>10}  winner")
    for name, gpu, n, seq, gb in CASES:
        model = load_model_preset(name)
        cluster = load_cluster(gpu=gpu, num_gpus=n, gpus_per_node=None, cluster_path=None)
        times = []
        for _ in range(3):
            clear_caches()
            started = time.perf_counter()
            result = search_plans(model, cluster, seq_len=seq, global_batch_size=gb, constraints=FULL_SPACE)
            times.append(time.perf_counter() - started)
        from autotune.report import plan_summary

        winner = plan_summary(result.candidates[0].plan) if result.candidates else "-"
        print(f"{name:<14}{n:>7}{seq:>6}{gb:>7}{result.num_enumerated:>12,}{result.num_feasible:>10,}"
              f"{result.num_enumerated / min(times):>11,.0f}{min(times):>8.2f}{statistics.median(times):>10.2f}  {winner}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
