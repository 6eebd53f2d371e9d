"""Megatron-Bridge's matched recompute-modules study on 8 H100 (bench/data/megatron_bridge_recompute_ab.csv): for each
``--recompute-modules`` set, the peak allocated memory and step time it changed, measured and as `autotune estimate`
predicts, each against the study's no-recompute control.

    python bench/recompute_modules_ab.py

Moonlight-16B-A3B pre-training (Megatron-Bridge's moonlight_16b_pretrain_8gpu_h100_bf16_config: BF16, seq 4096, MBS 1,
GBS 4, TP2 PP1 CP1 EP8 ETP1, the all-to-all dispatcher, no CUDA graphs, Transformer Engine's cross entropy); each row
changes only the module set. The recipe's optimizer keeps its moments in bf16 (the precision-aware optimizer,
moonlight_16b.py:212-216 at 067f987), which the tool does not model (12 bytes of optimizer state a parameter): the
absolute peaks differ by that, so the memory columns compare what each set frees. The measured peak moved with every
set but core_attn, so it lies where the activations are held; the predicted one is shown as the ledger's activation
term (what a set frees there) and as its allocated peak. These runs are checks: nothing is fitted on them.
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

DATA = ROOT / "bench" / "data" / "megatron_bridge_recompute_ab.csv"
COMMON = ["estimate", "--model", "moonlight-16b-a3b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--engine",
          "megatron", "--zero", "1", "--seq-len", "4096", "--global-batch", "4", "--micro-batch", "1", "--tp", "2",
          "--pp", "1", "--ep", "8", "--etp", "1", "--precision", "bf16", "--grad-dtype", "bf16", "--cross-entropy", "te"]
"""What every row shares (the data file's header); a row adds its recompute."""
GB = 1e9


@dataclass
class Row:
    modules: tuple[str, ...]
    peak_gb: float
    step_ms: float
    where: str
    activations_gb: float = 0.0
    allocated_gb: float = 0.0
    predicted_ms: float = 0.0

    @property
    def argv(self) -> list[str]:
        if not self.modules:
            return [*COMMON, "--recompute", "none"]
        return [*COMMON, "--recompute", "selective", "--recompute-modules", *self.modules]


def read_rows() -> list[Row]:
    with DATA.open() as f:
        raw = list(csv.DictReader(line for line in f if not line.startswith("#")))
    return [Row(tuple(r["modules"].split()), float(r["peak_allocated_gb"]), float(r["step_ms"]), r["where"])
            for r in raw]


def estimate(row: Row) -> Row:
    result = estimate_from_flags(build_parser().parse_args(row.argv))
    row.activations_gb = result.memory.activations / GB
    row.allocated_gb = result.memory.allocated / GB
    row.predicted_ms = result.time.step_time_s * 1e3
    return row


def main() -> int:
    rows = [estimate(r) for r in read_rows()]
    base = rows[0]
    print(f"{'modules':<20}{'freed GB meas.':>15}{'pred. act.':>11}{'pred. peak':>11}"
          f"{'step ms meas.':>14}{'pred.':>8}{'added ms meas.':>15}{'pred.':>7}")
    for r in rows:
        print(f"{' '.join(r.modules) or '(none)':<20}{base.peak_gb - r.peak_gb:>15.3f}"
              f"{base.activations_gb - r.activations_gb:>11.3f}{base.allocated_gb - r.allocated_gb:>11.3f}"
              f"{r.step_ms:>14.1f}{r.predicted_ms:>8.1f}{r.step_ms - base.step_ms:>15.1f}"
              f"{r.predicted_ms - base.predicted_ms:>7.1f}")
    print(f"control: measured {base.step_ms:.0f} ms a step, predicted {base.predicted_ms:.0f} ms "
          f"({base.predicted_ms / base.step_ms - 1:+.0%}); peak allocated measured {base.peak_gb:.1f} GB, predicted "
          f"{base.allocated_gb:.1f} GB with fp32 moments")
    print("source: NVIDIA-NeMo/Megatron-Bridge@067f987df03b skills/nemo-mbridge-perf-activation-recompute/SKILL.md:105-126")
    return 0


if __name__ == "__main__":
    sys.exit(main())
