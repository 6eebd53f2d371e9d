"""The planner's rule shortcuts answer what the rules answer (``autotune.search.planner``: a layout's first layout
rule from a layout that differs in vpp alone, a variant's first rule from the layout's prefix rule or a variant rule
seen on another layout, the engine's rules alone where no generic one breaks). With ``_VERIFY_SHORTCUTS`` every
shortcut's answer is checked against ``plan_problems`` on the plan itself; the search then finds the same plans
with the same numbers and rejections."""

import dataclasses

import pytest

from autotune.search import planner
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.plan import ENGINE_NAMES

# (model, gpu, num_gpus, seq_len, global batch, constraints): every engine unless said; FP8 on an A100 breaks a
# prefix rule (precision_gpu) on every variant of a layout; run settings break the engines' run-setting rules.
CASES = [
    ("llama3-8b", "h100-sxm-80gb", 16, 8192, 128, {}),
    ("llama3-8b", "a100-80gb", 16, 4096, 64, {"precisions": ("bf16", "fp8")}),
    ("mixtral-8x7b", "h100-sxm-80gb", 16, 4096, 64, {"uneven_layouts": True}),
    ("llama3-70b", "h100-sxm-80gb", 32, 4096, 64, {"tp_overlap": "userbuffers", "vpp": 2,
                                                    "engine_versions": {"fsdp": "0.3"}}),
    ("tiny-llama", "cpu", 4, 256, 8, {"dp_replicate": 2}),
]


def _digest(result):
    return (result.num_enumerated, result.num_feasible, result.rejections,
            [(e.plan, dataclasses.asdict(e.memory), e.time.to_dict()) for e in result.ranked])


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}/{c[2]} {c[1]} {sorted(c[5])}" for c in CASES])
def test_shortcuts_answer_as_the_rules(case, monkeypatch):
    model_name, gpu, num_gpus, seq_len, gb, constraints = case
    model, cluster = load_model(model_name), load_cluster(gpu=gpu, num_gpus=num_gpus)
    c = SearchConstraints(engines=ENGINE_NAMES, **constraints)
    fast = search_plans(model, cluster, seq_len=seq_len, global_batch_size=gb, constraints=c, ties=False)
    monkeypatch.setattr(planner, "_VERIFY_SHORTCUTS", True)
    checked = search_plans(model, cluster, seq_len=seq_len, global_batch_size=gb, constraints=c, ties=False)
    assert _digest(fast) == _digest(checked)
    assert fast.num_enumerated > 0 and set(fast.rejections) - {"gpu_memory", "batch_triple"}
