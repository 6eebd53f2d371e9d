"""`tune --from FILE...`: the job the user runs now, measured first, beside the planner's best.

The study's candidates are the planner's ranked plans (``autotune.search.planner``); the current job's plan (read
from its files by ``autotune.job_files``) goes first in that order, so the sampler's first trial measures it
(``PlanSampler`` takes the first ``top_k`` keys in order) and every other trial is measured against it. It is
measured even where the memory ledger says it does not fit: it is what the user runs, and the trial says whether it
does.
"""

from __future__ import annotations

from optuna.trial import FrozenTrial, TrialState

from autotune.api import Estimate, estimate
from autotune.cost.efficiency import Efficiency
from autotune.cost.step_time import TimeSettings
from autotune.report import plan_summary
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.tune.sampler import plan_key

__all__ = ["CURRENT_JOB_ATTR", "current_job_first", "current_job_json", "current_job_report",
           "current_job_trial"]

CURRENT_JOB_ATTR = "current_job"
"""The user attribute that marks the trial of the job ``--from`` states."""


def current_job_first(ranked: list[Estimate], plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec,
                      efficiency: Efficiency) -> tuple[list[Estimate], str]:
    """The candidates with the current job's plan first (its own estimate where the planner did not rank it: a
    plan outside the search space or over the ledger), and its key."""
    key = plan_key(plan)
    mine = next((e for e in ranked if plan_key(e.plan) == key), None)
    mine = mine or estimate(model, cluster, plan, time_settings=TimeSettings(efficiency=efficiency))
    return [mine, *(e for e in ranked if plan_key(e.plan) != key)], key


def current_job_trial(trials: list[FrozenTrial], key: str) -> FrozenTrial | None:
    """The trial that measured the current job's plan (None: the study stopped before it)."""
    return next((t for t in trials if t.user_attrs.get("plan_key") == key), None)


def current_job_report(trials: list[FrozenTrial], key: str | None) -> str:
    """One line: the current job's measured speed against the best other trial's ('' without a current job)."""
    if key is None:
        return ""
    mine = current_job_trial(trials, key)
    if mine is None:
        return "current job: not measured (the study stopped before it)"
    if mine.state != TrialState.COMPLETE or mine.value is None:
        reason = mine.user_attrs.get("reason") or mine.user_attrs.get("status") or mine.state.name.lower()
        return f"current job (trial {mine.number}): did not complete: {reason}"
    others = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None and t.number != mine.number]
    said = f"current job (trial {mine.number}): {mine.value:,.0f} tokens/s measured"
    if not others:
        return said + "; no other plan completed to compare with"
    best = max(others, key=lambda t: t.value)
    gain = best.value / mine.value - 1
    try:
        what = plan_summary(ParallelPlan(**best.user_attrs["plan"]))
    except (KeyError, TypeError, ValueError):  # a record another autotune release wrote: its key says the plan
        what = best.user_attrs.get("plan_key", "?")
    if gain <= 0:
        return said + f"; the fastest of the {len(others) + 1} plans measured (next: trial {best.number}, " \
                      f"{-gain:.1%} slower)"
    return said + f"; trial {best.number} ({what}) measured {gain:.1%} faster: {best.value:,.0f} tokens/s"


def current_job_json(trials: list[FrozenTrial], key: str | None) -> dict | None:
    """The current job's trial in ``tune --json`` (None without --from)."""
    if key is None:
        return None
    mine = current_job_trial(trials, key)
    return {"plan_key": key, "trial": mine.number if mine else None, "tokens_per_s": mine.value if mine else None,
            "state": mine.state.name.lower() if mine else "not measured"}
