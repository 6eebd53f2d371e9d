"""The Megatron-LM / Megatron-DeepSpeed arguments autotune writes for a model, as a flag -> value mapping (a bare
flag maps to True), for tests that check one flag and read the file back (autotune.job_megatron_model)."""

from __future__ import annotations

from autotune.api import make_plan
from autotune.emit.megatron import megatron_args, megatron_deepspeed_args
from autotune.specs.loading import load_cluster


def as_flags(argv: list[str]) -> dict:
    out, i = {}, 0
    while i < len(argv):
        takes = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        out[argv[i]] = argv[i + 1] if takes else True
        i += 2 if takes else 1
    return out


def emitted_flags(model, engine: str = "megatron", **plan) -> dict:
    """The arguments of ``model`` on 8 H100s (seq 4096, global batch 8) for ``engine``, ``plan`` fields on top."""
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    plan = make_plan(model, cluster, engine=engine, **{"global_batch_size": 8, "seq_len": 4096, **plan})
    if engine == "megatron":
        return as_flags(megatron_args(model, cluster, plan))
    return as_flags(megatron_deepspeed_args(model, cluster, plan, None, "ds_config.json"))
