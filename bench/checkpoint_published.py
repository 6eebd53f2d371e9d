"""The checkpoint and goodput model beside the published figures it can be held against (issue 19), each row
estimated through the CLI a user runs (``python -m autotune estimate ... --json``), nothing fitted to them.

    python bench/checkpoint_published.py

Rows:
- Llama 3 405B on 16,384 H100 (Dubey et al. 2024, "The Llama 3 Herd of Models", Sec. 3.3.4: "higher than 90%
  effective training time"; Sec. 3.3.1: the Tectonic file system sustained 2 TB/s, 7 TB/s peak). Plan: TP 8,
  PP 16, CP 1, DP 128 (their Table 4, the 8K-context stage, 16,384 GPUs, batch 16M tokens = 2,048 x 8,192).
- NeMo Automodel, Llama-3-8B on 8 H100 with torch DCP (NVIDIA NeMo Automodel docs, checkpointing: 27.34 s
  blocked per save synchronous, 0.54 s asynchronous). Their storage bandwidth is not published: the synchronous
  row uses autotune's 5 GB/s default, so it says how near the default is, not how right the model is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA3_405B = ["--model", "llama3-405b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16384", "--seq-len", "8192",
               "--global-batch", "2048", "--engine", "megatron", "--tp", "8", "--pp", "16", "--micro-batch", "1",
               "--zero", "1", "--recompute", "none", "--storage-gb-per-s", "2000"]
LLAMA3_8B = ["--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--seq-len", "8192",
             "--global-batch", "32", "--engine", "fsdp", "--zero", "3", "--micro-batch", "1"]
# (case, published figure, unit, estimate arguments, what to read from --json's goodput block)
ROWS = (
    ("Llama 3 405B, 16,384 H100: effective training time", 0.90, "share (published: > 0.90)", LLAMA3_405B,
     lambda g: g["fractions"]["train"]),
    ("Llama-3-8B, 8 H100, DCP synchronous save: blocked", 27.34, "s", [*LLAMA3_8B, "--no-async-save"],
     lambda g: g["blocking_s"]),
    ("Llama-3-8B, 8 H100, DCP asynchronous save: blocked", 0.54, "s", LLAMA3_8B, lambda g: g["blocking_s"]),
)


def estimate(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-m", "autotune", "estimate", *args, "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"estimate {' '.join(args)} failed:\n{proc.stderr}")
    return json.loads(proc.stdout)["goodput"]


def main() -> int:
    print(f"{'case':<54}{'published':>11}{'model':>10}  unit")
    for case, published, unit, args, read in ROWS:
        print(f"{case:<54}{published:>11.4g}{read(estimate(args)):>10.4g}  {unit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
