"""A winner that is not one lucky measurement: the best few plans re-run alternately, chosen on medians.

On 2 CPU cores one trial's throughput varies by ~6-10% run to run and differences under ~15% are
not resolvable (measured here: ``bench/tuning_efficiency.py`` prints the repeats' spread), and the best of many
single measurements is biased upwards (the plan that got lucky wins). So after the study, the
``n`` best completed plans are re-run ``runs`` times each, interleaved (A B C A B C: drift in the
machine's speed hits every finalist alike), and the winner is the finalist with the highest
median re-run throughput. The re-runs are recorded in the study's user attribute ``finalists``
(finished trials cannot be updated), so a resumed study continues them rather than starting over.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.tune.sampler import trial_key

__all__ = ["Finalist", "pick_finalists", "run_finalists", "ATTR"]

ATTR = "finalists"


@dataclass(frozen=True, slots=True)
class Finalist:
    trial: FrozenTrial
    key: str
    runs_tokens_per_s: tuple[float | None, ...]
    """Each re-run's tokens/s (None: that re-run did not complete)."""

    @property
    def measured(self) -> list[float]:
        return [r for r in self.runs_tokens_per_s if r]

    @property
    def median(self) -> float | None:
        return statistics.median(self.measured) if self.measured else None

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the re-runs."""
        m = self.measured
        return (max(m) - min(m)) / statistics.median(m) if len(m) >= 2 else None


def pick_finalists(study: optuna.Study, n: int) -> list[FrozenTrial]:
    """The ``n`` best completed trials, one per plan."""
    done = sorted((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value),
                  key=lambda t: -t.value)
    out, seen = [], set()
    for t in done:
        key = trial_key(t)
        if key not in seen:
            seen.add(key)
            out.append(t)
        if len(out) == n:
            break
    return out


def run_finalists(study: optuna.Study, n: int, runs: int, measure: Callable[[FrozenTrial, int], float | None],
                  on_run: Callable[[int, int, FrozenTrial], None] | None = None) -> list[Finalist]:
    """Re-run the ``n`` best plans ``runs`` times each, interleaved; best median first.

    ``measure(trial, k)`` runs the trial's plan again (re-run ``k``) and returns its tokens/s or None.
    With fewer than two completed plans there is nothing to choose between: no re-runs.
    """
    finalists = pick_finalists(study, n)
    if len(finalists) < 2 or runs < 1:
        return []
    record: dict = dict(study.user_attrs.get(ATTR) or {})
    done: dict[str, list] = {k: list(v) for k, v in (record.get("runs") or {}).items()}
    keys = [trial_key(t) for t in finalists]
    total, count = runs * len(finalists), 0
    for k in range(runs):
        for t, key in zip(finalists, keys):
            count += 1
            have = done.setdefault(key, [])
            if len(have) > k:
                continue  # measured before the tuner was stopped (resume)
            if on_run is not None:
                on_run(count, total, t)
            have.append(measure(t, k))
            study.set_user_attr(ATTR, {"runs": done, "order": keys})
    out = [Finalist(t, key, tuple(done.get(key, ()))[:runs]) for t, key in zip(finalists, keys)]
    out.sort(key=lambda f: -(f.median or 0.0))
    study.set_user_attr(ATTR, {"runs": done, "order": keys, "winner": out[0].key if out[0].median else None})
    return out
