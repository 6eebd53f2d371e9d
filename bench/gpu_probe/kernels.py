"""Kernel measurements on one GPU, written as JSON: the facts the cost model takes from datasheets and papers,
read off the real chip.

    python bench/gpu_probe/kernels.py --out h200_kernels.json            # on a GPU machine (torch only)
    python bench/gpu_probe/kernels.py --out /tmp/k.json --device cpu --quick   # a syntax run here

What it measures (each the median of timed repetitions after warm-ups, CUDA events around a loop long enough to
hide one launch):

* ``gemm``: dense bf16 [m x k] @ [k x n] TFLOP/s over token counts m and the layer shapes of the models the
  benches hold (Llama-3 8B / 70B, Qwen3-30B-A3B, GPT-OSS-120B, DeepSeek-V3), and a few narrow ones;
* ``grouped_gemm``: ``torch._grouped_mm`` (the grouped GEMM torchtitan's MoE runs; CUTLASS on sm90) over the
  experts' shapes: E local experts, r routed rows per expert, [r x k] @ [k x n] each, TFLOP/s;
* ``attention``: causal ``scaled_dot_product_attention`` forward + backward TFLOP/s per backend (flash, cuDNN), with
  the causal half of the 4 b s^2 h d forward FLOPs (backward 2.5x);
* ``hbm``: a device-to-device copy's GB/s (bytes read + written);
* ``host_op_us``: the host time of one eager ``torch.nn.Linear`` forward on a 1-token input (no synchronisation,
  the GPU never the bottleneck): what a Python-issued layer costs the CPU per op.

``bench/kernels_vs_measured.py`` compares these with the cost model's rates (``autotune.cost.kernels``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

MODEL_SHAPES = {  # (k, n) of the layer GEMMs, per model (hidden, widths from autotune/presets/models)
    "llama3-8b": [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)],
    "llama3-70b": [(8192, 10240), (8192, 8192), (8192, 57344), (28672, 8192)],
    "qwen3-30b-a3b": [(2048, 5120), (4096, 2048)],
    "gpt-oss-120b": [(2880, 5120), (4096, 2880)],
    "narrow": [(4096, 128), (128, 4096), (4096, 512), (2048, 768), (768, 2048)],
}
TOKENS = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
EXPERT_SHAPES = {  # (local experts, k, n): fc1 (gate+up) and fc2 of one EP rank's experts
    "qwen3-30b-a3b ep8 fc1": (16, 2048, 1536), "qwen3-30b-a3b ep8 fc2": (16, 768, 2048),
    "qwen3-30b-a3b ep1 fc1": (128, 2048, 1536), "qwen3-30b-a3b ep1 fc2": (128, 768, 2048),
    "gpt-oss-120b ep8 fc1": (16, 2880, 5760), "gpt-oss-120b ep8 fc2": (16, 2880, 2880),
    "deepseek-v3 ep32 fc1": (8, 7168, 4096), "deepseek-v3 ep32 fc2": (8, 2048, 7168),
}
ROWS_PER_EXPERT = [64, 128, 256, 512, 1024, 2048, 4096]


def _timed(fn, device: str, min_s: float = 2e-3, reps: int = 7) -> float:
    """Seconds per call of ``fn``: a loop of enough calls to last ``min_s``, timed ``reps`` times, the median."""
    fn()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-6)
    loops = max(1, min(200, int(min_s / one)))
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(loops):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / loops)
        else:
            t0 = time.perf_counter()
            for _ in range(loops):
                fn()
            times.append((time.perf_counter() - t0) / loops)
    return statistics.median(times)


def gemm_rows(device: str, quick: bool) -> list[dict]:
    rows = []
    for model, shapes in MODEL_SHAPES.items():
        for k, n in shapes[:1] if quick else shapes:
            for m in TOKENS[:2] if quick else TOKENS:
                a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
                b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
                s = _timed(lambda: a @ b, device)
                rows.append(dict(model=model, m=m, k=k, n=n, seconds=s, tflops=2 * m * k * n / s / 1e12))
    return rows


def grouped_rows(device: str, quick: bool) -> list[dict]:
    rows = []
    for name, (experts, k, n) in EXPERT_SHAPES.items():
        for r in ROWS_PER_EXPERT[:2] if quick else ROWS_PER_EXPERT:
            if experts * r * max(k, n) * 2 > 8 * 2**30:
                continue
            a = torch.randn(experts * r, k, device=device, dtype=torch.bfloat16)
            w = torch.randn(experts, n, k, device=device, dtype=torch.bfloat16)
            offs = torch.cumsum(torch.full((experts,), r, device=device, dtype=torch.int32), 0, dtype=torch.int32)
            try:
                s = _timed(lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs), device)
            except (RuntimeError, NotImplementedError) as err:
                rows.append(dict(shape=name, experts=experts, rows=r, k=k, n=n, error=str(err)[:200]))
                continue
            rows.append(dict(shape=name, experts=experts, rows=r, k=k, n=n, seconds=s,
                             tflops=2 * experts * r * k * n / s / 1e12))
    return rows


def attention_rows(device: str, quick: bool, seqs=(2048, 4096, 8192), head_dims=(128,)) -> list[dict]:
    if device != "cuda":
        return []
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        for seq, d in [(s_, d_) for s_ in ((2048,) if quick else seqs) for d_ in head_dims]:
            heads, batch = 4096 // d, max(1, 16384 // seq)
            q, k, v = (torch.randn(batch, heads, seq, d, device=device, dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            grad = torch.randn(batch, heads, seq, d, device=device, dtype=torch.bfloat16)

            def fwd():
                with sdpa_kernel(backend):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fwd_bwd():
                fwd().backward(grad)

            try:
                f, fb = _timed(fwd, device), _timed(fwd_bwd, device)
            except RuntimeError as err:
                rows.append(dict(backend=backend.name, seq=seq, error=str(err)[:200]))
                continue
            flops_fwd = 4 * batch * seq * seq * heads * d / 2
            rows.append(dict(backend=backend.name, seq=seq, batch=batch, heads=heads, head_dim=d, fwd_s=f,
                             fwd_bwd_s=fb, fwd_tflops=flops_fwd / f / 1e12,
                             fwd_bwd_tflops=3.5 * flops_fwd / fb / 1e12))
    return rows


def hbm_row(device: str, quick: bool) -> dict:
    n = (64 if quick else 2048) * 2**20
    src = torch.empty(n, device=device, dtype=torch.float16)
    dst = torch.empty_like(src)
    s = _timed(lambda: dst.copy_(src), device)
    return dict(bytes_moved=4 * n, seconds=s, gb_per_s=4 * n / s / 1e9)


def host_op_row(device: str) -> dict:
    layer = torch.nn.Linear(4096, 4096, device=device, dtype=torch.bfloat16)
    x = torch.randn(1, 4096, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(200):
            layer(x)
        if device == "cuda":
            torch.cuda.synchronize()
        per = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(1000):
                layer(x)
            per.append((time.perf_counter() - t0) / 1000 * 1e6)
    return dict(op="torch.nn.Linear(4096, 4096) forward, bf16, 1 token, no grad", us_per_op=statistics.median(per))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="a few shapes only (a syntax run)")
    ap.add_argument("--parts", default="host,hbm,gemm,grouped,attention", help="what to measure (comma-separated)")
    ap.add_argument("--seqs", default="2048,4096,8192", help="attention sequence lengths")
    ap.add_argument("--head-dims", default="128", help="attention head widths (heads x width = 4096)")
    a = ap.parse_args()
    torch.manual_seed(0)
    env = dict(torch=torch.__version__, python=platform.python_version(), cpu=platform.processor() or platform.machine(),
               device=torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
               date=time.strftime("%Y-%m-%d"))
    parts = set(a.parts.split(","))
    ints = lambda text: tuple(int(x) for x in text.split(","))  # noqa: E731
    doc = dict(env=env, host_op_us=host_op_row(a.device) if "host" in parts else None,
               hbm=hbm_row(a.device, a.quick) if "hbm" in parts else None,
               gemm=gemm_rows(a.device, a.quick) if "gemm" in parts else [],
               grouped_gemm=grouped_rows(a.device, a.quick) if "grouped" in parts else [],
               attention=attention_rows(a.device, a.quick, ints(a.seqs), ints(a.head_dims))
               if "attention" in parts else [])
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(dict(env=env, host_op_us=doc["host_op_us"], hbm=doc["hbm"]), indent=1))
    for row in doc["gemm"] + doc["grouped_gemm"] + doc["attention"]:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
