"""A Hugging Face config.json of a model autotune has a preset for gets the preset's engine files: torchtitan's
registry flavor (0.2 TOML), its 0.3 recipe, and Megatron-Bridge's library recipe. The model read from the file is
named as the file says (``meta-llama/Meta-Llama-3-8B``), so a lookup by preset name alone found nothing: the
TOML was refused ("no flavor there that autotune knows") for the user's own Llama 3 8B."""
from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.emit.megatron_bridge import bridge_recipe
from autotune.emit.torchtitan import TORCHTITAN_FLAVORS, torchtitan_toml
from autotune.emit.torchtitan_module import torchtitan_module
from autotune.errors import InputError
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset, preset_matching

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
CLUSTER = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)


def _plan(**kw) -> ParallelPlan:
    return ParallelPlan(**({"tp": 1, "pp": 1, "dp": 8, "zero_stage": 3, "micro_batch_size": 1, "global_batch_size": 8,
                            "seq_len": 2048, "precision": "bf16", "engine": "fsdp"} | kw))


@pytest.mark.parametrize("preset", ["llama3-8b", "llama3-70b", "qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v3"])
def test_config_json_is_the_preset(preset):
    model = load_model(str(HF / preset / "config.json"))
    assert model.name != preset  # named as the file says
    assert preset_matching(model, tuple(TORCHTITAN_FLAVORS)) == preset


def test_no_preset_for_another_shape():
    """Mixtral has no torchtitan flavor; a Llama 3 8B with one layer fewer is no preset (under another name)."""
    mixtral = load_model(str(HF / "mixtral-8x7b" / "config.json"))
    assert preset_matching(mixtral, tuple(TORCHTITAN_FLAVORS)) is None
    llama = load_model(str(HF / "llama3-8b" / "config.json"))
    assert preset_matching(replace(llama, num_layers=31), tuple(TORCHTITAN_FLAVORS)) is None


def test_torchtitan_toml_from_config_json():
    model = load_model(str(HF / "llama3-8b" / "config.json"))
    data = tomllib.loads(torchtitan_toml(model, CLUSTER, _plan()))
    assert (data["model"]["name"], data["model"]["flavor"]) == ("llama3", "8B")
    with pytest.raises(InputError, match="no flavor there"):
        torchtitan_toml(replace(model, num_layers=30), CLUSTER, _plan())


def test_torchtitan_03_module_from_config_json():
    model = load_model(str(HF / "qwen3-30b-a3b" / "config.json"))
    text = torchtitan_module(model, CLUSTER, _plan(ep=8))
    preset = torchtitan_module(load_model_preset("qwen3-30b-a3b"), CLUSTER, _plan(ep=8))
    assert " ".join(text.split()) == " ".join(preset.replace("qwen3-30b-a3b on", "Qwen/Qwen3-30B-A3B on").split())


def test_bridge_library_recipe_from_config_json():
    model = load_model(str(HF / "llama3-70b" / "config.json"))
    assert bridge_recipe(model) == bridge_recipe(load_model_preset("llama3-70b"))
    assert bridge_recipe(model).hf_model == "meta-llama/Meta-Llama-3-70B"
    assert bridge_recipe(replace(model, num_layers=79)).hf_model is None  # another shape: the generic recipe
