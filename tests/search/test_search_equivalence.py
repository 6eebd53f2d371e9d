"""The planner answers what it answered before it was made faster: for each search of ``golden_cases.CASES``
the same number of plans enumerated and feasible, the same rejections by rule, the same top 20 plans with the
same predicted step times, the same explanation, and the same ranked list of every feasible plan (a hash over
each plan, its step time, tokens/s and memory)."""

import json

import pytest
from golden_cases import CASES, FIXTURE, digest, run_case

GOLDEN = json.loads(FIXTURE.read_text())


def test_fixture_covers_every_case():
    assert set(GOLDEN) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_search_unchanged(name):
    got, want = digest(run_case(name)), GOLDEN[name]
    assert got["num_enumerated"] == want["num_enumerated"]
    assert got["num_feasible"] == want["num_feasible"]
    assert got["rejections"] == want["rejections"]
    assert got["top"] == want["top"]
    assert got["explanation"] == want["explanation"]
    assert got["ranked_sha256"] == want["ranked_sha256"]
