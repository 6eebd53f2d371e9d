"""The plan-quality table of bench/accuracy_nvidia_recipes.py: for each NVIDIA row estimated, NVIDIA's plan's place
in `autotune plan --engine megatron` on the same model, GPUs, global batch, sequence, precision and run settings, and
the predicted gain of the planner's first plan over it."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from autotune.cost.time_settings import TimeSettings
from autotune.cost.uncertainty import NVIDIA_FAMILY_PREFIX
from autotune.search.planner import search_plans
from autotune.specs.settings import MemorySettings
from autotune.search.space import SearchConstraints
from autotune.search.ties import interval, rank_with_ties
from autotune.specs.peft import PEFT_SETTINGS  # LoRA rows: the search fine-tunes as NVIDIA's plan does


RUN_SETTINGS_SEARCHED = ("cuda_graph", "cuda_graph_scope", "tp_overlap", "ep_overlap", "moe_dispatcher",
                         "moe_capacity_factor", "moe_pad_to_capacity", "mtp_layers", "fp8_attention",
                         "fp8_output_proj")
"""The run settings of NVIDIA's plan (its recipe's, as estimated) that the search is given too, as `autotune plan
--cuda-graph --cuda-graph-scope --tp-overlap --ep-overlap --moe-dispatcher --moe-capacity-factor --moe-pad-to-capacity
--mtp-layers --fp8-attention --fp8-output-proj` takes them (token-dropping rows: the same capacity for every plan;
DeepSeek-V3's: its MTP module; MXFP8 rows with FP8 attention / an MXFP8 output layer: every plan's attention / output
layer in FP8):
NVIDIA's plan and the plans it is ranked among then run the same settings (the TP / EP ones on the plans with tp > 1 / ep > 1). The recompute is
searched (the planner's own choice per plan, Megatron's module sets on MoE / MLA models included), as are the layout,
micro-batch and ZeRO stage."""


def uncertainty_family(family: str) -> str:
    """The family of an NVIDIA row's record in autotune/data/uncertainty_runs.json (bench/uncertainty_table.py): the
    table's model family (``accuracy_nvidia_recipes.family_of``) named so that it never equals a published-runs
    family."""
    return NVIDIA_FAMILY_PREFIX + family


def search_constraints(est) -> SearchConstraints:
    """`autotune plan --engine megatron --precision P --grad-dtype G --fp8-recipe R` (NVIDIA's plan's) with NVIDIA's plan's run
    settings (``RUN_SETTINGS_SEARCHED``; unset ones left to the engine's defaults, as the plan's are)."""
    plan = est.plan
    return SearchConstraints(engines=("megatron",), precisions=(plan.precision,), grad_dtype=plan.grad_dtype,
                             fp8_recipe=plan.fp8_recipe,
                             **{name: getattr(plan, name) for name in RUN_SETTINGS_SEARCHED + PEFT_SETTINGS})


def planner_rank(found, est, exclude_families: frozenset[str] = frozenset()) -> tuple[int, int]:
    """NVIDIA's plan's place among the searched plans: (in the planner's order, by predicted speed alone).

    The planner's order is what `autotune plan` lists (autotune.search.ties): plans within each other's interval are
    a tie group, listed simplest first, the groups fastest first. NVIDIA's plan joins the searched plans where its
    predicted speed puts it (it may lie outside the search space: a vpp the search does not try, a recipe's pipeline
    layout) and the groups are made over them all, as the planner would had it searched it; its rank is its group's
    first place (a tie counts as a tie: the plans of its group listed before it are simpler, not faster by what the
    model can tell). ``exclude_families``: the row's own family in autotune/data/uncertainty_runs.json, whose errors
    the intervals leave out (leave-one-family-out: a row's own error does not widen the interval it is judged by)."""
    nv = est.time.tokens_per_s
    by_speed = sum(1 for e in found.ranked if e.time.tokens_per_s > nv * (1 + 1e-9)) + 1
    merged = sorted((*found.ranked, est), key=lambda e: (e.time.tokens_per_s, e.memory.headroom), reverse=True)
    tie = rank_with_ties(merged, exclude_families=exclude_families)
    position = next(i for i, e in enumerate(tie.ranked) if e is est)
    return tie.group_start(position) + 1, by_speed


def like_for_like_search(est, argv: list[str], searches: dict):
    """`autotune plan` on ``est``'s model, GPUs, batch, sequence, precision and run settings (``search_constraints``),
    with the allocator and loss its estimate arguments ``argv`` ran (``--expandable-segments``, ``--cross-entropy
    te``: the only value the benches write) for every searched plan; one search per workload in ``searches``."""
    plan = est.plan
    key = (est.model.name, est.cluster.gpu.name, est.cluster.num_gpus, est.cluster.gpus_per_node,
           plan.global_batch_size, plan.seq_len, plan.precision, plan.fp8_recipe,
           *(getattr(plan, name) for name in RUN_SETTINGS_SEARCHED + PEFT_SETTINGS),
           expandable := "--expandable-segments" in argv, te_loss := "--cross-entropy" in argv)
    if key not in searches:
        searches[key] = search_plans(est.model, est.cluster, seq_len=plan.seq_len,
                                     global_batch_size=plan.global_batch_size, top_k=10,
                                     constraints=search_constraints(est),
                                     memory_settings=MemorySettings(expandable_segments=expandable,
                                                                    te_cross_entropy=te_loss or None),
                                     time_settings=TimeSettings(te_cross_entropy=te_loss or None))
    return searches[key]


WORKLOAD_COLUMNS = ("task", "model", "system", "gpus", "precision", "gbs", "seq")
"""What makes two rows of the table the same workload (their plans and containers may differ)."""
PLAN_COLUMNS = ("mbs", "fsdp", "tp", "pp", "cp", "vp", "ep")
MEASURED_MARGIN = 0.10
"""How much faster another plan's measurement must be to count: more than one plan's spread across the table's
containers (LLAMA3_70B GB300 64 MXFP8 pp4vp5 measured 4596 in 26.02, 4864 in 26.04.01: 5.8%)."""


def measured_faster(row: dict, rows: list[dict]) -> dict | None:
    """The fastest row NVIDIA measured on the same workload (``WORKLOAD_COLUMNS``) with another plan, where it is
    more than ``MEASURED_MARGIN`` faster than ``row``: NVIDIA's own measurement that a plan other than this row's
    wins (a planner that ranks this row's plan low is then right), whichever container ran it."""
    same = [r for r in rows if all(_workload_value(r, k) == _workload_value(row, k) for k in WORKLOAD_COLUMNS)
            and _plan(r) != _plan(row)]
    best = max(same, key=lambda r: float(r["tokens_per_s_per_gpu"]), default=None)
    if best is None or float(best["tokens_per_s_per_gpu"]) <= (1 + MEASURED_MARGIN) * float(row["tokens_per_s_per_gpu"]):
        return None
    return best


def _plan(row: dict) -> tuple[int, ...]:
    """A row's plan columns as numbers (empty, "n/a" and 0 read as 1: not used)."""
    values = []
    for k in PLAN_COLUMNS:
        v = row[k].strip()
        values.append(int(v) if v.isdigit() and int(v) > 0 else 1)
    return tuple(values)


def _workload_value(row: dict, column: str) -> str:
    """A workload column as compared: the table names MX block scaling "MXFP8" and "FP8-MX" in different
    containers (the bench runs both as ``--fp8-recipe te-mxfp8``)."""
    value = row[column].strip()
    return "MXFP8" if column == "precision" and value.upper() in ("MXFP8", "FP8-MX") else value


def plan_summary_of_row(row: dict) -> str:
    """A row's plan in the table's words: mb4 tp2pp4vp5, fsdp64 for Megatron-FSDP."""
    lay = "".join(f"{k}{row[k]}" for k in ("fsdp", "tp", "pp", "cp", "vp", "ep")
                  if row[k].strip() not in ("", "n/a", "0", "1"))
    return f"mb{row['mbs']} {lay or 'dp'}"


STEP_TERMS = (("compute", "compute_s"), ("comm", "exposed_comm_s"), ("bubble", "bubble_s"),
              ("offload", "offload_s"), ("optimizer", "optimizer_s"))


def gain_terms(top, nvidia) -> dict[str, float]:
    """Where the planner's first plan saves time over NVIDIA's: each step-time term's difference as a share of
    NVIDIA's step (same model, GPUs and global batch, so the same tokens a step; negative: the first plan's is
    shorter). Compute differs between plans of the same FLOPs by the slowest pipeline stage (its extra layers, the
    output layer and loss on the last) and by kernel shapes (GEMM widths, rows per expert)."""
    step = nvidia.time.step_time_s
    return {name: (getattr(top.time, attr) - getattr(nvidia.time, attr)) / step for name, attr in STEP_TERMS}


def plan_quality_table(cases: list, show_rows: bool, label: Callable[[dict], str], last_stage: bool = False) -> dict:
    """The plan-quality table of the estimated rows (``label``: a row's name in the table; ``last_stage``: NVIDIA's
    pipelined plans among the misses with a lighter last stage too, bench/nvidia_last_stage.py)."""
    done = [c for c in cases if c.predicted is not None]
    searches: dict[tuple, object] = {}
    ranks, speed_ranks, gains, first_intervals = [], [], [], []
    all_rows = [c.row for c in cases]
    confirmed = []  # misses where NVIDIA measured another plan faster on the same workload
    misses = []  # (case, gain_terms, the first plan pipelines less than NVIDIA's, its tokens/s)
    print(f"\nPLAN QUALITY: NVIDIA's plan in `autotune plan --engine megatron` on the same model / GPUs / global batch "
          f"/ seq / precision / run settings ({len(done)} rows); rank: the first place of its tie group in the "
          f"planner's order (intervals without the row's own family's records); speed: 1 + the plans predicted faster")
    if show_rows:
        print(f"\n{'row':<84}{'rank':>6}{'speed':>6}{'of':>7}{'gain':>8}  top plan")
    for c in done:
        est = c.result
        found = like_for_like_search(est, c.argv, searches)
        nv = est.time.tokens_per_s
        own = frozenset({uncertainty_family(c.family)})  # its family's records out of every interval
        in_order, by_speed = planner_rank(found, est, own)
        rank = in_order if c.fits else None
        top_plan = found.in_order[0] if found.in_order else None
        gain = top_plan.time.tokens_per_s / nv - 1 if top_plan is not None else None
        ranks.append(rank)
        speed_ranks.append(by_speed if c.fits else None)
        if gain is not None:
            gains.append(gain)
            first_intervals.append(interval(top_plan).relative)  # the one the planner ranked it by
        if show_rows:
            from autotune.report import plan_summary

            top = plan_summary(top_plan.plan) if top_plan is not None else "(nothing feasible)"
            shown = f"{rank}" if rank is not None else f"({in_order})"
            print(f"{label(c.row):<84}{shown:>6}{by_speed:>6}{found.num_feasible:>7}"
                  f"{'' if gain is None else f'{gain:+.1%}':>8}  {top}")
        if rank is not None and rank > 10 and (faster := measured_faster(c.row, all_rows)) is not None:
            confirmed.append((c.row, faster))
        if rank is not None and rank > 10 and top_plan is not None:
            misses.append((c, gain_terms(top_plan, est), est.plan.pp > 1 and top_plan.plan.pp < est.plan.pp,
                           top_plan.time.tokens_per_s))
    top10 = sum(1 for r in ranks if r is not None and r <= 10)
    top10_speed = sum(1 for r in speed_ranks if r is not None and r <= 10)
    unfit = sum(1 for r in ranks if r is None)
    cache = sum(1 for c in done if not c.fits and c.result.memory.cache_bound)
    med_gain = statistics.median(gains) if gains else math.nan
    print(f"\nNVIDIA's plan in the planner's top 10: {top10}/{len(ranks)} rows "
          f"({top10 / len(ranks) if ranks else 0:.0%}; by predicted speed alone {top10_speed}); not feasible by the "
          f"ledger (unranked, rank in brackets): {unfit}, {cache} of them over only by the allocator's reserve "
          f"(MemoryEstimate.cache_bound: they fit with expandable segments); searches: {len(searches)}")
    print(f"median predicted gain of the planner's first plan over NVIDIA's: {med_gain:+.1%}"
          + (f" (p90 {sorted(gains)[min(len(gains) - 1, math.ceil(0.9 * len(gains)) - 1)]:+.1%})" if gains else ""))
    print(f"misses (rank > 10) where NVIDIA itself measured another plan over {MEASURED_MARGIN:.0%} faster on the same "
          f"workload (task / model / system / GPUs / precision / batch / sequence), so a planner that ranks this row's "
          f"plan low has NVIDIA's measurements on its side (in another container its software may account for part; "
          f"the container is shown): {len(confirmed)} (counted as misses above)")
    for row, faster in confirmed:
        print(f"  {label(row)}  measured {float(row['tokens_per_s_per_gpu']):.0f}; NVIDIA's "
              f"{plan_summary_of_row(faster)} ({faster['container']}) measured "
              f"{float(faster['tokens_per_s_per_gpu']):.0f} tokens/s/GPU")
    _print_gain_terms(misses)
    last = {}
    if last_stage:
        from nvidia_last_stage import last_stage_table

        last = last_stage_table([(c, first) for c, _, less, first in misses if less], label, show_rows)
    return {"last_stage": last, "ranks": ranks, "speed_ranks": speed_ranks, "gains": gains, "first_intervals": first_intervals,
            "top10": top10, "confirmed_misses": len(confirmed)}


def _print_gain_terms(misses: list) -> None:
    """Where the predicted gain of the misses' first plans comes from, by step-time term (``gain_terms``)."""
    if not misses:
        return
    print(f"\nwhere the first plan's predicted gain comes from on the {len(misses)} misses (each term's change, share "
          f"of NVIDIA's step; negative: saved), median over the misses:")
    for group, keep in (("all misses", lambda less: True), ("first plan pipelines less than NVIDIA's", bool),
                        ("the others", lambda less: not less)):
        chosen = [terms for _, terms, less, _ in misses if keep(less)]
        if chosen:
            parts = ", ".join(f"{name} {statistics.median(t[name] for t in chosen):+.1%}" for name, _ in STEP_TERMS)
            print(f"  {group:<42} {len(chosen):>3} rows: {parts}")
