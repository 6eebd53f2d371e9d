"""The sync-free MoE path a whole-iteration CUDA graph needs, and the run settings autotune writes for it.

A full-iteration graph (``--cuda-graph full-iteration``) replays every kernel of the forward-backward with no
host in between, so nothing in it may wait for the host. The dropless token dispatchers do: they copy the tokens
per expert to the host to size their buffers and splits (megatron-core core_v0.19.0
``megatron/core/transformer/moe/token_dispatcher.py``: allgather ``.cpu()`` at :317; alltoall's sync points at
:540-610; DeepEP's ``tokens_per_expert.sum().item()`` at :1441; HybridEP without a rank budget "sizes buffers
dynamically (CPU sync in dispatch)", :1103-1104 and :1164-1169). Megatron's MoE guide says the same: without a
capacity, "the resulting dynamic shapes make MoE layers uncapturable" (megatron/core/transformer/moe/README.md:514
there).

The path NVIDIA's full-iteration recipes run instead (Megatron-Bridge 067f987
``src/megatron/bridge/perf_recipes/qwen/common.py:36-59`` ``_enable_hybridep_full_iteration_mxfp8``; the same
values in perf_recipes/deepseek/common.py:63-69 and gpt_oss/common.py:30-38):
  * HybridEP with ``moe_expert_rank_capacity_factor`` c: each EP rank's receive buffer is a static budget of
    ``tokens x top_k x c`` rows (token_dispatcher.py:1090-1102 at core_v0.19.0), so the dispatch needs no host
    count. Tokens beyond the budget are dropped and flagged; the grouped GEMMs still run on the tokens routed
    (their split sizes stay on the GPU: TransformerEngine d0067d0 ``pytorch/ops/fused/grouped_mlp.py:1095-1106``
    passes them as the grouped tensor's ``first_dims``), so the budget costs memory, not GEMM work (each expert's
    rows are padded to the op fuser's 256-row multiple, though: ``autotune.cost.expert_padding``). Megatron
    requires the Transformer Engine op fuser with it (transformer_config.py:1692-1706 at core_v0.19.0).
  * ``moe_paged_stash``: the routed experts' saved activations go to one preallocated paged buffer sized from the
    balanced token count (``max_num_tokens // c``, experts.py:656-663 there) times
    ``moe_paged_stash_buffer_size_factor_cuda`` (paged_stash.py:546-603 there), rather than to tensors of the
    budget's size; it needs the rank capacity factor (transformer_config.py:1904-1911 there). The
    ``..._factor_cpu`` buffer is pinned host memory for overflow (paged_stash.py:77).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.specs.plan import FULL_ITERATION_GRAPH

if TYPE_CHECKING:
    from autotune.specs.model import ModelSpec
    from autotune.specs.plan import ParallelPlan

__all__ = ["SYNC_FREE_DISPATCHER", "RANK_CAPACITY_FACTOR", "PAGED_STASH_CUDA_FACTOR", "PAGED_STASH_CPU_FACTOR",
           "sync_free_moe", "sync_free_path"]

SYNC_FREE_DISPATCHER = "flex-hybridep"
"""The only dispatcher autotune writes that has a static-budget path (module docstring)."""

RANK_CAPACITY_FACTOR = 1.5
"""moe_expert_rank_capacity_factor: Megatron-Bridge 067f987 perf_recipes/qwen/common.py:45 (deepseek/common.py:63,
gpt_oss/common.py:30)."""

PAGED_STASH_CUDA_FACTOR = 1.2
"""moe_paged_stash_buffer_size_factor_cuda: the same file, :46 (Megatron's default 1.10, transformer_config.py:1274
at core_v0.19.0)."""

PAGED_STASH_CPU_FACTOR = 1.0
"""moe_paged_stash_buffer_size_factor_cpu: the same file, :47 (pinned host overflow; 0 disables it)."""


def sync_free_moe(model: ModelSpec, plan: ParallelPlan) -> bool:
    """Whether the plan runs MoE layers inside a whole-iteration graph on the static-budget HybridEP path (the
    settings above are then written, and their memory counted)."""
    return model.moe is not None and sync_free_path(plan)


def sync_free_path(plan: ParallelPlan) -> bool:
    """:func:`sync_free_moe` as the plan alone says it (a whole-iteration graph with the sync-free dispatcher, which
    only an MoE plan sets): for callers without the model, such as the launch environment."""
    return plan.cuda_graph == FULL_ITERATION_GRAPH and plan.moe_dispatcher == SYNC_FREE_DISPATCHER
