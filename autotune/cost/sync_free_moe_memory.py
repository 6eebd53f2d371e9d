"""What the sync-free MoE path of a whole-iteration CUDA graph adds to a GPU's memory (``autotune.specs.sync_free_moe``
has the path and its sources).

* Paged stash headroom: the routed experts' saved tensors (``activations.grouped_mlp_bytes``, at balanced routing,
  already in the activation ledger) live in one preallocated buffer ``PAGED_STASH_CUDA_FACTOR`` times the balanced
  token count of every MoE layer and micro-batch the stage holds at its peak (Megatron sizes it from the largest
  running sum of stashed tokens over the schedule, ``max_avg_tokens_across_vp_stages``, megatron/core/transformer/
  moe/paged_stash.py:546-603 at core_v0.19.0): the factor less one is what it adds. Nothing is stashed where the
  routed experts recompute (``moe`` in the recompute modules, full recompute keeping layer inputs); ``moe_act``
  drops the activation output (fc2's input) from it.
* The rank budget: the layer at work holds its dispatch output and grouped-MLP tensors at the budget's
  ``RANK_CAPACITY_FACTOR`` times the balanced rows (token_dispatcher.py:1090-1102 there) before they are paged:
  one layer and micro-batch's grouped-MLP bytes times the factor less one.
The pinned host overflow buffer (``PAGED_STASH_CPU_FACTOR``) is host memory, not counted on the GPU. Not modelled:
the stash's copy kernels (they run on their own stream, paged_stash.py ``pack_stream``, beside the compute) and
the rerun of an iteration whose tokens overflowed the budget (paged_stash.py's ``_MAX_RERUN_ATTEMPTS``; balanced
routing never does).
"""

from __future__ import annotations

from autotune.cost.activations import grouped_mlp_bytes, linear_input_bytes
from autotune.cost.stage_chunks import moe_layers_in
from autotune.specs.layout import microbatches_in_flight, stage_layers
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.sync_free_moe import PAGED_STASH_CUDA_FACTOR, RANK_CAPACITY_FACTOR, sync_free_moe

__all__ = ["sync_free_moe_bytes"]


def _stashed_bytes_per_layer(model: ModelSpec, plan: ParallelPlan) -> tuple[float, float]:
    """(grouped-MLP bytes of one MoE layer and micro-batch, the part of them the paged stash keeps)."""
    moe = model.moe
    assert moe is not None
    pairs = plan.seq_len / plan.cp * plan.micro_batch_size * moe.top_k
    lin = linear_input_bytes(plan)
    work = grouped_mlp_bytes(model, pairs, plan.tp, lin)
    modules = (plan.recompute_modules or ("core_attn",)) if plan.recompute == "selective" else ()
    if plan.recompute == "full" or "moe" in modules:
        return work, 0.0
    if "moe_act" in modules:  # fc2's saved input, as activations.recompute_module_bytes drops it
        return work, work - pairs * lin * moe.expert_ffn_hidden_size / plan.tp
    return work, work


def sync_free_moe_bytes(model: ModelSpec, plan: ParallelPlan, stage: int, scheme: str) -> float:
    """Bytes the paged stash's headroom and the rank budget's working tensors add on pipeline stage ``stage`` (none
    off the path); ``scheme``: the engine's layer split (``autotune.specs.layout``)."""
    if not sync_free_moe(model, plan):
        return 0.0
    first, count = stage_layers(model.num_layers, plan.pp, stage, scheme)
    moe_layers = moe_layers_in(model, first, first + count)
    if not moe_layers:
        return 0.0
    work, stashed = _stashed_bytes_per_layer(model, plan)
    held = stashed * moe_layers * microbatches_in_flight(plan, stage)
    return (PAGED_STASH_CUDA_FACTOR - 1) * held + (RANK_CAPACITY_FACTOR - 1) * work
