"""The settings of the sync-free MoE path under a whole-iteration CUDA graph (``autotune.specs.sync_free_moe``), as
Megatron-LM arguments and as Megatron-Bridge TransformerConfig keys.

Megatron-core's checks they meet (core_v0.19.0 ``megatron/core/transformer/transformer_config.py``): the rank
capacity factor only with the HybridEP (or NCCL-EP) flex backend and, with HybridEP, the Transformer Engine op
fuser (:1692-1706); the paged stash only with the rank capacity factor (:1904-1911). The flags exist from
core 0.18 (``megatron_flags_core_v0.18.json``, ``megatron_flags_core_v0.19.json``); an older release has no
static-budget path, so a full-iteration graph cannot capture the MoE layers there.
"""

from __future__ import annotations

from autotune.emit.megatron_flags import megatron_flag_table
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.sync_free_moe import (
    PAGED_STASH_CPU_FACTOR,
    PAGED_STASH_CUDA_FACTOR,
    RANK_CAPACITY_FACTOR,
    sync_free_moe,
    sync_free_path,
)

__all__ = ["FUSED_GROUPED_MLP_ENV", "sync_free_moe_args", "sync_free_moe_config", "sync_free_moe_env"]

FUSED_GROUPED_MLP_ENV = {"NVTE_CUTEDSL_FUSED_GROUPED_MLP": "1"}
"""The environment the op fuser's experts need: with ``use_transformer_engine_op_fuser`` Megatron-core asserts
``_is_fused_impl_supported()`` (megatron/core/transformer/moe/experts.py:287-290 at d98e8a64), which is False for
gated experts unless ``NVTE_CUTEDSL_FUSED_GROUPED_MLP`` is set (:454-455; Transformer Engine d0067d0 reads the same
variable, transformer_engine/pytorch/ops/fused/grouped_mlp.py:946-947). NVIDIA's full-iteration recipes export it
(Megatron-Bridge 067f987 src/megatron/bridge/perf_recipes/gpt_oss/gb300/gpt_oss.py:251)."""


def sync_free_moe_config(model: ModelSpec, plan: ParallelPlan) -> dict:
    """TransformerConfig fields of the path (Megatron-Bridge 067f987 perf_recipes/qwen/common.py:44-47, :52), none
    where the plan does not take it."""
    if not sync_free_moe(model, plan):
        return {}
    return {"moe_expert_rank_capacity_factor": RANK_CAPACITY_FACTOR, "moe_paged_stash": True,
            "moe_paged_stash_buffer_size_factor_cuda": PAGED_STASH_CUDA_FACTOR,
            "moe_paged_stash_buffer_size_factor_cpu": PAGED_STASH_CPU_FACTOR,
            "use_transformer_engine_op_fuser": True}


def sync_free_moe_env(plan: ParallelPlan) -> dict[str, str]:
    """Environment variables the path needs (:data:`FUSED_GROUPED_MLP_ENV`), none off it. Read from the plan alone:
    the full-iteration graph with the sync-free dispatcher is an MoE plan's (``sync_free_path``)."""
    return dict(FUSED_GROUPED_MLP_ENV) if sync_free_path(plan) else {}


def sync_free_moe_args(model: ModelSpec, plan: ParallelPlan, release: str | None, problems: list[str]) -> list[str]:
    """The same as Megatron-LM arguments (dest = the field's name); one problem, and none of them, where the release
    lacks them (the release's flag table: core 0.18 on)."""
    config = sync_free_moe_config(model, plan)
    flags = {"--" + name.replace("_", "-"): value for name, value in config.items()}
    missing = [flag for flag in flags if flag not in megatron_flag_table(release)]
    if missing:
        problems.append(f"{model.name}'s MoE layers inside a full-iteration CUDA graph need HybridEP's static rank "
                        f"budget and paged stash ({', '.join(missing)}), which Megatron-core "
                        f"{release or 'newest'} does not have (core 0.18 on): use --engine-version megatron=0.19, or "
                        "--cuda-graph transformer_engine")
        return []
    args: list[str] = []
    for flag, value in flags.items():
        args += [flag] if value is True else [flag, f"{value:g}"]
    return args
