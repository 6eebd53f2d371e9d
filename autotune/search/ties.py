"""Plans the model cannot tell apart are ties, and a tie goes to the simpler plan.

The cost model's error on runs like a plan is several percent (:mod:`autotune.cost.uncertainty`); ranking by a
0.06% difference in predicted speed picks at random between plans the model cannot separate, and a random pick
is often the fragile one (ZeRO-3 with CPU optimizer offload ahead of ZeRO-1, whose first run JIT-builds the CPU
Adam for 20 minutes). So, over the plans ranked by predicted speed: the fastest one left leads a tie group of
every plan left whose prediction lies within its interval while its own lies within theirs; a group is ordered
simplest first (:func:`simplicity`: no offload before offload, a lower ZeRO stage, fewer parallel dimensions, no
context parallelism), then by predicted speed; then the next group. ``autotune tune`` measures the first group.

Memory headroom comes before simplicity in a group: a plan whose predicted peak lies within the memory model's own
p90 error of the GPU's capacity (:func:`near_capacity`; the p90 |error| of the predicted peak on the published runs
that give one, :func:`autotune.cost.uncertainty.shipped_memory_error_p90`) fits by the prediction but not by its
error, so it ranks after the tied plans that keep that headroom. It still fits and stays in the group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.cost.estimate import Estimate
from autotune.cost.uncertainty import Uncertainty, shipped_memory_error_p90, uncertainty_of
from autotune.report import plan_summary

__all__ = ["TieRanking", "rank_with_ties", "interval", "simplicity", "near_capacity", "TIE_WINDOW"]

TIE_WINDOW = 2000
"""Plans (fastest first) regrouped; the slower rest keep their order (none of them ties the leaders)."""


def simplicity(est: Estimate) -> tuple:
    """Smaller is simpler: offloads, ZeRO stage, parallel dimensions in use, context parallelism."""
    p = est.plan
    offloads = (p.offload_optimizer != "none") + (p.offload_param != "none")
    dims = sum(d > 1 for d in (p.tp, p.pp, p.cp, p.ep)) + (p.vpp > 1)
    return offloads, p.zero_stage, dims, p.cp > 1


def near_capacity(est: Estimate, memory_error: float) -> bool:
    """The predicted per-GPU peak within ``memory_error`` (relative) of the GPU's capacity: an under-prediction that
    large would not fit."""
    return est.memory.total * (1 + memory_error) > est.memory.capacity


@dataclass(frozen=True, slots=True)
class TieRanking:
    ranked: tuple[Estimate, ...]
    """Every plan in tie order."""
    leading_group: int
    """Plans in the first tie group (the first ``leading_group`` of ``ranked``)."""
    fastest: Estimate | None
    """The fastest plan by prediction alone (the first of the input)."""
    uncertainty: Uncertainty | None
    """The interval of the fastest plan (the leading group's)."""
    groups: tuple[int, ...] = ()
    """The size of each tie group in ``ranked`` order (the plans past ``TIE_WINDOW`` not counted)."""
    memory_error: float = 0.0
    """The memory model's p90 |error| the headroom order used (:func:`near_capacity`)."""
    near_capacity_in_lead: int = 0
    """Plans of the leading group ranked after its plans with headroom (0 when all or none have it)."""

    def group_start(self, position: int) -> int:
        """The place (0-based) in ``ranked`` of the first plan of the tie group holding the plan at ``position``: the
        plans before it are those the model tells apart from it as faster (or that lead a group ahead of its own);
        one past the window is its own group."""
        start = 0
        for size in self.groups:
            if position < start + size:
                return start
            start += size
        return position

    def explanation(self) -> str:
        if not self.ranked or self.uncertainty is None or self.fastest is None:
            return ""
        u, first = self.uncertainty, self.ranked[0]
        head = (f"{self.leading_group} plan{'s' if self.leading_group != 1 else ''} within the model's "
                f"±{u.relative:.1%} of the fastest ({u.basis()})")
        if self.leading_group == 1:
            return f"no other plan within the model's ±{u.relative:.1%} of the fastest ({u.basis()})"
        tight = ""
        if self.near_capacity_in_lead:
            n = self.near_capacity_in_lead
            tight = (f"; {n} of them with a predicted peak within the memory model's p90 error ({self.memory_error:.1%}"
                     f" on published runs) of GPU memory rank{'s' if n == 1 else ''} after those with headroom")
        if first is self.fastest:
            return f"{head}: the fastest is also the simplest of them{tight}; `autotune tune` measures them"
        gain = self.fastest.time.tokens_per_s / first.time.tokens_per_s - 1
        order = "with memory headroom first, then simplest" if self.near_capacity_in_lead else "simplest"
        return (f"{head}: ranked {order} first (no offload, lower ZeRO stage, fewer parallel dimensions, no CP)"
                f"{tight}, so #1 is {plan_summary(first.plan)}; by prediction alone {plan_summary(self.fastest.plan)} "
                f"would lead by {gain:+.1%}, within the error; `autotune tune` measures the tied plans")


def interval(est: Estimate, exclude_families: frozenset[str] = frozenset()) -> Uncertainty:
    """The interval of an estimate (:func:`autotune.cost.uncertainty.uncertainty_of`), the runs of
    ``exclude_families`` left out."""
    return uncertainty_of(est.plan, est.cluster, moe=est.model.is_moe, exclude_families=exclude_families)


def rank_with_ties(by_speed: Sequence[Estimate], memory_error: float | None = None,
                   exclude_families: frozenset[str] = frozenset()) -> TieRanking:
    """``by_speed`` (fastest first) regrouped into tie groups, each with memory headroom first, then simplest first.
    ``memory_error``: the relative margin of :func:`near_capacity` (default: the shipped memory p90 |error|).
    ``exclude_families``: families whose runs the intervals leave out (a check of a family's own plan is judged by
    the other families' errors: leave-one-family-out)."""
    if not by_speed:
        return TieRanking(ranked=(), leading_group=0, fastest=None, uncertainty=None)
    margin = shipped_memory_error_p90() if memory_error is None else memory_error
    window = by_speed[:TIE_WINDOW]
    speed = [e.time.tokens_per_s for e in window]
    error = [interval(e, exclude_families).relative for e in window]
    left = list(range(len(window)))  # indices still ungrouped, fastest first
    out: list[Estimate] = []
    sizes: list[int] = []
    while left:
        lead = left[0]
        floor = speed[lead] * (1 - error[lead])
        group, rest = [], []
        for pos, i in enumerate(left):
            if speed[i] < floor:  # fastest first: no later plan is within the leader's interval either
                rest += left[pos:]
                break
            # Each within the other's interval: the leader's prediction within this plan's too.
            (group if speed[lead] - speed[i] <= error[i] * speed[i] else rest).append(i)
        left = rest
        members = sorted((window[i] for i in group),
                         key=lambda e: (near_capacity(e, margin), simplicity(e), -e.time.tokens_per_s))
        sizes.append(len(members))
        out += members
    lead = out[:sizes[0]]
    tight = sum(near_capacity(e, margin) for e in lead)
    fastest = by_speed[0]
    return TieRanking(ranked=(*out, *by_speed[TIE_WINDOW:]), leading_group=sizes[0], fastest=fastest,
                      uncertainty=interval(fastest, exclude_families), groups=tuple(sizes),
                      memory_error=margin, near_capacity_in_lead=tight if tight < len(lead) else 0)
