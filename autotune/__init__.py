"""autotune: plan, estimate, tune and emit large-model training on DeepSpeed, Megatron-LM, Megatron-DeepSpeed,
PyTorch FSDP2 / torchtitan and Hugging Face Trainer / accelerate.

API (``autotune.__all__``; the ``autotune`` command is a thin layer over it):

- ``load_model(ref)``: a ModelSpec from a preset name, a Hugging Face config.json or a model YAML.
- ``load_cluster(gpu=, num_gpus=, gpus_per_node=, cluster_path=)``: a ClusterSpec from a GPU preset or a file.
- ``make_plan(model, cluster, tp=, pp=, ...)``: a ParallelPlan with dp and accumulation derived, rules checked.
- ``estimate(model, cluster, plan)``: an Estimate: the per-GPU memory ledger and the step time.
- ``search_plans(model, cluster, seq_len=, global_batch_size=, constraints=SearchConstraints(...))``:
  every plan, the feasible ones ranked by predicted tokens/s.
- ``write_bundle(estimate, out_dir)``: the job's files (DeepSpeed JSON or Megatron-LM arguments, launch
  scripts, checkpoint policy, plan.md), written atomically.
- ``deepspeed_config(model=, gpu=, num_gpus=, seq_len=)``: a config for ``deepspeed.initialize`` or
  ``TrainingArguments(deepspeed=...)``.
- Types: ``ModelSpec``, ``GPUSpec``, ``ClusterSpec``, ``ParallelPlan``, ``Estimate``, ``SearchConstraints``;
  ``InputError`` (a ValueError listing every problem of bad input).

Example::

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
    "write_bundle": "autotune.bundle.writer",
}
__all__ = [*_EXPORTS, "deepspeed_config"]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def __getattr__(name: str):
    if name == "deepspeed_config":
        from autotune.api import deepspeed_config_for

        return deepspeed_config_for
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")
