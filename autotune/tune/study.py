"""The tuning study: Optuna trials that measure the planner's candidates on real hardware.

One Optuna study whose parameters are the plan dimensions (:data:`autotune.tune.sampler.DIMENSIONS`),
each categorical over the values the planner's feasible candidates take; whole plans are picked
by :class:`autotune.tune.sampler.PlanSampler` (planner top-K first, then calibrated best-predicted
with exploration), the plan's identity kept in ``plan_key``. Before the first trial the DeepSpeed
ops the plans need are built once (:mod:`autotune.tune.ops`), outside every trial's timeout. Each
trial claims its plan (user attrs ``plan_key``, ``plan``, ``predicted``, ``host``, ``pid``, and
``launch``: its process group), runs :func:`autotune.tune.trial.run_trial`, and ends:

* completed -> COMPLETE, objective tokens/s (maximize), user attr ``measurement``;
* pruned (:class:`SlowStepPruner`) -> PRUNED;
* oom / crashed / hung -> FAIL with ``status``, ``reason``, ``log_path``; the study goes on;
* Ctrl-C, SIGTERM, SIGHUP -> FAIL ``interrupted`` (run_trial has ended the processes), then the
  KeyboardInterrupt goes on up.

``trials`` is the number of finished trials the study should hold in total (interrupted and
duplicate trials do not count), so ``--resume`` and extra ``--worker`` processes complete the
same budget. Trials left RUNNING by a tuner killed with SIGKILL have their processes ended and
become FAIL ``interrupted`` on ``resume`` (all of them) or, for a worker, when their recorded
tuner process on this host is gone (:func:`autotune.tune.storage.fail_stale_trials`); their plans
are free again. Then the best ``finalists`` plans are re-run ``finalist_runs`` times each,
interleaved, and the winner is chosen on the medians (:mod:`autotune.tune.finalists`).

Test-only hook: ``AUTOTUNE_TUNE_TEST_OVERRIDES`` = JSON ``{"<trial number>": {"timeout_s": 1}}``
replaces TrialSpec fields for those trial numbers (the integration test injects a hung trial
and a host-memory OOM this way). Not for users.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.pruners import BasePruner
from optuna.trial import FrozenTrial, TrialState

from autotune.api import Estimate
from autotune.cost.efficiency import DEFAULT_EFFICIENCY, Efficiency
from autotune.cost.step_time import TimeSettings
from autotune.emit.options import EmitOptions
from autotune.errors import InputError
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.tune import ops
from autotune.tune import trial as trial_mod
from autotune.tune.calibrate import CalibrationReport, calibrate, trial_prediction
from autotune.tune.current_job import CURRENT_JOB_ATTR, current_job_first
from autotune.tune.finalists import Finalist, run_finalists
from autotune.tune.launchers import LaunchSettings, trial_fields
from autotune.tune.plan_files import PLAN_FILE_PLACEHOLDERS, command_plan_problem, named_placeholders
from autotune.tune.sampler import (PARAM, CalibratedRank, PlanSampler, claimed_keys, plan_key, plan_region,
                                   step_measurements, trial_key)
from autotune.tune.storage import LAUNCH_ATTR, fail_stale_trials, open_storage, open_study
from autotune.tune.study_job import same_job, study_job
from autotune.tune.trialspec import trial_model_of

__all__ = ["SlowStepPruner", "TuneResult", "open_storage", "tune", "claim_conflict", "fail_stale_trials"]

TEST_OVERRIDES_ENV = "AUTOTUNE_TUNE_TEST_OVERRIDES"
Progress = Callable[..., None]
"""``progress(event, study, trial, detail=None)``; events: start, ops, trial_start, phase, trial_end, finalist."""


class SlowStepPruner(BasePruner):
    """Prune a trial whose every post-warm-up step (two at least) took over ``ratio`` x the best completed one's step
    time: its fastest step, as a busy machine only ever slows a step down (a median of two steps is one spike's).

    Intermediate values are step times (lower is better) while the objective (tokens/s) is
    maximised, so Optuna's own pruners, which compare in the study's direction, do not apply.
    """

    def __init__(self, ratio: float = 1.5, warmup_steps: int = 2) -> None:
        self.ratio, self.warmup_steps = ratio, warmup_steps

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        measured = [v for step, v in trial.intermediate_values.items() if step > self.warmup_steps]
        # Two measured steps at least: one step of a busy shared machine can take 2x (seen on this 2-core
        # machine, bench/tuning_efficiency.py --space tp-pp: the exhaustive best pruned after one step).
        if len(measured) < 2:
            return False
        best = [t.user_attrs.get("measurement", {}).get("step_time_s")
                for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
        best = [b for b in best if b]
        return bool(best) and min(measured) > self.ratio * min(best)


@dataclass(kw_only=True)
class TuneResult:
    study_name: str
    storage_url: str
    best: FrozenTrial | None
    """The winner: the finalist with the best median re-run, else the best single measurement."""
    best_estimate: Estimate | None
    trials: list[FrozenTrial]
    state_counts: dict[str, int]
    failure_summary: str = ""
    """When no trial completed: why (each failure's status and reason)."""
    calibration: CalibrationReport | None = None
    calibration_path: str | None = None
    finalists: list[Finalist] = field(default_factory=list)
    """The re-run finalists, best median first (empty: fewer than two completed plans, or disabled)."""
    candidates: dict[str, Estimate] = field(default_factory=dict, repr=False)
    not_measured: str = ""
    """Feasible plans the workload cannot run (never launched), counted by reason; empty when none."""
    current_job: str | None = None
    """The key of the plan ``tune --from`` read from the user's files (None: no --from)."""


def claim_conflict(study: optuna.Study, number: int, key: str) -> int | None:
    """The number of an earlier trial that holds ``key`` (None when this trial's claim stands)."""
    return claimed_keys(study.get_trials(deepcopy=False), before=number).get(key)


def _counted(t: FrozenTrial) -> bool:
    if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return t.state == TrialState.FAIL and t.user_attrs.get("status") not in ("interrupted", "duplicate")


def _by_reason(reasons: list[str], limit: int = 3) -> str:
    """Why plans are not measured, most frequent reason first, each with its count ("N plans: reason")."""
    counts: dict[str, int] = {}
    for r in reasons:
        counts[r] = counts.get(r, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    parts = [f"{n} plan{'s' if n > 1 else ''}: {r}" for r, n in ranked[:limit]]
    if len(ranked) > limit:
        parts.append(f"{sum(n for _, n in ranked[limit:])} more for {len(ranked) - limit} other reasons")
    return "; ".join(parts)


def _test_overrides() -> dict:
    raw = os.environ.get(TEST_OVERRIDES_ENV)
    return json.loads(raw) if raw else {}


def _tell(study: optuna.Study, trial: optuna.Trial, result: trial_mod.TrialResult) -> None:
    attrs = result.to_attrs()
    for k in ("status", "reason", "log_path"):
        trial.set_user_attr(k, attrs[k])
    if result.status == "completed" and result.tokens_per_s:
        trial.set_user_attr("measurement", {k: attrs[k] for k in ("step_time_s", "tokens_per_s", "tflops_per_gpu",
                                                                  "peak_memory_bytes", "step_times_s")})
        study.tell(trial, result.tokens_per_s)
    elif result.status == "pruned":
        study.tell(trial, state=TrialState.PRUNED)
    else:
        if result.status == "completed":
            trial.set_user_attr("status", "crashed")
            trial.set_user_attr("reason", "completed without a throughput measurement")
        study.tell(trial, state=TrialState.FAIL)


def tune(model: ModelSpec, cluster: ClusterSpec, *, seq_len: int, global_batch: int,
         constraints: SearchConstraints | None = None, workload: trial_mod.Workload, out_dir: str | Path,
         trials: int = 8, timeout_s: float | None = None, trial_timeout_s: float = 300.0, top_k: int = 3,
         steps: int = 6, warmup_steps: int = 2, storage_url: str | None = None, study_name: str = "autotune",
         resume: bool = False, worker: bool = False, host_memory_limit_bytes: int | None = None,
         num_layers: int | None = None, calibration_path: str | None = None,
         start_efficiency: Efficiency = DEFAULT_EFFICIENCY, prune_ratio: float | None = 1.5,
         finalists: int = 3, finalist_runs: int = 2, launcher: str | LaunchSettings = "torchrun",
         progress: Progress | None = None, emit_options: EmitOptions | None = None,
         current_job: ParallelPlan | None = None) -> TuneResult:
    """Run (or continue) the study; see the module docstring. InputError before any trial on bad input.

    ``prune_ratio``: trials whose step time exceeds this multiple of the best completed one are
    pruned (None: never prune, e.g. to measure every plan). ``finalists`` (0 or 1: none) best plans
    are re-run ``finalist_runs`` times each before the winner is declared (not by ``--worker``
    processes: the tuner that owns the study does it). ``calibration_path``: default OUT/cal.json.
    ``constraints.engine_versions``: the engine releases tuned (their defaults in the plans, held by the study: a
    resume or worker asking others is refused); ``emit_options``: their file formats, for the trials' files.
    ``current_job``: the plan the user runs now (``tune --from``), measured first (``autotune.tune.current_job``).
    """
    out = Path(out_dir)
    search = search_plans(model, cluster, seq_len=seq_len, global_batch_size=global_batch,
                          constraints=constraints, top_k=max(top_k, 1),
                          time_settings=TimeSettings(efficiency=start_efficiency))
    if not search.ranked:
        reasons = ", ".join(f"{k} {v}" for k, v in search.rejections.items())
        raise InputError([f"no feasible plan to tune among the {search.num_enumerated} enumerated ({reasons})"],
                         subject="search")
    ranked = list(search.in_order)
    mine = None
    if current_job is not None:
        ranked, mine = current_job_first(ranked, current_job, model, cluster, start_efficiency)
    skipped, run_model = "", trial_model_of(model, workload.kind, num_layers)  # the model the trials run
    if workload.kind in ("builtin", "script") or named_placeholders(workload.command) & set(PLAN_FILE_PLACEHOLDERS):
        # Measure only what the workload runs. builtin: every plan under its engine's trainer (python -m
        # autotune.train), which names what it cannot run (autotune.train.plan_problem); Megatron plans never
        # (their pretrain_gpt.py needs CUDA). script: the user's DeepSpeed script gets the plan as a DeepSpeed
        # config, so only plans a DeepSpeed config expresses. command: plans its {accelerate_config} /
        # {torchtitan_config} carry (autotune.tune.plan_files).
        from autotune.engines import engine_for
        from autotune.train import plan_problem

        if workload.kind == "builtin":
            why = {id(e): plan_problem(run_model, e.plan, full_layers=model.num_layers) for e in ranked}
        elif workload.kind == "command":
            why = {id(e): command_plan_problem(workload.command, run_model, cluster, e.plan, emit_options)
                   for e in ranked}
        else:
            why = {id(e): None if engine_for(e.plan).trainer_takes_deepspeed_config else
                   f"engine {engine_for(e.plan).name}: --workload script runs a DeepSpeed script with the plan's "
                   f"DeepSpeed config, which cannot express this engine's plans (use --engine deepspeed with a DeepSpeed "
                   f"script; measure other engines with --workload builtin or command)" for e in ranked}
        reasons = [r for r in why.values() if r]
        if mine is not None and why[id(ranked[0])]:
            raise InputError([f"the current job (--from) is not a plan the {workload.kind} workload runs: "
                              f"{why[id(ranked[0])]}" + ("" if workload.kind == "command" else "; measure your own "
                              "program with --workload command (or script)")], subject="tune")
        if len(reasons) == len(ranked):
            other = "" if workload.kind != "builtin" or all("--workload command" in r for r in reasons) else (
                "; or measure your own program: --workload script (a DeepSpeed script) or --workload command")
            raise InputError([f"the {workload.kind} workload runs none of the {len(ranked)} feasible plans "
                              f"({_by_reason(reasons)}){other}"], subject="tune")
        if reasons:
            skipped = (f"{len(reasons)} of the {len(ranked)} feasible plans are not measured by the {workload.kind} "
                       f"workload ({_by_reason(reasons)})")
        ranked = [e for e in ranked if not why[id(e)]]
    out.mkdir(parents=True, exist_ok=True)
    storage_url = storage_url or f"sqlite:///{(out / 'study.db').resolve()}"
    calibration_path = calibration_path or str(out / "cal.json")
    candidates = {plan_key(e.plan): e for e in ranked}
    order = list(candidates)
    rank = CalibratedRank({k: e.plan for k, e in candidates.items()}, order, run_model, cluster, start_efficiency)
    # Plans tied with the first within the model's error (autotune.search.ties) are measured before the sampler
    # explores: as many as the trials allow.
    top_k = max(top_k, min(search.tied, trials))
    sampler = PlanSampler(order, top_k=top_k, regions={k: plan_region(e.plan) for k, e in candidates.items()},
                          rank=rank, plans={k: e.plan for k, e in candidates.items()})
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(storage_url)
    pruner = SlowStepPruner(prune_ratio, warmup_steps) if prune_ratio else optuna.pruners.NopPruner()
    study = open_study(storage, storage_url, study_name, sampler=sampler, pruner=pruner,
                       must_be_new=not (resume or worker))
    _same_releases(study, dict((constraints or SearchConstraints()).engine_versions))
    same_job(study, study_job(model, cluster, seq_len=seq_len, global_batch=global_batch, num_layers=num_layers,
                              constraints=constraints, workload=workload, steps=steps, warmup_steps=warmup_steps))
    fail_stale_trials(study, all_running=resume and not worker, out_dir=out)
    say = (lambda text: progress("ops", study, None, text)) if progress else (lambda text: None)
    from autotune.engines import engine_for

    ds_plans = [e.plan for e in ranked if engine_for(e.plan).uses_deepspeed_ops]  # FSDP trials build nothing
    needed = ops.needed_ops(ds_plans, cpu=cluster.gpu.name == "cpu") \
        if ds_plans and workload.kind in ("builtin", "script") else []

    def ensure_ops() -> None:
        try:
            ops.ensure_ops(needed, say=say)
        except ops.OpsError as err:
            raise InputError([f"{err} (before any trial: fix it and rerun with --resume)"], subject="ops") from None

    ensure_ops()
    overrides = _test_overrides()
    started = time.monotonic()
    host = socket.gethostname()
    if progress:
        progress("start", study, None)

    def spec_for(plan, workdir: Path, number: int | None) -> trial_mod.TrialSpec:
        spec = trial_mod.TrialSpec(model=model, cluster=cluster, plan=plan, workload=workload, workdir=workdir,
                                   steps=steps, warmup_steps=warmup_steps, timeout_s=trial_timeout_s,
                                   host_memory_limit_bytes=host_memory_limit_bytes, num_layers=num_layers,
                                   emit_options=emit_options, **trial_fields(launcher))
        if number is not None and str(number) in overrides:
            spec = dataclasses.replace(spec, **overrides[str(number)])
        return spec

    while True:
        all_trials = study.get_trials(deepcopy=False)
        # Trials running elsewhere (other workers) count against the budget too; two workers
        # asking in the same instant may overshoot it by one trial each.
        if sum(_counted(t) or t.state == TrialState.RUNNING for t in all_trials) >= trials:
            break
        if timeout_s is not None and time.monotonic() - started >= timeout_s:
            break
        if sampler.next_key(all_trials) is None:
            break
        trial = study.ask(sampler.search_space)
        key = study._storage.get_trial_system_attrs(trial._trial_id).get(PARAM)
        est = candidates[key]
        # pid before host: another worker starting up (fail_stale_trials) takes a trial of this host with no pid
        # for one whose tuner died before writing it; written in this order, a trial being claimed has no host yet.
        predicted = trial_prediction(est, run_model, start_efficiency)  # of the model the trial runs
        for name, value in (("plan_key", key), ("plan", est.plan.to_dict()), ("predicted", predicted),
                            (CURRENT_JOB_ATTR, key == mine), ("pid", os.getpid()), ("host", host)):
            trial.set_user_attr(name, value)
        holder = claim_conflict(study, trial.number, key)
        if holder is not None:
            trial.set_user_attr("status", "duplicate")
            trial.set_user_attr("reason", f"duplicate: trial {holder} already holds this plan (not run)")
            study.tell(trial, state=TrialState.FAIL)
            continue
        ensure_ops()  # milliseconds when warm; rebuilds an op whose dead lock a trial cleared
        if progress:
            progress("trial_start", study, trial.number)
        spec = spec_for(est.plan, out / "trials" / f"{trial.number:04d}", trial.number)

        def on_step(i: int, seconds: float, _trial=trial) -> bool:
            _trial.report(seconds, i)
            return warmup_steps < i < warmup_steps + steps and _trial.should_prune()  # the last step: measured

        def on_phase(text: str, _n=trial.number) -> None:
            if progress:
                progress("phase", study, _n, text)

        try:
            result = trial_mod.run_trial(spec, on_step=on_step, on_phase=on_phase,
                                         on_launch=lambda record, _t=trial: _t.set_user_attr(LAUNCH_ATTR, record))
        except KeyboardInterrupt as err:
            what = getattr(err, "what", "Ctrl-C")
            trial.set_user_attr("status", "interrupted")
            trial.set_user_attr("reason", f"interrupted: {what} (trial processes ended; the study is resumable)")
            study.tell(trial, state=TrialState.FAIL)
            raise
        except InputError as err:
            trial.set_user_attr("status", "crashed")
            trial.set_user_attr("reason", f"not launched: {err.render()}")
            study.tell(trial, state=TrialState.FAIL)
            raise
        _tell(study, trial, result)
        if progress:
            progress("trial_end", study, trial.number)

    chosen: list[Finalist] = []
    if not worker and finalists >= 2 and (timeout_s is None or time.monotonic() - started < timeout_s):
        def measure(t: FrozenTrial, k: int) -> float | None:
            spec = spec_for(candidates[trial_key(t)].plan, out / "trials" / f"{t.number:04d}" / f"rerun-{k + 1}",
                            None)
            ensure_ops()
            def on_phase(text: str, _n=t.number) -> None:
                if progress:
                    progress("phase", study, _n, text)

            res = trial_mod.run_trial(spec, on_phase=on_phase)
            return res.tokens_per_s if res.status == "completed" else None

        def on_run(count: int, total: int, t: FrozenTrial) -> None:
            if progress:
                progress("finalist", study, t.number, f"re-running the best plans alternately: {count}/{total}")

        chosen = run_finalists(study, finalists, finalist_runs, measure, on_run)
    return dataclasses.replace(_result(study, storage_url, candidates, run_model, cluster, start_efficiency,
                                       calibration_path, chosen), not_measured=skipped, current_job=mine)


def _same_releases(study: optuna.Study, versions: dict[str, str]) -> None:
    """The engine releases a study tunes (user attribute ``engine_versions``, set by its first tuner): a ``--resume``
    or ``--worker`` asking for other ones would mix plans of two releases (other defaults, other files)."""
    held = study.user_attrs.get("engine_versions")
    if held is None:
        study.set_user_attr("engine_versions", versions)
    elif held != versions:
        said = ",".join(f"{e}={r}" for e, r in held.items())
        raise InputError([f"study {study.study_name!r} tunes the engine releases {said or '(none named)'}, this run "
                          f"asks {','.join(f'{e}={r}' for e, r in versions.items()) or '(none named)'}: continue it "
                          f"with {f'--engine-version {said}' if said else 'the releases it was started with'}, or start "
                          "another (--study-name / --out)"], subject="--engine-version")


def _result(study, storage_url, candidates, run_model, cluster, start, calibration_path,
            chosen: list[Finalist]) -> TuneResult:
    all_trials = study.get_trials(deepcopy=False)
    counts: dict[str, int] = {}
    for t in all_trials:
        status = t.user_attrs.get("status") if t.state == TrialState.FAIL else t.state.name.lower()
        counts[status or "fail"] = counts.get(status or "fail", 0) + 1
    completed = [t for t in all_trials if t.state == TrialState.COMPLETE]
    best = max(completed, key=lambda t: t.value) if completed else None
    if chosen and chosen[0].median:
        best = next((t for t in all_trials if t.number == chosen[0].trial.number), best)
    summary = ""
    if best is None:
        lines = [f"trial {t.number}: {t.user_attrs.get('status', t.state.name.lower())}: "
                 f"{t.user_attrs.get('reason', '')} (log {t.user_attrs.get('log_path', '-')})"
                 for t in all_trials if t.state != TrialState.COMPLETE]
        summary = "no trial completed:\n" + "\n".join(lines) if lines else "no trial ran"
    ms = step_measurements(all_trials, {k: e.plan for k, e in candidates.items()}, run_model, cluster)
    report = calibrate(ms, start, calibration_path) if ms else None
    return TuneResult(study_name=study.study_name, storage_url=storage_url, best=best,
                      best_estimate=candidates.get(trial_key(best)) if best else None, trials=all_trials,
                      state_counts=counts, failure_summary=summary, calibration=report,
                      calibration_path=calibration_path if report else None, finalists=chosen,
                      candidates=candidates)
