"""The LoRA rows of bench/data/nvidia_recipes_blackwell.csv ("LoRA Performance"): the fine-tuning settings of
NVIDIA's Megatron-Bridge recipes that produced them, as `autotune estimate` flags.

The rows are container 26.06 (Megatron-Bridge v0.5.0, the release bench/data/nvidia_recipe_settings.csv reads
26.06 rows at; mirrored at NVIDIA-NeMo/Megatron-Bridge). What their recipes set, with the lines that set it:

- LoRA rank 16, alpha 32: src/megatron/bridge/recipes/llama/llama3.py:2474-2475 at v0.5.0 (``llama3_70b_peft_config``,
  "70B uses dim=16, alpha=32"; HEAD 067f987: recipes/llama/h100/llama3.py ``llama3_70b_peft_8gpu_h100_bf16_config``);
- adapters on linear_qkv only: scripts/performance/configs/llama/llama3_llm_finetune.py:219 (GB300) and :260 (GB200)
  at v0.5.0 (``cfg.peft.target_modules = ["linear_qkv"]``; HEAD: perf_recipes/llama/gb200/llama3.py:660);
- no activation recompute: recipes/llama/llama3.py:2533 at v0.5.0 (``recompute_granularity = None``);
- Transformer Engine CUDA graphs of the MLP: scripts/performance/configs/llama/llama3_workload_base_configs.py:587-588
  (GB300) and :631-632 (GB200 FP8) at v0.5.0;
- packed sequences padded to the full 4096 (``pad_to_max_length``, llama3_llm_finetune.py:225 / :256): every
  micro-batch is a full sequence, as the row's seq column says.
"""

from __future__ import annotations

from nvidia_recipe_settings import Flags

__all__ = ["LORA_RECIPES", "lora_flags"]

LORA_RECIPES: dict[str, tuple[list[str], list[str]]] = {
    "LLAMA3_70B": (["--peft", "lora", "--lora-rank", "16", "--lora-alpha", "32", "--lora-targets", "linear_qkv"],
                   ["--recompute", "none", "--cuda-graph", "transformer_engine", "--cuda-graph-scope", "mlp"]),
}
"""Family -> (the LoRA flags, the recipe's run-setting flags)."""


def lora_flags(family: str) -> tuple[list[str], Flags] | None:
    """(LoRA flags for the plan, the recipe's run settings as the bench's Flags) of a family's LoRA recipe; None
    where none was read."""
    if family not in LORA_RECIPES:
        return None
    peft, settings = LORA_RECIPES[family]
    return peft, Flags(argv=list(settings), recompute_set=True,
                       applied=["recompute none", "CUDA graphs transformer_engine", "LoRA r16 on linear_qkv"])
