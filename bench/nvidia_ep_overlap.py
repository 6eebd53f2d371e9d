"""The NVIDIA bench's MoE rows split by their recipe's expert-parallel all-to-all overlap (Megatron
``--overlap-moe-expert-parallel-comm``, ``ParallelPlan.ep_overlap``): within one family, do the rows that overlap
lean faster than measured than the rows that do not? A gap that holds in every family says the overlap's credit
(autotune.cost.ep_overlap: two streams, the hidden all-to-all slowing the compute beside it by the measured
EP_A2A_OVERLAP_COST) is off, not the family's other terms. With the shared overlap_cost (0.21) in its place the
gaps were +4.5 (DeepSeek-V3) to +16.6 points (GPT-OSS-120B), every family the same way; with the measured cost they
are -5.1 to +10.6 (2026-12-05).
"""

from __future__ import annotations

import statistics
from collections import defaultdict


def overlap_of(case) -> str:
    """"on" (a2a, with or without delayed weight gradients), "off" (the recipe says none) or "unset"."""
    mode = case.result.plan.ep_overlap
    return "unset" if mode is None else ("off" if mode == "none" else "on")


def ep_overlap_table(done: list) -> dict[str, float]:
    """Print, per MoE family with rows both ways, the median error with and without the overlap and the gap;
    return the gaps by family."""
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for c in done:
        if c.result.model.is_moe and c.result.plan.ep > 1:
            groups[(c.family, overlap_of(c))].append(c.error)
    print("\nEP OVERLAP: MoE rows by their recipe's all-to-all overlap (median error; gap = overlapped - not)")
    gaps = {}
    for family in sorted({f for f, _ in groups}):
        on, off = groups.get((family, "on"), []), groups.get((family, "off"), [])
        if not on or not off:
            continue
        gaps[family] = statistics.median(on) - statistics.median(off)
        print(f"  {family:<28} overlapped {len(on):>3} rows {statistics.median(on):>+7.1%}   not {len(off):>3} rows "
              f"{statistics.median(off):>+7.1%}   gap {gaps[family]:>+6.1%}")
    on_all = [e for (_, mode), errs in groups.items() if mode == "on" for e in errs]
    off_all = [e for (_, mode), errs in groups.items() if mode == "off" for e in errs]
    if on_all and off_all:
        print(f"  {'all MoE rows':<28} overlapped {len(on_all):>3} rows {statistics.median(on_all):>+7.1%}   not "
              f"{len(off_all):>3} rows {statistics.median(off_all):>+7.1%}")
    return gaps
