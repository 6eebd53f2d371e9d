"""Fields of config.json that the counts do not show, read as transformers 5.25 builds the model: sliding windows
(Mistral on every layer, its class default 4096; Qwen2 from max_window_layers on; Qwen3-MoE on every layer with
use_sliding_window), rope_theta nested in transformers 5's rope_parameters, Mistral's bias-free layers whatever
attention_bias says, and Gemma 3's text_config that leaves num_attention_heads to its class default (8)."""

from __future__ import annotations

import json

import pytest

from autotune.specs import hf_fields
from autotune.specs.hf_config import model_from_hf_config

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

_SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=257)


def _read(tmp_path, data: dict, *, ours: bool = False, monkeypatch=None):
    (tmp_path / "config.json").write_text(json.dumps(data))
    if ours:
        monkeypatch.setattr(hf_fields, "USE_TRANSFORMERS", False)
    return model_from_hf_config(tmp_path)


def _windowed(cfg) -> tuple[int | None, tuple[int, ...] | None]:
    """(window, its layers; None: all) of the model transformers builds from ``cfg``."""
    types = getattr(cfg, "layer_types", None)
    window = cfg.sliding_window
    if window is None:
        return None, None
    layers = tuple(i for i, t in enumerate(types) if t == "sliding_attention") if types else None
    return window, None if layers is None or len(layers) == cfg.num_hidden_layers else layers


@pytest.mark.parametrize("model_type, extra", [
    ("mistral", {"sliding_window": 4096}), ("mistral", {}), ("mistral", {"sliding_window": None}),
    ("mixtral", {"sliding_window": 1024, "num_local_experts": 4, "num_experts_per_tok": 2}),
    ("qwen2", {"use_sliding_window": True, "max_window_layers": 1, "sliding_window": 512}),
    ("qwen2", {"use_sliding_window": False, "sliding_window": 512}),
])
@pytest.mark.parametrize("written", ["to_dict", "to_diff_dict"])
def test_sliding_windows_are_the_ones_transformers_builds(model_type, extra, written, tmp_path, monkeypatch):
    cfg = transformers.AutoConfig.for_model(model_type, **_SMALL, **extra)
    data = getattr(cfg, written)() | {"model_type": model_type}
    spec = _read(tmp_path, data, ours=written == "to_diff_dict", monkeypatch=monkeypatch)
    assert (spec.sliding_window, spec.sliding_window_layers) == _windowed(cfg)


def test_qwen3_moe_windows_every_layer(tmp_path):
    cfg = transformers.Qwen3MoeConfig(**_SMALL, use_sliding_window=True, sliding_window=256, num_experts=4,
                                      num_experts_per_tok=2, moe_intermediate_size=32)
    spec = _read(tmp_path, cfg.to_dict() | {"model_type": "qwen3_moe"})
    assert (spec.sliding_window, spec.sliding_window_layers) == (256, None)


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2"])
def test_rope_theta_in_rope_parameters(model_type, tmp_path):
    data = {**_SMALL, "model_type": model_type, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
    assert _read(tmp_path, data).rope_theta == 500000.0


def test_mistral_has_no_bias_whatever_attention_bias_says(tmp_path):
    cfg = transformers.MistralConfig(**_SMALL, attention_bias=True)
    with torch.device("meta"):
        built = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(cfg).parameters())
    spec = _read(tmp_path, cfg.to_dict() | {"model_type": "mistral"})
    assert spec.num_params == built and not spec.qkv_bias and not spec.linear_bias


def test_gemma3_text_config_without_head_count(tmp_path):
    # google/gemma-3-4b-pt's text_config states no num_attention_heads: Gemma3TextConfig's 8
    data = {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
            "head_dim": 256, "sliding_window": 1024}
    spec = _read(tmp_path, data)
    assert (spec.num_attention_heads, spec.num_kv_heads) == (8, 4)
    cfg = transformers.Gemma3TextConfig(**{k: v for k, v in data.items() if k != "model_type"})
    with torch.device("meta"):
        built = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(cfg).parameters())
    assert spec.num_params == built
