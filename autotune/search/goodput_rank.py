"""Plans ranked by goodput (``plan --objective goodput``), and how that ranking differs from step time's.

The planner's feasible plans (best tokens/s first) are re-ranked by tokens/s x the fraction of wall time
that trains (:mod:`autotune.cost.goodput`). Goodput never exceeds tokens/s, so once a plan's tokens/s is
below the K-th best goodput found, neither it nor any plan after it can enter the top K: the walk stops
there, exactly.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from autotune.cost.estimate import Estimate
from autotune.cost.goodput import Goodput, goodput
from autotune.emit.options import CheckpointOptions
from autotune.report import plan_summary, release_defaults_line
from autotune.search.planner import SearchResult

__all__ = ["GoodputRanking", "rank_by_goodput"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GoodputRanking:
    """The top K by goodput, each with its place in the step-time ranking (1 = fastest)."""

    search: SearchResult
    top: tuple[tuple[Estimate, Goodput, int], ...]
    evaluated: int
    """Plans whose goodput was computed (the rest could not reach the top K)."""
    step_time_winner: Goodput

    @property
    def moved(self) -> int:
        """How many of the goodput top K are not in the step-time top K."""
        k = len(self.top)
        return sum(1 for _, _, place in self.top if place > k)

    def explanation(self) -> str:
        est, best, place = self.top[0]
        first = self.search.ranked[0]
        if place == 1:
            head = (f"the fastest plan also keeps the most goodput: {plan_summary(est.plan)}, "
                    f"{100 * best.fractions['train']:.1f}% of wall time training")
        else:
            w = self.step_time_winner
            head = (f"{plan_summary(est.plan)} (#{place} by step time) keeps {best.goodput_tokens_per_s:,.0f} tok/s, "
                    f"more than the fastest plan {plan_summary(first.plan)}, which loses "
                    f"{100 * w.lost_fraction:.1f}% of its {w.tokens_per_s:,.0f} tok/s ({_losses(w)}) against "
                    f"{100 * best.lost_fraction:.1f}% here ({_losses(best)})")
        return (f"{head}; {self.moved} of the goodput top {len(self.top)} are outside the step-time top "
                f"{len(self.top)}")

    def to_text(self) -> str:
        """The table ``plan --objective goodput`` prints, then why #1 and what the search rejected."""
        r = self.search
        lines = [f"{r.model.name} on {r.cluster.num_gpus} x {r.cluster.gpu.name}: plans ranked by goodput (tokens/s x "
                 "the share of wall time that trains, after checkpoint stalls, rework and restarts)", "",
                 f"{'#':>3}  {'plan':<52}{'tokens/s':>12}{'goodput':>12}{'lost':>7}{'saves':>8}{'every':>10}"
                 f"{'step-time #':>13}"]
        for i, (est, g, place) in enumerate(self.top, 1):
            p = g.policy
            lines.append(f"{i:>3}  {plan_summary(est.plan):<52}{g.tokens_per_s:>12,.0f}{g.goodput_tokens_per_s:>12,.0f}"
                         f"{100 * g.lost_fraction:>6.1f}%{'async' if p.async_save else 'block':>8}"
                         f"{_duration(p.interval_s):>10}{place:>13,}")
        p = self.step_time_winner.policy
        lines += ["", "why #1: " + self.explanation(),
                  f"failures: the job fails every {p.job_mtbf_s / 3600:,.1f} h (--gpu-mtbf-hours {p.gpu_mtbf_hours:,.0f} "
                  f"over {p.num_gpus:,} GPUs); a restart takes {p.detection_s:,.0f} s to detect (mean), "
                  f"{p.relaunch_s:,.0f} s to relaunch (--restart-s) and the checkpoint read; storage {p.storage_bandwidth_gb_per_s:g} GB/s (--storage-gb-per-s)",
                  f"searched {r.num_enumerated:,} plans: {r.num_feasible:,} feasible, the goodput of {self.evaluated:,} "
                  "computed (no other can reach the top: goodput <= tokens/s)"]
        if said := release_defaults_line(r.release_defaults, r.release_cost_settings):
            lines.insert(-1, said)
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"objective": "goodput", "explanation": self.explanation(), "evaluated": self.evaluated,
                "candidates": [{**est.to_dict(), "goodput": g.to_dict(), "step_time_rank": place}
                               for est, g, place in self.top],
                "step_time_winner_goodput": self.step_time_winner.to_dict(),
                "num_enumerated": self.search.num_enumerated, "num_feasible": self.search.num_feasible,
                "rejections": dict(self.search.rejections), "engine_versions": self.search.engine_versions,
                "release_defaults": self.search.release_defaults,
                "release_cost_settings": self.search.release_cost_settings}


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:,.0f} min" if seconds < 7200 else f"{seconds / 3600:,.1f} h"


def _losses(g: Goodput) -> str:
    f = g.fractions
    p = g.policy
    save = f"{'async' if p.async_save else 'blocking'} saves {100 * f['checkpoint']:.1f}%"
    return f"{save}, rework {100 * f['rework']:.1f}%, restarts {100 * (f['restart'] + f['planned']):.1f}%"


def rank_by_goodput(search: SearchResult, *, top_k: int = 10, options: CheckpointOptions | None = None
                    ) -> GoodputRanking:
    """Re-rank ``search.ranked`` (every feasible plan, fastest first) by goodput; ValueError when it is empty."""
    if not search.ranked:
        raise ValueError("no feasible plan to rank")
    heap: list[tuple[float, int, Goodput]] = []  # the best K so far, smallest goodput first
    evaluated = 0
    for place, est in enumerate(search.ranked, 1):
        if len(heap) == top_k and est.time.tokens_per_s <= heap[0][0]:
            break  # goodput <= tokens/s, and tokens/s only falls from here
        g = goodput(est, options)
        evaluated += 1
        item = (g.goodput_tokens_per_s, -place, g)
        if len(heap) < top_k:
            heapq.heappush(heap, item)
        elif item[:2] > heap[0][:2]:
            heapq.heapreplace(heap, item)
    winner = goodput(search.ranked[0], options)
    ordered = sorted(heap, key=lambda item: item[:2], reverse=True)
    top = tuple((search.ranked[-neg - 1], g, -neg) for _, neg, g in ordered)
    return GoodputRanking(search=search, top=top, evaluated=evaluated, step_time_winner=winner)
