"""Which rows of bench/data/nvidia_recipes_blackwell.csv ran Transformer Engine's cross entropy as their loss
(``autotune estimate --cross-entropy te``, ``MemorySettings.te_cross_entropy``): the 16-bit logits kept with the
gradient written into them, not an fp32 softmax.

Megatron-core 0.19 sends the loss to TE's ``parallel_cross_entropy`` when ``cross_entropy_loss_fusion`` is on and
``cross_entropy_fusion_impl`` is "te" (models/common/language_module/language_module.py:167-190). Megatron-Bridge's
model providers turn the fusion on (src/megatron/bridge/models/gpt_provider.py:196 at c810129341a8, :180 at
1c43b39285a4); its performance launcher sets the impl to "te" for every run of releases v0.2-v0.5:

    release   where (Megatron-Bridge, scripts/performance/)
    v0.2.x    utils/helpers.py@1c43b39285a4:108
    v0.3.x    utils/overrides.py@21b02e0cfb2f:64
    v0.4.0    utils/overrides.py@0fbfe7d3e970:66
    v0.4.2    utils/overrides.py@c810129341a8:67-68
    v0.5.0    utils/overrides.py@v0.5.0:69-70

Pre-training rows only: the PEFT and SFT recipes turn the fusion off for some models (e.g. v0.4.2
src/megatron/bridge/recipes/llama/llama3.py:2041 in ``llama32_1b_peft_config``), which these rows do not tell apart.
The launcher's override comes after the recipe, so it wins over a recipe's own "native" (v0.4-v0.5 base recipes set
one for GPT-OSS, e.g. recipes/gpt_oss/gpt_oss.py:225 at c810129341a8). From v0.6.0 the launcher sets nothing and
each flat recipe picks its impl through ``_benchmark_common(cfg, cross_entropy_impl="te")`` (perf_recipes/_common.py:
30, 68 at v0.6.0; "native" in e.g. perf_recipes/deepseek/gb200/deepseek_v4.py:61), which the settings build records
per row (``cross_entropy_fusion_impl`` in bench/data/nvidia_recipe_settings.csv, with its line).
"""

from __future__ import annotations

RELEASES = {
    "v0.2": "Megatron-Bridge@1c43b39285a4 scripts/performance/utils/helpers.py:108",
    "v0.3": "Megatron-Bridge@21b02e0cfb2f scripts/performance/utils/overrides.py:64",
    "v0.4.0": "Megatron-Bridge@0fbfe7d3e970 scripts/performance/utils/overrides.py:66",
    "v0.4": "Megatron-Bridge@c810129341a8 scripts/performance/utils/overrides.py:67-68",
    "v0.5": "Megatron-Bridge@v0.5.0 scripts/performance/utils/overrides.py:69-70",
}
"""Release (exactly, else its major.minor prefix) -> where its launcher sets ``cross_entropy_fusion_impl = "te"``."""


def te_cross_entropy_source(task: str, read_at: str, recipe_impl: str | None = None, recipe_where: str = "") -> str:
    """Where this row's loss is made TE's cross entropy ("" where neither the launcher nor the recipe says so): the
    v0.2-v0.5 launcher for every pre-training row, else the row's recipe (``recipe_impl`` "te", set at
    ``recipe_where``)."""
    if not read_at or not task.startswith("Pre-Training"):
        return ""
    launcher = RELEASES.get(read_at) or RELEASES.get(".".join(read_at.split(".")[:2]), "")
    return launcher or (recipe_where if recipe_impl == "te" else "")
