"""The fallback plan: the best plan on the GPUs left after losing some (one node by default) that the chosen
plan's checkpoint can be resumed into, and the conversion step that takes.

Same engine, model, sequence length, global batch, precision and optimizer (the run continues: its data
order and numerics stay), any parallel layout: each engine's checkpoint format resumes into another layout
(sources in :data:`RESHARD`). None when no plan fits on what is left, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autotune.cost.checkpoint import checkpoint_bytes
from autotune.cost.estimate import Estimate
from autotune.cost.memory import estimate_memory
from autotune.cost.step_time import TimeSettings, estimate_step_time
from autotune.emit.options import CheckpointOptions
from autotune.engines import engine_for
from autotune.specs.hardware import GB
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints

__all__ = ["Fallback", "RESHARD", "fallback_plan", "switch_times"]

RESHARD = {
    # DeepSpeed 0.19: deepspeed/checkpoint/ds_to_universal.py turns a ZeRO checkpoint into per-parameter fp32 /
    # optimizer fragments that load into another DP/TP/PP layout with checkpoint.load_universal (runtime/engine.py
    # load_checkpoint -> load_universal_checkpoint); DeepSpeed's "Universal Checkpointing" tutorial.
    "deepspeed": ("convert first: python -m deepspeed.checkpoint.ds_to_universal --input_folder SAVE/TAG "
                  "--output_folder SAVE/TAG_universal (it writes SAVE/latest_universal), then load it with "
                  "checkpoint.load_universal: true"),
    # torch.distributed.checkpoint: a save records each tensor's global shape and shards; load_state_dict reads
    # them into whatever sharding the new state dict has ("resharding on load", torch DCP docs).
    "dcp": "no conversion: torch.distributed.checkpoint reshards on load into the new mesh",
    # Megatron-core dist_checkpointing (--ckpt-format torch_dist) saves sharded tensors with their global layout
    # and loads them into another TP/PP/DP layout (Megatron-LM docs, "Distributed checkpointing").
    "torch_dist": "no conversion: Megatron's torch_dist checkpoint loads into another TP/PP/DP layout (--load SAVE)",
}


RESUMES_INTO = {
    # A universal checkpoint loads into a ZeRO optimizer (stages 1-3: deepspeed/runtime/zero/stage_1_and_2.py and
    # stage3.py load the universal fragments); ZeRO-0's fp16/bf16 optimizer (runtime/fp16/unfused_optimizer.py
    # load_state_dict) expects its own keys and fails on one (seen with DeepSpeed 0.19.8 here: 'NoneType' object is
    # not subscriptable at state_dict['dynamic_loss_scale']).
    "deepspeed": {"zero_stages": (1, 2, 3)},
}
"""SearchConstraints fields a checkpoint format limits the fallback plan to (formats not listed: none)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fallback:
    """The plan to resume on after losing ``lost_gpus`` GPUs; ``estimate`` None when none fits (``reason``)."""

    lost_gpus: int
    num_gpus: int
    estimate: Estimate | None
    conversion: str
    conversion_s: float = 0.0
    """Converting the checkpoint for the new layout (DeepSpeed's ds_to_universal: one node reads the checkpoint
    and writes it again; 0 where the format reshards on load)."""
    load_s: float = 0.0
    """Reading the checkpoint into the fallback plan at the storage's aggregate bandwidth."""
    reason: str = ""

    def to_dict(self) -> dict:
        return {"lost_gpus": self.lost_gpus, "num_gpus": self.num_gpus, "conversion": self.conversion,
                "conversion_s": self.conversion_s, "load_s": self.load_s,
                "reason": self.reason, "plan": None if self.estimate is None else self.estimate.plan.to_dict(),
                "tokens_per_s": None if self.estimate is None else self.estimate.time.tokens_per_s}


def switch_times(est: Estimate, storage_bandwidth_gb_per_s: float) -> tuple[float, float]:
    """(conversion, load) seconds to resume ``est``'s checkpoint in another layout.

    DeepSpeed's ds_to_universal runs on one machine (its --num_extract_workers / --num_merge_workers are
    processes of that machine): it reads every fragment and writes the universal checkpoint, about the same
    bytes again, through one node's network links or the storage's bandwidth, whichever is smaller. DCP and
    torch_dist reshard while loading: no conversion."""
    total = checkpoint_bytes(est.model, est.plan).total
    aggregate = storage_bandwidth_gb_per_s * GB
    if engine_for(est.plan).checkpoint_format != "deepspeed":
        return 0.0, total / aggregate
    one_node = min(aggregate, est.cluster.gpus_per_node * est.cluster.inter_node_bandwidth_gb_per_s * GB)
    return 2 * total / one_node, total / aggregate


def fallback_plan(est: Estimate, *, lost_gpus: int | None = None, time_settings: TimeSettings | None = None,
                  storage_bandwidth_gb_per_s: float = CheckpointOptions().storage_bandwidth_gb_per_s) -> Fallback:
    """The best plan of ``est``'s engine on ``est.cluster`` less ``lost_gpus`` (default: one node)."""
    cluster, plan = est.cluster, est.plan
    lost = cluster.gpus_per_node if lost_gpus is None else lost_gpus
    left = cluster.num_gpus - lost
    conversion = RESHARD[engine_for(plan).checkpoint_format]
    if lost < 1 or left < 1 or (left % cluster.gpus_per_node and left > cluster.gpus_per_node):
        why = (f"{cluster.num_gpus} GPUs less {lost} leave {max(left, 0)}: "
               + ("nothing to resume on" if left < 1 else f"not whole nodes of {cluster.gpus_per_node}"))
        return Fallback(lost_gpus=lost, num_gpus=max(left, 0), estimate=None, conversion=conversion, reason=why)
    if left < cluster.gpus_per_node:
        smaller = replace(cluster, num_nodes=1, gpus_per_node=left)
    else:
        smaller = replace(cluster, num_nodes=left // cluster.gpus_per_node)
    constraints = SearchConstraints(engines=(plan.engine,), precisions=(plan.precision,),
                                    max_tp=max(plan.tp, smaller.gpus_per_node),
                                    # the checkpoint holds the MTP modules' weights: the plan resumed on builds them too
                                    mtp_layers=plan.mtp_layers,
                                    **RESUMES_INTO.get(engine_for(plan).checkpoint_format, {}))
    result = search_plans(est.model, smaller, seq_len=plan.seq_len, global_batch_size=plan.global_batch_size,
                          constraints=constraints, top_k=1, time_settings=time_settings)
    if not result.candidates:
        rejected = ", ".join(f"{k} {v:,}" for k, v in list(result.rejections.items())[:3])
        return Fallback(lost_gpus=lost, num_gpus=left, estimate=None, conversion=conversion,
                        reason=f"no {plan.engine} plan of global batch {plan.global_batch_size} fits on {left} GPUs "
                               f"({rejected})")
    best = result.candidates[0]
    if best.plan.optimizer != plan.optimizer:  # the planner searches AdamW: the same layout with the run's optimizer
        same = best.plan.with_(optimizer=plan.optimizer)
        best = Estimate(model=est.model, cluster=smaller, plan=same, memory=estimate_memory(est.model, smaller, same),
                        time=estimate_step_time(est.model, smaller, same, time_settings))
    conversion_s, load_s = switch_times(est, storage_bandwidth_gb_per_s)
    return Fallback(lost_gpus=lost, num_gpus=left, estimate=best, conversion=conversion, conversion_s=conversion_s,
                    load_s=load_s)
