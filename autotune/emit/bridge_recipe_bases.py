"""What a Megatron-Bridge library recipe sets before a file's overrides apply: the base its overrides are read on
(``autotune.job_bridge``, ``autotune.emit.megatron_bridge_lint``).

Bridge's run_recipe.py calls the recipe function, then merges the override file (or the command line's Hydra
overrides) onto the ConfigContainer it returns (``process_config_with_overrides``): whatever the file leaves unsaid is
the recipe's, not Megatron-core's default. An override file on ``llama3_70b_pretrain_32gpu_h100_bf16_config`` that
sets only ``train.global_batch_size`` trains at TP 4 x PP 4 x VPP 5 x CP 2 with sequence parallelism, the recipe's
(Bridge r0.6.0 recipes/llama/h100/llama3.py:734-745), not at TP 1.

The values are those megatron-bridge 0.6.2 builds for each recipe of ``autotune.emit.megatron_bridge_recipes.RECIPES``
(``autotune/data/bridge_recipe_bases.json``, the fields :data:`BASE_KEYS` names, written and checked by
tests/emit/bridge_recipe_bases.py against Bridge's own code).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

__all__ = ["BASE_KEYS", "BASES_FILE", "load_bases", "recipe_base", "with_base"]

BASES_FILE = Path(__file__).resolve().parents[1] / "data" / "bridge_recipe_bases.json"

BASE_KEYS: dict[str, list[str]] = {
    "model": ["tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
              "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size",
              "sequence_parallel", "seq_length", "num_moe_experts", "pipeline_model_parallel_layout",
              "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage", "recompute_granularity",
              "recompute_method", "recompute_num_layers", "recompute_modules", "cpu_offloading",
              "cpu_offloading_num_layers", "mtp_num_layers", "cuda_graph_impl", "cuda_graph_modules",
              "cuda_graph_scope", "fp8_dot_product_attention", "fp8_output_proj", "tp_comm_overlap",
              "overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "moe_token_dispatcher_type",
              "moe_flex_dispatcher_backend", "cp_comm_type", "moe_expert_capacity_factor",
              "moe_pad_expert_input_to_capacity"],
    "train": ["micro_batch_size", "global_batch_size"],
    "dataset": ["seq_length"],
    "ddp": ["use_distributed_optimizer", "overlap_grad_reduce", "grad_reduce_in_fp32", "use_megatron_fsdp",
            "data_parallel_sharding_strategy"],
    "comm_overlap": ["tp_comm_overlap", "overlap_moe_expert_parallel_comm", "delay_wgrad_compute"],
    "mixed_precision": ["bf16", "fp16", "fp8", "fp8_recipe", "fp4", "fp4_recipe", "grad_reduce_in_fp32",
                        "fp8_dot_product_attention"],
}
"""The ConfigContainer fields ``autotune.job_bridge.bridge_fields`` reads, by section."""


@lru_cache(maxsize=1)
def load_bases() -> dict[str, dict]:
    """{recipe function: {section: {key: value}, or a registered precision name for mixed_precision}}."""
    return json.loads(BASES_FILE.read_text())["recipes"]


def recipe_base(recipe: str) -> dict | None:
    """The sections recipe function ``recipe`` sets (None: not a recipe the file holds)."""
    return load_bases().get(recipe)


def with_base(base: dict, overrides: dict) -> dict:
    """``overrides`` merged onto ``base`` as Bridge merges a file onto its recipe: a mapping key by key, a value of the
    file's (a list, a precision name) in place of the recipe's."""
    out = dict(base)
    for key, value in overrides.items():
        below = out.get(key)
        out[key] = with_base(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
    return out
