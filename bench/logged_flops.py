"""NVIDIA's published FLOPs per token (bench/data/nvidia_recipes_blackwell.csv: Model TFLOP/s per GPU over tokens/s
per GPU) against Megatron-Bridge's own count as autotune.cost.logged_flops re-expresses it, and against our model-FLOPs
count (autotune.cost.flops, what `autotune estimate` prints as "model FLOPs": full s x s attention square).

    PYTHONPATH=. python bench/logged_flops.py

One line per family, sequence length, MTP setting and formula version (FORMULA_VERSIONS: containers 25.09-26.04.01
and 26.06 on): NVIDIA's median GFLOP/token over the rows, ours, the ratio, and the same for our model FLOPs. Rows
whose published pair departs by more than 0.5% from the median of their own group are NVIDIA's columns disagreeing
with each other (the count is a function of model and sequence only); they are listed under the table.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from autotune.cost.flops import step_flops
from autotune.cost.logged_flops import FORMULA_VERSIONS, logged_flops_per_token
from autotune.cost.mtp import mtp_flops_per_token
from autotune.specs.presets import load_model_preset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvidia_variants import mtp_layers as variant_mtp_layers  # noqa: E402  (DeepSeek-V3 recipes: 1 MTP module)
from accuracy_nvidia_recipes import family_of, load_rows  # noqa: E402  (the table's rows and model names)

DATA = Path(__file__).resolve().parent / "data" / "nvidia_recipes_blackwell.csv"

PRESETS = {
    "LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3-405b",
    "DeepSeekV3": "deepseek-v3", "Kimi_K2": "kimi-k2", "Qwen3_30B_a3B": "qwen3-30b-a3b",
    "Qwen3_235B_a22B": "qwen3-235b-a22b", "GPT OSS 120B": "gpt-oss-120b",
}
"""The table's family (model name without its parenthesised variant) -> our preset."""

QUICK_GELU_GLU = {"GPT OSS 120B"}
"""Families whose gated MLP is not SiLU (GPT-OSS: quick-GELU, Megatron-Bridge@067f987df03b
src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py:82): the "25.09" formula counts them as 2-projection MLPs."""

NOT_COVERED = {
    "Nemotron_3": "hybrid Mamba-Transformer: Bridge's hybrid_flops branch, layers ModelSpec does not describe",
    "DeepSeekV4": "DeepSeek-V4's compressed sparse attention (dsv4_hybrid): no ModelSpec fields for it",
    "LoRA Performance": "LoRA on packed SQuAD: Bridge's own Llama-3-70B LoRA formula (flop_utils.py:983-1007 at "
                        "067f987df03b: frozen GEMMs x 2/3, the packed file's mean tokens and squared lengths), not a "
                        "function of (model, seq_len)",
}
"""Rows left out, by family prefix or task, with the reason. The 26.06 SFT rows (Llama 3 70B, packed SQuAD, seq 4096)
are covered: Bridge v0.5.0 counts them with the plain formula at the configured sequence length (its packed-sequence
accounting, d12548a3c, came after v0.5.0)."""
OLD_CONTAINERS = {"25.09", "25.11", "26.02", "26.02.01", "26.04", "26.04.01"}
"""Containers that ran the "25.09" formula (Bridge before baa0259bd); later ones ran "26.06"."""
OUTLIER = 0.005
"""A row whose published FLOPs/token departs from its group's median by more than this is listed as NVIDIA's columns
disagreeing (integer rounding explains at most 0.24% on these rows)."""


@dataclass(frozen=True)
class Row:
    """One pre-training row of the table we can express, with both counts."""

    source: dict
    family: str
    seq: int
    mtp: int
    version: str
    nvidia: float
    """NVIDIA's FLOPs per token: model_tflops_per_gpu x 1e12 / tokens_per_s_per_gpu."""
    ours: float
    """Megatron-Bridge's formula (autotune.cost.logged_flops)."""
    own: float
    """Our model FLOPs (autotune.cost.flops, with the MTP modules as step_time adds them)."""


def not_covered_reason(row: dict) -> str | None:
    """Why a row is left out, None if covered."""
    family, _ = family_of(row["model"])
    for key, reason in NOT_COVERED.items():
        if family.startswith(key) or row["task"] == key:
            return reason
    return None if family in PRESETS else "no preset"


