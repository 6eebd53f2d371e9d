"""How a plan's context-parallel ranks split for Megatron's hierarchical ``a2a+p2p`` exchange: the first level an
all-to-all among adjacent CP ranks, the second a ring across them (``--hierarchical-context-parallel-sizes A B``,
"every A adjacent gpus forms the first level of cp groups", megatron/core/model_parallel_config.py:103 and
megatron/training/arguments.py:580-585 at d98e8a6: the sizes' product must be cp; Transformer Engine
``attn_forward_func_with_cp`` takes ``cp_group = [a2a_cp_group, p2p_cp_group]``, context_parallel.py:5020).

autotune keeps the all-to-all inside a node's NVLink (adjacent CP ranks are ``tp`` apart in Megatron's rank order,
so ``tp x A`` GPUs must fit the node) and the ring across nodes: ``A`` is the largest power of two dividing cp with
``tp x A <= gpus_per_node``.
"""

from __future__ import annotations

__all__ = ["hierarchical_cp_sizes"]


def hierarchical_cp_sizes(cp: int, tp: int, gpus_per_node: int) -> tuple[int, int]:
    """(all-to-all size, ring size) of ``cp`` context-parallel ranks under a2a+p2p (module docstring)."""
    inner = 1
    while cp % (inner * 2) == 0 and tp * inner * 2 <= gpus_per_node:
        inner *= 2
    return inner, cp // inner
