"""The rows of NVIDIA's Megatron-Bridge performance table (bench/data/nvidia_recipes_blackwell.csv) and what its
columns say: model family and variant, GPU preset, precision, counts; which model preset stands for a family. Read
by bench/accuracy_nvidia_recipes.py and the benches beside it."""

from __future__ import annotations

import csv
from pathlib import Path

from autotune.specs.presets import model_preset_names

__all__ = ["DATA", "SYSTEM_PRESETS", "MODEL_PRESETS", "NOT_MODELLED", "load_rows", "family_of", "count",
           "precision_of", "precision_tag", "model_preset"]

DATA = Path(__file__).resolve().parent / "data" / "nvidia_recipes_blackwell.csv"

SYSTEM_PRESETS = {"DGX-B200": "b200", "DGX-B300": "b300", "DGX-GB200": "gb200", "DGX-GB300": "gb300"}
"""The table's system names and the GPU presets of autotune/presets/gpus.yaml."""

MODEL_PRESETS = {
    "LLAMA3_8B": ("llama3-8b",),
    "LLAMA3_70B": ("llama3-70b",),
    "LLAMA3.1_405B": ("llama3.1-405b", "llama3-405b"),  # 405B exists only as Llama 3.1 (the preset's source)
    "DeepSeekV3": ("deepseek-v3",),
    "Qwen3_30B_a3B": ("qwen3-30b-a3b",),
    "Qwen3_235B_a22B": ("qwen3-235b-a22b",),
    "GPT OSS 120B": ("gpt-oss-120b",),
    "Kimi_K2": ("kimi-k2", "kimi-k2-base", "kimi-k2-instruct"),
}
"""Family (the table's model name without its parenthesised variant) -> preset names to look for, first found wins.
Presets are looked up when the bench runs: a family whose preset is not there yet is reported as such."""

NOT_MODELLED = {
    "Nemotron_3": "hybrid Mamba-Transformer (Mamba-2 and attention layers): ModelSpec has transformer layers only",
    "DeepSeekV4": "DeepSeek-V4: its attention and MoE variants have no model spec here",
}


def load_rows(path: Path = DATA) -> list[dict]:
    """The CSV's rows (lines starting with # are comments), in file order."""
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if not ln.startswith("#")]
    return list(csv.DictReader(lines))


def family_of(model: str) -> tuple[str, str]:
    """("LLAMA3_70B", "") or ("DeepSeekV3", "tokendrop") from the table's model name."""
    base, _, variant = model.partition("(")
    return base.strip(), variant.rstrip(")").strip()


def count(value: str, default: int = 1) -> int:
    """An integer column; empty and "n/a" are the default (not used)."""
    v = str(value).strip()
    return default if v in ("", "n/a") else int(v)


def precision_of(text: str) -> tuple[str | None, str]:
    """(--precision value or None, why not) of the table's precision column."""
    t = text.upper()
    if t.startswith("BF16"):
        return "bf16", ""
    if t == "NVFP4":  # Transformer Engine NVFP4BlockScaling (Bridge bf16_with_nvfp4_mixed): --precision fp4
        return "fp4", ""
    if "FP4" in t:
        return None, f"{text}: the tool's FP4 precision is NVFP4 only"
    if "FP8" in t or t.startswith("NOT STATED"):  # the 25.09 table: both columns are FP8 granularities
        return "fp8", ""
    return None, f"precision {text!r} not understood"


def precision_tag(text: str) -> tuple[str, ...]:
    """The recipe functions' precision tags a precision column names (the settings build matches recipes by them,
    bench/nvidia_recipe_settings_build.py; the estimate picks its FP8 recipe by them)."""
    t = text.upper()
    if t.startswith("BF16"):
        return ("bf16",)
    if t.startswith("FP8-CS"):
        return ("fp8cs",)
    if t in ("MXFP8", "FP8-MX"):
        return ("fp8mx",)
    if t == "FP8":  # the 26.x tables' Llama "FP8" column: the recipes' FP8 current-scaling functions
        return ("fp8cs",)
    if t == "NVFP4":  # the recipes' *_nvfp4_config functions (v0.3+ workload variants: <MODEL>_..._NVFP4_...)
        return ("nvfp4",)
    return ()


def model_preset(family: str) -> tuple[str | None, str]:
    """(preset name, why none) of a family; presets are looked up now."""
    for prefix, why in NOT_MODELLED.items():
        if family.startswith(prefix):
            return None, why
    names = MODEL_PRESETS.get(family)
    if names is None:
        return None, f"no preset maps to {family!r}"
    found = [n for n in names if n in model_preset_names()]
    return (found[0], "") if found else (None, f"no model preset {' / '.join(names)} yet")
