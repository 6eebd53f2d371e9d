"""The position-embedding and attention-variant flags of megatron_args.sh: the windowed layers Megatron builds from
--window-size / --window-attn-skip-freq are the model's, YaRN carries its factor, sinks their softmax type."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.emit.megatron_attention import position_and_attention_flags
from autotune.specs.presets import load_model_preset


def _windowed_by_megatron(flags: list[str], num_layers: int) -> set[int]:
    """The 0-indexed layers Megatron-core runs windowed (megatron/core/transformer/utils.py:531-547 at d98e8a6,
    ``is_layer_window_attention``: 1-indexed layer numbers; an int N leaves every Nth layer full; a list says which
    are windowed)."""
    if "--window-size" not in flags:
        return set()
    if "--window-attn-skip-freq" not in flags:
        return set(range(num_layers))
    freq = flags[flags.index("--window-attn-skip-freq") + 1]
    if freq.startswith("["):
        pattern = [int(v) for v in freq.strip("[]").split(",")]
        return {i for i in range(num_layers) if pattern[i]}
    return {i for i in range(num_layers) if (i + 1) % int(freq) != 0}


@pytest.mark.parametrize("name", ["gpt-oss-120b", "gpt-oss-20b", "gemma3-27b", "llama3-8b"])
def test_megatron_windows_the_models_local_layers(name):
    model = load_model_preset(name)
    flags = position_and_attention_flags(model)
    expected = (set() if model.sliding_window is None else set(range(model.num_layers))
                if model.sliding_window_layers is None else set(model.sliding_window_layers))
    assert _windowed_by_megatron(flags, model.num_layers) == expected
    if model.sliding_window is not None:  # the window counts the query's own token (Bridge: sliding_window - 1)
        assert flags[flags.index("--window-size") + 1] == f"{model.sliding_window - 1},0"


def test_an_irregular_pattern_is_written_as_a_list():
    model = dataclasses.replace(load_model_preset("gemma3-27b"), sliding_window_layers=(0, 1, 3))
    flags = position_and_attention_flags(model)
    assert flags[flags.index("--window-attn-skip-freq") + 1].startswith("[")
    assert _windowed_by_megatron(flags, model.num_layers) == {0, 1, 3}


def test_yarn_and_sinks():
    gpt_oss = load_model_preset("gpt-oss-120b")
    flags = position_and_attention_flags(gpt_oss)
    assert flags[:2] == ["--position-embedding-type", "yarn"]
    assert flags[flags.index("--rotary-scaling-factor") + 1] == "32" and "--softmax-type" in flags
    plain = position_and_attention_flags(load_model_preset("llama3-8b"))
    assert plain == ["--position-embedding-type", "rope", "--rotary-base", "500000"]
    chunked = position_and_attention_flags(load_model_preset("llama4-scout"))
    assert "--window-size" not in chunked  # chunked attention is not a sliding window
