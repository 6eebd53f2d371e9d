"""ModelSpec's parameter count of a config.json equals that of the model transformers builds from it.

For every supported model_type: a small config (few layers, narrow, a handful of experts) made with
transformers' own config class, written as config.json, read by autotune, and compared exactly with
``AutoModelForCausalLM.from_config`` on the meta device (tied weights counted once). Two ways of
writing it: the full ``to_dict()`` (autotune normalises through transformers too), and the
``to_diff_dict()`` read with the transformers normalisation turned off, so autotune's own fallback
defaults must equal the class defaults.

Counted beside ``parameters()``: persistent buffers that are in the checkpoint (DeepSeek-V3's and
GLM-4.5's ``e_score_correction_bias``, updated by a rule rather than by gradients; ModelSpec's
``router_bias``). Multi-token-prediction modules (num_nextn_predict_layers) are not built by
transformers and not in ``num_params``.
"""

from __future__ import annotations

import json

import pytest

from autotune.specs import hf_fields
from autotune.specs.hf_config import SUPPORTED_MODEL_TYPES, model_from_hf_config

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

_DENSE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=257)

# Small configs, per model_type: extra fields exercise the features (biases, experts, dense-layer patterns).
SMALL: dict[str, dict] = {
    "llama": dict(_DENSE), "mistral": dict(_DENSE), "qwen2": dict(_DENSE),
    "mixtral": dict(_DENSE, num_local_experts=4, num_experts_per_tok=2),
    "gpt2": dict(n_embd=64, n_layer=3, n_head=4, vocab_size=257, n_positions=128),
    "gpt_neox": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                     vocab_size=257),
    "bloom": dict(hidden_size=64, n_layer=3, n_head=4, vocab_size=257),
    "falcon": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, vocab_size=257),
    "opt": dict(hidden_size=64, ffn_dim=96, num_hidden_layers=3, num_attention_heads=4, vocab_size=257,
                max_position_embeddings=128, word_embed_proj_dim=64),
    "deepseek_v3": dict(_DENSE, num_key_value_heads=4, num_hidden_layers=5, n_routed_experts=6, n_shared_experts=2,
                        num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=2, kv_lora_rank=16,
                        q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, n_group=2,
                        topk_group=1, num_nextn_predict_layers=1),
    "deepseek_v2": dict(_DENSE, num_key_value_heads=4, num_hidden_layers=4, n_routed_experts=6, n_shared_experts=2,
                        num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1, kv_lora_rank=16,
                        q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12,
                        topk_method="group_limited_greedy", n_group=2, topk_group=1),
    "qwen3": dict(_DENSE, head_dim=24),
    "olmoe": dict(_DENSE, num_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(_DENSE, num_hidden_layers=6, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                      decoder_sparse_step=2, mlp_only_layers=[0, 1]),
    "gpt_oss": dict(_DENSE, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=16),
    "llama4_text": dict(_DENSE, head_dim=16, num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=80,
                        interleave_moe_layer_step=2, attention_chunk_size=32),
    "gemma2": dict(_DENSE, head_dim=32, sliding_window=16),
    "gemma3_text": dict(_DENSE, head_dim=32, num_hidden_layers=7, sliding_window=16),
    "glm4_moe": dict(_DENSE, num_hidden_layers=4, head_dim=20, n_routed_experts=6, n_shared_experts=2,
                     num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1, attention_bias=True,
                     use_qk_norm=True, n_group=1, topk_group=1),
    "olmo2": dict(_DENSE),
    "phi3": dict(_DENSE, sliding_window=16, pad_token_id=0),
    "qwen2_moe": dict(_DENSE, num_hidden_layers=6, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, decoder_sparse_step=2, mlp_only_layers=[0],
                      use_sliding_window=True, sliding_window=16, max_window_layers=4),
    "starcoder2": dict(_DENSE, sliding_window=16),
    "smollm3": dict(_DENSE, use_sliding_window=True, sliding_window=16, pad_token_id=0, bos_token_id=1,
                    eos_token_id=2),
    "exaone4": dict(_DENSE, head_dim=24, num_hidden_layers=5, sliding_window=16, sliding_window_pattern=4),
    "ernie4_5": dict(_DENSE, head_dim=24, use_bias=True),
    "ernie4_5_moe": dict(_DENSE, num_hidden_layers=6, moe_num_experts=6, moe_k=2, moe_intermediate_size=32,
                         moe_num_shared_experts=2, moe_layer_start_index=1, moe_layer_interval=2),
    "seed_oss": dict(_DENSE, head_dim=24),
    "dots1": dict(_DENSE, head_dim=24, num_hidden_layers=4, n_routed_experts=6, n_shared_experts=2,
                  num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1, norm_topk_prob=True,
                  sliding_window=16, max_window_layers=2),
    "hunyuan_v1_dense": dict(_DENSE, head_dim=24, attention_bias=True),
    "hunyuan_v1_moe": dict(_DENSE, head_dim=24, num_experts=4, moe_topk=2),
    "minimax_m2": dict(_DENSE, head_dim=24, num_local_experts=4, num_experts_per_tok=2,
                       rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)),
}
# Types read through another's class: the config.json of Kimi-K2 is DeepSeek-V3's architecture; RefinedWeb*
# are Falcon's original names; gemma3 and llama4 are multimodal wrappers around gemma3_text / llama4_text.
SAME_AS = {"kimi_k2": "deepseek_v3", "RefinedWeb": "falcon", "RefinedWebModel": "falcon", "gemma3": "gemma3_text",
           "llama4": "llama4_text"}


