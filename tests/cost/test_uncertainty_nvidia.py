"""NVIDIA's Blackwell recipes in the uncertainty records (autotune/data/uncertainty_runs.json,
bench/uncertainty_table.py) and the interval lookup's MoE key and family exclusion (autotune.cost.uncertainty).

- a GB200 Megatron MoE FP8 plan's interval rests on NVIDIA's MoE Blackwell records, not on the published H100 dense
  runs: its families are NVIDIA's MoE ones and its width differs from an H100 dense Megatron plan's; the same plan
  read as dense rests on NVIDIA's dense families;
- ``exclude_families`` takes a family's records out of the basis (recomputed by hand from the file), and
  ``rank_with_ties`` passes it through;
- the shipped NVIDIA records are what the bench computes now (every row, ~3 s), three of them recomputed by hand from
  bench/accuracy_nvidia_recipes.py's functions; the rows NVIDIA's footnotes mark as a regressed container are left
  out;
- the memory p90 of the tie-break comes from the published runs alone (NVIDIA's rows carry no memory error).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from autotune.cli import build_parser
from autotune.commands.estimate import estimate_from_flags
from autotune.cost.uncertainty import (MIN_RUNS, WEIGHTS, memory_error_p90, plan_kind, shipped_memory_error_p90,
                                       uncertainty_of)
from autotune.resources import data_path
from autotune.search.ties import interval, rank_with_ties

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import accuracy_nvidia_recipes as nv  # noqa: E402
import uncertainty_table  # noqa: E402
from nvidia_table_footnotes import TABLE_FOOTNOTES  # noqa: E402

RUNS = json.loads(data_path("autotune", "data/uncertainty_runs.json").read_text())["runs"]
NVIDIA = [r for r in RUNS if r["source"] == "nvidia"]
PUBLISHED = [r for r in RUNS if r["source"] == "published"]


def _estimate(flags: str):
    return estimate_from_flags(build_parser().parse_args(["estimate", *flags.split()]))


@pytest.fixture(scope="module")
def moe_gb200():
    return _estimate("--model deepseek-v3 --gpu gb200 --num-gpus 256 --gpus-per-node 64 --engine megatron --pp 4 "
                     "--vpp 4 --ep 64 --etp 1 --precision fp8 --seq-len 4096 --global-batch 2048 --recompute selective")


@pytest.fixture(scope="module")
def dense_h100():
    return _estimate("--model llama3-70b --gpu h100-sxm-80gb --num-gpus 64 --engine megatron --tp 4 --pp 2 "
                     "--precision bf16 --seq-len 4096 --global-batch 128")


def _by_hand(kind: dict, records: list[dict]) -> tuple[float, set[str]]:
    scores = [(sum(w for k, w in WEIGHTS.items() if r[k] == kind[k]), r) for r in records]
    floor = max(s for s, _ in scores)
    while sum(s >= floor for s, _ in scores) < MIN_RUNS or len({r["family"] for s, r in scores if s >= floor}) < 2:
        floor -= 1
    chosen = [r for s, r in scores if s >= floor]
    return statistics.median(abs(r["lofo_error"]) for r in chosen), {r["family"] for r in chosen}


def test_a_blackwell_moe_plan_rests_on_nvidias_moe_blackwell_records(moe_gb200, dense_h100):
    kind = plan_kind(moe_gb200.plan, moe_gb200.cluster, moe=True)
    assert kind["moe"] and kind["generation"] == "blackwell" and kind["precision"] == "fp8"
    u = moe_gb200.uncertainty
    assert u == interval(moe_gb200) == uncertainty_of(moe_gb200.plan, moe_gb200.cluster, moe=True)
    assert u.sources == ("nvidia",) and "NVIDIA's Blackwell recipes" in u.basis()
    assert all(f.startswith("NVIDIA Megatron-Bridge ") for f in u.families)
    moe_families = {r["family"] for r in NVIDIA if r["moe"]}
    assert set(u.families) <= moe_families and u.runs >= MIN_RUNS
    assert (u.relative, set(u.families)) == (pytest.approx(_by_hand(kind, RUNS)[0]), _by_hand(kind, RUNS)[1])
    h100 = dense_h100.uncertainty
    assert "published" in h100.sources and not any(f.startswith("NVIDIA") for f in h100.families)
    assert set(u.families).isdisjoint(h100.families)  # two different bases (their medians may happen to be close)
    # The MoE key decides: the same plan read as dense rests on NVIDIA's dense families.
    dense = uncertainty_of(moe_gb200.plan, moe_gb200.cluster, moe=False)
    assert dense.families and not set(dense.families) & moe_families


def test_exclude_families_takes_a_familys_records_out_of_the_basis(moe_gb200):
    u = moe_gb200.uncertainty
    gone = frozenset({u.families[0]})
    left = uncertainty_of(moe_gb200.plan, moe_gb200.cluster, moe=True, exclude_families=gone)
    assert u.families[0] not in left.families and left != u
    kind = plan_kind(moe_gb200.plan, moe_gb200.cluster, moe=True)
    relative, families = _by_hand(kind, [r for r in RUNS if r["family"] not in gone])
    assert left.relative == pytest.approx(relative) and set(left.families) == families
    assert interval(moe_gb200, gone) == left
    assert rank_with_ties([moe_gb200], exclude_families=gone).uncertainty == left
    assert rank_with_ties([moe_gb200]).uncertainty == u


def test_the_nvidia_records_are_what_the_bench_computes_now():
    fresh = {r["run_id"]: r for r in uncertainty_table.nvidia_records()}
    assert len(fresh) == len(NVIDIA) >= 150
    for shipped in NVIDIA:
        now = fresh[shipped["run_id"]]
        assert {k: v for k, v in now.items() if k != "lofo_error"} == \
            {k: v for k, v in shipped.items() if k != "lofo_error"}, shipped["run_id"]
        assert now["lofo_error"] == pytest.approx(shipped["lofo_error"], abs=2e-4), shipped["run_id"]
    footnoted = {uncertainty_table.NVIDIA_RUN_PREFIX + source for source in TABLE_FOOTNOTES}
    assert footnoted and not footnoted & set(fresh)
    published_families = {r["family"] for r in PUBLISHED}
    assert not published_families & {r["family"] for r in NVIDIA}
    assert {r["moe"] for r in NVIDIA} == {True, False}


@pytest.mark.parametrize("model, system", [("LLAMA3_70B", "DGX-GB200"), ("DeepSeekV3", "DGX-GB200"),
                                           ("Qwen3_30B_a3B", "DGX-B200")])
def test_a_shipped_nvidia_record_by_hand(model, system):
    row = next(r for r in nv.load_rows() if r["model"] == model and r["system"] == system
               and r["source"] not in TABLE_FOOTNOTES)
    case = nv.express(row)
    nv.estimate_case(case)
    est = case.result
    shipped = next(r for r in NVIDIA if r["run_id"] == "nvidia:" + row["source"])
    assert shipped["family"] == "NVIDIA Megatron-Bridge " + nv.family_of(row["model"])[0]
    assert shipped["moe"] == est.model.is_moe == (model != "LLAMA3_70B")
    assert {k: shipped[k] for k in WEIGHTS} == plan_kind(est.plan, est.cluster, moe=est.model.is_moe)
    measured = float(row["tokens_per_s_per_gpu"])
    assert shipped["lofo_error"] == pytest.approx(est.time.tokens_per_s / est.cluster.num_gpus / measured - 1, abs=2e-4)
    assert shipped["memory_error"] is None


def test_the_memory_p90_comes_from_the_published_runs_alone():
    assert NVIDIA and all(r["memory_error"] is None for r in NVIDIA)
    published = [r["memory_error"] for r in PUBLISHED if r["memory_error"] is not None]
    assert len(published) >= 10
    assert shipped_memory_error_p90() == memory_error_p90(published)


def test_the_plan_quality_table_ranks_a_row_without_its_own_familys_records(monkeypatch, capsys):
    import nvidia_plan_quality as pq

    seen = []

    def spy(by_speed, memory_error=None, exclude_families=frozenset()):
        seen.append(exclude_families)
        return rank_with_ties(by_speed, memory_error, exclude_families)

    monkeypatch.setattr(pq, "rank_with_ties", spy)
    case = nv.express(next(r for r in nv.load_rows() if r["model"] == "LLAMA3_8B"))
    nv.estimate_case(case)
    pq.plan_quality_table([case], False, nv.label)
    assert seen == [frozenset({"NVIDIA Megatron-Bridge LLAMA3_8B"})]
    assert {r["family"] for r in NVIDIA} >= set(seen[0])


def test_an_interval_rests_on_two_families_at_least(monkeypatch):
    """An H100 MoE bf16 plan's nearest runs (score 12 of 14) are GPT-OSS's NVIDIA rows alone, 27% off: one family's
    systematic error. The score widens until a second family is in (MIN_FAMILIES), so the interval is not that one
    family's error alone."""
    import autotune.cost.uncertainty as uncertainty
    from autotune.search.ties import interval

    est = _estimate("--model qwen3-30b-a3b --gpu h100-sxm-80gb --num-gpus 16 --engine megatron --ep 8 --etp 1 "
                    "--precision bf16 --seq-len 4096 --global-batch 256")
    u = est.uncertainty
    assert uncertainty.MIN_FAMILIES == 2 and len(set(u.families)) >= 2
    monkeypatch.setattr(uncertainty, "MIN_FAMILIES", 1)
    uncertainty._lookup.cache_clear()
    try:
        alone = interval(est)
    finally:
        monkeypatch.undo()
        uncertainty._lookup.cache_clear()
    assert alone.families == ("NVIDIA Megatron-Bridge GPT OSS 120B",) and alone.score > u.score
    assert u.relative < alone.relative


def test_the_gain_terms_add_up_to_the_step_difference():
    # bench/nvidia_plan_quality.gain_terms: each step-time term's change as a share of NVIDIA's step; they add up to
    # the whole step's change (the terms make the step), and a pipelined plan's bubble shows as a bubble saving.
    from nvidia_plan_quality import gain_terms

    flags = ["estimate", "--model", "qwen3-30b-a3b", "--gpu", "gb200", "--num-gpus", "16", "--gpus-per-node", "8",
             "--engine", "megatron", "--global-batch", "256", "--seq-len", "4096", "--ep", "8"]
    flat = estimate_from_flags(build_parser().parse_args(flags))
    piped = estimate_from_flags(build_parser().parse_args([*flags, "--pp", "2"]))
    terms = gain_terms(flat, piped)
    step_change = (flat.time.step_time_s - piped.time.step_time_s) / piped.time.step_time_s
    assert sum(terms.values()) == pytest.approx(step_change, rel=1e-9)
    assert terms["bubble"] == pytest.approx(-piped.time.bubble_s / piped.time.step_time_s) and terms["bubble"] < 0
