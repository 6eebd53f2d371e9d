"""The cost model's fused attention against cuDNN's attention kernels as NVIDIA timed them for training.

    PYTHONPATH=. python bench/attention_vs_cudnn_sdpa.py [--rows]

bench/data/cudnn_sdpa_training.csv holds NVIDIA's own timings of cuDNN's SDPA forward and backward (the kernels
Transformer Engine runs for Megatron, the model's "fa3" class) on GB200, GB300 and H200, BF16, for the attention
shapes of Llama 3.1, DeepSeek-V3 / Kimi-K2.6 (MLA: 192-wide keys, 128-wide values), GPT-OSS (sliding window 128),
Qwen3.5 and two video models, causal ("top_left") and full ("no_mask"), 2K-75K tokens a sequence. Blackwell's
attention rate was an estimate in the GPU presets (the H100 FlashAttention-3 fraction, the SFU exponential rate);
this is its check.

Each call is costed as ``autotune.cost.layer_time`` costs the attention core of a layer, isolated (no in-step
``gemm_peak_fraction``): the executed FLOPs (QK^T and PV over the useful keys of each query row: half the keys
causal, all of them unmasked, the window with one) at the GPU's attention rate times the head-width factor
(``autotune.cost.attention_head_dim``) and the key-length curve (``autotune.cost.attention_seq``; an unmasked call of
L keys as a causal one of 2L, the same useful keys a row), plus the exponentials beyond the GPU's reference rate;
the backward as ``layer_time.attention_bwd_s``. A layer runs both, so fwd + bwd is the figure the step depends on;
their split only matters to recompute.

The fp8 / mxfp8 rows (``data_type``) are costed as a plan with FP8 attention is (``autotune.cost.fp8_attention``): the
BF16 call's passes over the recipe's speedups for the head width, a windowed call's backward over every causal tile.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from autotune.cost import fp8_attention
from autotune.cost.attention_head_dim import head_dim_factor
from autotune.cost.attention_seq import key_length_factor
from autotune.cost.efficiency import DEFAULT_EFFICIENCY
from autotune.cost.kernels import rates
from autotune.cost.layer_time import attention_bwd_s
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan

DATA = Path(__file__).resolve().parent / "data" / "cudnn_sdpa_training.csv"
KERNEL = "fa3"  # cuDNN fused attention: Transformer Engine's backend for Megatron (autotune.cost.attention_head_dim)


@dataclass(frozen=True)
class Call:
    """One configuration: the measured and modelled seconds of its forward and backward."""

    gpu: str
    model: str
    mask: str
    seq: int
    data_type: str
    measured_fwd: float
    measured_bwd: float
    model_fwd: float
    model_bwd: float

    @property
    def ratio(self) -> float:
        """Modelled over measured fwd + bwd time (above 1: the model thinks the kernels slower than they are)."""
        return (self.model_fwd + self.model_bwd) / (self.measured_fwd + self.measured_bwd)


def load(path: Path = DATA) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


_RATES: dict[str, object] = {}


def modelled_s(gpu: str, row: dict) -> tuple[float, float]:
    """(forward, backward) seconds of the row's call by the cost model, isolated; FP8 rows with FP8 attention."""
    if row.get("data_type", "bf16") != "bf16":
        fwd_x, bwd_x = fp8_attention.speedup("te-mxfp8" if row["data_type"] == "mxfp8" else "te-current",
                                             int(row["head_dim_qk"]))
        bf16 = dict(row, data_type="bf16")
        forward, backward = modelled_s(gpu, bf16)
        if row["window"]:  # the FP8 backward runs every causal tile (fp8_attention, attention_tiles.fp8_backward_share)
            backward = modelled_s(gpu, dict(bf16, window=""))[1]
        return forward / fwd_x, backward / bwd_x
    if gpu not in _RATES:
        isolated = DEFAULT_EFFICIENCY.with_(gemm_peak_fraction=1.0)
        _RATES[gpu] = rates(load_cluster(gpu=gpu, num_gpus=1), "bf16", isolated, KERNEL, None)
    r = _RATES[gpu]
    kv, window = int(row["kv_seq"]), int(row["window"] or 0)
    useful = min(window, kv) if window else (kv + 1) / 2 if row["mask"] == "top_left" else kv
    pairs = int(row["batch"]) * int(row["q_heads"]) * int(row["q_seq"]) * useful
    flops = 2 * pairs * (int(row["head_dim_qk"]) + int(row["head_dim_vo"]))
    rate = r.attention * head_dim_factor(KERNEL, int(row["head_dim_qk"])) * key_length_factor(KERNEL, 2 * useful)
    exp_delta = pairs * r.exp_delta_s
    forward = flops / rate + exp_delta
    return forward, attention_bwd_s(forward, exp_delta, ParallelPlan(flash_attention=True))


def calls(rows: list[dict]) -> list[Call]:
    """Every configuration timed in both passes."""
    by_config: dict[tuple, dict[str, tuple[float, float]]] = defaultdict(dict)
    for row in rows:
        gpu = row["gpu"]
        key = (gpu, row["model"], row["mask"], int(row["q_seq"]), row.get("data_type", "bf16"))
        fwd, bwd = modelled_s(gpu, row)
        by_config[key][row["pass"]] = (float(row["time_ms"]) / 1e3, fwd if row["pass"] == "fwd" else bwd)
    return [Call(*key, passes["fwd"][0], passes["bwd"][0], passes["fwd"][1], passes["bwd"][1])
            for key, passes in sorted(by_config.items()) if {"fwd", "bwd"} <= passes.keys()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", action="store_true", help="print every configuration")
    args = parser.parse_args(argv)
    found = calls(load())
    print("ATTENTION: cost model over NVIDIA's cuDNN SDPA timings, forward + backward (1.00: right; above 1 the model "
          "thinks the kernels slower)")
    groups: dict[tuple, list[Call]] = defaultdict(list)
    for call in found:
        groups[(call.data_type, call.gpu, call.model, call.mask)].append(call)
    print(f"{'type':5} {'gpu':6} {'model':11} {'mask':9} {'seq':>6} {'fwd ms':>8} {'bwd ms':>8} {'model':>6} {'ratio':>6}")
    for key, group in sorted(groups.items()):
        shown = group if args.rows else [c for c in group if c.seq <= 8192]
        for c in shown:
            print(f"{c.data_type:5} {c.gpu:6} {c.model:11} {c.mask:9} {c.seq:6d} {c.measured_fwd * 1e3:8.3f} "
                  f"{c.measured_bwd * 1e3:8.3f} {(c.model_fwd + c.model_bwd) * 1e3:6.2f} {c.ratio:6.2f}")
    print()
    for kind, gpu in sorted({(c.data_type, c.gpu) for c in found}):
        all_ = [c.ratio for c in found if (c.data_type, c.gpu) == (kind, gpu)]
        train = [c.ratio for c in found if (c.data_type, c.gpu) == (kind, gpu) and c.seq <= 8192]
        print(f"{kind:5} {gpu:6} {len(all_):3d} configurations: median {statistics.median(all_):.2f} "
              f"(range {min(all_):.2f}-{max(all_):.2f}); at training lengths (<= 8K) {len(train)}: median "
              f"{statistics.median(train):.2f} (range {min(train):.2f}-{max(train):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
