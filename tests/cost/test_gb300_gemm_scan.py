"""bench/gb300_gemm_scan.py's arithmetic: pairs matched by plan, errors as logs, the factor nearest a zero median."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import gb300_gemm_scan as scan  # noqa: E402
from nvidia_gpu_pairs import SAME  # noqa: E402


def _row(system: str, plan: str) -> dict:
    # a CSV row: the plan's columns (nvidia_gpu_pairs.SAME) and the system
    return {**{k: "1" for k in SAME}, "container": plan, "system": system}


def _rows(gb300_speed: float) -> list[list]:
    # Two plans measured on both systems (GB300 1.2x faster), one GB300-only row; predictions scale with the GB300 rate.
    return [["DGX-GB300", "A", 120.0, 100.0 * gb300_speed, _row("DGX-GB300", "p1")],
            ["DGX-GB200", "A", 100.0, 100.0, _row("DGX-GB200", "p1")],
            ["DGX-GB300", "B", 60.0, 50.0 * gb300_speed, _row("DGX-GB300", "p2")],
            ["DGX-GB200", "B", 50.0, 50.0, _row("DGX-GB200", "p2")],
            ["DGX-GB300", "C", 10.0, 9.0 * gb300_speed, _row("DGX-GB300", "p3")]]


def test_pairs_are_the_same_plan_on_both_systems_and_rows_can_leave_a_family_out():
    rows = _rows(1.0)
    assert scan.pair_errors(rows) == pytest.approx([math.log(1 / 1.2)] * 2)  # p3 has no GB200 sibling
    assert len(scan.gb300_errors(rows)) == 3
    assert scan.gb300_errors(rows, family="C") == pytest.approx([math.log(0.9)])
    assert len(scan.gb300_errors(rows, without="A")) == 2


def test_the_factor_picked_is_the_one_whose_median_error_is_nearest_zero():
    grid = {f: _rows(f) for f in (1.0, 1.1, 1.2, 1.3)}
    assert scan.pick(grid, scan.pair_errors) == 1.2
    assert scan.pick(grid, lambda rows: scan.gb300_errors(rows, family="C")) == 1.1  # 0.99: nearest 1
