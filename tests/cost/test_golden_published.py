"""Golden test: the step-time model against every published run (autotune/data/published_runs), family by family.

Predicted tokens/s per GPU (``autotune.cost.published_runs.predict_run``, the same path as
``bench/accuracy_published.py``) against the published figure, with the shipped (fitted) parameters. Each family
holds its in-sample median and worst |error| to what the model reaches today (a little headroom), so a change that
makes any family worse fails here; the bench prints the leave-one-family-out figures.
"""

import statistics
from collections import defaultdict

import pytest

from autotune.cost.published_runs import predict_run, published_runs

RUNS = published_runs()
TIMED = [r for r in RUNS if not r.skipped and r.tokens_per_s_per_gpu]

# family -> (median |error| bound, worst |error| bound), in-sample (python bench/accuracy_published.py --runs).
TOLERANCE = {  # 2026-12-04: attention costed by its key length (H200-measured), refit: 4 families moved up (below)
    "Megatron-LM 2021 (Narayanan Table 1)": (0.03, 0.05),  # was (0.02, 0.07): median 1.9% -> 2.8%
    "Megatron-LM 2022 (Korthikanti, SP + selective)": (0.04, 0.13),
    "DeepSpeed ZeRO-3 (Narayanan Table 2)": (0.27, 0.52),
    "Megatron-LM 2021 (Narayanan Table 2, PTD-P)": (0.04, 0.065),
    "Megatron-core H100 (README scaling)": (0.105, 0.12),  # was (0.095, 0.115): median 7.2% -> 10.0%
    "Llama 3 405B (Meta, FSDP + TP + PP)": (0.14, 0.14),
    "Megatron-DeepSpeed (BLOOM tr11)": (0.075, 0.16),  # was (0.06, 0.14): 5.1% / 13.2% -> 7.1% / 15.8%
    "Megatron-DeepSpeed (MT-NLG)": (0.06, 0.065),  # was (0.035, 0.04): 3.3% / 3.9% -> 5.6% / 6.1%
    "Turing-NLG 17B (ZeRO paper, V100)": (0.02, 0.02),
    "torchtitan H100 (FSDP2 / TP / PP / CP, Float8)": (0.05, 0.17),
    "torchtitan A100 (FSDP2)": (0.09, 0.12),
    "MosaicML MPT (FSDP)": (0.065, 0.14),
    "PyTorch FSDP paper": (0.045, 0.045),
    "NeMo / Megatron-Bridge FP8 (H100)": (0.05, 0.085),
}


@pytest.fixture(scope="module")
def errors():
    out = defaultdict(list)
    for r in TIMED:
        out[r.family].append((r.run_id, predict_run(r)[0] / r.tokens_per_s_per_gpu - 1))
    return out


def test_every_run_is_estimated_or_says_why_not():
    # Korthikanti Table 4's single-layer timings are compared as one layer's forward + backward, the FSDP paper's
    # 175B as GPT-3's shape (published_facts.READINGS); what stays out is the TPU run and the two ZeRO-paper
    # headline figures without one model configuration.
    skipped = {r.run_id: r.skipped for r in RUNS if r.skipped}
    assert all(skipped.values())
    assert set(skipped) == {"palm-mfu-gopher-280b", "zero-paper-100b-class-400gpu"}
    assert sum(r.layer_timing for r in TIMED) == 5
    assert {r.family for r in TIMED} == set(TOLERANCE)


def test_every_family_has_a_tolerance(errors):
    assert set(errors) == set(TOLERANCE)


@pytest.mark.parametrize("family", sorted(TOLERANCE))
def test_family_within_its_tolerance(errors, family):
    median_bound, worst_bound = TOLERANCE[family]
    runs = errors[family]
    assert statistics.median(abs(e) for _, e in runs) <= median_bound, runs
    assert max(abs(e) for _, e in runs) <= worst_bound, runs


def test_selective_recompute_beats_full_as_published():
    # Korthikanti Table 5: selective + SP is 29-32% faster than full recompute for every model size.
    by_id = {r.run_id: r for r in TIMED}
    for size in ("22b", "175b", "530b", "1t"):
        sel = predict_run(by_id[f"korthikanti22-t5-{size}-selective-sp"])[0]
        full = predict_run(by_id[f"korthikanti22-t5-{size}-full-recompute"])[0]
        assert 1.15 < sel / full < 1.45, (size, sel / full)


def test_single_layer_timings_order_as_table_4():
    # Korthikanti Table 4 (22B layer, tp 8): full recompute costs ~39% over none, selective ~7%, SP saves a little.
    by_id = {r.run_id: predict_run(r)[0] for r in TIMED if r.layer_timing}
    base = by_id["korthikanti22-t4-22b-layer-baseline-no-recompute"]
    assert 1.25 < base / by_id["korthikanti22-t4-22b-layer-baseline-full-recompute"] < 1.5
    assert 1.0 < base / by_id["korthikanti22-t4-22b-layer-selective-recompute"] < 1.12
    assert by_id["korthikanti22-t4-22b-layer-sp-no-recompute"] > base


def test_selective_recompute_costs_what_table_4_measured():
    # Korthikanti Table 4: selective recompute reruns QK^T, softmax, dropout and the product with V; unfused, the
    # softmax and dropout over the s x s scores are memory-bound kernels as long as the GEMMs: the 22B layer runs
    # 6.6% slower than without recompute (52244.9 / 48995.2 tokens/s), with SP 6.8% (53894.7 / 50443.3).
    # Counting only the core's GEMMs gave 1.6%.
    runs = {r.run_id: r for r in TIMED if r.layer_timing}
    for none, sel in (("baseline-no-recompute", "selective-recompute"), ("sp-no-recompute", "selective-plus-sp")):
        a, b = runs[f"korthikanti22-t4-22b-layer-{none}"], runs[f"korthikanti22-t4-22b-layer-{sel}"]
        published = a.tokens_per_s_per_gpu / b.tokens_per_s_per_gpu
        predicted = predict_run(a)[0] / predict_run(b)[0]
        assert abs(predicted - published) < 0.03, (sel, predicted, published)
