"""Pipeline parallelism for the FSDP trainer with ``torch.distributed.pipelining`` (torch 2.13).

The layers are split over ``pp * vpp`` virtual stages as the engine splits them
(:func:`autotune.specs.layout.virtual_layout` with the fsdp engine's scheme, uneven allowed: every pipeline rank
keeps the layers the cost model gives it, a chunk may hold the embedding or the output alone); virtual stage
``s`` lives on pipeline rank ``s % pp`` (the loop placement ``ScheduleInterleaved1F1B`` expects), so rank 0
holds the embedding and rank ``pp - 1`` the output. ``Schedule1F1B`` with one stage per rank,
``ScheduleInterleaved1F1B`` with ``vpp > 1``; ``n_microbatches`` = the plan's gradient-accumulation steps.
"""

from __future__ import annotations

from autotune.engines.builtin_trainer import pipeline_stage_problem as stage_problem
from autotune.engines.builtin_trainer import stage_layer_counts as _counts

__all__ = ["virtual_stages", "stage_problem", "build_schedule"]


def virtual_stages(num_layers: int, pp: int, vpp: int, scheme: str) -> list[tuple[int, int]]:
    """(first layer, layer count) of every virtual stage, first to last."""
    counts = _counts(num_layers, pp, vpp, scheme)
    assert counts is not None, f"no {scheme} split of {num_layers} layers over {pp * vpp} stages"
    out, first = [], 0
    for c in counts:
        out.append((first, c))
        first += c
    return out


def build_schedule(stage_modules: list, stage_ids: list[int], num_stages: int, pp_group, device, *,
                   n_microbatches: int, loss_fn):
    """The schedule over this rank's stage modules (``stage_ids`` their virtual stage indices)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

    stages = [PipelineStage(m, s, num_stages, device, group=pp_group) for m, s in zip(stage_modules, stage_ids)]
    if len(stages) == 1:
        return Schedule1F1B(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn)
    return ScheduleInterleaved1F1B(stages, n_microbatches=n_microbatches, loss_fn=loss_fn)
