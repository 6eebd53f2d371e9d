"""Every rule id the code can reject a plan with has a meaning in the legend, and `python -m autotune.legend`
prints them all (the planner's "N more rules" line sends the user there)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.legend import ENGINE_DIMENSIONS, REJECTIONS, all_rules_text, rejection_legend, rule_meaning

PACKAGE = Path(__file__).resolve().parents[1] / "autotune"


def _rule_ids_in_source() -> set[str]:
    """Rule ids as the code writes them: bad("id", ...) in the rules, Rule(id="...") and id=f"{...}:dim" in the
    engines, and the planner's memory reasons."""
    support = (PACKAGE / "engines" / "support_rules.py").read_text(encoding="utf-8")
    text = "\n".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py") if p.name != "support_rules.py")
    ids = set(re.findall(r'\bbad\("([a-z_0-9]+)"', text))
    ids |= {f"any:{dim}" for dim in re.findall(r'\bbad\("([a-z_0-9]+)"', support)}  # "<engine>:<dimension>"
    ids |= set(re.findall(r'Rule\(id="([a-z_0-9:]+)"', text))
    ids |= {f"any:{dim}" for dim in re.findall(r'id=f"\{[a-z_.]+\}:([a-z_]+)"', text)}
    ids |= set(re.findall(r'"(gpu_memory|host_memory|headroom)"', text))
    return ids


@pytest.mark.parametrize("rule", sorted(_rule_ids_in_source()))
def test_every_rule_id_has_a_meaning(rule):
    engine, sep, dim = rule.partition(":")
    if sep:
        assert dim in ENGINE_DIMENSIONS, f"add {dim!r} to autotune/legend.py ENGINE_DIMENSIONS"
    else:
        assert rule in REJECTIONS, f"add {rule!r} to autotune/legend.py REJECTIONS"


def test_the_scan_finds_the_rules_it_should():
    ids = _rule_ids_in_source()
    assert {"world_size", "batch_triple", "gpu_memory", "offload_param_zero3", "fsdp:pp_microbatches", "any:tp",
            "any:ulysses_layout"} <= ids


def test_more_rules_than_shown_point_to_the_full_list():
    rules = list(REJECTIONS)[:12]
    line = rejection_legend(rules)
    assert "4 more rules: `python -m autotune.legend` explains every rule" in line.replace("\n  ", " ")


@pytest.mark.slow
def test_python_m_autotune_legend_prints_every_rule():
    out = subprocess.run([sys.executable, "-m", "autotune.legend"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert out.strip() == all_rules_text()
    for rule, meaning in REJECTIONS.items():
        assert f"{rule}" in out and meaning in out
    assert rule_meaning("hf:tp") == "hf cannot run it: no tensor parallelism"
