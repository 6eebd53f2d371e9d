"""The same plan on two GPUs of one generation: NVIDIA's measured speed ratio against the cost model's.

bench/accuracy_nvidia_recipes.py's rows hold pairs that differ in the system alone: the same container, model, GPU
count, precision, batch, sequence and plan on Blackwell Ultra and Blackwell (GB300 NVL72 and GB200 NVL72; B300 and
B200). Their measured ratio isolates what the GPU presets say about the faster part (peaks, GEMM fractions, the
softmax exponentials, power) from the rest of the model: the model's errors on the workload mostly cancel in the
ratio. Each pair's recipes may still differ in run settings the launcher picks per system (recompute, activation
offload, CUDA graphs: bench/nvidia_recipe_settings.py); the predicted ratio takes each row with its own.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Protocol

PAIRS = (("DGX-GB300", "DGX-GB200"), ("DGX-B300", "DGX-B200"))
"""(faster part, its sibling): the systems compared."""
SAME = ("container", "task", "model", "gpus", "precision", "gbs", "mbs", "seq", "fsdp", "tp", "pp", "cp", "vp", "ep")
"""The columns two rows must share to be a pair (all but the system and the measurements)."""


class EstimatedRow(Protocol):  # accuracy_nvidia_recipes.Case
    row: dict
    measured: float
    predicted: float | None


def gpu_pairs(cases: Sequence[EstimatedRow]) -> list[tuple[EstimatedRow, EstimatedRow]]:
    """(faster part's row, its sibling's row) for every pair of estimated rows that differ in the system alone."""
    by_key = {}
    for case in cases:
        if case.predicted is not None:
            by_key[(case.row["system"], *(case.row[k] for k in SAME))] = case
    out = []
    for fast, slow in PAIRS:
        for key, case in by_key.items():
            if key[0] == fast and (slow, *key[1:]) in by_key:
                out.append((case, by_key[(slow, *key[1:])]))
    return out


def ratio_errors(pairs: Sequence[tuple[EstimatedRow, EstimatedRow]]) -> list[tuple[float, float]]:
    """(measured ratio, predicted ratio) of the faster part's tokens/s over its sibling's, pair by pair."""
    return [(a.measured / b.measured, a.predicted / b.predicted) for a, b in pairs]


def gpu_pairs_table(cases: Sequence[EstimatedRow], show_rows: bool) -> None:
    pairs = gpu_pairs(cases)
    print(f"\nSAME PLAN, TWO GPUS: rows that differ in the system alone ({len(pairs)} pairs); the faster part's "
          "tokens/s over its sibling's, as NVIDIA measured and as predicted (each row with its own recipe settings)")
    if not pairs:
        return
    ratios = ratio_errors(pairs)
    if show_rows:
        print(f"{'pair':<24}{'container':<10}{'model':<18}{'prec':<8}{'plan':<16}{'measured':>9}{'predicted':>10}")
        for (a, b), (measured, predicted) in zip(pairs, ratios):
            plan = "".join(f"{k}{a.row[k]}" for k in ("fsdp", "tp", "pp", "vp", "ep")
                           if a.row[k] not in ("", "n/a", "0", "1"))
            print(f"{a.row['system'][4:] + '/' + b.row['system'][4:]:<24}{a.row['container']:<10}"
                  f"{a.row['model'][:17]:<18}{a.row['precision'][:7]:<8}{plan[:15]:<16}{measured:>9.3f}"
                  f"{predicted:>10.3f}")
    for fast, slow in PAIRS:
        mine = [r for (a, _), r in zip(pairs, ratios) if a.row["system"] == fast]
        if mine:
            measured = statistics.median(m for m, _ in mine)
            predicted = statistics.median(p for _, p in mine)
            print(f"  {fast[4:]} / {slow[4:]}: {len(mine)} pairs, median measured ratio {measured:.3f}, predicted "
                  f"{predicted:.3f}: predicted / measured {predicted / measured - 1:+.1%} (below 0: the model rates "
                  f"{fast[4:]} too slow against {slow[4:]}, or {slow[4:]} too fast)")
