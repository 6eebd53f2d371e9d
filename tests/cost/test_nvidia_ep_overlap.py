"""bench/nvidia_ep_overlap.py splits the NVIDIA bench's MoE rows by their recipe's EP overlap, per family."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import nvidia_ep_overlap as bench  # noqa: E402


def _case(family: str, mode: str | None, error: float, moe: bool = True, ep: int = 8):
    result = SimpleNamespace(plan=SimpleNamespace(ep_overlap=mode, ep=ep), model=SimpleNamespace(is_moe=moe))
    return SimpleNamespace(family=family, result=result, error=error)


def test_gap_per_family_is_the_overlapped_median_less_the_other(capsys):
    done = [_case("A", "a2a", 0.10), _case("A", "a2a-delay-wgrad", 0.20), _case("A", "none", 0.0),
            _case("B", "a2a", 0.05),  # no rows without: no gap
            _case("C", "none", 0.3), _case("C", "a2a", 0.1),
            _case("D", "a2a", 0.9, moe=False), _case("D", "none", 0.0, moe=False),  # dense: left out
            _case("E", None, 0.5)]  # unset: neither side
    gaps = bench.ep_overlap_table(done)
    assert gaps.keys() == {"A", "C"}
    assert abs(gaps["A"] - 0.15) < 1e-12 and abs(gaps["C"] + 0.2) < 1e-12
    out = capsys.readouterr().out
    assert "EP OVERLAP" in out and "all MoE rows" in out
