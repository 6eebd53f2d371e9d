"""Which plan the next trial measures: an Optuna sampler over the planner's feasible candidates.

Written as an Optuna ``BaseSampler`` rather than as enqueue logic in the study, because the
sampler is consulted inside ``study.ask()`` with the study's trials freshly read from storage.
Each plan dimension (:data:`DIMENSIONS`: engine, tp, pp, vpp, cp, ZeRO stage, HSDP replicas, offload,
micro-batch, recompute, precision) is its own categorical Optuna parameter, so
optuna-dashboard's importance and slice views mean something; the sampler still picks whole
feasible plans: ``sample_relative`` chooses one candidate and returns its values for every
dimension, and records the candidate's identity (``plan_key``: the JSON of the plan, sorted
keys) as a system attribute of the trial, since two plans may share every dimension's value. That is
what makes it safe for several ``--worker`` processes sharing one study: every pick looks at
the plans every worker has already claimed (RUNNING, COMPLETE, FAIL, PRUNED), and the
planner's top-K "queue" is simply the first phase of the same rule, so no enqueued trial is
ever left waiting for a plan another worker already took. The remaining race (two workers
asking at the same instant) is settled by :func:`autotune.tune.study.claim_conflict`.

The rule, in order:

1. the planner's top-K (as the planner ranked them, best predicted first) not yet claimed;
2. then the best *calibrated* prediction among the untried candidates, the cost model refitted
   on every completed trial so far (:class:`CalibratedRank`, :mod:`autotune.tune.calibrate`); the
   first pick after the top-K and every ``explore_every``-th one after it instead take the best
   candidate with a layout (tp, pp, cp; else a micro-batch, else a ZeRO stage, else a
   ZeRO/micro-batch/offload region) no trial has measured yet, so one wrong prior cannot hide a
   region.

A plan whose earlier trial was interrupted (the tuner was killed or Ctrl-C'd) is free again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from autotune.specs.plan import ParallelPlan

__all__ = ["PARAM", "DIMENSIONS", "plan_key", "plan_region", "plan_params", "distributions", "claimed_keys",
           "trial_key", "layout", "pruned_step_time_s", "step_measurements", "CalibratedRank", "PlanSampler"]

PARAM = "plan_key"
"""The trial's plan identity (system and user attribute; the parameter itself in studies of autotune <= 0.1)."""

DIMENSIONS = ("engine", "tp", "pp", "vpp", "cp", "zero_stage", "dp_replicate", "offload", "micro_batch_size",
              "recompute", "precision")
"""The Optuna parameters of a tuning study, one per plan dimension."""

_RELEASED = ("interrupted", "duplicate")
"""Trial statuses that do not hold their plan: it was never (fully) measured."""


def plan_key(plan: ParallelPlan) -> str:
    """A stable identity of a plan: its dict as JSON with sorted keys."""
    return json.dumps(plan.to_dict(), sort_keys=True, separators=(",", ":"))


def plan_region(plan: ParallelPlan) -> tuple:
    """The coarse region a plan belongs to, for exploration picks: (ZeRO stage, micro-batch, offload, layout),
    the layout being (tp, pp, cp)."""
    return (plan.zero_stage, plan.micro_batch_size, plan.offload_optimizer != "none" or plan.offload_param != "none",
            layout(plan))


def _engine(plan: ParallelPlan) -> str:
    return getattr(plan, "engine", None) or getattr(plan, "framework", "deepspeed")


def _offload(plan: ParallelPlan) -> str:
    parts = [f"{what}:{dev}" for what, dev in (("optimizer", plan.offload_optimizer), ("param", plan.offload_param))
             if dev != "none"]
    return "+".join(parts) or "none"


def plan_params(plan: ParallelPlan) -> dict[str, Any]:
    """The plan's value for every dimension of :data:`DIMENSIONS`."""
    return {"engine": _engine(plan), "tp": plan.tp, "pp": plan.pp, "vpp": plan.vpp, "cp": plan.cp,
            "zero_stage": plan.zero_stage, "dp_replicate": plan.dp_replicate, "offload": _offload(plan), "micro_batch_size": plan.micro_batch_size,
            "recompute": plan.recompute, "precision": plan.precision}


def distributions(plans: Sequence[ParallelPlan]) -> dict[str, CategoricalDistribution]:
    """One categorical distribution per dimension over the values the candidates take (sorted: stable across
    resumes and workers)."""
    values: dict[str, set] = {d: set() for d in DIMENSIONS}
    for plan in plans:
        for d, v in plan_params(plan).items():
            values[d].add(v)
    return {d: CategoricalDistribution(sorted(vs, key=lambda v: (str(type(v)), v))) for d, vs in values.items()}


def trial_key(t: FrozenTrial) -> str | None:
    """The plan a trial holds: its system attribute, else user attribute, else (old studies) its parameter."""
    return t.system_attrs.get(PARAM) or t.user_attrs.get(PARAM) or t.params.get(PARAM)


