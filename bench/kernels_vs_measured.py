"""The cost model's kernel rates against kernels measured on a real GPU (``bench/gpu_probe/kernels.py``'s JSON).

    PYTHONPATH=. python bench/kernels_vs_measured.py [bench/data/h200_kernels.json] [--gpu h200] [--rows]

An isolated kernel is compared with the model's rate for it without the in-step share
(``Efficiency.gemm_peak_fraction`` = 1): datasheet peak x the GPU's measured ``gemm_fraction`` x the GEMM shape
curve (``autotune.cost.kernels``). The grouped GEMM of E experts with r rows each is what the model costs with
``Rates.grouped_s`` (``autotune.cost.layer_time``: ``m_expert`` rows per expert on the grouped rows curve, the
expert's k and n on the dense one). Attention: the
kernel's ``attention_fraction`` of the 16-bit peak (flash = FlashAttention-2, cuDNN = the FA3-class kernel) times
the head-width factor (``autotune.cost.attention_head_dim``) and the key-length curve at the row's sequence
(``autotune.cost.attention_seq``, one kernel call of ``seq`` keys).
HBM: ``hbm_fraction`` of the datasheet bandwidth. Host op: ``autotune.engines.facts.EAGER_OP_S``.
Prints one table per kind and each kind's median model/measured ratio (1.00 = the model is right; above 1 the
model thinks the kernel faster than it is).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from autotune.cost.attention_head_dim import head_dim_factor
from autotune.cost.attention_seq import key_length_factor
from autotune.cost.efficiency import DEFAULT_EFFICIENCY
from autotune.cost.kernels import rates
from autotune.engines.facts import EAGER_OP_S
from autotune.specs.hardware import GB
from autotune.specs.loading import load_cluster

DEFAULT = Path(__file__).resolve().parent / "data" / "h200_kernels.json"


def model_rates(gpu: str):
    cluster = load_cluster(gpu=gpu, num_gpus=1)
    isolated = DEFAULT_EFFICIENCY.with_(gemm_peak_fraction=1.0)
    return cluster, {kernel: rates(cluster, "bf16", isolated, kernel, None) for kernel in ("fa2", "fa3")}


def gemm_table(doc: dict, r) -> list[tuple]:
    """(label, m, k, n, measured TFLOP/s, model TFLOP/s) of each dense and grouped GEMM row."""
    out = []
    for row in doc["gemm"]:
        m, k, n = row["m"], row["k"], row["n"]
        model = r.bf16_peak * r.shape(r.bf16_half, m, k, n) / 1e12
        out.append(("gemm " + row["model"], m, k, n, row["tflops"], model))
    for row in doc["grouped_gemm"]:
        if "error" in row:
            continue
        m, k, n = row["rows"], row["k"], row["n"]
        model = 2 * m * k * n / r.grouped_s(2 * m * k * n, m, k, n) / 1e12
        out.append((f"grouped {row['shape']} (E={row['experts']})", m, k, n, row["tflops"], model))
    return out


def summarize(rows: list[tuple], key) -> dict[str, tuple[int, float]]:
    groups: dict[str, list[float]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row[5] / row[4])
    return {g: (len(v), statistics.median(v)) for g, v in sorted(groups.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path", nargs="?", default=str(DEFAULT))
    ap.add_argument("--gpu", default="h200", help="the GPU preset the file was measured on (default h200)")
    ap.add_argument("--rows", action="store_true", help="print every GEMM row")
    a = ap.parse_args(argv)
    doc = json.loads(Path(a.path).read_text(encoding="utf-8"))
    cluster, by_kernel = model_rates(a.gpu)
    r = by_kernel["fa2"]
    env = doc["env"]
    print(f"{a.path}: {env['device']}, torch {env['torch']}, {env['date']}; model: preset {a.gpu}")
    rows = gemm_table(doc, r)
    if a.rows:
        print(f"\n{'kernel':44} {'m':>6} {'k':>6} {'n':>6} {'meas':>7} {'model':>7} {'ratio':>6}")
        for label, m, k, n, meas, model in rows:
            print(f"{label:44} {m:6d} {k:6d} {n:6d} {meas:7.1f} {model:7.1f} {model / meas:6.2f}")
    print("\nGEMMs, median model/measured by kind and rows (m):")
    for group, (count, ratio) in summarize(rows, lambda x: f"{x[0].split()[0]:8} m={x[1]:>5}").items():
        print(f"  {group:18} {count:3d} shapes  {ratio:5.2f}")
    print("\nGEMMs, median model/measured by shape:")
    for group, (count, ratio) in summarize(rows, lambda x: x[0]).items():
        print(f"  {group:44} {count:3d} sizes  {ratio:5.2f}")
    peak16 = cluster.gpu.peak_flops_per_s("bf16") / 1e12
    print("\nattention (causal, fwd + bwd, executed FLOPs):")
    for row in doc.get("attention", []) + doc.get("attention_sweep", []):
        if "error" in row:
            print(f"  {row['backend']:18} seq {row['seq']:5d}  error: {row['error'][:80]}")
            continue
        kernel = "fa3" if row["backend"].startswith("CUDNN") else "fa2"
        d = row.get("head_dim", 128)
        model = (by_kernel[kernel].attention * head_dim_factor(kernel, d) * key_length_factor(kernel, row["seq"])
                 / 1e12)
        print(f"  {row['backend']:18} d {d:3d} seq {row['seq']:5d}  measured {row['fwd_bwd_tflops']:6.1f} TFLOP/s "
              f"({row['fwd_bwd_tflops'] / peak16:.2f} of peak)  model {kernel} {model:6.1f}  ratio "
              f"{model / row['fwd_bwd_tflops']:.2f}")
    hbm = doc["hbm"]["gb_per_s"]
    print(f"\nHBM copy: measured {hbm:,.0f} GB/s; model {r.hbm / GB * GB / 1e9:,.0f} GB/s; ratio {r.hbm / 1e9 / hbm:.2f}")
    host = doc["host_op_us"]["us_per_op"]
    print(f"host time per eager op ({doc['host_op_us']['op']}): measured {host:.2f} us on {env.get('cpu', '?')}; "
          f"model {EAGER_OP_S * 1e6:.2f} us; ratio {EAGER_OP_S * 1e6 / host:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
