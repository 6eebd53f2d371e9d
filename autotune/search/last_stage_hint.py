"""What a lighter last pipeline stage would gain on one plan (``autotune estimate``).

The last stage carries the output layer and the loss; Megatron-core's own split gives them at most one layer's slot
(``--account-for-loss-in-pipeline-split``), while they can cost several layers' time (a 16-bit hidden x vocab GEMM
beside FP8 layers). Every stage waits for the slowest, so where the last stage is the slowest, ``--loss-slots K``
(``ParallelPlan.loss_slots``: K layer slots for the output layer and loss, the layers moved to the earlier stages)
may shorten the step. `estimate` tries K = 2..6 on the plan it estimates, each that passes every rule and fits, and
names the fastest where it gains at least ``MIN_GAIN``. `plan --uneven-layouts` searches the same K over every layout.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autotune.cost.estimate import Estimate, estimate
from autotune.engines import engine_for
from autotune.rules import plan_problems
from autotune.search.setting_gains import MIN_GAIN  # gains under 1% are not named: the model's error is larger
from autotune.search.space import UNEVEN_LOSS_SLOTS

__all__ = ["LOSS_SLOTS_TRIED", "MIN_GAIN", "LastStageHint", "last_stage_hint", "with_last_stage_hint"]

LOSS_SLOTS_TRIED = UNEVEN_LOSS_SLOTS
"""The K tried: those `plan --uneven-layouts` searches."""


@dataclass(frozen=True, slots=True)
class LastStageHint:
    loss_slots: int
    estimate: Estimate
    gain: float
    """Tokens/s over the plan as estimated, minus 1."""

    def text(self) -> str:
        t = self.estimate.time
        last = self.estimate.plan.pp - 1
        layers = next(n for s, n, _ in t.stage_times_s if s == last)
        return (f"lighter last stage: this plan with --loss-slots {self.loss_slots} (the output layer and loss as "
                f"{self.loss_slots} layer slots, {layers} layers on stage {last}): {t.tokens_per_s:,.0f} tokens/s, "
                f"{self.gain:+.1%}")

    def to_dict(self) -> dict:
        return {"loss_slots": self.loss_slots, "tokens_per_s": self.estimate.time.tokens_per_s, "gain": self.gain}


def last_stage_hint(result: Estimate, memory=None, timing=None) -> LastStageHint | None:
    """The fastest ``--loss-slots K`` of ``LOSS_SLOTS_TRIED`` on ``result``'s plan (its memory / time settings), or
    None: no pipeline, an engine that cannot write the split, loss slots already set, the last stage not the
    slowest, or no K that passes the rules, fits and gains ``MIN_GAIN``."""
    plan, model, cluster = result.plan, result.model, result.cluster
    stages = result.time.stage_times_s
    if plan.pp < 2 or plan.loss_slots is not None or not engine_for(plan).support.loss_slots or not stages:
        return None
    if max(stages, key=lambda s: s[2])[0] != plan.pp - 1:
        return None
    best: LastStageHint | None = None
    for k in LOSS_SLOTS_TRIED:
        lighter = plan.with_(loss_slots=k)
        if plan_problems(model, cluster, lighter):
            continue
        est = estimate(model, cluster, lighter, memory, timing)
        gain = est.time.tokens_per_s / result.time.tokens_per_s - 1
        if est.memory.fits and gain >= MIN_GAIN and (best is None or gain > best.gain):
            best = LastStageHint(loss_slots=k, estimate=est, gain=gain)
    return best


def with_last_stage_hint(result, memory=None, timing=None):
    """A search result (``SearchResult``) with the hint of its first plan (`autotune plan`)."""
    return replace(result, last_stage_hint=last_stage_hint(result.in_order[0], memory, timing))
