"""The norms' epsilon as the checkpoint has it (ModelSpec.norm_eps), in every file and trainer that builds the model.

Megatron-LM's --norm-epsilon and Megatron-DeepSpeed's --layernorm-epsilon default to 1e-5, Llama 3's; Qwen3,
Qwen2.5, DeepSeek-V3, Kimi-K2 and Gemma use 1e-6, which every engine used to leave at its own default.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from megatron_argv import emitted_flags  # tests/ is on sys.path (no __init__)

from autotune.emit.megatron_bridge_recipes import generic_model_fields
from autotune.emit.megatron_model_flags import MEGATRON_NORM_EPS
from autotune.job_megatron_model import megatron_model
from autotune.specs.hf_config import _CLASS_EPS, model_from_hf_config
from autotune.specs.loading import load_model
from autotune.specs.presets import load_model_preset, model_preset_names

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


@pytest.mark.parametrize("name, eps", [("qwen3-8b", 1e-6), ("deepseek-v3", 1e-6), ("llama3-8b", 1e-5),
                                       ("gpt-neox-20b", 1e-5), ("bloom-176b", 1e-5), ("gemma3-27b", 1e-6)])
def test_config_json_states_it(name, eps):
    """rms_norm_eps / layer_norm_eps / layer_norm_epsilon as the file has them (Gemma 3's file leaves it to
    Gemma3TextConfig's default), and each preset with a config.json carries its file's value."""
    assert model_from_hf_config(FIXTURES / name / "config.json").norm_eps == eps
    assert load_model(name).norm_eps == eps


def test_class_defaults_are_transformers_own():
    transformers = pytest.importorskip("transformers")
    assert transformers.Gemma2Config().rms_norm_eps == _CLASS_EPS["gemma2"]
    assert transformers.Gemma3TextConfig().rms_norm_eps == _CLASS_EPS["gemma3_text"] == _CLASS_EPS["gemma3"]
    assert not hasattr(transformers.OPTConfig(), "layer_norm_eps")  # torch's LayerNorm default, 1e-5
    assert _CLASS_EPS["opt"] == 1e-5


def test_every_preset_with_a_config_json_carries_its_eps():
    for name in model_preset_names():
        path = FIXTURES / name / "config.json"
        if path.exists():
            assert load_model_preset(name).norm_eps == model_from_hf_config(path).norm_eps, name


def test_megatron_writes_it_where_it_is_not_the_default_and_reads_it_back():
    qwen = emitted_flags(load_model("qwen3-8b"))
    assert float(qwen["--norm-epsilon"]) == 1e-6
    assert "--norm-epsilon" not in emitted_flags(load_model("llama3-8b"))  # Megatron's default is 1e-5
    notes: list[str] = []
    assert megatron_model({**qwen, "--hidden-dropout": "0"}, "q.sh", notes).norm_eps == 1e-6
    # a Qwen3 shape from a file that says nothing of it runs Megatron's 1e-5, and --from says so
    del qwen["--norm-epsilon"]
    read = megatron_model({**qwen, "--hidden-dropout": "0"}, "q.sh", notes)
    assert read.norm_eps == MEGATRON_NORM_EPS
    assert any("as q.sh runs it" in n and "norm eps 1e-06" in n for n in notes), notes


def test_megatron_deepspeed_writes_its_own_flag():
    model = dataclasses.replace(load_model("llama3-8b"), name="llama-eps6", norm_eps=1e-6)
    args = emitted_flags(model, "megatron-deepspeed")
    assert float(args["--layernorm-epsilon"]) == 1e-6 and "--norm-epsilon" not in args
    assert megatron_model({**args, "--hidden-dropout": "0"}, "m.sh", []).norm_eps == 1e-6


def test_bridge_generic_model_and_the_built_in_trainers():
    import torch

    from autotune.train.hf_models import build_hf_model
    from autotune.workloads.transformer import build_model

    spec = dataclasses.replace(load_model("tiny-llama"), norm_eps=1e-6, qk_norm="head")
    assert generic_model_fields(spec)["layernorm_epsilon"] == 1e-6
    assert "layernorm_epsilon" not in generic_model_fields(load_model("tiny-llama"))  # unstated: Bridge's default
    hf = build_hf_model(spec, seq_len=64, dtype=None)
    assert hf.config.rms_norm_eps == 1e-6
    torch.manual_seed(0)
    own = build_model(spec, seq_len=64)
    eps = {m.eps for m in own.modules() if hasattr(m, "eps")}
    assert eps == {1e-6}


def test_yaml_reads_1e_6_as_text_and_the_message_says_how_to_write_it(tmp_path):
    """PyYAML (YAML 1.1) loads ``norm_eps: 1e-6`` as the string '1e-6': the refusal says so and how to write it."""
    from autotune.errors import InputError

    text = (Path(__file__).resolve().parents[2] / "autotune/presets/models/tiny-llama.yaml").read_text()
    path = tmp_path / "m.yaml"
    path.write_text(text.replace("norm: rmsnorm\n", "norm: rmsnorm\nnorm_eps: 1e-6\n"))
    with pytest.raises(InputError, match=r"YAML reads 1e-6 as text: write it with a decimal point, e\.g\. 1\.0e-6"):
        load_model(str(path))
    path.write_text(text.replace("norm: rmsnorm\n", "norm: rmsnorm\nnorm_eps: 1.0e-6\n"))
    assert load_model(str(path)).norm_eps == 1e-6


def test_a_bad_epsilon_is_named_beside_the_configs_other_problems():
    import json

    from autotune.errors import InputError

    data = json.loads((FIXTURES / "qwen3-8b" / "config.json").read_text())
    data |= {"rms_norm_eps": -1.0, "num_attention_heads": "x"}
    with pytest.raises(InputError) as err:
        model_from_hf_config(data)
    assert any("'num_attention_heads' must be an integer" in p for p in err.value.problems)
    assert any("'rms_norm_eps' must be a positive number, got -1.0" in p for p in err.value.problems)
