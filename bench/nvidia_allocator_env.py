"""Which rows of bench/data/nvidia_recipes_blackwell.csv NVIDIA ran with ``PYTORCH_CUDA_ALLOC_CONF=
expandable_segments:True`` (``autotune estimate --expandable-segments``, ``MemorySettings.expandable_segments``).

Read from Megatron-Bridge's performance launcher at the release that first documents each row's container (the
settings file's ``read_at``; bench/nvidia_recipe_settings.py). Before v0.5 the Llama 3.1 405B rule below, and v0.4's
DeepSeek-V3 and Llama 3 70B MXFP8 rules (``OTHER_FAMILIES``; Qwen3-Next's and Nemotron's are for rows the tool does
not estimate); v0.5.0's launcher sets it for every run, whatever the model (scripts/performance/utils/executors.py
PERF_ENV_VARS), so every row read at v0.5 has it.

    release   GPUs             precisions (the recipe's compute_dtype)       where
    v0.2.x    GB200            fp8_cs, fp8_mx                                 perf_plugins.py@717c62de401b:250-252
    v0.3.x    GB200            fp8_cs, fp8_mx                                 perf_plugins.py@21b02e0cfb2f:262-269
    v0.4.0    GB200, GB300     fp8_cs, fp8_mx                                 perf_plugins.py@0fbfe7d3e970:262-270
    v0.4.2    GB200, GB300     fp8_cs, fp8_mx; nvfp4 on GB200                 perf_plugins.py@c810129341a8:265-273
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
    "v0.4.0": (("DGX-GB200", "DGX-GB300"), {"DGX-GB200": ("fp8_cs", "fp8_mx"), "DGX-GB300": ("fp8_cs", "fp8_mx")},
               "Megatron-Bridge@0fbfe7d3e970 scripts/performance/perf_plugins.py:262-270"),
    "v0.4": (("DGX-GB200", "DGX-GB300"), {"DGX-GB200": ("fp8_cs", "fp8_mx", "nvfp4"),
                                          "DGX-GB300": ("fp8_cs", "fp8_mx")},
             "Megatron-Bridge@c810129341a8 scripts/performance/perf_plugins.py:265-273"),
    "v0.5": (("DGX-GB200", "DGX-GB300", "DGX-B200", "DGX-B300"), {},
             "Megatron-Bridge@fcbb6031103d scripts/performance/utils/executors.py:48"),
    "v0.6": (("DGX-GB200", "DGX-GB300"), {},
             "Megatron-Bridge@067f987df03b src/megatron/bridge/perf_recipes/llama/gb200/llama31.py:278"),
}
"""Release (exactly, else its major.minor prefix) -> (systems, precisions per system where the rule names them
(empty: every precision), source)."""

FAMILY = "LLAMA3.1_405B"

OTHER_FAMILIES: dict[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...], str]] = {
    # v0.4's launcher, beside the 405B rule: DeepSeek-V3 pre-training on GB200 / B200 at every precision (:274-282);
    # Llama 3 70B MXFP8 on GB300, pre-training (:318-320) and fine-tuning (:313-317) alike (its FP8 fine-tuning
    # rule on GB200 is not claimed: the rows do not say which task ran)
    ("v0.4.2", "DeepSeekV3"): (("DGX-GB200", "DGX-B200"), (),
                               "Megatron-Bridge@c810129341a8 scripts/performance/perf_plugins.py:274-282"),
    ("v0.4.2", "LLAMA3_70B"): (("DGX-GB300",), ("fp8_mx",),
                               "Megatron-Bridge@c810129341a8 scripts/performance/perf_plugins.py:312-320"),
    # v0.4.0 (0fbfe7d3e970): DeepSeek-V3 on GB200 only (:271-279); Llama 3 70B only for fine-tuning on GB300 / H100
    # (:294-299), which the rows do not tell apart from pre-training: not claimed
    ("v0.4.0", "DeepSeekV3"): (("DGX-GB200",), (),
                               "Megatron-Bridge@0fbfe7d3e970 scripts/performance/perf_plugins.py:271-279"),
}
"""(release prefix, family) -> (systems, precisions (empty: every one), source) where a release's launcher sets the
variable for a family other than the 405B's."""
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
    if (read_at, family) in OTHER_FAMILIES:
        systems, dtypes_any, where = OTHER_FAMILIES[(read_at, family)]
        if system in systems and (not dtypes_any or compute_dtype(precision, recipe) in dtypes_any):
            return where
        return ""
    rule = RULES.get(read_at) or RULES.get(release)
    if rule is None or (family != FAMILY and release not in EVERY_RUN):
        return ""
    systems, dtypes, where = rule
    if system not in systems:
        return ""
    if dtypes and compute_dtype(precision, recipe) not in dtypes.get(system, ()):
        return ""
    return where
