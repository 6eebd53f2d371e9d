"""The planner's memory floor (``states_floor`` of a ledger that did not fit) skips the ledgers of the variant's other
micro-batches and recompute modes without changing an answer: it is below every ledger it stands for, and a search
that never uses it finds the same plans, numbers and rejections while building more ledgers."""

import dataclasses
import math

import pytest

from autotune.cost.memory import estimate_memory, states_floor
from autotune.search import planner
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.plan import ENGINE_NAMES
from autotune.specs.settings import MemorySettings

# Cases where the model states alone outgrow the GPU on some variants (ZeRO-0/1 of 70B on few GPUs) and not others.
CASES = [
    ("llama3-70b", "h100-sxm-80gb", 32, 4096, 64),
    ("mixtral-8x7b", "a100-80gb", 16, 4096, 64),
]


def _digest(result):
    return (result.num_enumerated, result.num_feasible, result.rejections,
            [(e.plan, dataclasses.asdict(e.memory), e.time.to_dict()) for e in result.ranked])


def _counting(monkeypatch, name, target):
    calls = []
    original = getattr(target, name)

    def counted(*args, **kwargs):
        out = original(*args, **kwargs)
        calls.append(out)
        return out

    monkeypatch.setattr(target, name, counted)
    return calls


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}/{c[2]} {c[1]}" for c in CASES])
def test_floor_skips_ledgers_not_answers(case, monkeypatch):
    model_name, gpu, num_gpus, seq_len, gb = case
    model, cluster = load_model(model_name), load_cluster(gpu=gpu, num_gpus=num_gpus)
    c = SearchConstraints(engines=ENGINE_NAMES)
    ledgers = _counting(monkeypatch, "estimate_memory", planner)
    fast = search_plans(model, cluster, seq_len=seq_len, global_batch_size=gb, constraints=c, ties=False)
    with_floor = len(ledgers)
    monkeypatch.setattr(planner, "_FLOOR_MARGIN", math.inf)  # the floor never rejects
    slow = search_plans(model, cluster, seq_len=seq_len, global_batch_size=gb, constraints=c, ties=False)
    assert _digest(fast) == _digest(slow)
    skipped = len(ledgers) - 2 * with_floor  # ledgers the search without the floor built beyond the other's
    assert skipped > 0, "the floor skipped no ledger in this case"
    assert any(not m.fits_gpu for m in ledgers[with_floor:])


def test_floor_is_below_the_ledger_for_every_microbatch():
    model, cluster = load_model("llama3-70b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=32)
    result = search_plans(model, cluster, seq_len=4096, global_batch_size=64,
                          constraints=SearchConstraints(engines=ENGINE_NAMES), ties=False)
    seen = 0
    for est in result.ranked[::10]:
        for zero in (0, 1):  # the ZeRO stages whose model states may not fit, for floors above the GPU too
            try:
                base = est.plan.with_(zero_stage=zero, dp_replicate=1, offload_optimizer="none",
                                      offload_param="none")
            except ValueError:
                continue
            plans = [base.with_microbatch(mb, 64 // (mb * base.dp), recompute)
                     for mb in (1, 2, 4, 8) if 64 % (mb * base.dp) == 0
                     for recompute in ("none", "selective", "full")
                     if base.recompute_modules is None or recompute == "selective"]
            for settings in (MemorySettings(), MemorySettings(expandable_segments=True)):  # reserve counted or not
                ledgers = [estimate_memory(model, cluster, plan, settings) for plan in plans]
                for ledger in ledgers:
                    floor = states_floor(ledger, settings)
                    # below each, up to rounding (the planner's margin covers it: tight where no activation outgrows
                    # the optimizer step's transient and no buffer is held)
                    assert 0 < floor <= min(other.total for other in ledgers) * planner._FLOOR_MARGIN
                    seen += floor > ledger.capacity
    assert seen > 0, "no floor above the GPU: the case tests too little"
