"""The plan searches whose results must not change when the planner gets faster, and how to digest them.

``PYTHONPATH=. python tests/search/golden_cases.py`` (from the repository root) writes ``fixtures/golden_searches.json``
with the planner as it is; ``test_search_equivalence.py`` compares the planner against that file. The
fixture was written by the planner of commit 5cb9d42 (before any speed work): regenerate it only for a
change that is meant to change results, and say so in the commit.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from autotune.report import plan_summary
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.plan import ENGINE_NAMES

FIXTURE = Path(__file__).parent / "fixtures" / "golden_searches.json"
TOP = 20

# name -> (model, gpu, num_gpus, seq_len, global_batch, constraints); every engine unless the name says otherwise.
CASES: dict[str, tuple[str, str, int, int, int, dict]] = {
    "llama3-405b/16384 h100 all engines": ("llama3-405b", "h100-sxm-80gb", 16384, 8192, 2048, {}),
    "llama3-70b/64 h100 all engines": ("llama3-70b", "h100-sxm-80gb", 64, 8192, 512, {}),
    "llama3-70b/64 h100 megatron,deepspeed": ("llama3-70b", "h100-sxm-80gb", 64, 8192, 512,
                                              {"engines": ("megatron", "deepspeed")}),
    "llama3-70b/64 h100 fsdp bf16+fp8 no offload": ("llama3-70b", "h100-sxm-80gb", 64, 8192, 512,
                                                    {"engines": ("fsdp",), "precisions": ("bf16", "fp8"),
                                                     "allow_offload": False}),
    "tiny-llama/4 cpu all engines": ("tiny-llama", "cpu", 4, 256, 8, {}),
    "mixtral-8x7b/16 h100 all engines": ("mixtral-8x7b", "h100-sxm-80gb", 16, 4096, 256, {}),
    "llama3-8b/8 a100-40gb deepspeed,hf headroom 4 GiB": ("llama3-8b", "a100-40gb", 8, 4096, 64,
                                                          {"engines": ("deepspeed", "hf"),
                                                           "min_headroom_gib": 4.0}),
}


def run_case(name: str):
    model_name, gpu, n, seq, gb, extra = CASES[name]
    model = load_model(model_name)
    cluster = load_cluster(gpu=gpu, num_gpus=n, gpus_per_node=None, cluster_path=None)
    constraints = SearchConstraints(**{"engines": ENGINE_NAMES, **extra})
    # ties=False: the golden searches are the speed ranking the planner's speed-ups must not change; the tie
    # regrouping on top of it (autotune.search.ties) has tests of its own.
    return search_plans(model, cluster, seq_len=seq, global_batch_size=gb, constraints=constraints, top_k=TOP,
                        ties=False)


def _row(est) -> str:
    t, m = est.time, est.memory
    return f"{plan_summary(est.plan)}|{est.plan!r}|{t.step_time_s!r}|{t.tokens_per_s!r}|{m.total!r}|{m.host_per_node!r}"


def digest(result) -> dict:
    """What the planner answered: counts, rejections by rule, the top plans, and a hash over every ranked plan."""
    return {
        "num_enumerated": result.num_enumerated,
        "num_feasible": result.num_feasible,
        "rejections": dict(sorted(result.rejections.items())),
        "top": [[plan_summary(e.plan), e.time.step_time_s] for e in result.candidates],
        "explanation": result.explanation,
        "ranked_sha256": hashlib.sha256("\n".join(_row(e) for e in result.ranked).encode()).hexdigest(),
    }


def main() -> int:
    out = {name: digest(run_case(name)) for name in CASES}
    FIXTURE.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE} ({len(out)} searches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
