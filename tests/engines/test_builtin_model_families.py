"""The built-in trainers train the model the plan names, or refuse it by name.

- The hf trainer (and DeepSpeed's AutoTP) build a transformers model: Llama for Llama-style specs, Qwen2 where
  Q/K/V have biases (Llama's attention_bias would add one to o_proj), Qwen3 with a per-head Q/K norm, Mixtral and
  Qwen3-MoE for MoE specs their routers compute, DeepSeek-V3 (MLA) and GLM-4.5 for sigmoid-routed MoE specs with
  shared experts; each with exactly the spec's parameters. AutoTP stays on Llama, the one measured here.
- The fsdp and deepspeed trainers' own model (autotune.workloads.transformer) builds Q/K norms and Llama 4's layers
  without RoPE (tests/workloads/test_transformer_vs_hf.py checks it against transformers) and refuses what it does
  not build: MLA, attention sinks, the clamped activation, YaRN, ALiBi.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.api import make_plan
from autotune.engines import engine_for
from autotune.engines.builtin_trainer import built_model_problem, fsdp_trainer_problem, hf_model_family
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.model import ModelSpec, MoESpec
from autotune.train.hf_models import build_hf_model

FIXTURES = "tests/fixtures/hf"


@pytest.mark.parametrize("name, family", [("llama3-8b", "llama"), ("qwen2.5-72b", "qwen2"), ("qwen3-8b", "qwen3"),
                                          ("gpt3-175b", "gpt2"), (f"{FIXTURES}/olmo2-13b/config.json", None),
                                          ("llama4-scout", None), ("gpt-oss-20b", None), ("mixtral-8x7b", "mixtral"),
                                          ("qwen3-30b-a3b", "qwen3_moe"), ("glm-4.5", "glm4_moe"),
                                          ("deepseek-v3", "deepseek_v3"), ("kimi-k2", "deepseek_v3"),
                                          ("moonlight-16b-a3b", "deepseek_v3")])
def test_the_transformers_model_of_each_architecture(name, family):
    assert hf_model_family(load_model(name)) == family


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2", "moonlight-16b-a3b", "glm-4.5"])
def test_sigmoid_routed_models_are_transformers_own_and_their_size(name):
    """DeepSeek-V3, Kimi-K2, Moonlight (DeepseekV3ForCausalLM) and GLM-4.5 (Glm4MoeForCausalLM) as the hf trainer
    builds them: the config transformers reads from the checkpoint's own config.json, field by field (MTP aside: the
    trainer builds none), and exactly the spec's parameters on the meta device (the routers' expert biases are
    buffers there, e_score_correction_bias, and parameters in the spec)."""
    import torch
    import transformers

    from autotune.train.hf_models import sigmoid_router_config

    spec = load_model(name)
    family = hf_model_family(spec)
    ours = sigmoid_router_config(spec, family, 4096).to_dict()
    raw = json.loads(Path(f"{FIXTURES}/{name}/config.json").read_text())
    config_class = transformers.DeepseekV3Config if family == "deepseek_v3" else transformers.Glm4MoeConfig
    theirs = config_class.from_dict({k: v for k, v in raw.items() if k not in ("auto_map", "model_type")}).to_dict()
    keys = ["vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "n_shared_experts", "n_routed_experts", "num_experts_per_tok",
            "routed_scaling_factor", "n_group", "topk_group", "first_k_dense_replace", "norm_topk_prob",
            "tie_word_embeddings", "hidden_act", "rms_norm_eps"]
    keys += (["q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rope_interleave"]
             if family == "deepseek_v3" else ["head_dim", "use_qk_norm", "attention_bias"])
    assert {k: ours[k] for k in keys} == {k: theirs[k] for k in keys}
    rope = {k: v for k, v in theirs["rope_parameters"].items() if v is not None and k != "type"}  # (legacy alias)
    assert {k: ours["rope_parameters"].get(k) for k in rope} == pytest.approx(rope)
    with torch.device("meta"):
        model = build_hf_model(spec, seq_len=4096, dtype=None)
    assert type(model).__name__ == ("DeepseekV3ForCausalLM" if family == "deepseek_v3" else "Glm4MoeForCausalLM")
    biases = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert sum(p.numel() for p in model.parameters()) + biases == spec.num_params


MIXTRAL_MOE = MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=48)
QWEN3_MOE = MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=48, router_pre_softmax=True, moe_layer_step=2)


@pytest.mark.parametrize("fields, built", [({}, "LlamaForCausalLM"), ({"qkv_bias": True}, "Qwen2ForCausalLM"),
                                           ({"qk_norm": "head"}, "Qwen3ForCausalLM"),
                                           ({"moe": MIXTRAL_MOE}, "MixtralForCausalLM"),
                                           ({"qk_norm": "head", "moe": QWEN3_MOE}, "Qwen3MoeForCausalLM")])
def test_the_built_transformers_model_has_the_specs_parameters(fields, built):
    spec = ModelSpec(name="small", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, head_dim=32,
                     ffn_hidden_size=96, vocab_size=128, position_embedding="rope", activation="swiglu",
                     norm="rmsnorm", **fields)
    model = build_hf_model(spec, seq_len=32, dtype=None)
    assert type(model).__name__ == built
    assert sum(p.numel() for p in model.parameters()) == spec.num_params
    if spec.moe is not None:  # the router transformers runs is the spec's (tests/workloads/test_moe_vs_hf.py)
        assert getattr(model.config, "norm_topk_prob", True) is not spec.moe.router_pre_softmax


def _trainer_problem(model, engine: str, num_gpus: int = 8, **plan):
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=num_gpus)
    spec = load_model(model) if isinstance(model, str) else model
    return engine_for(engine).builtin_trainer_problem(
        spec, make_plan(spec, cluster, engine=engine, global_batch_size=64, seq_len=4096, **plan))


def test_autotp_builds_llama_only():
    assert _trainer_problem("llama3-8b", "deepspeed", tp=2, zero_stage=1) is None
    problem = _trainer_problem("qwen3-8b", "deepspeed", tp=2, zero_stage=1)
    assert problem.startswith("AutoTP: model 'qwen3-8b'") and "Llama-style" in problem
    assert _trainer_problem("qwen3-8b", "deepspeed", zero_stage=1) is None  # the built-in model, with its norms
    assert _trainer_problem("qwen3-8b", "hf", zero_stage=1) is None  # Qwen3ForCausalLM


@pytest.mark.parametrize("model, seq_len, named", [
    ("deepseek-v3", 4096, ["multi-head latent attention"]),
    ("bloom-176b", 2048, ["ALiBi"]),
    # GPT-OSS below its window (128): what else its layers do
    ("gpt-oss-20b", 128, ["attention sinks", "clamp (7)", "YaRN RoPE scaling"]),
])
def test_what_the_built_in_model_does_not_build_is_named(model, seq_len, named):
    problem = built_model_problem(load_model(model), seq_len)
    assert problem is not None and all(n in problem for n in named), problem
    assert "emit --script" in problem


@pytest.mark.parametrize("model", ["qwen3-8b", "llama3-8b", f"{FIXTURES}/olmo2-13b/config.json"])
def test_models_it_builds_pass(model):
    assert built_model_problem(load_model(model), 4096) is None


def test_whole_width_qk_norm_refuses_dtensor_tp_only():
    olmo2 = load_model(f"{FIXTURES}/olmo2-13b/config.json")
    assert olmo2.qk_norm == "full"
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    tp2 = make_plan(olmo2, cluster, engine="fsdp", tp=2, zero_stage=3, global_batch_size=64, seq_len=4096)
    assert "qk_norm full" in fsdp_trainer_problem(olmo2, tp2, "even") and "tp=1" in fsdp_trainer_problem(
        olmo2, tp2, "even")
    assert fsdp_trainer_problem(replace(olmo2, qk_norm="head", post_norm=False), tp2, "even") is None
    assert fsdp_trainer_problem(olmo2, tp2.with_(tp=1, dp=8, sequence_parallel=False), "even") is None


def test_a_yarn_spec_that_states_no_yarn_fields_builds_with_transformers_defaults():
    """A DeepSeek-style spec with YaRN and nothing else stated (a model YAML's ``rope_scaling: yarn`` alone): the
    unstated fields are left to transformers' YaRN defaults (a None among them failed its config check)."""
    import torch

    base = load_model("moonlight-16b-a3b")
    spec = replace(base, name="yarn-small", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=4,
                   ffn_hidden_size=96, vocab_size=128, rope_scaling="yarn", rope_scaling_factor=4.0,
                   moe=replace(base.moe, num_experts=4, top_k=2, expert_ffn_hidden_size=32),
                   mla=replace(base.mla, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16))
    assert spec.yarn_beta_fast is None and spec.rope_original_max_positions is None
    model = build_hf_model(spec, seq_len=32, dtype=None)
    assert model.config.rope_parameters["factor"] == 4.0 and "beta_fast" not in model.config.rope_parameters
    tokens = torch.randint(0, 128, (1, 16))
    assert torch.isfinite(model(input_ids=tokens, labels=tokens).loss)
