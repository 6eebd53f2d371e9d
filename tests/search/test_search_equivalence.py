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


# The searches of a million plans and more take 5-15 s each: `make test` runs them, `make test-fast` the rest.
HEAVY = {"llama3-405b/16384 h100 all engines", "llama3-70b/64 h100 all engines", "mixtral-8x7b/16 h100 all engines"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in sorted(CASES)])
def test_search_unchanged(name):
    got, want = digest(run_case(name)), GOLDEN[name]
    assert got["num_enumerated"] == want["num_enumerated"]
    assert got["num_feasible"] == want["num_feasible"]
    assert got["rejections"] == want["rejections"]
    assert got["top"] == want["top"]
    assert got["explanation"] == want["explanation"]
    assert got["ranked_sha256"] == want["ranked_sha256"]
