"""The out-of-sample errors behind every estimate's interval (autotune/cost/uncertainty.py).

    PYTHONPATH=. python bench/uncertainty_table.py            # print the table the planner would ship
    PYTHONPATH=. python bench/uncertainty_table.py --write    # write autotune/data/uncertainty_runs.json

Published runs (``"source": "published"``): for each published run with a throughput, the shared parameters are
refitted on every *other* family (as bench/accuracy_published.py does), the run is predicted with them, and its
signed error is kept with the kind of plan it was (engine, GPU generation, mixture of experts or not, precision,
tp / pp / cp > 1, ZeRO-3 / FSDP sharding, offload), and the error of its predicted peak memory where the run
published one.

NVIDIA's Blackwell recipes (``"source": "nvidia"``): each row of bench/data/nvidia_recipes_blackwell.csv that
bench/accuracy_nvidia_recipes.py estimates (NVIDIA's plan and recipe settings through `autotune estimate`'s own
code), with the kind of the plan estimated and its signed error. No parameter is fitted on these rows (the shared
parameters come from the published runs alone), so each row's error is already out of its family. Left out: the rows
NVIDIA's own table footnotes mark as run on a container with a known software regression
(bench/nvidia_table_footnotes.py ``TABLE_FOOTNOTES``). Their family is "NVIDIA Megatron-Bridge <model family>"
(:func:`nvidia_plan_quality.uncertainty_family`), never a published-runs family.

Nothing is fitted per run: the table only records how wrong the model was where it was not fitted. About a minute.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy_nvidia_recipes import estimate_case, express, load_rows
from accuracy_published import fit, memory_error
from nvidia_plan_quality import uncertainty_family
from nvidia_table_footnotes import TABLE_FOOTNOTES

from autotune.cost.efficiency import DEFAULT_EFFICIENCY
from autotune.cost.published_runs import predict_run, published_runs
from autotune.cost.uncertainty import RUNS_FILE, memory_error_p90, plan_kind

OUT = Path(__file__).resolve().parents[1] / "autotune" / RUNS_FILE
LOFO_ROUNDS = 6  # as bench/accuracy_published.py
NVIDIA_RUN_PREFIX = "nvidia:"
"""An NVIDIA row's run_id: this and the row's source (file and line of NVIDIA's table, unique per row)."""


def published_records() -> list[dict]:
    """The published runs' records (leave-one-family-out refits; about a minute)."""
    runs = [r for r in published_runs() if not r.skipped and r.tokens_per_s_per_gpu]
    families = defaultdict(list)
    for r in runs:
        families[r.family].append(r)
    records = []
    for family, members in families.items():
        others = fit([r for r in runs if r.family != family], DEFAULT_EFFICIENCY, rounds=LOFO_ROUNDS)
        for r in members:
            value, plan, _, memory = predict_run(r, others)
            mem_error = memory_error(r, memory)
            records.append({"run_id": r.run_id, "family": family, "source": "published",
                            **plan_kind(plan, r.cluster, moe=r.model.is_moe),
                            "lofo_error": round(value / r.tokens_per_s_per_gpu - 1, 4),
                            "memory_error": None if mem_error is None else round(mem_error, 4)})
    return records


def nvidia_record(case) -> dict:
    """The record of one estimated NVIDIA row (an accuracy_nvidia_recipes Case)."""
    est = case.result
    return {"run_id": NVIDIA_RUN_PREFIX + case.row["source"], "family": uncertainty_family(case.family),
            "source": "nvidia", **plan_kind(est.plan, est.cluster, moe=est.model.is_moe),
            "lofo_error": round(case.error, 4), "memory_error": None}


def nvidia_cases(rows: list[dict] | None = None) -> list:
    """The NVIDIA rows (default: every row of the table) expressed and estimated as the accuracy bench does, less the
    rows NVIDIA's footnotes mark as a regressed container's; rows not expressed or not estimated are left out."""
    cases = []
    for row in load_rows() if rows is None else rows:
        if row["source"] in TABLE_FOOTNOTES:
            continue
        case = express(row)
        if not case.reason:
            estimate_case(case)
        if case.predicted is not None:
            cases.append(case)
    return cases


def nvidia_records() -> list[dict]:
    return [nvidia_record(c) for c in nvidia_cases()]


def table() -> dict:
    records = published_records() + nvidia_records()
    records.sort(key=lambda rec: rec["run_id"])
    return {"source": "bench/uncertainty_table.py: each published run (autotune/data/published_runs, source "
                      "\"published\") predicted with the shared parameters refitted on the other families; "
                      "lofo_error = predicted / published tokens/s - 1; memory_error = predicted / published peak "
                      "memory - 1 (the allocator's reserved peak or the device total, as the run published it; null: "
                      "none published). Each row of NVIDIA's Megatron-Bridge Blackwell table "
                      "(bench/data/nvidia_recipes_blackwell.csv, source \"nvidia\", family \"NVIDIA Megatron-Bridge "
                      "<model>\") that bench/accuracy_nvidia_recipes.py estimates (no parameter is fitted on them: "
                      "every row is out of its family); lofo_error = predicted / measured tokens/s per GPU - 1; "
                      "memory_error null (none published); the rows NVIDIA's footnotes mark as a known software "
                      "regression of their container (bench/nvidia_table_footnotes.py) left out",
            "runs": records}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help=f"write {OUT}")
    args = ap.parse_args()
    doc = table()
    by_family = defaultdict(list)
    for rec in doc["runs"]:
        by_family[rec["family"]].append(abs(rec["lofo_error"]))
    print(f"{'family':<50}{'runs':>5}{'median |LOFO error|':>21}")
    for family, errors in sorted(by_family.items()):
        print(f"{family[:49]:<50}{len(errors):>5}{statistics.median(errors):>21.1%}")
    for source in ("published", "nvidia"):
        every = [abs(r["lofo_error"]) for r in doc["runs"] if r["source"] == source]
        print(f"{'all ' + source:<50}{len(every):>5}{statistics.median(every):>21.1%}")
    memory = [r["memory_error"] for r in doc["runs"] if r["memory_error"] is not None]
    print(f"peak memory: {len(memory)} runs, median |error| {statistics.median(abs(e) for e in memory):.1%}, "
          f"p90 {memory_error_p90(memory):.1%} (the planner's tie-break headroom, autotune/search/ties.py)")
    if args.write:
        OUT.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
