"""Which layers a pipeline stage's chunks hold and how many micro-batches its first chunk keeps in flight:
the bookkeeping :mod:`autotune.cost.activations` weighs each chunk's saved activations by."""

from __future__ import annotations

import functools

from autotune.specs.layout import interleaved_forwards_at_peak, microbatches_in_flight, scheme_parts, virtual_layout
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["first_chunk_in_flight", "moe_layers_in", "uneven_chunks"]


def first_chunk_in_flight(plan: ParallelPlan) -> float:
    """Micro-batches of the first stage's first chunk (the one with the embedding) in flight at its peak.

    Megatron ``get_model_chunk_id``: forward k runs chunk ``(k % (pp * vpp)) // pp``, so chunk 0 gets the first
    pp of every pp*vpp forwards; without interleaving every in-flight micro-batch is chunk 0's."""
    if not plan.interleaved or plan.pp == 1:
        return microbatches_in_flight(plan, 0)
    group = plan.pp * plan.vpp
    forwards = interleaved_forwards_at_peak(plan, 0)
    return float(forwards // group * plan.pp + min(forwards % group, plan.pp))


def moe_layers_in(model: ModelSpec, start: int, stop: int) -> int:
    """MoE layers among layer indices [start, stop) (after the leading dense ones, every moe_layer_step-th)."""
    if model.moe is None:
        return 0
    if model.moe.moe_layer_step != 1:  # Llama 4 Maverick: dense and MoE layers alternate
        return sum(model.is_moe_layer(i) for i in range(start, stop))
    return max(0, stop - max(start, model.moe.num_dense_layers))


def uneven_chunks(num_layers: int, plan: ParallelPlan, stage: int, scheme: str) -> tuple[tuple[int, int], ...] | None:
    """The [start, stop) layer indices of each of ``stage``'s virtual chunks where the engine gives its chunks
    unequal layer counts: Megatron's embedding and loss slots (``layout.virtual_layout``), torch.distributed.pipelining's
    pp x vpp split by module names (``layout.virtual_layout(..., "any")``: torchtitan's chunk with the
    embedding or the output alone). None otherwise (no interleaving, equal chunks, or another engine's split), where
    every chunk holds 1/vpp of the stage's layers."""
    if not plan.interleaved or scheme_parts(scheme)[0] not in ("megatron", "any"):
        return None
    return _uneven_chunks(num_layers, plan.pp, plan.vpp, stage, scheme)


@functools.lru_cache(maxsize=4096)
def _uneven_chunks(num_layers: int, pp: int, vpp: int, stage: int, scheme: str) -> tuple[tuple[int, int], ...] | None:
    """:func:`uneven_chunks` of an interleaved plan, by the only plan fields it reads (pp, vpp): the planner asks it
    for every micro-batch, recompute mode and precision of a layout, ~10^4 times a search, with ~10^2 distinct
    answers (cached; a tuple, so no caller can change a cached answer)."""
    layout = virtual_layout(num_layers, pp, vpp, scheme)
    if layout is None:
        return None
    own = [pp * c + stage for c in range(vpp)]
    if len({layout[i] for i in own}) == 1:
        return None
    return tuple((sum(layout[:i]), sum(layout[:i + 1])) for i in own)
