"""How a pipeline splits the layers: evenly when pp divides them, else Megatron's uneven split.

Megatron-LM takes ``--decoder-first-pipeline-num-layers`` and ``--decoder-last-pipeline-num-layers``
and splits the rest evenly over the middle stages. When pp does not divide the layers we give
every middle stage ceil(L/pp) layers and the first and last stages the remainder, halved: the
two stages that also hold the embedding and the output layer get fewer transformer layers.
Llama 3 405B: 126 layers on pp = 16 is 7 + 14 x 8 + 7 (Llama 3 paper, Sec. 3.3.2).
"""

from __future__ import annotations

import functools

__all__ = ["pipeline_split", "stage_layers", "representative_stages"]


@functools.lru_cache(maxsize=4096)
def pipeline_split(num_layers: int, pp: int) -> tuple[int, int, int] | None:
    """(first, middle, last) stage layer counts, or None when no even or uneven split exists."""
    if pp == 1:
        return (num_layers, num_layers, num_layers)
    if num_layers % pp == 0:
        per = num_layers // pp
        return (per, per, per)
    if pp < 3:
        return None
    middle = -(-num_layers // pp)
    ends = num_layers - (pp - 2) * middle
    if ends < 2 or ends % 2:
        return None
    return (ends // 2, middle, ends // 2)


def stage_layers(num_layers: int, pp: int, stage: int) -> tuple[int, int]:
    """(first layer index, layer count) of pipeline stage ``stage``."""
    split = pipeline_split(num_layers, pp)
    assert split is not None, f"no pipeline split of {num_layers} layers over {pp} stages"
    first, middle, last = split
    if stage == 0:
        return 0, first
    if stage == pp - 1:
        return num_layers - last, last
    return first + (stage - 1) * middle, middle


def representative_stages(num_layers: int, pp: int) -> tuple[int, ...]:
    """The stages whose memory or time can be the largest: first, last, and a middle one if it differs."""
    split = pipeline_split(num_layers, pp)
    stages = {0, pp - 1}
    if split is not None and pp > 2 and split[1] != split[0]:
        stages.add(1)
    return tuple(sorted(stages))