def claimed_keys(trials: Sequence[FrozenTrial], *, before: int | None = None) -> dict[str, int]:
    """Plan key -> number of the first trial holding it (optionally only trials numbered below ``before``).

    Held: RUNNING, COMPLETE, PRUNED, FAIL; a FAIL whose status is interrupted or duplicate
    releases its plan.
    """
    out: dict[str, int] = {}
    for t in sorted(trials, key=lambda t: t.number):
        if before is not None and t.number >= before:
            continue
        if t.state == TrialState.WAITING:
            continue
        if t.state == TrialState.FAIL and t.user_attrs.get("status") in _RELEASED:
            continue
        key = trial_key(t)
        if key is not None and key not in out:
            out[key] = t.number
    return out


def pruned_step_time_s(t: FrozenTrial) -> float | None:
    """A pruned trial's step time as far as it ran: the median of its reported step times after the first
    (the first is warm-up), else the one it reported. A lower bound of its plan's step time (it was pruned
    for being slow), better for ranking than no number: without it a pruned exploration trial of a slow
    layout teaches the ranking nothing, and the next pick goes to the same slow layout."""
    if t.state != TrialState.PRUNED or not t.intermediate_values:
        return None
    steps = [v for _, v in sorted(t.intermediate_values.items())]
    steps = steps[1:] or steps
    return sorted(steps)[len(steps) // 2]


def step_measurements(trials: Sequence[FrozenTrial], plans: dict[str, ParallelPlan], run_model, cluster, *,
                      pruned: bool = False) -> list:
    """The completed trials as :class:`autotune.tune.calibrate.StepMeasurement` (plans known, a step time);
    ``pruned``: the pruned ones too (:func:`pruned_step_time_s`)."""
    from autotune.tune.calibrate import StepMeasurement

    out = []
    for t in trials:
        if t.state != TrialState.COMPLETE and not (pruned and t.state == TrialState.PRUNED):
            continue
        plan = plans.get(trial_key(t))
        step = t.user_attrs.get("measurement", {}).get("step_time_s") or (pruned and pruned_step_time_s(t))
        if plan is not None and step:
            out.append(StepMeasurement(model=run_model, cluster=cluster, plan=plan, step_time_s=step,
                                       label=f"#{t.number}"))
    return out


def layout(plan: ParallelPlan) -> tuple[int, int, int]:
    """(tp, pp, cp): how the plan splits the model."""
    return (plan.tp, plan.pp, plan.cp)


class CalibratedRank:
    """``rank`` for :class:`PlanSampler`: every candidate key, fastest predicted step first.

    The prediction: the cost model refitted (:func:`autotune.tune.calibrate.fit_step_times`) on the
    completed trials of the most measured layout (tp, pp, cp), times a correction per layout: the
    geometric mean of measured / predicted over that layout's measured plans (1 for a layout not
    measured yet). A fit over every layout can only spread what a machine does to one layout and the
    model does not predict over all plans (on the ``cpu`` preset tp = 2 is predicted as fast as
    tp = 1 and measures ~3x slower: gloo all-reduces, 4 ranks on 2 cores): fitted on 3 tp = 1 plans
    and one tp = 2 plan of such a machine it predicted the tp = 1 plans ~85% slow and ranked a tp = 2
    plan first. With the correction, one tp = 2 trial puts the other tp = 2 plans right
    (``tests/tune/test_sampler_layouts.py``).

    ``run_model``: the model as the trials run it (cut to their layer count). The fit is cached on the
    measurements it saw and warm-started from the previous one once there are three or more.
    """

    def __init__(self, plans: dict[str, ParallelPlan], order: Sequence[str], run_model, cluster, start) -> None:
        self._plans, self._order = plans, list(order)
        self._model, self._cluster, self._start = run_model, cluster, start
        self._sig: tuple | None = None
        self._eff = start

    def efficiency(self, completed: Sequence[FrozenTrial]):
        """The efficiency fitted on ``completed`` (the start one when none has a measurement)."""
        from autotune.tune.calibrate import fit_step_times

        ms = step_measurements(completed, self._plans, self._model, self._cluster, pruned=True)
        if not ms:
            return self._start
        counts: dict[tuple, int] = {}
        for m in ms:
            counts[layout(m.plan)] = counts.get(layout(m.plan), 0) + 1
        reference = max(counts, key=counts.get)  # the most measured layout (the first measured on a tie)
        ms = [m for m in ms if layout(m.plan) == reference]
        sig = tuple((m.label, m.step_time_s) for m in ms)
        if sig != self._sig:
            warm = self._eff if len(ms) >= 3 else self._start
            self._sig, self._eff = sig, fit_step_times(ms, warm)
        return self._eff

    def predicted_step_time_s(self, completed: Sequence[FrozenTrial]) -> dict[str, float]:
        from autotune.cost.step_time import TimeSettings, estimate_step_time

        ts = TimeSettings(efficiency=self.efficiency(completed))
        predicted = {k: estimate_step_time(self._model, self._cluster, self._plans[k], ts).step_time_s
                     for k in self._order}
        logs: dict[tuple, list[float]] = {}
        for t in completed:
            key = trial_key(t)
            step = t.user_attrs.get("measurement", {}).get("step_time_s") if t.state == TrialState.COMPLETE \
                else pruned_step_time_s(t)
            if step and key in predicted:
                logs.setdefault(layout(self._plans[key]), []).append(math.log(step / predicted[key]))
        factor = {lay: math.exp(sum(v) / len(v)) for lay, v in logs.items()}
        return {k: p * factor.get(layout(self._plans[k]), 1.0) for k, p in predicted.items()}

    def __call__(self, completed: list[FrozenTrial]) -> list[str]:
        if not step_measurements(completed, self._plans, self._model, self._cluster, pruned=True):
            return list(self._order)
        predicted = self.predicted_step_time_s(completed)
        return sorted(self._order, key=predicted.__getitem__)


class PlanSampler(BaseSampler):
    """Planner top-K first, then calibrated best-predicted with periodic exploration.

    ``planner_order``: every candidate key, best predicted first (the planner's ranking).
    ``rank``: called with the study's completed and pruned trials, returns the candidate keys ordered by
    the current (calibrated) prediction, best first; default: ``planner_order``.
    """

    def __init__(self, planner_order: Sequence[str], *, top_k: int, regions: dict[str, tuple],
                 rank: Callable[[list[FrozenTrial]], list[str]] | None = None, explore_every: int = 3,
                 plans: dict[str, ParallelPlan] | None = None) -> None:
        self._order = list(planner_order)
        self._plans = plans or {}
        self._dists = distributions(list(self._plans.values())) if self._plans else {}
        self._top = self._order[:top_k]
        self._regions = regions
        self._rank = rank or (lambda completed: list(self._order))
        self._explore_every = explore_every

    @property
    def search_space(self) -> dict[str, CategoricalDistribution]:
        """What the study asks for (``study.ask(sampler.search_space)``)."""
        return dict(self._dists)

    def infer_relative_search_space(self, study, trial) -> dict[str, BaseDistribution]:
        return dict(self._dists)

    def before_trial(self, study, trial) -> None:
        """Pick the trial's plan as the trial is created (``study.ask``), its key recorded.

        Here rather than in ``sample_relative`` alone: Optuna fills a parameter whose distribution
        has one value without asking the sampler, so when every dimension is single-valued (one
        candidate, or candidates that differ only outside :data:`DIMENSIONS`) ``sample_relative``
        is never called.
        """
        if self._plans:
            self._claim(study, trial)

    def _claim(self, study, trial) -> str:
        recorded = study._storage.get_trial_system_attrs(trial._trial_id).get(PARAM)
        if recorded is not None:
            return recorded
        trials = study.get_trials(deepcopy=False)
        key = self.next_key([t for t in trials if t.number != trial.number])
        # Nothing free (another worker took the last one): return a claimed key; the claim
        # check gives the trial up as a duplicate and the study loop stops.
        key = key if key is not None else self._order[0]
        study._storage.set_trial_system_attr(trial._trial_id, PARAM, key)
        return key

    def sample_relative(self, study, trial, search_space) -> dict[str, Any]:
        """The whole plan: the claimed candidate's value for every dimension."""
        if not search_space or not self._plans:
            return {}
        values = plan_params(self._plans[self._claim(study, trial)])
        return {d: v for d, v in values.items() if d in search_space}

    def next_key(self, trials: Sequence[FrozenTrial]) -> str | None:
        """The key the next trial should measure, or None when every candidate is claimed."""
        taken = claimed_keys(trials)
        for key in self._top:
            if key not in taken:
                return key
        free = [k for k in self._rank([t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)])
                if k not in taken]
        if not free:
            return None
        picks_after_top = sum(1 for k in taken if k not in self._top)
        if self._explore_every and picks_after_top % self._explore_every == 0:
            seen = [self._regions[k] for k in taken if k in self._regions]
            # A layout (tp, pp, cp) no trial measured first: it moves the step time most and the cost
            # model's prior on it is the least trustworthy (on the cpu preset tp = 2 is predicted as
            # fast as tp = 1 and measures ~3x slower); calibration needs one of each to fit the links.
            # Then a micro-batch, then a ZeRO stage, then any new region.
            for unseen in (lambda r: r[3:] and r[3] not in {s[3] for s in seen if s[3:]},
                           lambda r: r[1] not in {s[1] for s in seen}, lambda r: r[0] not in {s[0] for s in seen},
                           lambda r: r not in seen):
                for key in free:
                    if unseen(self._regions[key]):
                        return key
        return free[0]

    def sample_independent(self, study, trial, param_name: str, param_distribution: BaseDistribution) -> Any:
        # Every dimension comes from sample_relative; anything else a caller asks for is drawn at random.
        return optuna.samplers.RandomSampler().sample_independent(study, trial, param_name, param_distribution)
