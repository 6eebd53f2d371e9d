"""How much of the planner's claimed gain over NVIDIA's pipelined recipes is the last pipeline stage.

On the plan-quality misses where the planner's first plan pipelines less than NVIDIA's (bench/nvidia_plan_quality.py
``gain_terms``), the gain is the slowest stage's compute: the last stage carries the output layer and loss, which
Megatron-core's ``--account-for-loss-in-pipeline-split`` counts as one layer's slot. This asks `autotune estimate`
of NVIDIA's own plan what it says a user: its ``lighter last stage`` hint (``autotune.search.last_stage_hint``: the
fastest ``--loss-slots K``, K = 2..6, where the last stage is the slowest, that passes the rules, fits and gains 1% or
more; written as ``--pipeline-model-parallel-layout``). Where that recovers most of the first plan's gain, the
planner's claim is about the split, not about pipelining: NVIDIA's layout with a lighter last stage would do as
well, by the same model. A row without a hint (the last stage not the slowest, or no K gains) counts as +0%.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from autotune.cli import build_parser
from autotune.commands.estimate import flags_estimate
from autotune.search.last_stage_hint import LastStageHint, last_stage_hint

__all__ = ["hint_of", "last_stage_table"]


def hint_of(argv: list[str]) -> LastStageHint | None:
    """`autotune estimate ARGV`'s ``lighter last stage`` hint (its own parsing, estimate and settings)."""
    result, memory, timing = flags_estimate(build_parser().parse_args(argv))
    return last_stage_hint(result, memory, timing)


def last_stage_table(misses: list, label: Callable[[dict], str], show_rows: bool) -> dict:
    """For each miss (case, the first plan's tokens/s) whose NVIDIA plan is pipelined: the hint's gain over NVIDIA's
    plan as run, and the first plan's gain over the lightened plan."""
    recovered, lifted, left = [], [], []
    for case, first_tokens_per_s in misses:
        est = case.result
        if est.plan.pp < 2:
            continue
        hint = hint_of([*case.argv, *case.flags.argv, "--recompute", est.plan.recompute])
        lift = hint.gain if hint is not None else 0.0
        gain = first_tokens_per_s / est.time.tokens_per_s - 1
        lifted.append(lift)
        left.append((1 + gain) / (1 + lift) - 1)
        recovered.append(min(1.0, lift / gain) if gain > 0 else 1.0)
        if show_rows:
            said = f"--loss-slots {hint.loss_slots}: {lift:+.1%}" if hint is not None else "no lighter split gains"
            print(f"  {label(case.row):<84} {said} over NVIDIA's plan; first plan {gain:+.1%}, {left[-1]:+.1%} over "
                  f"the lightened one")
    if lifted:
        print(f"NVIDIA's pipelined plans among the misses, with `estimate`'s lighter last stage (--loss-slots 2-6 where "
              f"the last stage is the slowest; +0% where none gains): {len(lifted)} rows, {sum(x > 0 for x in lifted)} "
              f"lightened; median {statistics.median(lifted):+.1%} over NVIDIA's plan as run, the planner's first plan "
              f"then median {statistics.median(left):+.1%} ahead (share of its gain recovered: median "
              f"{statistics.median(recovered):.0%})")
    return {"lifted": lifted, "left": left, "recovered": recovered}
