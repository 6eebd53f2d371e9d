"""Uncertainty intervals (autotune.cost.uncertainty) and tie ranking (autotune.search.ties).

- the shipped table's published records (leave-one-family-out errors) cover exactly the published runs with a
  throughput, and a regeneration of them (bench/uncertainty_table.py ``published_records``, ~25 s: kept in the fast
  suite, so a cost-model change that leaves the table stale fails at once) gives the same errors, throughput and
  peak memory (NVIDIA's Blackwell records: tests/cost/test_uncertainty_nvidia.py);
- a plan's interval is the median |error| of the runs most like it, recomputed here by hand from the file;
- the planner's tie groups: each member within the fastest's interval and the fastest within its; simplest
  first; the same set of plans as the speed ranking; ``ties=False`` is the speed ranking;
- the fragile pick of issue 20: DeepSpeed on 8 H100 for Llama-3-8B, where ZeRO-3 led ZeRO-1 by less than the
  model's error, now returns the ZeRO-1 plan;
- the interval is in `estimate`, `plan` (a ± column, '=' for the tied) and their --json.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from autotune.api import deepspeed_config_for
from autotune.cli import main
from autotune.cost.published_runs import published_runs
from autotune.cost.uncertainty import MIN_RUNS, WEIGHTS, plan_kind, uncertainty_of
from autotune.resources import data_path
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.search.ties import interval, rank_with_ties, simplicity
from autotune.specs.loading import load_cluster, load_model

REPO = Path(__file__).resolve().parents[2]
ALL_SHIPPED = json.loads(data_path("autotune", "data/uncertainty_runs.json").read_text())["runs"]
SHIPPED = [r for r in ALL_SHIPPED if r["source"] == "published"]


def test_the_table_covers_the_published_runs_with_a_throughput():
    timed = {r.run_id: r.family for r in published_runs() if not r.skipped and r.tokens_per_s_per_gpu}
    assert {r["run_id"]: r["family"] for r in SHIPPED} == timed
    assert all(set(WEIGHTS) <= set(r) and abs(r["lofo_error"]) < 5 for r in ALL_SHIPPED)
    assert not any(r["moe"] for r in SHIPPED)  # no published run is of a mixture-of-experts model


def test_the_table_is_what_the_bench_writes_now():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import uncertainty_table
    finally:
        sys.path.remove(str(REPO / "bench"))
    fresh = {r["run_id"]: r for r in uncertainty_table.published_records()}
    assert len(fresh) == len(SHIPPED)
    for shipped in SHIPPED:
        now = fresh[shipped["run_id"]]
        errors = ("lofo_error", "memory_error")
        assert {k: v for k, v in now.items() if k not in errors} == {k: v for k, v in shipped.items()
                                                                      if k not in errors}
        assert now["lofo_error"] == pytest.approx(shipped["lofo_error"], abs=2e-4), shipped["run_id"]
        assert (now["memory_error"] is None) == (shipped["memory_error"] is None), shipped["run_id"]
        if now["memory_error"] is not None:
            assert now["memory_error"] == pytest.approx(shipped["memory_error"], abs=2e-4), shipped["run_id"]


def _search(model="llama3-8b", gpu="h100-sxm-80gb", n=8, **kw):
    return search_plans(load_model(model), load_cluster(gpu=gpu, num_gpus=n), seq_len=4096, global_batch_size=n,
                        constraints=SearchConstraints(engines=("deepspeed",)), top_k=20, **kw)


def test_an_interval_is_the_median_error_of_the_nearest_runs_by_hand():
    est = _search().candidates[0]
    kind = plan_kind(est.plan, est.cluster, moe=False)
    scores = [(sum(w for k, w in WEIGHTS.items() if r[k] == kind[k]), r) for r in ALL_SHIPPED]
    floor = max(s for s, _ in scores)
    while sum(s >= floor for s, _ in scores) < MIN_RUNS or len({r["family"] for s, r in scores if s >= floor}) < 2:
        floor -= 1
    chosen = [r for s, r in scores if s >= floor]
    u = uncertainty_of(est.plan, est.cluster, moe=False)
    assert u == interval(est) and u.runs == len(chosen) >= MIN_RUNS and u.score == floor
    assert u.relative == pytest.approx(statistics.median(abs(r["lofo_error"]) for r in chosen))
    assert set(u.families) == {r["family"] for r in chosen}
    assert 0 < u.relative < 0.5


def test_tie_groups_within_each_others_interval_simplest_first():
    by_speed, tied = _search(ties=False), _search()
    assert [e.plan for e in tied.ranked] == [e.plan for e in by_speed.ranked]  # fastest first: goodput walks it
    assert [e.plan for e in tied.decided] != [e.plan for e in by_speed.ranked] and not by_speed.decided
    assert sorted(e.time.tokens_per_s for e in by_speed.ranked) == sorted(e.time.tokens_per_s for e in tied.decided)
    assert tied.candidates == tied.decided[:20]
    fastest = by_speed.ranked[0]
    group = tied.decided[:tied.tied]
    assert tied.tied > 1 and fastest in group
    t0, u0 = fastest.time.tokens_per_s, interval(fastest).relative
    for e in group:
        t, u = e.time.tokens_per_s, interval(e).relative
        assert abs(t - t0) <= u0 * t0 + 1e-9 and abs(t - t0) <= u * t + 1e-9
    keys = [(simplicity(e), -e.time.tokens_per_s) for e in group]
    assert keys == sorted(keys)
    after = tied.decided[tied.tied]  # the first plan outside the group is not tied with the fastest
    t, u = after.time.tokens_per_s, interval(after).relative
    assert abs(t - t0) > u0 * t0 or abs(t - t0) > u * t
    assert "within the model's" in tied.explanation and tied.uncertainty is not None


def test_tie_groups_partition_the_order_each_led_by_the_fastest_left():
    """``TieRanking.groups`` cuts ``ranked`` into the groups the rule made: each one's fastest member is the fastest
    plan not in an earlier group, every member ties it both ways, and ``group_start`` of any member is its group's
    first place (the bench's tie-aware rank of NVIDIA's plan)."""
    by_speed = _search(ties=False).ranked
    tie = rank_with_ties(by_speed)
    assert sum(tie.groups) == len(tie.ranked) == len(by_speed) and tie.groups[0] == tie.leading_group
    assert len(tie.groups) > 1 and max(tie.groups) > 1
    start, seen = 0, set()
    for size in tie.groups:
        members = tie.ranked[start:start + size]
        lead = max(members, key=lambda e: e.time.tokens_per_s)
        left = [e for e in by_speed if id(e) not in seen]
        assert lead.time.tokens_per_s == left[0].time.tokens_per_s
        t0, u0 = lead.time.tokens_per_s, interval(lead).relative
        for pos, e in enumerate(members, start):
            t, u = e.time.tokens_per_s, interval(e).relative
            assert t0 - t <= u0 * t0 + 1e-9 and t0 - t <= u * t + 1e-9
            assert tie.group_start(pos) == start
        seen |= {id(e) for e in members}
        start += size


def test_the_fragile_pick_goes_to_the_simpler_plan():
    """Issue 20: ZeRO-3 led ZeRO-1 by less than the model's error; the config is the ZeRO-1 plan now."""
    by_speed, tied = _search(ties=False), _search()
    fast, simple = by_speed.candidates[0], tied.candidates[0]
    assert fast.plan.zero_stage == 3 and simple.plan.zero_stage < 3
    gap = fast.time.tokens_per_s / simple.time.tokens_per_s - 1
    assert 0 < gap <= interval(fast).relative
    cfg = deepspeed_config_for("llama3-8b", "h100-sxm-80gb", 8)
    assert cfg["zero_optimization"]["stage"] == simple.plan.zero_stage
    assert "offload_optimizer" not in cfg["zero_optimization"] or \
        cfg["zero_optimization"]["offload_optimizer"].get("device") in (None, "none")


def test_the_interval_in_estimate_and_plan_output(capsys):
    base = ["--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--seq-len", "4096",
            "--global-batch", "8"]
    assert main(["estimate", *base, "--engine", "deepspeed", "--zero", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert 0 < doc["uncertainty"]["relative"] < 0.5 and doc["uncertainty"]["runs"] >= MIN_RUNS
    assert main(["estimate", *base, "--engine", "deepspeed", "--zero", "1"]) == 0
    assert f"uncertainty: ±{doc['uncertainty']['relative']:.1%}" in capsys.readouterr().out
    assert main(["plan", *base, "--engine", "deepspeed", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tied_with_first"] > 1 and doc["uncertainty"]["relative"] > 0
    assert all("uncertainty" in c for c in doc["candidates"])
    assert main(["plan", *base, "--engine", "deepspeed"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line[:3].strip().isdigit()]
    assert rows[1][3] == "=" and "%" in rows[0].split()[-2]  # tied with #1; the ± column
    assert "simplest first" in out or "also the simplest" in out
