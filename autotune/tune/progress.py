"""What a tuning study looks like while it runs and after: a status line, a table, two PNG plots.

The status line goes to stderr on every event (a trial starts, changes phase or ends): rewritten in place with
``\\r`` when stderr is a terminal, one line per event otherwise (logs, CI). No curses.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from optuna.trial import FrozenTrial, TrialState

from autotune.specs.plan import ParallelPlan
from autotune.tune.finalists import ATTR as FINALISTS_ATTR

__all__ = ["ProgressLine", "summary_table", "finalists_table", "write_plots"]


def _fmt_s(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


class ProgressLine:
    """Callable passed to :func:`autotune.tune.study.tune` as ``progress(event, study, trial, detail)``.

    Shows the running trial's phase (launching, building op X, initialising the engine, step k/N with
    the last step times), what the tuner does between trials (building DeepSpeed ops, re-running the
    finalists), and an ETA from the durations of the trials measured so far.
    """

    def __init__(self, total_trials: int, stream=None, finalist_runs: int = 0) -> None:
        self.total = total_trials
        self.finalist_runs = finalist_runs
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.started = time.monotonic()
        self._last_len = 0
        self.phase: tuple[int | None, str] | None = None
        self.trial_started: float | None = None
        self.durations: list[float] = []
        self.note = ""
        self.finalists_done = 0

    def _eta(self, finished: int, trials: list[FrozenTrial] = ()) -> str:
        trials_left = max(0, self.total - finished)
        runs_left = max(0, self.finalist_runs - self.finalists_done)
        if not trials_left and not runs_left and self.trial_started is None:
            return "none, nothing left to run"
        # This session's trials first; a resumed study's earlier trials (their stored start and end) until then.
        durations = self.durations or [t.duration.total_seconds() for t in trials if t.duration is not None
                                       and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
        if not durations:
            return "after the first trial"
        per = statistics.median(durations)
        left = trials_left * per + runs_left * per
        if self.trial_started is not None:
            left -= min(per, time.monotonic() - self.trial_started)
        return _fmt_s(max(0.0, left))

    def line(self, trials: list[FrozenTrial]) -> str:
        done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
        failed = [t for t in trials if t.state == TrialState.FAIL
                  and t.user_attrs.get("status") not in ("interrupted", "duplicate")]
        values = [t.value for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
        best = f"{max(values):,.0f} tok/s" if values else "-"
        finished = len(done) + len(failed)
        now = ""
        if self.phase is not None:
            number, text = self.phase
            now = f"{'trial ' + str(number) if number is not None else 're-run'}: {text}, "
        note = f"{self.note}; " if self.note else ""
        return (f"tune: {finished}/{self.total} finished ({len(done)} done, {len(failed)} failed), {note}{now}"
                f"best {best}, elapsed {_fmt_s(time.monotonic() - self.started)}, ETA {self._eta(finished, trials)}")

    def __call__(self, event: str, study, trial: int | None = None, detail: str | None = None) -> None:
        now = time.monotonic()
        if event == "trial_start":
            self.trial_started, self.phase, self.note = now, (trial, "launching"), ""
        elif event == "phase":
            self.phase = (trial, detail or "")
            if trial is None and self.trial_started is None:
                self.trial_started = now
        elif event == "trial_end":
            if self.trial_started is not None:
                self.durations.append(now - self.trial_started)
            self.trial_started, self.phase = None, None
        elif event == "finalist":
            if self.trial_started is not None:
                self.durations.append(now - self.trial_started)
                self.finalists_done += 1
            self.trial_started, self.phase = now, (trial, "launching")
            self.note = detail or ""
        elif event == "ops":
            self.note = detail or ""
        if not self.finalists_done and self.finalist_runs:
            self.finalists_done = min(self.finalist_runs, _stored_finalist_runs(study))  # a resumed study's
        text = self.line(study.get_trials(deepcopy=False))
        if self.tty:
            pad = max(0, self._last_len - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._last_len = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self._last_len:
            self.stream.write("\n")
            self.stream.flush()


def _stored_finalist_runs(study) -> int:
    """Finalist re-runs a resumed study already holds (autotune.tune.finalists keeps them in the study)."""
    try:
        record = study.user_attrs.get(FINALISTS_ATTR) or {}
        return sum(len(v) for v in (record.get("runs") or {}).values())
    except Exception:  # noqa: BLE001 - a progress line never stops a study
        return 0


def _plan_text(t: FrozenTrial) -> str:
    from autotune.report import plan_summary

    plan = t.user_attrs.get("plan")
    if not plan:
        return "-"
    try:
        return plan_summary(ParallelPlan(**plan))
    except Exception:  # noqa: BLE001 - a plan from another version of autotune: show it raw
        return str(plan)


def summary_table(trials: list[FrozenTrial]) -> str:
    """One row per trial: plan, state, measured and predicted step time, tokens/s, reason."""
    w = max([44] + [len(_plan_text(t)) + 2 for t in trials])  # the longest plan still leaves a gap
    head = f"{'#':>4}  {'plan':<{w}}{'state':<12}{'step s':>9}{'pred s':>9}{'tokens/s':>11}  reason"
    rows = [head, "-" * len(head)]
    for t in sorted(trials, key=lambda t: t.number):
        state = t.user_attrs.get("status") if t.state == TrialState.FAIL else t.state.name.lower()
        meas = t.user_attrs.get("measurement") or {}
        pred = (t.user_attrs.get("predicted") or {}).get("step_time_s")
        step = meas.get("step_time_s")
        tok = meas.get("tokens_per_s")
        reason = "" if t.state == TrialState.COMPLETE else (t.user_attrs.get("reason") or "")
        reason = reason.replace("\n", " ")[:90]
        rows.append(f"{t.number:>4}  {_plan_text(t):<{w}}{state or 'fail':<12}"
                    f"{'-' if step is None else f'{step:.4f}':>9}{'-' if pred is None else f'{pred:.4f}':>9}"
                    f"{'-' if tok is None else f'{tok:,.0f}':>11}  {reason}")
    preds = [t.user_attrs.get("predicted") or {} for t in trials]
    cut = {(p.get("num_layers"), p["whole_model"].get("num_layers")) for p in preds if isinstance(p, dict)
           and isinstance(p.get("whole_model"), dict)}
    for ran, whole in sorted(cut, key=str):  # tune --num-layers: the trials ran a cut of the model, predicted as run
        rows.append(f"pred s: predicted for the model the trials ran ({ran} of its {whole} layers, tune --num-layers), "
                    "like step s; the whole model's is each trial's predicted.whole_model (the best's in --json)")
    return "\n".join(rows)


def finalists_table(finalists) -> str:
    """The re-run finalists (:class:`autotune.tune.finalists.Finalist`), best median first, with their spread."""
    w = max([44] + [len(_plan_text(f.trial)) + 2 for f in finalists])
    head = f"{'#':>4}  {'plan':<{w}}{'trial tok/s':>12}{'re-runs tok/s':>24}{'median':>10}{'spread':>8}"
    rows = [head, "-" * len(head)]
    for f in finalists:
        runs = ", ".join("-" if r is None else f"{r:,.0f}" for r in f.runs_tokens_per_s)
        median = "-" if f.median is None else f"{f.median:,.0f}"
        spread = "-" if f.spread is None else f"{f.spread:.1%}"
        rows.append(f"{f.trial.number:>4}  {_plan_text(f.trial):<{w}}{f.trial.value or 0:>12,.0f}{runs:>24}"
                    f"{median:>10}{spread:>8}")
    rows.append("spread: (max - min) / median of the re-runs; the winner has the best median.")
    return "\n".join(rows)


def write_plots(trials: list[FrozenTrial], out_dir: str | Path, calibration=None) -> list[Path]:
    """history.png (tokens/s per trial, best so far) and predicted_vs_measured.png; [] without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    out = Path(out_dir)
    paths = []
    figures = [("history.png", history_figure(trials))]
    if calibration is not None and calibration.rows:
        figures.append(("predicted_vs_measured.png", calibration_figure(calibration)))
    for name, fig in figures:
        paths.append(out / name)
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths


