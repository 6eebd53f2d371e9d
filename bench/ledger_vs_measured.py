"""The memory ledger vs real DeepSpeed (2 gloo ranks) and real autograd, as a table.

    python bench/ledger_vs_measured.py            # runs the DeepSpeed probe (~1 min per model)
    python bench/ledger_vs_measured.py --probe-dir DIR   # reuse ds_memory_<model>.json files in DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from autotune.workloads.ledger_check import compare_activations, compare_model_states, run_deepspeed_probe

MODELS = ("tiny-gpt", "tiny-llama")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probe-dir", help="folder with ds_memory_<model>.json from an earlier probe run")
    args = parser.parse_args()
    work = Path(args.probe_dir) if args.probe_dir else Path(tempfile.mkdtemp(prefix="ledger-bench-"))
    print("Model states per rank (most loaded rank), DeepSpeed 0.19.8, bf16, AdamW, dp=2, micro-batch 2, seq 128")
    print(f"{'model':<12}{'config':<15}{'category':<18}{'measured B':>13}{'ledger B':>13}{'error':>9}")
    worst = 0.0
    for name in MODELS:
        path = work / f"ds_memory_{name}.json"
        doc = json.loads(path.read_text()) if path.is_file() else run_deepspeed_probe(name, work)
        for r in compare_model_states(doc):
            worst = max(worst, abs(r.error))
            print(f"{r.model:<12}{r.case:<15}{r.category:<18}{r.measured_bytes:>13,.0f}{r.ledger_bytes:>13,.0f}"
                  f"{r.error:>+9.2%}")
    print(f"worst model-state error: {worst:.3%} (target 2%)\n")
    print("Activations saved for backward, one forward, micro-batch 2, seq 128 (CPU LayerNorm statistics accounted)")
    print(f"{'model':<12}{'recompute, attention':<30}{'measured B':>13}{'ledger B':>13}{'error':>9}")
    worst = 0.0
    for name in MODELS:
        for recompute in ("none", "selective", "full"):
            for flash in (True, False):
                r = compare_activations(name, recompute, flash_attention=flash)
                worst = max(worst, abs(r.error))
                print(f"{r.model:<12}{r.case:<30}{r.measured_bytes:>13,.0f}{r.ledger_bytes:>13,.0f}{r.error:>+9.2%}")
    print(f"worst activation error: {worst:.3%} (target 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
