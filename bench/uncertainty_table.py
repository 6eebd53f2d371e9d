"""The leave-one-family-out errors behind every estimate's interval (autotune/cost/uncertainty.py).

    PYTHONPATH=. python bench/uncertainty_table.py            # print the table the planner would ship
    PYTHONPATH=. python bench/uncertainty_table.py --write    # write autotune/data/uncertainty_runs.json

For each published run with a throughput: the shared parameters are refitted on every *other* family (as
bench/accuracy_published.py does), the run is predicted with them, and its signed error is kept with the kind
of plan it was (engine, GPU generation, precision, tp / pp / cp > 1, ZeRO-3 / FSDP sharding, offload), and the
error of its predicted peak memory where the run published one. Nothing is fitted per run: the table only records
how wrong the model was where it was not fitted. About a minute.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from accuracy_published import fit, memory_error

from autotune.cost.efficiency import DEFAULT_EFFICIENCY
from autotune.cost.published_runs import predict_run, published_runs
from autotune.cost.uncertainty import RUNS_FILE, memory_error_p90, plan_kind

OUT = Path(__file__).resolve().parents[1] / "autotune" / RUNS_FILE
LOFO_ROUNDS = 6  # as bench/accuracy_published.py


def table() -> dict:
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
            records.append({"run_id": r.run_id, "family": family, **plan_kind(plan, r.cluster),
                            "lofo_error": round(value / r.tokens_per_s_per_gpu - 1, 4),
                            "memory_error": None if mem_error is None else round(mem_error, 4)})
    records.sort(key=lambda rec: rec["run_id"])
    return {"source": "bench/uncertainty_table.py: each published run (autotune/data/published_runs) predicted "
                      "with the shared parameters refitted on the other families; lofo_error = predicted / "
                      "published tokens/s - 1; memory_error = predicted / published peak memory - 1 (the "
                      "allocator's reserved peak or the device total, as the run published it; null: none published)",
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
    every = [abs(r["lofo_error"]) for r in doc["runs"]]
    print(f"{'all':<50}{len(every):>5}{statistics.median(every):>21.1%}")
    memory = [r["memory_error"] for r in doc["runs"] if r["memory_error"] is not None]
    print(f"peak memory: {len(memory)} runs, median |error| {statistics.median(abs(e) for e in memory):.1%}, "
          f"p90 {memory_error_p90(memory):.1%} (the planner's tie-break headroom, autotune/search/ties.py)")
    if args.write:
        OUT.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