def history_figure(trials: list[FrozenTrial]):
    """tokens/s of each completed trial and the best so far; trials on integer ticks."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    done = sorted((t for t in trials if t.state == TrialState.COMPLETE and t.value is not None),
                  key=lambda t: t.number)
    fig, ax = plt.subplots(figsize=(6, 4))
    if done:
        xs = [t.number for t in done]
        ys = [t.value for t in done]
        best, run = [], 0.0
        for y in ys:
            run = max(run, y)
            best.append(run)
        ax.plot(xs, ys, "o", label="trial")
        ax.step(xs, best, where="post", label="best so far")
    failed = [t.number for t in trials if t.state != TrialState.COMPLETE]
    if failed:
        ax.plot(failed, [0] * len(failed), "x", color="red", label="failed / pruned")
    numbers = [t.number for t in trials]
    if numbers:  # half a trial of margin: integer ticks always exist in the view
        ax.set_xlim(min(numbers) - 0.5, max(numbers) + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # trial numbers: 0, 1, 2, never 0.25
    ax.set_xlabel("trial")
    ax.set_ylabel("tokens/s")
    ax.set_title("optimisation history")
    if done or failed:
        ax.legend()
    fig.tight_layout()
    return fig


def calibration_figure(calibration):
    """Predicted vs measured step time before and after calibration, on log axes with few, plain labels."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, StrMethodFormatter

    fig, ax = plt.subplots(figsize=(5.5, 5))
    meas = [r[1] for r in calibration.rows]
    ax.plot(meas, [r[2] for r in calibration.rows], "o", label="before calibration")
    ax.plot(meas, [r[3] for r in calibration.rows], "s", label="after calibration")
    values = meas + [r[2] for r in calibration.rows] + [r[3] for r in calibration.rows]
    lo, hi = min(values), max(values)
    ax.plot([lo, hi], [lo, hi], "k--", linewidth=1, label="predicted = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    # The same limits on both axes (the diagonal is y = x), wide enough to hold 1-2-5 ticks; over more than
    # two decades only the powers of ten are labelled (1-2-5 labels would overlap).
    limits = (lo / 2, hi * 2) if hi / lo < 10 else (lo / 1.3, hi * 1.3)
    subs = (1.0, 2.0, 5.0) if limits[1] / limits[0] <= 100 else (1.0,)
    ax.set_xlim(*limits)
    ax.set_ylim(*limits)
    for axis in (ax.xaxis, ax.yaxis):  # few plain labels: log minor labels overlap on narrow ranges
        axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=8))
        axis.set_major_formatter(StrMethodFormatter("{x:.3g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.legend()
    fig.tight_layout()
    return fig
