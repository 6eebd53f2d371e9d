"""How much of the planner's claimed gain over NVIDIA's pipelined recipes is the last pipeline stage.

On the plan-quality misses where the planner's first plan pipelines less than NVIDIA's (bench/nvidia_plan_quality.py
``gain_terms``), the gain is the slowest stage's compute: the last stage carries the output layer and loss, which
Megatron-core's ``--account-for-loss-in-pipeline-split`` counts as one layer's slot. This re-estimates NVIDIA's own
plan with the last stage lightened (``autotune estimate ... --loss-slots K``, K = 2..6: the output layer and loss take
K layer slots, the layers moved to the earlier stages, written as ``--pipeline-model-parallel-layout``) and keeps the
fastest K. Where that recovers most of the first plan's gain, the planner's claim is about the split, not about
pipelining: NVIDIA's layout with a lighter last stage would do as well, by the same model.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from autotune.errors import InputError

__all__ = ["LOSS_SLOTS", "lightened", "last_stage_table"]

LOSS_SLOTS = (2, 3, 4, 5, 6)


def lightened(argv: list[str], reestimate: Callable[[list[str]], object]) -> tuple[int, object] | None:
    """(K, estimate) of the fastest ``--loss-slots K`` that the plan of ``argv`` runs, or None (no K is valid)."""
    best = None
    for k in LOSS_SLOTS:
        try:
            est = reestimate([*argv, "--loss-slots", str(k)])
        except InputError:
            continue  # a K that empties a virtual stage (or a plan without a pipeline)
        if best is None or est.time.tokens_per_s > best[1].time.tokens_per_s:
            best = (k, est)
    return best


def last_stage_table(misses: list, reestimate: Callable[[list[str]], object], label: Callable[[dict], str],
                     show_rows: bool) -> dict:
    """For each miss (case, the first plan's tokens/s) whose NVIDIA plan is pipelined: NVIDIA's plan with its last
    stage lightened against NVIDIA's plan as run and against the planner's first plan."""
    recovered, lifted, left = [], [], []
    for case, first_tokens_per_s in misses:
        est = case.result
        if est.plan.pp < 2:
            continue
        argv = [*case.argv, *case.flags.argv, "--recompute", est.plan.recompute]
        found = lightened(argv, reestimate)
        if found is None:
            continue
        k, light = found
        gain = first_tokens_per_s / est.time.tokens_per_s - 1
        lift = light.time.tokens_per_s / est.time.tokens_per_s - 1
        lifted.append(lift)
        left.append(first_tokens_per_s / light.time.tokens_per_s - 1)
        recovered.append(lift / gain if gain > 0 else 1.0)
        if show_rows:
            print(f"  {label(case.row):<84} --loss-slots {k}: {lift:+.1%} over NVIDIA's plan; first plan "
                  f"{gain:+.1%}, {left[-1]:+.1%} over the lightened one")
    if lifted:
        print(f"NVIDIA's pipelined plans among the misses, with the last stage lightened (--loss-slots 2-6, the "
              f"fastest): {len(lifted)} rows; median {statistics.median(lifted):+.1%} over NVIDIA's plan as run, the "
              f"planner's first plan then median {statistics.median(left):+.1%} ahead (share of its gain recovered: "
              f"median {statistics.median(recovered):.0%})")
    return {"lifted": lifted, "left": left, "recovered": recovered}
