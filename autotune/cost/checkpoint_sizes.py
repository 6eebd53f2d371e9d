"""What one save of a plan writes: the rank that writes the most, and the whole job (what is counted per engine:
:mod:`autotune.cost.checkpoint`'s docstring)."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.cost.memory import model_state_bytes
from autotune.engines import engine_for
from autotune.specs.layout import stage_param_groups
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.stage_mix import model_representative_stages

__all__ = ["CheckpointBytes", "checkpoint_bytes"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointBytes:
    """Bytes of one checkpoint: the rank that writes the most, and the whole job."""

    weight_bytes_per_rank: float
    optimizer_bytes_per_rank: float
    """fp32 master weights plus optimizer states."""
    weight_bytes_total: float
    optimizer_bytes_total: float
    consolidated_bytes: float = 0.0
    """The whole 16-bit model rank 0 writes beside the checkpoint at every save (engine ``hf``); a resume does not
    read it back, so it is in ``storage_bytes`` and not in ``total``."""

    @property
    def per_rank(self) -> float:
        return self.weight_bytes_per_rank + self.optimizer_bytes_per_rank

    @property
    def total(self) -> float:
        return self.weight_bytes_total + self.optimizer_bytes_total


def checkpoint_bytes(model: ModelSpec, plan: ParallelPlan) -> CheckpointBytes:
    """What one save writes (see the module docstring for what is counted, per engine)."""
    engine = engine_for(plan)
    resident, weights_written = engine.saved_states_plan(plan)
    per_rank = []
    scheme = engine.layer_split_of(plan, model.num_layers)
    for stage in model_representative_stages(model, plan.pp, scheme, plan.vpp):
        groups = stage_param_groups(model, plan, stage, scheme)
        dense = groups.tp_sharded / plan.tp + groups.replicated
        expert = groups.expert / (plan.ep * plan.expert_tp)
        s = model_state_bytes(resident, dense, expert)
        per_rank.append((s.weights if weights_written else 0.0, s.optimizer_states))
    w_rank, o_rank = max(per_rank, key=sum)
    whole = model_state_bytes(ParallelPlan(optimizer=plan.optimizer, precision=plan.precision, engine=plan.engine),
                              float(model.num_params), 0.0)  # one rank, nothing partitioned: 2 Psi and K Psi
    return CheckpointBytes(weight_bytes_per_rank=w_rank, optimizer_bytes_per_rank=o_rank,
                           weight_bytes_total=whole.weights if weights_written else 0.0,
                           optimizer_bytes_total=whole.optimizer_states,
                           consolidated_bytes=whole.weights if engine.consolidates_weights_at_save else 0.0)
