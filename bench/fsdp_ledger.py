"""The memory ledger vs real FSDP2 (torch 2.13 fully_shard, 2 gloo ranks), as a table.

    python bench/fsdp_ledger.py                 # runs the probe (~1-2 min per model)
    python bench/fsdp_ledger.py --probe-dir DIR # reuse fsdp_memory_<model>.json files in DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from autotune.train.fsdp_probe import MICRO_BATCH, SEQ_LEN, compare, run_probe

MODELS = ("tiny-gpt", "tiny-llama")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probe-dir", help="folder with fsdp_memory_<model>.json from an earlier probe run")
    args = parser.parse_args()
    work = Path(args.probe_dir) if args.probe_dir else Path(tempfile.mkdtemp(prefix="fsdp-ledger-"))
    print(f"Most loaded rank, FSDP2 bf16 params / fp32 reduce, AdamW, dp=2, micro-batch {MICRO_BATCH}, seq {SEQ_LEN}")
    print(f"{'model':<12}{'config':<22}{'category':<19}{'measured B':>13}{'ledger B':>13}{'error':>9}")
    for name in MODELS:
        path = work / f"fsdp_memory_{name}.json"
        doc = json.loads(path.read_text()) if path.is_file() else run_probe(name, work)
        for case, category, measured, ledger in compare(doc):
            print(f"{name:<12}{case:<22}{category:<19}{measured:>13,}{ledger:>13,.0f}{ledger / measured - 1:>+9.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
