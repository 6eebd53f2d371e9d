"""How a pipeline splits the transformer layers over its stages.

Two schemes, as the engines do it:

- ``megatron``: evenly when pp divides the layers; else Megatron-LM's
  ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``: every middle
  stage gets ceil(L/pp) layers and the first and last stages the remainder, halved (the two
  stages that also hold the embedding and the output layer get fewer transformer layers).
  Llama 3 405B: 126 layers on pp = 16 is 7 + 14 x 8 + 7 (Llama 3 paper, Sec. 3.3.2).
- ``uniform``: DeepSpeed's ``PipelineModule(partition_method="uniform"|"type:<layer>")`` through
  ``deepspeed.runtime.utils.partition_uniform``: chunk = L // pp, and the first L % pp stages get
  one layer more. BLOOM-176B: 70 layers on pp = 12 is 10 x 6 + 2 x 5.
- ``any``: ``megatron`` where it exists, else ``uniform`` (torchtitan splits by module names, so
  it can express either).
"""

from __future__ import annotations

import functools

__all__ = ["SPLIT_SCHEMES", "layer_counts", "pipeline_split", "stage_layers", "representative_stages"]

SPLIT_SCHEMES = ("megatron", "uniform", "any")


@functools.lru_cache(maxsize=4096)
def pipeline_split(num_layers: int, pp: int) -> tuple[int, int, int] | None:
    """Megatron's (first, middle, last) stage layer counts, or None when no even or uneven split exists."""
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


def _uniform(num_layers: int, pp: int) -> tuple[int, ...] | None:
    # deepspeed/runtime/utils.py partition_uniform: the first `residual` parts get chunk + 1 items.
    if num_layers < pp:
        return None  # a stage with no transformer layer: DeepSpeed allows it, nobody trains that way
    chunk, residual = divmod(num_layers, pp)
    return tuple(chunk + 1 if i < residual else chunk for i in range(pp))


@functools.lru_cache(maxsize=4096)
def layer_counts(num_layers: int, pp: int, scheme: str = "megatron") -> tuple[int, ...] | None:
    """Transformer layers of every stage, first to last, or None when the scheme cannot split them."""
    if scheme not in SPLIT_SCHEMES:
        raise ValueError(f"unknown split scheme {scheme!r}")
    if scheme in ("megatron", "any"):
        split = pipeline_split(num_layers, pp)
        if split is not None:
            first, middle, last = split
            return (num_layers,) if pp == 1 else (first, *([middle] * (pp - 2)), last)
        if scheme == "megatron":
            return None
    return _uniform(num_layers, pp)


def stage_layers(num_layers: int, pp: int, stage: int, scheme: str = "megatron") -> tuple[int, int]:
    """(first layer index, layer count) of pipeline stage ``stage``."""
    counts = layer_counts(num_layers, pp, scheme)
    assert counts is not None, f"no {scheme} pipeline split of {num_layers} layers over {pp} stages"
    return sum(counts[:stage]), counts[stage]


@functools.lru_cache(maxsize=4096)
def representative_stages(num_layers: int, pp: int, scheme: str = "megatron") -> tuple[int, ...]:
    """The stages whose memory or time can be the largest: first, last, and the first middle stage of each
    distinct layer count."""
    counts = layer_counts(num_layers, pp, scheme)
    stages = {0, pp - 1}
    if counts is not None:
        seen: set[int] = set()
        for s in range(1, pp - 1):
            if counts[s] not in seen:
                seen.add(counts[s])
                stages.add(s)
    return tuple(sorted(stages))
