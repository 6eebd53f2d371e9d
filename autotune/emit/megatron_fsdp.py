"""The Megatron-LM arguments and Megatron-Bridge DDP fields of Megatron-FSDP, Megatron-core's fully sharded data
parallelism (the Megatron engine's ZeRO-2 / ZeRO-3; what it holds and refuses: ``autotune.engines.megatron_fsdp``).
Sources: NVIDIA/Megatron-LM d98e8a64 ``megatron/training/arguments.py``; the flags are in every modelled release's
flag table (``megatron_flags_core_v0.*.json``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.specs.plan import ParallelPlan

__all__ = ["SHARDING_STRATEGIES", "FSDP_CKPT_FORMAT", "sharding_strategy", "megatron_fsdp_flags",
           "megatron_fsdp_ddp_fields"]

SHARDING_STRATEGIES = {2: "optim_grads", 3: "optim_grads_params"}
"""ZeRO stage -> ``--data-parallel-sharding-strategy`` (arguments.py:3190-3192): optim_grads shards gradients and
optimizer states, optim_grads_params the weights too."""

FSDP_CKPT_FORMAT = "fsdp_dtensor"
"""arguments.py:1169-1170: "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format"."""


def sharding_strategy(plan: ParallelPlan) -> str | None:
    """The plan's ``--data-parallel-sharding-strategy``, None where it runs Megatron's DDP (ZeRO 0 / 1)."""
    return SHARDING_STRATEGIES.get(plan.zero_stage)


def megatron_fsdp_flags(plan: ParallelPlan) -> list[str]:
    """Megatron-LM arguments of a ZeRO-2/3 plan: Megatron-FSDP v1 (it needs and turns on the distributed optimizer,
    arguments.py:1124-1135), its sharding strategy, the double buffers, and the checkpoint format it requires
    (arguments.py:1169-1170: "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format")."""
    strategy = sharding_strategy(plan)
    if strategy is None:
        return []
    # mcore_fsdp_adapter.py:177-181: "1F1B overlap with FSDP does not support double buffer".
    double = [] if plan.ep_overlapped else ["--fsdp-double-buffer"]
    return ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy, *double]


def megatron_fsdp_ddp_fields(plan: ParallelPlan) -> dict[str, object]:
    """The same settings as Megatron-Bridge's DistributedDataParallelConfig fields (``ddp.use_megatron_fsdp``,
    ``ddp.data_parallel_sharding_strategy``, ``ddp.fsdp_double_buffer``: Bridge's Llama-3 70B FSDP recipe,
    perf_recipes/llama/gb300/llama3.py:218-222)."""
    strategy = sharding_strategy(plan)
    if strategy is None:
        return {}
    return {"use_megatron_fsdp": True, "data_parallel_sharding_strategy": strategy,
            "fsdp_double_buffer": not plan.ep_overlapped}
