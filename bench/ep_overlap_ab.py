"""Megatron-Bridge's controlled EP-overlap A/Bs on 16 H100 (bench/data/megatron_bridge_ep_overlap_ab.csv): each arm's
measured step time against `autotune estimate`'s, and the speed-up the overlap buys, measured and predicted.

    python bench/ep_overlap_ab.py

Both pairs run Qwen3-30B-A3B pre-training (BF16, seq 4096, TP1 PP1 CP1 EP16 over two nodes, MBS 1, GBS 1024) and
change only ``overlap_moe_expert_parallel_comm`` (one arm also ``delay_wgrad_compute``), so the ratio of the arms
isolates what the overlap hides and what hiding costs. The hybridep pair's Nsight profile is where the all-to-all's
overlap cost comes from (``autotune.cost.ep_overlap.EP_A2A_OVERLAP_COST``); the alltoall pair (no CUDA graphs, the
all-to-all dispatcher) is the check it was not taken from. The "hidden" column is the all-to-all the model moves
behind compute (the off arm's exposed MoE communication less the arm's), to set beside the profile's 3.96 s of
communication concurrent with GEMMs and attention.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.cli import build_parser  # noqa: E402
from autotune.commands.estimate import estimate_from_flags  # noqa: E402

DATA = ROOT / "bench" / "data" / "megatron_bridge_ep_overlap_ab.csv"
COMMON = ["estimate", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--engine", "megatron",
          "--zero", "1", "--seq-len", "4096", "--global-batch", "1024", "--micro-batch", "1", "--tp", "1", "--pp",
          "1", "--ep", "16", "--precision", "bf16", "--grad-dtype", "bf16", "--recompute", "none"]
"""What both pairs share (the data file's header); the arms add their graphs, dispatcher and overlap."""


@dataclass
class Arm:
    ab: str
    arm: str
    argv: list[str]
    measured_s: float
    where: str
    predicted_s: float = 0.0
    moe_exposed_s: float = 0.0

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1


def read_arms() -> list[Arm]:
    with DATA.open() as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    arms = []
    for raw in rows:
        argv = [*COMMON, "--cuda-graph", raw["cuda_graph"], "--moe-dispatcher", raw["dispatcher"],
                "--ep-overlap", raw["ep_overlap"]]
        if raw["cuda_graph_scope"]:
            argv += ["--cuda-graph-scope", *raw["cuda_graph_scope"].split()]
        arms.append(Arm(raw["ab"], raw["arm"], argv, float(raw["step_s"]), raw["where"]))
    return arms


def estimate(arm: Arm) -> Arm:
    result = estimate_from_flags(build_parser().parse_args(arm.argv))
    arm.predicted_s = result.time.step_time_s
    arm.moe_exposed_s = result.time.comm_parts_s["moe"]
    return arm


def main() -> int:
    arms = [estimate(a) for a in read_arms()]
    off = {a.ab: a for a in arms if a.arm == "off"}
    print(f"{'A/B':<10}{'arm':<16}{'measured s':>11}{'predicted s':>12}{'error':>8}{'speed-up meas.':>15}"
          f"{'pred.':>7}{'hidden s':>10}")
    for a in arms:
        base = off[a.ab]
        gain = "" if a is base else f"{base.measured_s / a.measured_s:>15.3f}{base.predicted_s / a.predicted_s:>7.3f}"
        hidden = "" if a is base else f"{base.moe_exposed_s - a.moe_exposed_s:>10.2f}"
        print(f"{a.ab:<10}{a.arm:<16}{a.measured_s:>11.2f}{a.predicted_s:>12.2f}{a.error:>+8.1%}"
              f"{gain or '':>22}{hidden}")
    print("sources: " + "; ".join(sorted({a.where.split('#')[0] for a in arms})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
