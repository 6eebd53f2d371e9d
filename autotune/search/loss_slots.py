"""The planner's search of the output layer and loss's layer slots (``ParallelPlan.loss_slots``, --uneven-layouts).

On the last pipeline stage the 16-bit output layer (hidden x vocab GEMMs) and the cross entropy cost about 2-5
transformer layers' time (``StepTimeEstimate.stage_times_s``), and Megatron-core's own account-for-loss split gives
them one layer's slot. With ``SearchConstraints.uneven_layouts`` each Megatron layout with a pipeline is also
searched with the loss as k slots (``space.UNEVEN_LOSS_SLOTS``; ``layout.split_scheme``), Megatron-core running the
split through --pipeline-model-parallel-layout (``emit.megatron_layout``); so is each fsdp (torchtitan) layout with
a pipeline, torchtitan splitting with ``pipeline_parallel_last_stage_less_layers = k`` (``emit.torchtitan``). The
default search never reaches here (``DimensionValues.loss_slots`` is empty).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Callable

from autotune.engines import engine_for
from autotune.specs.layout import layer_counts, split_scheme, virtual_layout

if TYPE_CHECKING:
    from autotune.search.space import DimensionValues
    from autotune.specs.model import ModelSpec
    from autotune.specs.plan import ParallelPlan

__all__ = ["search_loss_slots"]


def search_loss_slots(model: ModelSpec, layout: ParallelPlan, dims: DimensionValues, plans: int,
                      rejections: Counter, search: Callable[[ParallelPlan], None]) -> int:
    """The loss slots ``dims.loss_slots`` of a layout with a pipeline (an engine whose files write them: Megatron,
    fsdp) that passed the layout rules with the engine's own split: each k whose stages' layers are new (neither the
    engine's own split's nor a smaller k's, ``_stage_layers``) has its layout
    searched as the engine's is (``search``: the planner's variants of a layout); a k that has no split (Megatron's
    empties a virtual stage, torchtitan's raises) is counted against the engine's loss_slots rule
    (``support_rules``). ``plans``: the plans of one k's layout. Returns the plans enumerated."""
    num_layers, pp, vpp = model.num_layers, layout.pp, layout.vpp
    mtp = dims.run_settings[layout.engine]["mtp_layers"]
    engine = engine_for(layout)
    scheme = engine.support.layer_split
    own = layout if layout.mtp_layers == mtp else layout.with_(mtp_layers=mtp)
    seen = {_stage_layers(num_layers, pp, vpp, engine.layer_split_of(own, num_layers))}  # e.g. torchtitan's 1F1B
    enumerated = 0
    for k in dims.loss_slots:
        split = _stage_layers(num_layers, pp, vpp, split_scheme(scheme, mtp, num_layers, pp, vpp, k))
        if split in seen:
            continue
        enumerated += plans
        if split is None:
            rejections[f"{layout.engine}:loss_slots"] += plans
            continue
        seen.add(split)
        search(layout.with_(loss_slots=k))
    return enumerated


def _stage_layers(num_layers: int, pp: int, vpp: int, scheme: str) -> tuple[int, ...] | None:
    """Each pipeline stage's layers under ``scheme`` (None: no layout of it over pp x vpp). Two k that give every
    stage the same layers and differ only in how a stage's chunks share them cost the same step time (the cost
    model prices a stage by its layers) and near the same memory: the smaller k alone is searched."""
    if virtual_layout(num_layers, pp, vpp, scheme) is None:
        return None
    return layer_counts(num_layers, pp, scheme)
