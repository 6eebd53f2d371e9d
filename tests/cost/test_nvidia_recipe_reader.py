"""The reader of NVIDIA's Megatron-Bridge recipes (bench/nvidia_recipe_settings_build.py): a recipe's base is the
function its own file imports, not another function of the same name elsewhere in the trees."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import nvidia_recipe_settings_build as build  # noqa: E402

# v0.6.0's layout in small: a perf recipe for H100 and the base recipe share a name; the Blackwell perf recipe starts
# from the base, reached through a re-export with an alias (recipes/qwen/qwen3_moe.py) and a shared helper module.
SOURCES = {
    "src/megatron/bridge/perf_recipes/qwen/h100/qwen3_moe.py": (
        "from megatron.bridge.perf_recipes.qwen.common import qwen3_235b_a22b_pretrain_config\n"
        "def qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config():\n"
        "    cfg = qwen3_235b_a22b_pretrain_config()\n"
        "    cfg.model.recompute_granularity = 'selective'\n"
        "    _enable_overlap_param_gather_with_optimizer_step(cfg)\n"
        "    return cfg\n"),
    "src/megatron/bridge/perf_recipes/qwen/common.py": (
        "from megatron.bridge.recipes.qwen.qwen3_moe import qwen3_235b_a22b_pretrain_config\n"),
    "src/megatron/bridge/perf_recipes/qwen/gb200/qwen3_moe.py": (
        "from megatron.bridge.perf_recipes.qwen.common import qwen3_235b_a22b_pretrain_config\n"
        "def qwen3_235b_a22b_pretrain_256gpu_gb200_fp8mx_config():\n"
        "    cfg = qwen3_235b_a22b_pretrain_config()\n"
        "    cfg.model.pipeline_model_parallel_size = 8\n"
        "    return cfg\n"),
    "src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py": (
        "def qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config():\n"
        "    cfg = _pretrain_common()\n"
        "    cfg.model.pipeline_model_parallel_size = 16\n"
        "    cfg.model.account_for_loss_in_pipeline_split = True\n"
        "    cfg.model.recompute_granularity = None\n"
        "    return cfg\n"),
    "src/megatron/bridge/recipes/qwen/qwen3_moe.py": (
        "from megatron.bridge.recipes.qwen.h100.qwen3_moe import (\n"
        "    qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config as qwen3_235b_a22b_pretrain_config,\n"
        ")\n"),
}


def test_a_recipes_base_is_the_function_its_file_imports_not_a_namesake():
    index = build.index_sources(SOURCES)
    got = build.settings_of("qwen3_235b_a22b_pretrain_256gpu_gb200_fp8mx_config", index)
    assert got["model.pipeline_model_parallel_size"].value == "8"  # its own setting last
    assert got["model.account_for_loss_in_pipeline_split"].value == "True"  # the base recipe's
    assert got["model.recompute_granularity"].value == "None"
    assert got["model.recompute_granularity"].where == "src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py#L5"
    assert "optimizer.overlap_param_gather_with_optimizer_step" not in got  # the H100 perf recipe's, not its base
    # the H100 perf recipe itself: the base's settings, then its own
    h100 = build.settings_of("qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config", index,
                             caller="src/megatron/bridge/perf_recipes/qwen/h100/qwen3_moe.py")
    assert h100["model.recompute_granularity"].value == "selective"
    assert h100["optimizer.overlap_param_gather_with_optimizer_step"].value == "True"


def test_relative_imports_resolve_to_their_package():
    sources = {"scripts/performance/configs/qwen/helpers.py": "def base():\n    cfg = x()\n    cfg.model.a = 1\n",
               "scripts/performance/configs/qwen/run.py": ("from .helpers import base as start\n"
                                                           "def run():\n    cfg = start()\n    cfg.model.b = 2\n")}
    got = build.settings_of("run", build.index_sources(sources))
    assert {k: v.value for k, v in got.items()} == {"model.a": "1", "model.b": "2"}


def test_no_blackwell_recipe_setting_is_read_from_an_h100_perf_recipe():
    # A Blackwell perf recipe starts from the base recipe (src/megatron/bridge/recipes/...), never from an H100 perf
    # recipe; a setting read from perf_recipes/*/h100/ for a Blackwell row is a namesake read by mistake.
    lines = [ln for ln in build.OUT.read_text(encoding="utf-8").splitlines() if not ln.startswith("#")]
    wrong = [(r["recipe"], r["setting"], r["where"]) for r in csv.DictReader(lines)
             if "/perf_recipes/" in r["where"] and "/h100/" in r["where"]]
    assert not wrong, wrong[:3]