def our_model_flops(preset: str, seq: int, mtp: int) -> float:
    """Our model FLOPs per token (`autotune estimate`'s "model FLOPs": step_flops + the MTP modules, as
    autotune/cost/step_time.py adds them)."""
    model = load_model_preset(preset)
    forward_mtp, _ = mtp_flops_per_token(model, seq, mtp or None)
    return step_flops(model, seq, 1.0, "none").model + 3.0 * forward_mtp


def covered_rows(path: Path = DATA) -> list[Row]:
    """Every row we can express, with NVIDIA's FLOPs per token, ours and our model FLOPs."""
    out = []
    for r in load_rows(path):
        if not_covered_reason(r):
            continue
        family, variant = family_of(r["model"])
        seq, mtp = int(r["seq"]), variant_mtp_layers(family, variant) or 0
        tp = int(r["tp"]) if r["tp"].isdigit() else 1
        version = "25.09" if r["container"] in OLD_CONTAINERS else "26.06"
        ours = logged_flops_per_token(load_model_preset(PRESETS[family]), seq, mtp_layers=mtp, tp=tp,
                                      version=version, silu_glu=family not in QUICK_GELU_GLU)
        nvidia = float(r["model_tflops_per_gpu"]) * 1e12 / float(r["tokens_per_s_per_gpu"])
        out.append(Row(r, family, seq, mtp, version, nvidia, ours, our_model_flops(PRESETS[family], seq, mtp)))
    return out


def task_of(row: dict) -> str:
    """"pretrain" or "SFT", the table's task."""
    return "SFT" if row["task"].startswith("SFT") else "pretrain"


def groups(rows: list[Row]) -> dict[tuple, list[Row]]:
    """Rows by (family, seq, MTP modules, formula version, task): one count each."""
    out: dict[tuple, list[Row]] = defaultdict(list)
    for row in rows:
        out[(row.family, row.seq, row.mtp, row.version, task_of(row.source))].append(row)
    return out


def main() -> None:
    rows = covered_rows()
    print("GFLOP per token: NVIDIA's (median over rows) vs Megatron-Bridge's formula (autotune.cost.logged_flops) "
          "vs our model FLOPs (autotune.cost.flops)")
    print(f"{'family':16} {'task':8} {'seq':>5} {'mtp':>3} {'formula':>7} {'rows':>4} {'NVIDIA':>8} {'Bridge':>8} "
          f"{'ratio':>6} {'max|row|':>8} {'ours':>8} {'ratio':>6}")
    outliers = []
    for (family, seq, mtp, version, task), members in groups(rows).items():
        median = statistics.median(r.nvidia for r in members)
        worst = max(abs(r.ours / r.nvidia - 1) for r in members)
        print(f"{family:16} {task:8} {seq:5d} {mtp:3d} {version:>7} {len(members):4d} {median / 1e9:8.2f} "
              f"{members[0].ours / 1e9:8.2f} {members[0].ours / median:6.3f} {worst:8.2%} "
              f"{members[0].own / 1e9:8.2f} {members[0].own / median:6.3f}")
        outliers += [(r, r.nvidia / median - 1) for r in members if abs(r.nvidia / median - 1) > OUTLIER]
    for version, containers in FORMULA_VERSIONS.items():
        print(f"  formula {version}: {containers}")
    print(f"\nrows whose published pair departs from their group's median by more than {OUTLIER:.1%} "
          f"(NVIDIA's two columns disagree; ours vs the row beside):")
    for r, off in outliers:
        s = r.source
        print(f"  {s['container']:9} {s['model']:16} {task_of(s):8} {s['system']:10} {s['precision']:6} "
              f"tokens/s {s['tokens_per_s_per_gpu']:>6} TFLOP/s {s['model_tflops_per_gpu']:>5}: "
              f"{off:+.2%} from median, ours {r.ours / r.nvidia - 1:+.2%}")
    left = defaultdict(int)
    for r in load_rows():
        reason = not_covered_reason(r)
        if reason:
            left[reason] += 1
    print("\nrows not covered:")
    for reason, n in left.items():
        print(f"  {n:3d}  {reason}")


if __name__ == "__main__":
    main()
