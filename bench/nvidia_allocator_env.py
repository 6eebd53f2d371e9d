"""Which rows of bench/data/nvidia_recipes_blackwell.csv NVIDIA ran with ``PYTORCH_CUDA_ALLOC_CONF=
expandable_segments:True`` (``autotune estimate --expandable-segments``, ``MemorySettings.expandable_segments``).

Read from Megatron-Bridge's performance launcher at the release that first documents each row's container (the
settings file's ``read_at``; bench/nvidia_recipe_settings.py). Before v0.5 only the Llama 3.1 405B rule is read
here (the launcher sets the variable for a few other workloads too: DeepSeek-V3, Qwen3-Next, Llama 3 70B fine-tuning,
which this table does not claim, so those rows keep the full fragmentation reserve); v0.5.0's launcher sets it for
every run, whatever the model (scripts/performance/utils/executors.py PERF_ENV_VARS), so every row read at v0.5 has
it.

    release   GPUs             precisions (the recipe's compute_dtype)       where
    v0.2.x    GB200            fp8_cs, fp8_mx                                 perf_plugins.py@717c62de401b:250-252
    v0.3.x    GB200            fp8_cs, fp8_mx                                 perf_plugins.py@21b02e0cfb2f:262-269
    v0.4.x    GB200, GB300     fp8_cs, fp8_mx; nvfp4 on GB200                 perf_plugins.py@c810129341a8:265-273
    v0.5.0    every run                                                       utils/executors.py@fcbb6031103d:48
    v0.6.0    the 405B recipes' own env_vars (perf_recipes/llama/gb200/llama31.py@067f987df03b:58-369, one per
              recipe, e.g. :278 in llama31_405b_pretrain_256gpu_gb200_fp8cs_config)
"""

from __future__ import annotations

RULES: dict[str, tuple[tuple[str, ...], dict[str, tuple[str, ...]], str]] = {
    "v0.2": (("DGX-GB200",), {"DGX-GB200": ("fp8_cs", "fp8_mx")},
             "Megatron-Bridge@717c62de401b scripts/performance/perf_plugins.py:250-252"),
    "v0.3": (("DGX-GB200",), {"DGX-GB200": ("fp8_cs", "fp8_mx")},
             "Megatron-Bridge@21b02e0cfb2f scripts/performance/perf_plugins.py:262-269"),
    "v0.4": (("DGX-GB200", "DGX-GB300"), {"DGX-GB200": ("fp8_cs", "fp8_mx", "nvfp4"),
                                          "DGX-GB300": ("fp8_cs", "fp8_mx")},
             "Megatron-Bridge@c810129341a8 scripts/performance/perf_plugins.py:265-273"),
    "v0.5": (("DGX-GB200", "DGX-GB300", "DGX-B200", "DGX-B300"), {},
             "Megatron-Bridge@fcbb6031103d scripts/performance/utils/executors.py:48"),
    "v0.6": (("DGX-GB200", "DGX-GB300"), {},
             "Megatron-Bridge@067f987df03b src/megatron/bridge/perf_recipes/llama/gb200/llama31.py:278"),
}
"""Release prefix -> (systems, precisions per system where the rule names them (empty: every precision), source)."""

FAMILY = "LLAMA3.1_405B"
EVERY_RUN = ("v0.5",)
"""Releases whose launcher sets the variable for every workload (the family does not matter)."""


def compute_dtype(precision: str, recipe: str = "") -> str:
    """The launcher's compute_dtype of a row: from its recipe's name where one matched (``..._FP8_CS_V2``), else the
    table's precision column (the 405B "FP8" rows are the ``FP8_CS`` recipes wherever a recipe matched); "" where the
    table does not state it."""
    text = (recipe or precision).upper().replace("-", "_")
    if not recipe and text.startswith("NOT STATED"):
        return ""  # 25.09's table leaves the precision out: no rule is claimed for it
    if "NVFP4" in text:
        return "nvfp4"
    if "MX" in text:
        return "fp8_mx"
    if "FP8" in text:
        return "fp8_cs"
    return "bf16"


def expandable_segments_source(family: str, system: str, precision: str, read_at: str, recipe: str = "") -> str:
    """Where the launcher sets expandable segments for this row ("" where this table does not say it does)."""
    if not read_at:
        return ""
    release = ".".join(read_at.split(".")[:2])
    rule = RULES.get(release)
    if rule is None or (family != FAMILY and release not in EVERY_RUN):
        return ""
    systems, dtypes, where = rule
    if system not in systems:
        return ""
    if dtypes and compute_dtype(precision, recipe) not in dtypes.get(system, ()):
        return ""
    return where
