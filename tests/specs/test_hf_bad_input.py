"""Hugging Face configs autotune cannot read: what the user is told, and the exit code."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from autotune import resources
from autotune.errors import InputError
from autotune.specs import hf_fields
from autotune.specs.hf_config import (
    MODEL_YAML_FIELDS,
    SUPPORTED_MODEL_TYPES,
    model_from_hf_config,
)
from autotune.specs.loading import load_model


def test_unsupported_type_exits_2_naming_types_and_yaml_fields(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba2", "hidden_size": 2560, "num_hidden_layers": 64}))
    done = subprocess.run([sys.executable, "-m", "autotune", "estimate", "--model", str(path), "--gpu",
                           "h100-sxm-80gb", "--num-gpus", "8"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert "'mamba2' is not supported" in done.stderr
    assert all(t in done.stderr for t in ("qwen3_moe", "gpt_oss", "llama4", "gemma3", "glm4_moe", "kimi_k2"))
    for field in ("num_layers", "hidden_size", "ffn_hidden_size", "vocab_size", "num_experts", "top_k"):
        assert field in done.stderr


def test_yaml_fields_named_are_schema_fields():
    schema = resources.schema("model.schema.json")
    known = set(schema["properties"]) | set(schema["$defs"]["moe"]["properties"])
    named = set(re.findall(r"\b([a-z]+(?:_[a-z]+)+|name|moe)\b", MODEL_YAML_FIELDS.split(" is an example")[0]))
    named -= {"model"}
    assert named and named <= known, named - known


def test_yaml_with_the_new_fields_loads(tmp_path):
    """What the message tells a user to write: a model YAML using the fields the readers fill."""
    path = tmp_path / "m.yaml"
    path.write_text("name: mine\nnum_layers: 4\nhidden_size: 256\nnum_attention_heads: 4\nnum_kv_heads: 2\n"
                    "head_dim: 96\nffn_hidden_size: 512\nvocab_size: 1000\nactivation: swiglu\nnorm: rmsnorm\n"
                    "position_embedding: rope\nqk_norm: head\nattention_sinks: true\nsliding_window: 128\n"
                    "sliding_window_layers: [0, 2]\nmoe:\n  num_experts: 8\n  top_k: 2\n"
                    "  expert_ffn_hidden_size: 128\n  num_dense_layers: 1\n  moe_layer_step: 2\n")
    model = load_model(str(path))
    assert model.qk_norm == "head" and model.sliding_window_layers == (0, 2)
    assert [model.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert model.to_dict()["sliding_window_layers"] == [0, 2]


@pytest.mark.parametrize("use_transformers", [True, False])
def test_every_problem_at_once_with_or_without_transformers(use_transformers, monkeypatch):
    monkeypatch.setattr(hf_fields, "USE_TRANSFORMERS", use_transformers)
    bad = {"model_type": "qwen3_moe", "hidden_size": "2048", "num_hidden_layers": 4, "num_attention_heads": 4,
           "vocab_size": 100}
    with pytest.raises(InputError) as err:
        model_from_hf_config(bad)
    text = str(err.value)
    assert "'hidden_size' must be an integer" in text and "'moe_intermediate_size'" in text


def test_unmodelled_variants_of_new_types_are_refused():
    base = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 96, "vocab_size": 100, "moe_intermediate_size": 32}
    cases = [({"model_type": "qwen3_moe", "mlp_only_layers": [1, 3]}, "mlp_only_layers"),
             ({"model_type": "llama4_text", "moe_layers": [0, 3]}, "moe_layers"),
             ({"model_type": "gpt_oss", "attention_bias": False}, "attention_bias false")]
    for extra, needle in cases:
        with pytest.raises(InputError, match=needle):
            model_from_hf_config(base | extra)
    with pytest.raises(InputError, match="text_config"):
        model_from_hf_config({"model_type": "llama4"})
    assert "kimi_k2" in SUPPORTED_MODEL_TYPES


@pytest.mark.parametrize("model_type", ["gemma3_text", "gpt_oss", "llama4_text", "qwen3"])
def test_absurd_layer_count_is_refused_not_built(model_type):
    """Per-layer patterns (sliding layers, MoE layers) are not built for a count above the limit."""
    cfg = {"model_type": model_type, "hidden_size": 64, "num_hidden_layers": 10**12, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 100, "use_sliding_window": True,
           "sliding_window": 16}
    with pytest.raises(InputError, match="num_layers"):
        model_from_hf_config(cfg)


def test_a_config_transformers_saved_with_infinity_is_read_as_transformers_reads_it(tmp_path):
    """transformers saves an infinite float as Infinity (json.dumps' default) and reads it back: Mamba-2 layers'
    time_step_limit (0.0, inf) is in every nemotron_h / mamba2 config.json it writes. Such a file was refused as
    "not valid JSON", hiding what the user needed to hear: that its model type is not modelled."""
    transformers = pytest.importorskip("transformers")
    transformers.NemotronHConfig().save_pretrained(tmp_path)
    text = (tmp_path / "config.json").read_text()
    assert "Infinity" in text  # the premise: this is what transformers writes
    with pytest.raises(InputError) as err:
        load_model(str(tmp_path / "config.json"))
    assert "model_type 'nemotron_h' is not supported" in str(err.value) and "Mamba" in str(err.value)
    assert "not valid JSON" not in str(err.value)


def test_an_infinity_is_refused_where_a_reader_takes_it_and_ignored_where_none_does(tmp_path):
    base = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
            "intermediate_size": 1024, "vocab_size": 1000}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, "rms_norm_eps": float("inf")}))  # json.dumps writes Infinity
    with pytest.raises(InputError, match="'rms_norm_eps' must be a finite number, got inf"):
        load_model(str(path))
    path.write_text(json.dumps({**base, "some_unread_limit": [0.0, float("inf")]}))
    assert load_model(str(path)).num_layers == 4
    # autotune's own model JSON stays strict: no field of it may be infinite
    own = tmp_path / "m.json"
    own.write_text('{"name": "m", "num_layers": Infinity}')
    with pytest.raises(InputError, match=r"\$\.num_layers: must be a finite number, got inf"):
        load_model(str(own))
