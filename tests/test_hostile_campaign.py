"""bench/hostile_campaign.py's case list and classifier, against this checkout only (no worktrees): a sample of
issue 21's campaign (its refusals, the real-world files, special files, fuzz of every subcommand) ends with no
traceback, no hang, no nonsense accepted, no false alarm and no data loss. The full before/after count is the
bench's: `python bench/hostile_campaign.py`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import campaign_cases  # noqa: E402
import hostile_campaign  # noqa: E402


def test_the_classifier_names_each_kind():
    refuse = campaign_cases.Case(0, "refuse:x", ["estimate"], expect="refuse")
    good = campaign_cases.Case(0, "realworld:x", ["validate", "f", "--json"], expect="pass")
    fuzz = campaign_cases.Case(0, "fuzz:plan", ["plan"])
    assert hostile_campaign.classify(fuzz, {"status": "exception", "error": "Traceback ..."})[0] == "traceback"
    assert hostile_campaign.classify(fuzz, {"status": "ok", "code": 2,
                                            "err": "Traceback (most recent call last):\n x\nValueError: y"}) == (
        "traceback", "ValueError: y")
    assert hostile_campaign.classify(fuzz, {"status": "hang"})[0] == "hang"
    assert hostile_campaign.classify(fuzz, {"status": "memory"})[0] == "hang"
    assert hostile_campaign.classify(fuzz, {"status": "ok", "code": 3})[0] == "bad exit code"
    assert hostile_campaign.classify(fuzz, {"status": "study"})[0] == "clean"
    assert hostile_campaign.classify(refuse, {"status": "ok", "code": 0})[0] == "nonsense accepted"
    assert hostile_campaign.classify(refuse, {"status": "study"})[0] == "nonsense accepted"
    assert hostile_campaign.classify(refuse, {"status": "ok", "code": 2})[0] == "clean"
    assert hostile_campaign.classify(good, {"status": "ok", "code": 0, "out": "[]"})[0] == "clean"
    assert hostile_campaign.classify(good, {"status": "ok", "code": 1, "out": "[]"})[0] == "false alarm"
    assert hostile_campaign.classify(
        good, {"status": "ok", "code": 0, "out": '[{"severity": "warning", "path": "$.x", "message": "m"}]'})[0] == (
        "false alarm")


def test_both_checkouts_get_the_same_cases():
    spec = {"estimate": [{"flags": ["--tp"], "nargs": None, "choices": None, "type": "int", "dest": "tp"}],
            **{c: [] for c in ("plan", "emit", "validate", "recipes", "tune")}}
    fixtures = ROOT / "tests" / "fixtures" / "realworld"
    recipe = (ROOT / "recipes" / "cpu-demo.yaml").read_text()
    a = campaign_cases.build_cases(300, 7, spec, fixtures, recipe)
    b = campaign_cases.build_cases(300, 7, spec, fixtures, recipe)
    assert len(a) == 300 and [c.to_json() for c in a] == [c.to_json() for c in b]
    families = {c.family.split(":")[0] for c in a}
    assert families >= {"fuzz", "refuse", "realworld", "special", "dataloss"}


@pytest.mark.slow
def test_a_sample_of_the_campaign_is_clean_on_this_checkout(tmp_path):
    spec = hostile_campaign.worker_spec(ROOT, tmp_path / "spec")
    cases = campaign_cases.build_cases(60, 21, spec, ROOT / "tests" / "fixtures" / "realworld",
                                       (ROOT / "recipes" / "cpu-demo.yaml").read_text())
    rows = hostile_campaign.run_campaign(cases, ROOT, tmp_path / "cases")
    found = [(kind, why, case.shell()) for case, (kind, why, _) in zip(cases, rows) if kind != "clean"]
    assert found == []
    assert len(rows) == 60
