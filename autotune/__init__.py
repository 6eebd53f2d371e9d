"""autotune: plan, estimate, tune and emit large-model training on DeepSpeed and Megatron-LM.

The library API (the CLI is a thin layer over it)::

    import autotune
    model = autotune.load_model("llama3-70b")
    cluster = autotune.load_cluster(gpu="h100-sxm-80gb", num_gpus=64)
    plan = autotune.make_plan(model, cluster, tp=8, pp=2, global_batch_size=512, seq_len=8192)
    print(autotune.estimate(model, cluster, plan).to_dict()["memory"])
    ds_config = autotune.deepspeed_config(model="llama3-8b", gpu="h100-sxm-80gb", num_gpus=8)

Names are imported on first use, so ``import autotune`` stays fast.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "ModelSpec": "autotune.specs.model",
    "GPUSpec": "autotune.specs.hardware",
    "ClusterSpec": "autotune.specs.hardware",
    "ParallelPlan": "autotune.specs.plan",
    "InputError": "autotune.errors",
    "load_model": "autotune.specs.loading",
    "load_cluster": "autotune.specs.loading",
    "make_plan": "autotune.api",
    "estimate": "autotune.api",
    "Estimate": "autotune.api",
    "search_plans": "autotune.search.planner",
    "SearchConstraints": "autotune.search.space",
    "write_bundle": "autotune.emit.bundle",
}
__all__ = [*_EXPORTS, "deepspeed_config"]


def __getattr__(name: str):
    if name == "deepspeed_config":
        from autotune.emit.deepspeed import deepspeed_config_for

        return deepspeed_config_for
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")
