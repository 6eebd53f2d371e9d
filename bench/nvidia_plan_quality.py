"""The plan-quality table of bench/accuracy_nvidia_recipes.py: for each NVIDIA row estimated, NVIDIA's plan's place
in `autotune plan --engine megatron` on the same model, GPUs, global batch, sequence, precision and run settings, and
the predicted gain of the planner's first plan over it."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from autotune.cost.uncertainty import uncertainty_of
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.search.ties import rank_with_ties


RUN_SETTINGS_SEARCHED = ("cuda_graph", "cuda_graph_scope", "tp_overlap", "ep_overlap", "moe_dispatcher")
"""The run settings of NVIDIA's plan (its recipe's, as estimated) that the search is given too, as `autotune plan
--cuda-graph --cuda-graph-scope --tp-overlap --ep-overlap --moe-dispatcher` takes them: NVIDIA's plan and the plans it
is ranked among then run the same settings (the TP / EP ones on the plans with tp > 1 / ep > 1). The recompute is
searched (the planner's own choice per plan), as are the layout, micro-batch and ZeRO stage."""


def search_constraints(est) -> SearchConstraints:
    """`autotune plan --engine megatron --precision P --grad-dtype G --fp8-recipe R` (NVIDIA's plan's) with NVIDIA's plan's run
    settings (``RUN_SETTINGS_SEARCHED``; unset ones left to the engine's defaults, as the plan's are)."""
    plan = est.plan
    return SearchConstraints(engines=("megatron",), precisions=(plan.precision,), grad_dtype=plan.grad_dtype,
                             fp8_recipe=plan.fp8_recipe,
                             **{name: getattr(plan, name) for name in RUN_SETTINGS_SEARCHED})


def planner_rank(found, est) -> tuple[int, int]:
    """NVIDIA's plan's place among the searched plans: (in the planner's order, by predicted speed alone).

    The planner's order is what `autotune plan` lists (autotune.search.ties): plans within each other's interval are
    a tie group, listed simplest first, the groups fastest first. NVIDIA's plan joins the searched plans where its
    predicted speed puts it (it may lie outside the search space: a vpp the search does not try, a recipe's pipeline
    layout) and the groups are made over them all, as the planner would had it searched it; its rank is its group's
    first place (a tie counts as a tie: the plans of its group listed before it are simpler, not faster by what the
    model can tell)."""
    nv = est.time.tokens_per_s
    by_speed = sum(1 for e in found.ranked if e.time.tokens_per_s > nv * (1 + 1e-9)) + 1
    merged = sorted((*found.ranked, est), key=lambda e: (e.time.tokens_per_s, e.memory.headroom), reverse=True)
    tie = rank_with_ties(merged)
    position = next(i for i, e in enumerate(tie.ranked) if e is est)
    return tie.group_start(position) + 1, by_speed


def plan_quality_table(cases: list, show_rows: bool, label: Callable[[dict], str]) -> dict:
    """The plan-quality table of the estimated rows (``label``: a row's name in the table)."""
    done = [c for c in cases if c.predicted is not None]
    searches: dict[tuple, object] = {}
    ranks, speed_ranks, gains, first_intervals = [], [], [], []
    print(f"\nPLAN QUALITY: NVIDIA's plan in `autotune plan --engine megatron` on the same model / GPUs / global batch "
          f"/ seq / precision / run settings ({len(done)} rows); rank: the first place of its tie group in the "
          f"planner's order; speed: 1 + the plans predicted faster")
    if show_rows:
        print(f"\n{'row':<84}{'rank':>6}{'speed':>6}{'of':>7}{'gain':>8}  top plan")
    for c in done:
        est = c.result
        plan = est.plan
        constraints = search_constraints(est)
        key = (est.model.name, est.cluster.gpu.name, est.cluster.num_gpus, est.cluster.gpus_per_node,
               plan.global_batch_size, plan.seq_len, plan.precision, plan.fp8_recipe,
               *(getattr(plan, name) for name in RUN_SETTINGS_SEARCHED))
        if key not in searches:
            searches[key] = search_plans(est.model, est.cluster, seq_len=plan.seq_len,
                                         global_batch_size=plan.global_batch_size, top_k=10, constraints=constraints)
        found = searches[key]
        nv = est.time.tokens_per_s
        in_order, by_speed = planner_rank(found, est)
        rank = in_order if c.fits else None
        top_plan = found.in_order[0] if found.in_order else None
        gain = top_plan.time.tokens_per_s / nv - 1 if top_plan is not None else None
        ranks.append(rank)
        speed_ranks.append(by_speed if c.fits else None)
        if gain is not None:
            gains.append(gain)
            first_intervals.append(uncertainty_of(top_plan.plan, top_plan.cluster).relative)
        if show_rows:
            from autotune.report import plan_summary

            top = plan_summary(top_plan.plan) if top_plan is not None else "(nothing feasible)"
            shown = f"{rank}" if rank is not None else f"({in_order})"
            print(f"{label(c.row):<84}{shown:>6}{by_speed:>6}{found.num_feasible:>7}"
                  f"{'' if gain is None else f'{gain:+.1%}':>8}  {top}")
    top10 = sum(1 for r in ranks if r is not None and r <= 10)
    top10_speed = sum(1 for r in speed_ranks if r is not None and r <= 10)
    unfit = sum(1 for r in ranks if r is None)
    med_gain = statistics.median(gains) if gains else math.nan
    print(f"\nNVIDIA's plan in the planner's top 10: {top10}/{len(ranks)} rows "
          f"({top10 / len(ranks) if ranks else 0:.0%}; by predicted speed alone {top10_speed}); not feasible by the "
          f"ledger (unranked, rank in brackets): {unfit}; searches: {len(searches)}")
    print(f"median predicted gain of the planner's first plan over NVIDIA's: {med_gain:+.1%}"
          + (f" (p90 {sorted(gains)[min(len(gains) - 1, math.ceil(0.9 * len(gains)) - 1)]:+.1%})" if gains else ""))
    return {"ranks": ranks, "speed_ranks": speed_ranks, "gains": gains, "first_intervals": first_intervals,
            "top10": top10}
