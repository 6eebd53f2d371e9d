"""The tune plots, rendered: integer trial ticks, and no axis label overlapping another or leaving the figure."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from optuna.trial import TrialState, create_trial  # noqa: E402

from autotune.tune.progress import calibration_figure, history_figure, write_plots  # noqa: E402


def _trials(values):
    trials = []
    for number, value in enumerate(values):
        trial = create_trial(value=value, params={}, distributions={}) if value is not None else \
            create_trial(state=TrialState.FAIL, params={}, distributions={})
        trial.number = number
        trials.append(trial)
    return trials


def _labels(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]

    def shown(labels, limits, index):  # labels of ticks inside the view (matplotlib keeps the others hidden)
        lo, hi = sorted(limits)
        return [t for t in labels if t.get_text() and t.get_visible()
                and lo - 1e-9 * abs(hi) <= t.get_position()[index] <= hi * (1 + 1e-9)]

    xs = shown(ax.get_xticklabels(), ax.get_xlim(), 0)
    ys = shown(ax.get_yticklabels(), ax.get_ylim(), 1)
    return ax, renderer, xs, ys


def _no_overlap(texts, renderer, what):
    boxes = [t.get_window_extent(renderer) for t in texts]
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not boxes[i].overlaps(boxes[j]), (what, texts[i].get_text(), texts[j].get_text())


def _readable(fig):
    ax, renderer, xs, ys = _labels(fig)
    _no_overlap(xs, renderer, "x ticks")
    _no_overlap(ys, renderer, "y ticks")
    _no_overlap(xs + [ax.xaxis.label], renderer, "x label vs ticks")
    _no_overlap(ys + [ax.yaxis.label], renderer, "y label vs ticks")
    figure_box = fig.bbox
    for text in xs + ys + [ax.xaxis.label, ax.yaxis.label]:
        box = text.get_window_extent(renderer)
        assert figure_box.x0 - 1 <= box.x0 and box.x1 <= figure_box.x1 + 1, text.get_text()
        assert figure_box.y0 - 1 <= box.y0 and box.y1 <= figure_box.y1 + 1, text.get_text()
    return xs, ys


@pytest.mark.parametrize("values", [[120.0, 150.0, 130.0], [100.0], [100.0, None, 180.0, 170.0, None, 190.0] * 5])
def test_history_has_integer_trial_ticks(values):
    xs, _ = _readable(history_figure(_trials(values)))
    for tick in xs:
        text = tick.get_text().replace("\u2212", "-")
        assert float(text).is_integer(), text


@pytest.mark.parametrize("rows", [
    [("0", 0.21, 0.25, 0.22), ("1", 0.30, 0.33, 0.29), ("2", 0.45, 0.50, 0.46)],  # under one decade
    [("0", 0.002, 0.004, 0.0021), ("1", 3.0, 2.0, 2.9), ("2", 40.0, 55.0, 41.0)],  # four decades
    [("0", 1.0, 1.1, 1.0)],
])
def test_predicted_vs_measured_axes_are_readable(rows):
    xs, ys = _readable(calibration_figure(SimpleNamespace(rows=rows)))
    assert 2 <= len(xs) <= 9 and 2 <= len(ys) <= 9


def test_write_plots_writes_both(tmp_path):
    cal = SimpleNamespace(rows=[("0", 0.21, 0.25, 0.22), ("1", 0.3, 0.33, 0.29)])
    paths = write_plots(_trials([1.0, 2.0]), tmp_path, cal)
    assert [p.name for p in paths] == ["history.png", "predicted_vs_measured.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
