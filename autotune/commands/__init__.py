"""The subcommands of ``autotune``, one module each, and what they share.

Every number a flag takes is checked here for finiteness and range before anything uses it
(:func:`flag_problems`), each bound named in the message; every problem is reported at once.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from autotune.specs.loading import MAX_GPUS, MAX_GPUS_PER_NODE, MODEL_LIMITS

__all__ = ["EXIT_OK", "EXIT_PROBLEMS", "EXIT_BAD_INPUT", "EXIT_INTERRUPTED", "INT_RANGES", "FLOAT_RANGES",
           "positive_int", "flag_problems", "json_text"]

EXIT_OK, EXIT_PROBLEMS, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130

MAX_SEQ_LEN = 2**24  # 16M tokens: the longest contexts trained are ~10M (Llama 4 Scout)
MAX_BATCH = 2**24  # sequences per step: Llama 3 405B used 16M tokens = 2,048 x 8k
MAX_STEPS = 10**10

# flag (argparse dest) -> (smallest, largest, why the largest).
INT_RANGES: dict[str, tuple[int, int, str]] = {
    "num_gpus": (1, MAX_GPUS, "no cluster has more"),
    "gpus_per_node": (1, MAX_GPUS_PER_NODE, "an NVL576 rack holds 576"),
    "seq_len": (1, MAX_SEQ_LEN, "longer than any context trained"),
    "global_batch": (1, MAX_BATCH, "larger than any batch trained"),
    "tp": (1, MAX_GPUS, "the largest cluster"), "pp": (1, MODEL_LIMITS["num_layers"], "the most layers accepted"),
    "cp": (1, MAX_GPUS, "the largest cluster"), "ep": (1, MODEL_LIMITS["moe.num_experts"], "the most experts"),
    "vpp": (1, MODEL_LIMITS["num_layers"], "the most layers accepted"),
    "micro_batch": (1, MAX_BATCH, "the largest batch accepted"),
    "recompute_num_layers": (1, MODEL_LIMITS["num_layers"], "the most layers accepted"),
    "top_k": (1, 10_000, "more than a table shows"),
    "max_tp": (1, MAX_GPUS, "the largest cluster"), "max_pp": (1, MODEL_LIMITS["num_layers"], "the most layers"),
    "candidate": (1, 10**6, "more than any plan --json holds"),
    "train_steps": (1, MAX_STEPS, ""), "warmup_steps": (0, MAX_STEPS, ""),
    "keep_last": (1, 10**6, ""), "save_interval": (1, MAX_STEPS, ""),
    "master_port": (1, 65535, "the largest TCP port"),
}
# flag -> (smallest, largest, smallest excluded, why the largest).
FLOAT_RANGES: dict[str, tuple[float, float, bool, str]] = {
    "overhead_gib": (0.0, 1024.0, False, "more than any GPU holds"),
    "fragmentation": (0.0, 0.9, False, "a fraction of the allocation; PyTorch's allocator wastes 5-30%"),
    "min_headroom_gib": (0.0, 1024.0, False, "more than any GPU holds"),
    "min_mfu": (0.0, 1.0, False, "a fraction of peak"),
    "lr": (0.0, 10.0, True, "far above any stable learning rate"),
    "storage_gb_per_s": (0.0, 1e6, True, "1 PB/s"),
    "gpu_mtbf_hours": (0.0, 1e8, True, "11,000 years"),
}


def positive_int(text: str) -> int:
    """An integer; its range is checked with every other problem (see :func:`flag_problems`)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text[:40]!r}") from None


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def flag_problems(args: argparse.Namespace) -> list[str]:
    """Every numeric flag given that is not finite or out of its range, one line each."""
    from autotune.inputs import range_problem

    problems = []
    for dest, (lo, hi, why) in INT_RANGES.items():
        value = getattr(args, dest, None)
        if isinstance(value, int) and not isinstance(value, bool):
            problem = range_problem(_flag(dest), value, lo=lo, hi=hi, why_hi=why)
            if problem:
                problems.append(problem)
    for dest, (lo, hi, lo_open, why) in FLOAT_RANGES.items():
        value = getattr(args, dest, None)
        if value is not None:
            problem = range_problem(_flag(dest), value, lo=lo, hi=hi, lo_open=lo_open, why_hi=why)
            if problem:
                problems.append(problem)
    return problems


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def json_text(doc: Any) -> str:
    """Standard JSON (RFC 8259): a NaN or infinite number (an unbounded time) is written as null."""
    return json.dumps(_finite(doc), indent=2, allow_nan=False)
