"""bench/nvidia_plan_changes.py: plan changes found between consecutive containers, the software drift taken out
with the same system's unchanged plans, and the verdicts."""

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import nvidia_plan_changes as changes  # noqa: E402


@dataclass
class _Case:
    row: dict
    measured: float
    predicted: float | None


def _case(container: str, model: str, measured: float, predicted: float | None = 1.0, system: str = "DGX-GB200",
          **plan: str) -> _Case:
    row = {"task": "pre", "model": model, "system": system, "gpus": "64", "precision": "FP8", "gbs": "256",
           "seq": "8192", "container": container, "mbs": "1", "fsdp": "0", "tp": "1", "pp": "1", "cp": "1",
           "vp": "n/a", "ep": "n/a"}
    return _Case({**row, **plan}, measured, predicted)


def _cases() -> list[_Case]:
    return [
        # model A changes its plan from 26.02 to 26.04 (listed newest first, as the table is), and not again in 26.06
        _case("26.06", "A", 130.0, 1.3, pp="4", vp="5"),
        _case("26.04", "A", 120.0, 1.3, pp="4", vp="5"),
        _case("26.02", "A", 100.0, 1.0, pp="4"),
        # model B keeps its plan (blank FSDP and "1" VP spell the same as "0" and "n/a"): the drift, 1.1 in 26.04
        _case("26.04", "B", 110.0, fsdp="", vp="1"),
        _case("26.02", "B", 100.0),
        # the same plan change on another system: a separate workload, and no drift rows there
        _case("26.04", "A", 99.0, 1.2, system="DGX-GB300", pp="4", vp="5"),
        _case("26.02", "A", 100.0, 1.0, system="DGX-GB300", pp="4"),
        # a row the model could not estimate is left out
        _case("26.02.01", "A", 50.0, None, pp="8"),
    ]


def test_changes_pair_consecutive_containers_whose_plans_differ_and_blanks_read_as_defaults():
    pairs = changes.plan_changes(_cases())
    found = sorted((old.row["system"], old.row["container"], new.row["container"]) for old, new in pairs)
    assert found == [("DGX-GB200", "26.02", "26.04"), ("DGX-GB300", "26.02", "26.04")]
    assert changes.container_key("26.06.01") > changes.container_key("26.06") > changes.container_key("26.04.01")


def test_drift_is_the_same_systems_unchanged_plans_and_verdicts_follow_the_adjusted_ratio():
    cases = _cases()
    pairs = sorted(changes.plan_changes(cases), key=lambda p: p[0].row["system"])
    (m1, d1, n1, p1), (m2, d2, n2, p2) = changes.change_ratios(cases, pairs)
    assert (m1, d1, n1, p1) == pytest.approx((1.2, 1.1, 1, 1.3))  # GB200: B's 1.1 is the drift
    assert (m2, d2, n2, p2) == pytest.approx((0.99, 1.0, 0, 1.2))  # GB300: no unchanged plan there
    assert changes.verdict(m1 / d1, p1) == "agree"  # 1.09 measured after drift, 1.3 predicted
    assert changes.verdict(m2 / d2, p2) == "tie"  # 0.99: within 3%
    assert changes.verdict(0.9, 1.2) == "disagree"
    assert changes.verdict(1.1, 0.95) == "disagree"