def test_every_supported_type_is_covered():
    assert set(SMALL) | set(SAME_AS) == set(SUPPORTED_MODEL_TYPES)


def _count_built(cfg) -> int:
    """Parameters (shared ones once) plus checkpoint buffers that are not rotary tables."""
    try:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"transformers {transformers.__version__} cannot build {cfg.model_type}: {err}")
    params = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    names = dict(model.named_parameters())
    buffers = sum(b.numel() for n, b in model.state_dict().items()
                  if n not in names and n.endswith("e_score_correction_bias"))
    return params + buffers


ATTENTION_BIAS = ("qwen3", "qwen3_moe", "gemma2", "gemma3_text", "olmo2", "olmoe", "llama4_text")
"""Types whose attention_bias puts a bias on q, k, v and o_proj, none on the MLP: read as qkv_bias with
attention_output_bias."""
VARIANTS = [(t, {}) for t in sorted(SMALL)] + [(t, {"attention_bias": True}) for t in ATTENTION_BIAS]


@pytest.mark.parametrize("model_type, change", VARIANTS, ids=[t + "-bias" * bool(c) for t, c in VARIANTS])
@pytest.mark.parametrize("written", ["to_dict", "to_diff_dict"])
def test_count_equals_transformers(model_type, change, written, tmp_path, monkeypatch):
    cfg = transformers.AutoConfig.for_model(model_type, **(SMALL[model_type] | change))
    data = getattr(cfg, written)()
    data["model_type"] = model_type
    (tmp_path / "config.json").write_text(json.dumps(data))
    if written == "to_diff_dict":
        monkeypatch.setattr(hf_fields, "USE_TRANSFORMERS", False)  # autotune's own defaults
    spec = model_from_hf_config(tmp_path)
    assert spec.num_params == _count_built(cfg)
    if change:
        assert (spec.qkv_bias, spec.attention_output_bias, spec.linear_bias) == (True, True, False)


