"""RoPE scaling as transformers computes it: Llama 3.1's llama3 scaling (the low frequencies divided by the factor,
the middle ones blended) and a linear one, read from config.json into ModelSpec, give the built-in model
transformers' loss; without the scaling the loss moves. The same spec's Megatron-LM flags and Bridge fields say it
the way Megatron-core builds it, and --from reads the flags back."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_transformer_vs_hf import SEQ, _another_loss, _copy_llama_like, _same_loss  # tests/workloads is on sys.path

from autotune.specs.hf_config import model_from_hf_config
from autotune.train.hf_models import rope_parameters
from autotune.workloads.transformer import build_model

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5, tie_word_embeddings=False,
             max_position_embeddings=64, attn_implementation="eager")
# an original context of 16 puts head_dim 32's wavelengths (2 pi .. 2 pi 10^4) in all three llama3 bands
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


@pytest.mark.parametrize("params", [LLAMA3, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}],
                         ids=["llama3", "linear"])
def test_scaled_rope_matches_transformers_llama(params) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SMALL, rope_parameters=dict(params))
    spec = model_from_hf_config(config.to_dict() | {"model_type": "llama"}, name="llama-scaled")
    assert (spec.rope_scaling, spec.rope_scaling_factor) == (params["rope_type"], params["factor"])
    assert rope_parameters(spec) == params  # what the hf trainer gives transformers back
    torch.manual_seed(0)
    theirs = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # attention sharp enough for the rotation angles to matter
        for layer in theirs.model.layers:
            layer.self_attn.q_proj.weight.mul_(10.0)
            layer.self_attn.k_proj.weight.mul_(10.0)
    ours = build_model(spec, seq_len=SEQ, dtype=torch.float32).eval()
    _copy_llama_like(ours, theirs, interleaved_rope=False, mlp="mlp")
    _same_loss(ours, theirs)
    _another_loss(ours, replace(spec, rope_scaling=None, rope_scaling_factor=None, rope_low_freq_factor=None,
                                rope_high_freq_factor=None, rope_original_max_positions=None))


def test_llama31_scaling_in_megatron_flags_bridge_fields_and_back(tmp_path) -> None:
    from autotune.emit.megatron_attention import position_and_attention_flags, rope_scaling_problem
    from autotune.emit.megatron_bridge_recipes import bridge_model_problems, generic_model_fields
    from autotune.specs.loading import load_model

    model = load_model("tests/fixtures/hf/llama3-405b/config.json")  # Llama 3.1: llama3, 8, 1 / 4, 8192
    assert model == replace(load_model("llama3-405b"), name=model.name)
    flags = position_and_attention_flags(model)
    assert flags[flags.index("--use-rope-scaling") + 1:][:2] == ["--rope-scaling-factor", "8"]
    assert "--use-rope-scaling" not in position_and_attention_flags(load_model("llama3-70b"))  # Llama 3: none
    fields = generic_model_fields(model)
    assert (fields["rope_scaling"], fields["rope_scaling_factor"]) == (True, 8.0) and not bridge_model_problems(model)
    # Llama 4 Scout's llama3 scaling has high_freq_factor 1: Megatron-core's is fixed at 4, so it is refused
    scout = load_model("llama4-scout")
    assert "1 / 1" in rope_scaling_problem(scout) and "--use-rope-scaling" not in position_and_attention_flags(scout)
    assert any("llama3 RoPE scaling" in p for p in bridge_model_problems(scout))
