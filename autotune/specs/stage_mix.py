"""Which pipeline stages stand in for all of them: the stages whose memory or step time can be the largest, one of each
layer count and mix of layer kinds (MoE or dense, local or global attention), asked by the memory ledger, the step
time and the checkpoint sizes instead of every stage."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from autotune.specs.layout import layer_counts

if TYPE_CHECKING:
    from autotune.specs.model import ModelSpec

__all__ = ["representative_stages", "layer_kinds", "model_representative_stages"]


@functools.lru_cache(maxsize=4096)
def representative_stages(num_layers: int, pp: int, scheme: str = "megatron",
                          kinds: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The stages whose memory or time can be the largest: first, last, and the first middle stage of each distinct
    layer count, or with ``kinds`` (:func:`layer_kinds`) of each distinct mix of layer kinds (a stage of dense first
    layers is no stand-in for the MoE stages after it). :func:`model_representative_stages` passes a model's."""
    counts = layer_counts(num_layers, pp, scheme)
    stages = {0, pp - 1}
    if counts is not None:
        seen: set[tuple[int, ...]] = set()
        start = counts[0]
        for s in range(1, pp - 1):
            n = counts[s]
            mix = (n,) if kinds is None else (n, *(sum(1 for k in kinds[start:start + n] if k == kind)
                                                   for kind in range(_KINDS)))
            start += n
            if mix not in seen:
                seen.add(mix)
                stages.add(s)
    return tuple(sorted(stages))


_KINDS = 4
"""Layer kinds (:func:`layer_kinds`): 1 for a MoE layer, plus 2 for local (sliding-window or chunked) attention."""
_kinds_cache: dict[int, tuple[ModelSpec, tuple[int, ...] | None]] = {}


def layer_kinds(model: ModelSpec) -> tuple[int, ...] | None:
    """Each layer's kind (MoE or dense, local or global attention: what changes a layer's parameters, saved
    activations or time), or None where every layer is of one kind; cached by the model's id (each entry keeps its
    model, so a reused id cannot match)."""
    hit = _kinds_cache.get(id(model))
    if hit is None or hit[0] is not model:
        kinds = tuple(int(model.is_moe_layer(i)) + 2 * int(model.is_local_attention_layer(i))
                      for i in range(model.num_layers))
        if len(_kinds_cache) > 256:
            _kinds_cache.clear()
        hit = _kinds_cache[id(model)] = (model, kinds if len(set(kinds)) > 1 else None)
    return hit[1]


def model_representative_stages(model: ModelSpec, pp: int, scheme: str = "megatron", vpp: int = 1) -> tuple[int, ...]:
    """:func:`representative_stages` of ``model``'s layers, their kinds told apart; every stage where the layers are
    of several kinds and interleaved (``vpp`` > 1): a stage's chunks are not its contiguous share of the layers, and
    which kinds its first chunks (the ones most micro-batches are in flight in) hold differs from stage to stage."""
    kinds = layer_kinds(model)
    if kinds is not None and vpp > 1:
        return tuple(range(pp))
    return representative_stages(model.num_layers, pp, scheme, kinds)