def test_patterns_are_carried(tmp_path):
    def read(model_type):
        cfg = transformers.AutoConfig.for_model(model_type, **SMALL[model_type])
        return model_from_hf_config(cfg.to_dict() | {"model_type": model_type})

    qwen = read("qwen3_moe")  # layers 0, 1 dense (mlp_only_layers), then every 2nd: 3, 5
    assert [qwen.is_moe_layer(i) for i in range(6)] == [False, False, False, True, False, True]
    llama4 = read("llama4_text")  # interleave step 2: 1, 3 MoE; chunked attention except every 4th layer
    assert [llama4.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert (llama4.chunked_attention, llama4.sliding_window, llama4.sliding_window_layers) == (True, 32, (0, 1, 2))
    assert llama4.moe.num_shared_experts == 1 and llama4.ffn_hidden_size == 80
    gemma3 = read("gemma3_text")  # five sliding layers of six
    assert gemma3.sliding_window_layers == (0, 1, 2, 3, 4, 6) and gemma3.qk_norm == "head"
    oss = read("gpt_oss")
    assert oss.attention_sinks and oss.sliding_window_layers == (0, 2) and oss.moe.router_bias
    assert oss.activation_clamp == transformers.GptOssConfig().swiglu_limit == 7.0
    assert oss.rope_scaling == "yarn" == transformers.GptOssConfig().rope_scaling["rope_type"]
    assert read("qwen3_moe").rope_scaling is None  # no rope_scaling in its config
    glm = read("glm4_moe")
    assert glm.moe.num_dense_layers == 1 and glm.moe.num_shared_experts == 2 and glm.num_mtp_layers == 1
    assert read("olmo2").qk_norm == "full" and read("deepseek_v3").num_mtp_layers == 1


def test_wrappers_read_their_text_config():
    gemma = transformers.AutoConfig.for_model("gemma3", text_config=SMALL["gemma3_text"]).to_dict()
    text = transformers.AutoConfig.for_model("gemma3_text", **SMALL["gemma3_text"]).to_dict()
    assert model_from_hf_config(gemma, name="x").num_params == model_from_hf_config(
        text | {"model_type": "gemma3_text"}, name="x").num_params
    llama = transformers.AutoConfig.for_model("llama4", text_config=SMALL["llama4_text"]).to_dict()
    text = transformers.AutoConfig.for_model("llama4_text", **SMALL["llama4_text"]).to_dict()
    assert model_from_hf_config(llama, name="x").num_params == model_from_hf_config(
        text | {"model_type": "llama4_text"}, name="x").num_params
    for wrapper, text_type in (("gemma3", "gemma3_text"), ("llama4", "llama4_text")):  # the vision tower is said
        config = transformers.AutoConfig.for_model(wrapper, text_config=SMALL[text_type]).to_dict()
        assert "vision tower" in model_from_hf_config(config, name="x").note
        assert model_from_hf_config(SMALL[text_type] | {"model_type": text_type}, name="x").note is None
    kimi = SMALL["deepseek_v3"] | {"model_type": "kimi_k2"}
    assert model_from_hf_config(kimi, name="x") == model_from_hf_config(kimi | {"model_type": "deepseek_v3"}, name="x")


@pytest.mark.parametrize("mlp_bias", [False, True])
def test_llama_attention_bias_is_on_o_proj_too(mlp_bias, monkeypatch):
    """LlamaAttention's attention_bias puts a bias on q, k, v and o_proj (transformers 5.25 modeling_llama.py); with
    mlp_bias every linear layer has one."""
    cfg = transformers.AutoConfig.for_model("llama", **SMALL["llama"], attention_bias=True, mlp_bias=mlp_bias)
    spec = model_from_hf_config(cfg.to_dict() | {"model_type": "llama"})
    assert spec.num_params == _count_built(cfg)
    assert (spec.qkv_bias, spec.attention_output_bias, spec.linear_bias) == (not mlp_bias, not mlp_bias, mlp_bias)
    monkeypatch.setattr(hf_fields, "USE_TRANSFORMERS", False)
    assert model_from_hf_config(cfg.to_diff_dict() | {"model_type": "llama"}).num_params == spec.num_params
    from autotune.emit.megatron_model_flags import architecture_problems
    from autotune.specs.model_tensors import layer_tensors

    assert sum(n for n, _ in layer_tensors(spec, 0)) == spec.layer_params(0).total
    refused = [p for p in architecture_problems(spec) if "output bias" in p]  # Megatron: all linears or Q/K/V only
    assert bool(refused) is not mlp_bias


@pytest.mark.parametrize("model_type, change", [("smollm3", dict(attention_bias=True)),
                                                ("smollm3", dict(attention_bias=True, mlp_bias=True)),
                                                ("dots1", dict(attention_bias=True))])
def test_attention_bias_of_the_newer_readers(model_type, change):
    """SmolLM3Attention and Dots1Attention put attention_bias on q, k, v and o_proj; SmolLM3's mlp_bias on the MLP."""
    cfg = transformers.AutoConfig.for_model(model_type, **(SMALL[model_type] | change))
    assert model_from_hf_config(cfg.to_dict() | {"model_type": model_type}).num_params == _count_built(cfg)
