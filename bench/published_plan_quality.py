"""NVIDIA's dense H100 Megatron recipes among the published runs (autotune/data/published_runs): where each run's
plan ranks in `autotune plan --engine megatron` on the same model, GPUs, global batch, sequence, precision and run
settings, and the predicted gain of the planner's first plan over it (the Blackwell rows' table is
bench/accuracy_nvidia_recipes.py's; this is the H100 one issue 20 asks for).

    python bench/published_plan_quality.py

The runs: Megatron-core's H100 scaling table (Megatron-LM README), NeMo 24.07's GPT-3 175B FP8 and Megatron-Bridge
25.11's Llama 3 70B FP8 performance recipes (``NVIDIA_RUNS``). Each run's plan is the one `bench/accuracy_published.py`
estimates (its fastest candidate that fits, where the source leaves a setting out); the search gets the run's time
settings (TP communication overlap and the rest of ``PublishedRun.time_overrides``) for every plan it tries, and the
run's precision and gradient dtype, as the Blackwell table gives NVIDIA's run settings to its search. The rank is the
first place of the plan's tie group in the planner's order (``nvidia_plan_quality.planner_rank``), the intervals
without the run's own family's errors (leave-one-family-out, as the Blackwell table leaves each row's family out).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from autotune.cost.efficiency import DEFAULT_EFFICIENCY
from autotune.cost.estimate import estimate
from autotune.cost.published_runs import predict_run, published_runs
from autotune.cost.step_time import TimeSettings
from autotune.report import plan_summary
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.settings import MemorySettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvidia_plan_quality import planner_rank  # the Blackwell table's rank: first place of the tie group

NVIDIA_RUNS = ("megatron-core-h100-", "nemo", "bridge")
"""Run ids of NVIDIA's own dense Megatron runs on H100 (their recipes' plans)."""


def rank_row(run) -> tuple[int, int, int, float, str]:
    """(rank in the planner's order, 1 + plans predicted faster, feasible plans searched, gain of the planner's first
    plan over the run's, that plan in words) for one published run."""
    _, plan, _, _ = predict_run(run)
    memory = MemorySettings(**run.memory_overrides)
    timing = TimeSettings(efficiency=DEFAULT_EFFICIENCY, **run.time_overrides)
    est = estimate(run.model, run.cluster, plan, memory, timing)
    constraints = SearchConstraints(engines=("megatron",), precisions=(plan.precision,), grad_dtype=plan.grad_dtype,
                                    fp8_recipe=plan.fp8_recipe)
    found = search_plans(run.model, run.cluster, seq_len=plan.seq_len, global_batch_size=plan.global_batch_size,
                         top_k=10, constraints=constraints, memory_settings=memory, time_settings=timing)
    rank, by_speed = planner_rank(found, est, frozenset({run.family}))  # its own family's errors left out
    top = found.in_order[0] if found.in_order else None
    gain = top.time.tokens_per_s / est.time.tokens_per_s - 1 if top is not None else float("nan")
    return rank, by_speed, found.num_feasible, gain, plan_summary(top.plan) if top is not None else "(none)"


def main() -> int:
    runs = [r for r in published_runs() if r.run_id.startswith(NVIDIA_RUNS) and not r.skipped
            and r.tokens_per_s_per_gpu and r.engine == "megatron"]
    print(f"{'run':<44}{'plan':<40}{'rank':>6}{'speed':>7}{'of':>8}{'gain':>8}  top plan")
    ranks, gains = [], []
    for run in runs:
        rank, by_speed, feasible, gain, top = rank_row(run)
        plan = predict_run(run)[1]
        ranks.append(rank)
        gains.append(gain)
        print(f"{run.run_id:<44}{plan_summary(plan)[:38]:<40}{rank:>6}{by_speed:>7}{feasible:>8}{gain:>+8.1%}  {top}")
    top10 = sum(1 for r in ranks if r <= 10)
    print(f"\nNVIDIA's H100 dense recipes in the planner's top 10: {top10}/{len(ranks)}; median predicted gain of the "
          f"planner's first plan over the recipe's: {statistics.median(gains):+.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
