"""Where NVIDIA changed its plan for a workload between two containers: which plan ran faster, as measured and as
predicted.

bench/accuracy_nvidia_recipes.py's rows repeat each workload (task, model, system, GPU count, precision, batch,
sequence) container after container; now and then the plan changes (micro-batch, FSDP, TP, PP, CP, VP, EP). Such a
change is the nearest thing the table holds to an A/B of two plans on one workload, which is what the planner's
ranking rests on. The measured ratio (the newer row's tokens/s over the older's) also carries the new container's
software; that drift is taken out with the median ratio of the rows of the same system whose plan did not change
between the same two containers (the "drift" column; 1.0 where no such row exists). The predicted ratio takes each
row with its own recipe settings, as the accuracy table does.

A pair whose drift-adjusted measured ratio is within ``TIE`` of 1 is a tie (the measurement cannot tell the plans
apart); the others count as agreeing where the model puts the faster plan first too.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Protocol

WORKLOAD = ("task", "model", "system", "gpus", "precision", "gbs", "seq")
"""The columns two rows share to be the same workload."""
PLAN = ("mbs", "fsdp", "tp", "pp", "cp", "vp", "ep")
"""The columns that make a row's plan."""
TIE = 0.03
"""Drift-adjusted measured ratios within this of 1 are ties: containers' run-to-run and setting changes are of
this order (the drift's own spread)."""


class EstimatedRow(Protocol):  # accuracy_nvidia_recipes.Case
    row: dict
    measured: float
    predicted: float | None


def container_key(container: str) -> tuple[int, ...]:
    """"26.06.01" -> (26, 6, 1): containers in release order."""
    return tuple(int(part) for part in container.split("."))


def _plan(row: dict) -> tuple[str, ...]:
    """The row's plan columns, blanks read as the table's default (the containers' tables spell "no FSDP" as "",
    "0" or "n/a", "no VP / EP" as "n/a" or "1")."""
    return tuple(row[k] if row[k] not in ("", "n/a") else ("0" if k == "fsdp" else "1") for k in PLAN)


def plan_changes(cases: Sequence[EstimatedRow]) -> list[tuple[EstimatedRow, EstimatedRow]]:
    """(older row, newer row) for every workload whose plan differs between two consecutive containers it ran in."""
    by_workload: dict[tuple, list[EstimatedRow]] = defaultdict(list)
    for case in cases:
        if case.predicted is not None:
            by_workload[tuple(case.row[k] for k in WORKLOAD)].append(case)
    out = []
    for rows in by_workload.values():
        rows = sorted(rows, key=lambda c: container_key(c.row["container"]))
        for old, new in zip(rows, rows[1:]):
            if old.row["container"] != new.row["container"] and _plan(old.row) != _plan(new.row):
                out.append((old, new))
    return out


def drift(cases: Sequence[EstimatedRow], old: EstimatedRow, new: EstimatedRow) -> tuple[float, int]:
    """(median measured new/old ratio, rows) over the other workloads of ``old``'s system that ran the same plan in
    both containers; (1.0, 0) where none did."""
    system, before, after = old.row["system"], old.row["container"], new.row["container"]
    mine = tuple(old.row[k] for k in WORKLOAD)
    rows: dict[tuple, dict[str, EstimatedRow]] = defaultdict(dict)
    for case in cases:
        if case.row["system"] == system and case.row["container"] in (before, after):
            workload = tuple(case.row[k] for k in WORKLOAD)
            if workload != mine:
                rows[workload][case.row["container"]] = case
    ratios = [pair[after].measured / pair[before].measured for pair in rows.values()
              if len(pair) == 2 and _plan(pair[after].row) == _plan(pair[before].row)]
    return (statistics.median(ratios), len(ratios)) if ratios else (1.0, 0)


def change_ratios(cases: Sequence[EstimatedRow], pairs: Sequence[tuple[EstimatedRow, EstimatedRow]]
                  ) -> list[tuple[float, float, int, float]]:
    """(measured new/old, drift, drift rows, predicted new/old), pair by pair."""
    out = []
    for old, new in pairs:
        factor, n = drift(cases, old, new)
        out.append((new.measured / old.measured, factor, n, new.predicted / old.predicted))
    return out


def verdict(adjusted: float, predicted: float) -> str:
    """"tie" where the adjusted measured ratio is within TIE of 1; else "agree" or "disagree" on which plan is faster."""
    if abs(adjusted - 1) <= TIE:
        return "tie"
    return "agree" if (adjusted > 1) == (predicted > 1) else "disagree"


def _plan_text(row: dict) -> str:
    return f"mb{row['mbs']} " + "".join(f"{k}{row[k]}" for k in ("fsdp", "tp", "pp", "cp", "vp", "ep")
                                          if row[k] not in ("", "n/a", "0", "1"))


def plan_changes_table(cases: Sequence[EstimatedRow], show_rows: bool) -> None:
    pairs = plan_changes(cases)
    print(f"\nPLAN CHANGES: workloads whose plan NVIDIA changed between two consecutive containers ({len(pairs)}); "
          f"the newer row's tokens/s over the older's, measured (and over the drift of the same system's unchanged "
          f"plans between those containers) and predicted; ties: adjusted within {TIE:.0%}")
    if not pairs:
        return
    ratios = change_ratios(cases, pairs)
    verdicts = [verdict(m / d, p) for m, d, _, p in ratios]
    if show_rows:
        print(f"{'containers':<19}{'model':<18}{'system':<7}{'prec':<7}{'old plan':<18}{'new plan':<18}"
              f"{'measured':>9}{'drift':>7}{'adjusted':>9}{'predicted':>10}  verdict")
        for (old, new), (m, d, n, p), v in zip(pairs, ratios, verdicts):
            print(f"{old.row['container'] + '->' + new.row['container']:<19}{old.row['model'][:17]:<18}"
                  f"{old.row['system'][4:]:<7}{old.row['precision'][:6]:<7}{_plan_text(old.row)[:17]:<18}"
                  f"{_plan_text(new.row)[:17]:<18}{m:>9.3f}{d:>7.3f}{m / d:>9.3f}{p:>10.3f}  {v}"
                  + ("" if n else " (no drift rows)"))
    decided = [v for v in verdicts if v != "tie"]
    errors = [abs(math.log(p / (m / d))) for m, d, _, p in ratios]
    print(f"  the model puts the faster plan first in {decided.count('agree')} of {len(decided)} changes the "
          f"measurement decides ({verdicts.count('tie')} ties); median |predicted / adjusted - 1| "
          f"{math.exp(statistics.median(errors)) - 1:.1%}")
