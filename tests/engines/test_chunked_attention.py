"""Windowed and chunked attention where a program cannot run it: Megatron-LM's GPT model has no chunked attention
(Llama 4 at a sequence longer than its 8,192-token chunks trained full attention there), and autotune's built-in
models attend over the whole sequence (a windowed model's trial measured another model). At a sequence no longer than
the window both are the model itself."""
from __future__ import annotations

import pytest

from autotune.api import make_plan
from autotune.emit.megatron_attention import position_and_attention_flags
from autotune.engines.builtin_trainer import window_problem
from autotune.errors import InputError
from autotune.specs.loading import load_cluster, load_model


def test_megatron_runs_llama4_only_within_one_chunk():
    model = load_model("llama4-maverick")  # (Scout's llama3 RoPE scaling is not Megatron-core's: refused apart)
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=16)
    make_plan(model, cluster, engine="megatron", ep=16, zero_stage=1, global_batch_size=64, seq_len=8192)
    with pytest.raises(InputError) as err:
        make_plan(model, cluster, engine="megatron", ep=16, zero_stage=1, global_batch_size=64, seq_len=16384)
    assert "has no chunked attention" in str(err.value) and "--seq-len 8192 or less" in str(err.value)


def test_llama4s_global_layers_have_no_rope():
    flags = position_and_attention_flags(load_model("llama4-scout"))
    assert flags[flags.index("--no-rope-freq") + 1] == "4"
    assert "--no-rope-freq" not in position_and_attention_flags(load_model("gpt-oss-20b"))  # windows, all RoPE
    assert "--window-size" not in flags  # chunks are no sliding window


@pytest.mark.parametrize("name, window", [("phi3-mini", 2047), ("gpt-oss-20b", 128), ("llama4-scout", 8192)])
def test_the_built_in_model_stands_for_a_windowed_one_only_within_the_window(name, window):
    model = load_model(name)
    assert window_problem(model, window) is None
    problem = window_problem(model, window + 1)
    assert problem is not None and f"--seq-len {window} or less" in problem
    assert window_problem(load_model("llama3-8b"), 131072) is None
