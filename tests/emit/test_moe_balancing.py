"""The load-balancing loss a MoE checkpoint was trained with (MoESpec.aux_loss_coeff), in the files that train it.

Megatron-core's --moe-aux-loss-coeff defaults to 0 (no balancing loss at all) and Megatron-DeepSpeed's --moe-loss-coeff
to 0.1; the checkpoints state theirs (router_aux_loss_coef, DeepSeek-style aux_loss_alpha with seq_aux).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from megatron_argv import emitted_flags  # tests/ is on sys.path (no __init__)

from autotune.emit.megatron_bridge_recipes import generic_model_fields
from autotune.job_megatron_model import megatron_model
from autotune.specs.hf_config import model_from_hf_config
from autotune.specs.loading import load_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def _args(model, engine: str = "megatron") -> dict:
    return emitted_flags(model, engine, ep=8 if engine == "megatron" else 1, zero_stage=1)


@pytest.mark.parametrize("name, coeff, per_sequence", [("mixtral-8x7b", 0.02, False), ("qwen3-30b-a3b", 0.001, False),
                                                        ("gpt-oss-20b", 0.9, False), ("kimi-k2", 0.001, True),
                                                        ("llama4-scout", 0.001, False), ("deepseek-v3", 0.0001, True),
                                                        ("moonlight-16b-a3b", 0.0001, True), ("glm-4.5", None, False)])
def test_config_json_and_preset_state_it(name, coeff, per_sequence):
    read = model_from_hf_config(FIXTURES / name / "config.json").moe
    assert (read.aux_loss_coeff, read.aux_loss_per_sequence) == (coeff, per_sequence)
    assert load_model(name).moe == read or name.startswith("llama4")  # (Llama 4's preset is its text model)
    assert (load_model(name).moe.aux_loss_coeff, load_model(name).moe.aux_loss_per_sequence) == (coeff, per_sequence)


def test_megatron_lm_writes_it_and_reads_it_back():
    mixtral = _args(load_model("mixtral-8x7b"))
    assert mixtral["--moe-aux-loss-coeff"] == "0.02" and "--moe-router-load-balancing-type" not in mixtral
    kimi = dataclasses.replace(load_model("kimi-k2"), num_layers=4, name="kimi-4l")
    args = _args(kimi)
    assert (args["--moe-router-load-balancing-type"], args["--moe-aux-loss-coeff"]) == ("seq_aux_loss", "0.001")
    assert megatron_model(args, "k.sh", []).moe == kimi.moe  # no preset has this shape: the file's own
    deepseek = _args(dataclasses.replace(load_model("deepseek-v3"), num_layers=4, name="deepseek-4l"))
    assert (deepseek["--moe-router-load-balancing-type"], deepseek["--moe-aux-loss-coeff"]) == ("seq_aux_loss", "0.0001")
    assert "--moe-aux-loss-coeff" not in _args(dataclasses.replace(load_model("glm-4.5"), num_layers=4, name="g"))


def test_a_file_without_it_trains_none_and_from_says_so():
    flags = _args(load_model("qwen3-30b-a3b"))
    notes: list[str] = []
    assert megatron_model(flags, "q.sh", notes) == load_model("qwen3-30b-a3b") and not any("balancing" in n
                                                                                          for n in notes)
    del flags["--moe-aux-loss-coeff"]
    read = megatron_model(flags, "q.sh", notes)
    assert read.moe.aux_loss_coeff is None  # Megatron-core's default weight: 0
    assert any("load-balancing loss of weight 0 as q.sh trains it (the checkpoint's: 0.001)" in n for n in notes)
    # Megatron-DeepSpeed's default weight is 0.1
    assert megatron_model(flags, "q.sh", [], aux_default=0.1).moe.aux_loss_coeff == 0.1


def test_megatron_deepspeed_and_bridge_write_theirs():
    mixtral = load_model("mixtral-8x7b")
    assert _args(mixtral, "megatron-deepspeed")["--moe-loss-coeff"] == "0.02"
    fields = generic_model_fields(mixtral)
    assert (fields["moe_aux_loss_coeff"], fields["moe_router_load_balancing_type"]) == (0.02, "aux_loss")
    fields = generic_model_fields(load_model("kimi-k2"))
    assert (fields["moe_aux_loss_coeff"], fields["moe_router_load_balancing_type"]) == (0.001, "seq_aux_loss")
    assert "moe_aux_loss_coeff" not in generic_model_fields(load_model("glm-4.5"))  # its file states none


@pytest.mark.parametrize("name, experts, fp32", [("mixtral-8x7b", None, False), ("mixtral-8x7b", 24, False),
                                                  ("mixtral-8x7b", 32, True), ("gpt-oss-20b", None, True),
                                                  ("qwen3-30b-a3b", None, True), ("glm-4.5", None, True),
                                                  ("kimi-k2", None, True), ("llama4-maverick", None, True)])
def test_routers_of_32_experts_or_more_run_in_fp32(name, experts, fp32):
    """Megatron-core warns from 32 experts without fp32 routing (transformer_config.py:2794-2802, core 0.19);
    Megatron-LM's flag and Bridge's TransformerConfig field say it, fewer experts keep the model's dtype."""
    model = load_model(name)
    if experts is not None:
        model = dataclasses.replace(model, moe=dataclasses.replace(model.moe, num_experts=experts))
    assert (_args(model).get("--moe-router-dtype") == "fp32") is fp32
    assert (generic_model_fields(model).get("moe_router_dtype") == "fp32") is fp32


def test_nonsense_is_named():
    from autotune.errors import InputError
    from autotune.specs.model import MoESpec

    with pytest.raises(InputError, match="aux_loss_coeff must be a number >= 0"):
        dataclasses.replace(load_model("mixtral-8x7b"), moe=MoESpec(num_experts=8, top_k=2,
                                                                      expert_ffn_hidden_size=64, aux_loss_coeff=-1.0))
    with pytest.raises(InputError, match="aux_loss_per_sequence needs"):
        dataclasses.replace(load_model("mixtral-8x7b"), moe=MoESpec(num_experts=8, top_k=2,
                                                                      expert_ffn_hidden_size=64,
                                                                      aux_loss_per_sequence=True))


def test_the_hf_trainers_mixtral_adds_the_checkpoints_balancing_loss():
    """The built-in hf trainer's Mixtral / Qwen3-MoE return their router logits, and the loss is the cross entropy
    plus router_aux_loss_coef times transformers' load-balancing loss."""
    import torch

    from autotune.train.hf_models import build_hf_model

    preset = load_model("mixtral-8x7b")
    spec = dataclasses.replace(preset, name="mixtral-small", num_layers=2, hidden_size=64, num_attention_heads=4,
                               num_kv_heads=2, ffn_hidden_size=96, vocab_size=128,
                               moe=dataclasses.replace(preset.moe, expert_ffn_hidden_size=32))
    torch.manual_seed(0)
    model = build_hf_model(spec, seq_len=32, dtype=None)
    tokens = torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        out = model(input_ids=tokens, labels=tokens)
        model.config.output_router_logits = False
        plain = model(input_ids=tokens, labels=tokens).loss
    assert float(out.loss) == pytest.approx(float(plain) + 0.02 * float(out.aux_loss), rel=1e-6)
    assert float(out.aux_loss) > 0
