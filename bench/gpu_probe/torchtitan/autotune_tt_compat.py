"""Compat back-fills for running torchtitan 0.3.0 on torch < 2.13 (applied on import).

torchtitan 0.3.0 is written against torch nightly (>= 2.13). On an older torch (the GPU box
has 2.11) three things it touches on the single-GPU llama3 path are missing; this module
back-fills them, only where absent:
  1. torch.distributed.set_timeout (called after step 1)      -> distributed_c10d._set_pg_timeout
  2. create_block_mask(..., separate_full_blocks=) (flex mask) -> dropped (True == old behaviour)
  3. torch.distributed.fsdp.DataParallelMeshDims (import-time) -> stub. torchtitan only passes
     fully_shard(dp_mesh_dims=) for a >1-rank full_dtensor/spmd_types mesh; old torch then
     fails with TypeError (multi-GPU would need torch >= 2.13 or spmd_backend partial_dtensor).
"""
import dataclasses
import inspect
import sys

import torch

applied = []


def _patch():
    import torch.distributed as dist

    if not hasattr(dist, "set_timeout"):
        from torch.distributed.distributed_c10d import _set_pg_timeout

        def set_timeout(timeout, group=None):
            _set_pg_timeout(timeout, group)

        dist.set_timeout = set_timeout
        applied.append("torch.distributed.set_timeout")

    import torch.nn.attention.flex_attention as fa

    if "separate_full_blocks" not in inspect.signature(fa.create_block_mask).parameters:
        _orig_cbm = fa.create_block_mask

        def create_block_mask(*args, separate_full_blocks=True, **kwargs):
            # old torch always separates full blocks; False only matters in batch-invariant mode
            return _orig_cbm(*args, **kwargs)

        fa.create_block_mask = create_block_mask
        applied.append("create_block_mask(separate_full_blocks=)")

    import torch.distributed.fsdp as fsdp

    if not hasattr(fsdp, "DataParallelMeshDims"):

        @dataclasses.dataclass
        class DataParallelMeshDims:  # stub: only the name/type is needed at import time
            shard: object = None
            replicate: object = None

        fsdp.DataParallelMeshDims = DataParallelMeshDims
        applied.append("torch.distributed.fsdp.DataParallelMeshDims")


_patch()
print(f"[autotune_tt_compat] torch {torch.__version__}; compat shims: {applied or 'none needed'}",
      file=sys.stderr, flush=True)
