"""accelerate's FSDP2 YAML wraps the user's transformer block class (emit --wrap-class, LaunchOptions.wrap_class),
by default the decoder layer transformers builds for a Hugging Face config.json's architecture; the DeepSpeed
YAML says how its relative deepspeed_config_file is found (issue 21)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.api import make_plan
from autotune.emit.accelerate import (
    DEFAULT_LAYER_CLS,
    HF_DECODER_LAYERS,
    accelerate_deepspeed_yaml,
    accelerate_fsdp_yaml,
    hf_decoder_layer,
)
from autotune.emit.options import EmitOptions, LaunchOptions
from autotune.errors import InputError
from autotune.specs.loading import load_cluster, load_model

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
MODEL = load_model("tiny-llama")


def _fsdp_plan():
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=2)
    return cluster, make_plan(MODEL, cluster, seq_len=64, global_batch_size=4, engine="fsdp", zero_stage=3)


def _emit(tmp: Path, *flags: str) -> Path:
    out = tmp / "bundle"
    proc = subprocess.run([sys.executable, "-m", "autotune", "emit", "--engine", "fsdp", "--zero", "3",
                           "--out", str(out), *flags], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _wrapped(bundle: Path) -> str:
    return yaml.safe_load((bundle / "accelerate_fsdp.yaml").read_text())["fsdp_config"][
        "fsdp_transformer_layer_cls_to_wrap"]


def test_fsdp2_yaml_takes_the_users_layer_class():
    cluster, plan = _fsdp_plan()
    options = EmitOptions(launch=LaunchOptions(wrap_class="PairBlock", script="/abs/train.py"))
    text = accelerate_fsdp_yaml(MODEL, cluster, plan, options)
    assert yaml.safe_load(text)["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "PairBlock"
    # Without one, a user's script is told that Block is autotune's own class and where to set theirs.
    text = accelerate_fsdp_yaml(MODEL, cluster, plan, EmitOptions(launch=LaunchOptions(script="/abs/train.py")))
    assert yaml.safe_load(text)["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == DEFAULT_LAYER_CLS
    assert "--wrap-class" in text


def test_wrap_class_must_be_class_names():
    with pytest.raises(InputError, match="wrap_class"):
        EmitOptions(launch=LaunchOptions(wrap_class="my block; rm"))
    assert EmitOptions(launch=LaunchOptions(wrap_class="ABlock,BBlock")).launch.wrap_class == "ABlock,BBlock"


@pytest.mark.slow
def test_emit_wrap_class_flag(tmp_path):
    bundle = _emit(tmp_path, "--model", "tiny-llama", "--gpu", "h100-sxm-80gb", "--num-gpus", "2", "--seq-len", "64",
                   "--global-batch", "4", "--wrap-class", "PairBlock", "--script", "train.py")
    assert _wrapped(bundle) == "PairBlock"
    assert "PairBlock" in (bundle / "plan.md").read_text()


@pytest.mark.parametrize("fixture,layer", [("llama3-8b", "LlamaDecoderLayer"), ("qwen2.5-72b", "Qwen2DecoderLayer")])
@pytest.mark.slow
def test_emit_defaults_the_wrap_class_from_a_hf_config(tmp_path, fixture, layer):
    bundle = _emit(tmp_path, "--model", str(HF / fixture / "config.json"), "--gpu", "h100-sxm-80gb", "--num-gpus",
                   "64", "--seq-len", "4096", "--global-batch", "64", "--recompute", "full")
    assert _wrapped(bundle) == layer


@pytest.mark.slow
def test_emit_presets_keep_the_builtin_block(tmp_path):
    bundle = _emit(tmp_path, "--model", "tiny-llama", "--gpu", "h100-sxm-80gb", "--num-gpus", "2", "--seq-len", "64",
                   "--global-batch", "4")
    assert _wrapped(bundle) == DEFAULT_LAYER_CLS


def test_hf_decoder_layers_are_transformers_own():
    transformers = pytest.importorskip("transformers")
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from autotune.specs.hf_config import SUPPORTED_MODEL_TYPES

    for model_type, layer in HF_DECODER_LAYERS.items():
        cls = AutoModelForCausalLM._model_mapping[type(AutoConfig.for_model(model_type))]
        assert cls._no_split_modules == [layer], (model_type, transformers.__version__)
    # every config.json autotune reads whose model transformers builds has its layer here (a Qwen3 config.json's
    # accelerate FSDP file used to wrap autotune's own Block, which a Qwen3ForCausalLM does not hold)
    built = {t for t in SUPPORTED_MODEL_TYPES if t in CONFIG_MAPPING_NAMES
             and type(AutoConfig.for_model(t)) in AutoModelForCausalLM._model_mapping}
    assert built <= set(HF_DECODER_LAYERS), sorted(built - set(HF_DECODER_LAYERS))
    assert set(SUPPORTED_MODEL_TYPES) - built == {"kimi_k2", "RefinedWeb", "RefinedWebModel"}
    assert hf_decoder_layer({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}) == "LlamaDecoderLayer"
    assert hf_decoder_layer({"model_type": "RefinedWeb"}) is None
    kimi = json.loads((Path(__file__).resolve().parents[1] / "fixtures/hf/kimi-k2/config.json").read_text())
    assert kimi["model_type"] == "kimi_k2" and hf_decoder_layer(kimi) == "DeepseekV3DecoderLayer"  # remote code
    assert transformers.DeepseekV3ForCausalLM._no_split_modules == ["DeepseekV3DecoderLayer"]


def test_deepspeed_yaml_says_how_its_json_is_found():
    cluster = load_cluster(gpu="cpu", num_gpus=2)
    plan = make_plan(MODEL, cluster, seq_len=64, global_batch_size=4, engine="hf", zero_stage=2)
    header = [ln for ln in accelerate_deepspeed_yaml(MODEL, cluster, plan).splitlines() if ln.startswith("#")]
    text = "\n".join(header)
    assert "--deepspeed_config_file DIR/ds_config_accelerate.json" in text and "from this file's folder" in text
