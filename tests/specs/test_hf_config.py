"""Hugging Face config.json -> ModelSpec, against the presets and hand-derived counts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from autotune.errors import InputError
from autotune.rules import sequence_problems
from autotune.specs.hf_config import SUPPORTED_MODEL_TYPES, model_from_hf_config, read_hf_config
from autotune.specs.presets import load_model_preset, model_preset_names

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hf"
WITH_PRESET = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and p.name in model_preset_names())


def _config(name: str) -> dict:
    return json.loads((FIXTURES / name / "config.json").read_text())


def test_every_family_has_a_fixture():
    types = {_config(p.name)["model_type"] for p in FIXTURES.iterdir() if p.is_dir()}
    assert types == set(SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("name", WITH_PRESET)
def test_fixture_equals_preset(name):
    """The config of a checkpoint gives the preset of that model, field for field."""
    loaded, preset = model_from_hf_config(FIXTURES / name), load_model_preset(name)
    assert loaded.num_params == preset.num_params
    assert loaded.num_active_params == preset.num_active_params
    assert dataclasses.replace(loaded, name=preset.name) == preset


def test_presets_with_hf_checkpoints_all_have_fixtures():
    # Megatron GPT sizes, GPT-3 and its Korthikanti 22B sibling were never released as HF checkpoints; NVIDIA
    # released Nemotron-4-340B as NeMo checkpoints (.nemo files in nvidia/Nemotron-4-340B-Base), no config.json.
    released = {n for n in model_preset_names()
                if not n.startswith(("megatron-gpt-", "gpt3-", "tiny-", "nemotron-4-"))}
    assert released == set(WITH_PRESET)


def test_gpt2():
    small, xl = model_from_hf_config(FIXTURES / "gpt2"), model_from_hf_config(FIXTURES / "gpt2-xl")
    # per layer 12h^2 + 13h; token table Vh; positions 1024h; final LayerNorm 2h; tied.
    h = 768
    assert small.num_params == 12 * (12 * h * h + 13 * h) + 50257 * h + 1024 * h + 2 * h == 124_439_808
    h = 1600  # n_inner null: 4 * n_embd
    assert xl.ffn_hidden_size == 4 * h
    assert xl.num_params == 48 * (12 * h * h + 13 * h) + 50257 * h + 1024 * h + 2 * h == 1_557_611_200
    assert small.tied_embeddings and small.linear_bias and small.position_embedding == "learned"


def test_falcon_7b_both_formats():
    new, old = model_from_hf_config(FIXTURES / "falcon-7b"), model_from_hf_config(FIXTURES / "falcon-7b-refinedwebmodel")
    assert dataclasses.replace(old, name=new.name) == new
    assert (new.kv_heads, new.norms_per_layer, new.linear_bias, new.tied_embeddings) == (1, 1, False, True)
    # per layer: fused QKV h(h + 2*64) + dense h^2 + MLP 2 * h * 4h + one LayerNorm 2h; h = 4544
    h, d = 4544, 64
    per_layer = h * (h + 2 * d) + h * h + 2 * h * 4 * h + 2 * h
    assert new.num_params == 32 * per_layer + 65024 * h + 2 * h == 6_921_720_704


def test_falcon_new_decoder_both_formats():
    new, old = model_from_hf_config(FIXTURES / "falcon-40b"), model_from_hf_config(FIXTURES / "falcon-40b-refinedweb")
    assert dataclasses.replace(old, name=new.name) == new
    assert (new.kv_heads, new.norms_per_layer) == (8, 2)  # GQA, ln_attn + ln_mlp
    h, kv_width = 8192, 8 * 64
    per_layer = h * (h + 2 * kv_width) + h * h + 2 * h * 4 * h + 2 * 2 * h
    assert new.num_params == 60 * per_layer + 65024 * h + 2 * h
    big = model_from_hf_config(FIXTURES / "falcon-180b")
    assert big.num_params == pytest.approx(180e9, rel=0.01)  # TII: Falcon-180B


def test_family_details():
    bloom = model_from_hf_config(FIXTURES / "bloom-176b")
    assert bloom.embedding_norm and bloom.position_embedding == "alibi" and bloom.ffn_hidden_size == 4 * 14336
    neox = model_from_hf_config(FIXTURES / "gpt-neox-20b")
    assert not neox.tied_embeddings and neox.linear_bias and neox.norms_per_layer == 2
    opt = model_from_hf_config(FIXTURES / "opt-175b")
    assert opt.tied_embeddings and opt.activation == "relu"
    # OPT's table: 2048 positions after an offset of 2 rows; the rows counted, the sequence limit 2048
    assert (opt.max_position_embeddings, opt.position_offset) == (2048, 2)
    assert opt.embedding_params().replicated == 2050 * opt.hidden_size
    assert opt.num_params == load_model_preset("opt-175b").num_params
    assert sequence_problems(opt, 2048) == [] and "(max_position_embeddings 2048)" in sequence_problems(opt, 2050)[0][1]
    qwen = model_from_hf_config(FIXTURES / "qwen2.5-72b")
    assert qwen.qkv_bias and not qwen.linear_bias
    mixtral = model_from_hf_config(FIXTURES / "mixtral-8x7b")
    assert mixtral.moe is not None and (mixtral.moe.num_experts, mixtral.moe.top_k) == (8, 2)


def test_name_and_sources():
    cfg = _config("llama3-8b")
    assert model_from_hf_config(cfg).name == "meta-llama/Meta-Llama-3-8B"  # _name_or_path
    assert model_from_hf_config(cfg, name="mine").name == "mine"
    assert model_from_hf_config(FIXTURES / "gpt2" / "config.json").name == "gpt2"  # no _name_or_path: model_type
    assert model_from_hf_config(FIXTURES / "gpt2") == model_from_hf_config(read_hf_config(FIXTURES / "gpt2"), name="gpt2")


def test_explicit_head_dim_kept_only_when_it_differs():
    cfg = _config("mistral-7b") | {"hidden_size": 5120, "num_attention_heads": 32, "head_dim": 128}  # Mistral-Nemo
    assert model_from_hf_config(cfg).head_dim == 128
    assert model_from_hf_config(_config("mistral-7b") | {"head_dim": 128}).head_dim is None  # 4096 / 32


def test_missing_fields_are_each_named():
    cfg = {k: v for k, v in _config("llama2-7b").items() if k not in ("hidden_size", "num_hidden_layers")}
    with pytest.raises(InputError) as err:
        model_from_hf_config(cfg)
    assert len(err.value.problems) == 2
    text = str(err.value)
    assert "'hidden_size'" in text and "'num_hidden_layers'" in text and "llama" in text


def test_missing_moe_and_mla_fields_are_named():
    cfg = {k: v for k, v in _config("deepseek-v3").items() if k not in ("n_routed_experts", "kv_lora_rank")}
    with pytest.raises(InputError) as err:
        model_from_hf_config(cfg)
    assert "'n_routed_experts'" in str(err.value) and "'kv_lora_rank'" in str(err.value)
    cfg = {k: v for k, v in _config("gpt2").items() if k != "n_embd"}
    with pytest.raises(InputError, match="'n_embd' or 'hidden_size'"):
        model_from_hf_config(cfg)


def test_wrong_types_are_named():
    with pytest.raises(InputError, match="'intermediate_size' must be an integer, got '14336'"):
        model_from_hf_config(_config("mistral-7b") | {"intermediate_size": "14336"})


def test_unknown_model_type_lists_supported_types():
    with pytest.raises(InputError) as err:
        model_from_hf_config({"model_type": "mamba2", "hidden_size": 8})
    text = str(err.value)
    assert "mamba2" in text and all(t in text for t in SUPPORTED_MODEL_TYPES)
    with pytest.raises(InputError, match="did you mean llama"):
        model_from_hf_config({"model_type": "lama"})
    with pytest.raises(InputError, match="no 'model_type'"):
        model_from_hf_config({"hidden_size": 8})


def test_unmodelled_variants_are_refused():
    opt_350m = _config("opt-175b") | {"hidden_size": 1024, "word_embed_proj_dim": 512, "num_attention_heads": 16,
                                      "ffn_dim": 4096, "num_hidden_layers": 24, "do_layer_norm_before": False}
    with pytest.raises(InputError) as err:
        model_from_hf_config(opt_350m)
    assert len(err.value.problems) == 2 and "word_embed_proj_dim" in str(err.value)


def test_model_spec_problems_carry_the_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config("llama2-7b") | {"num_attention_heads": 30}))
    with pytest.raises(InputError) as err:
        model_from_hf_config(path)
    assert str(path) in str(err.value) and "divisible" in str(err.value)


def test_unreadable_or_malformed_file(tmp_path):
    with pytest.raises(InputError, match="missing.json.*no such file"):
        model_from_hf_config(tmp_path / "missing.json")
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama",\n "hidden_size": }')
    with pytest.raises(InputError, match="line 2 column"):
        model_from_hf_config(tmp_path)
    bad.write_text("[1, 2]")
    with pytest.raises(InputError, match="JSON object"):
        model_from_hf_config(bad)


def test_named_from_the_config_not_its_folder(tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    cfg = {k: v for k, v in _config("llama3-8b").items() if k != "_name_or_path"}
    (folder / "config.json").write_text(json.dumps(cfg))
    assert model_from_hf_config(folder).name == "llama"
    (folder / "config.json").write_text(json.dumps(cfg | {"_name_or_path": "org/my-model"}))
    assert model_from_hf_config(folder / "config.json").name == "org/my-model"


@pytest.mark.parametrize("change, message", [
    ({"tie_word_embeddings": "no"}, "'tie_word_embeddings' must be true or false"),
    ({"rope_theta": "abc"}, "'rope_theta' must be a finite number"),
    ({"attention_bias": 1}, "'attention_bias' must be true or false"),
    ({"attention_dropout": "0.1"}, "'attention_dropout' must be a finite number"),
    ({"model_type": ["llama"]}, "'model_type' must be a string"),
    ({"_name_or_path": 5}, "'_name_or_path' must be a string"),
    ({"num_hidden_layers": 10**30}, "num_layers .* is above 4,096"),
    ({"vocab_size": 10**12}, "vocab_size .* is above"),
])
def test_ill_typed_fields_are_problems_not_coerced(change, message):
    with pytest.raises(InputError, match=message):
        model_from_hf_config(_config("llama3-8b") | change)


@pytest.mark.parametrize("model_type, words", [("qwen3_next", "linear-attention"), ("nemotron_h", "Mamba"),
                                               ("deepseek_v32", "Sparse Attention")])
def test_a_model_of_other_layers_is_refused_with_what_it_has(model_type, words):
    from autotune.errors import InputError

    with pytest.raises(InputError) as err:
        model_from_hf_config({"model_type": model_type, "hidden_size": 64})
    text = str(err.value)
    assert words in text and "did you mean" not in text  # no near name to rename it to (qwen3_moe counted wrong)


@pytest.mark.parametrize("method, groups", [("greedy", None), ("group_limited_greedy", (4, 2))])
def test_deepseek_v2_reads_its_own_router(method, groups):
    """DeepseekV2Config (transformers 5.25): a softmax router without bias, unnormalised top-k, groups only for
    group_limited_greedy; first_k_dense_replace 0 and 2 shared experts by default; no MTP; V2-Lite's q_lora null."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.DeepseekV2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                        num_attention_heads=4, vocab_size=257, n_routed_experts=8,
                                        num_experts_per_tok=2, moe_intermediate_size=32, kv_lora_rank=16,
                                        q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                                        topk_method=method, n_group=4, topk_group=2)
    spec = model_from_hf_config(cfg.to_dict() | {"model_type": "deepseek_v2"})
    moe = spec.moe
    assert (moe.router_score, moe.router_bias, moe.router_pre_softmax) == ("softmax", False, True)
    assert ((moe.router_groups, moe.router_group_topk) if moe.router_groups else None) == groups
    assert (moe.num_dense_layers, moe.num_shared_experts, spec.num_mtp_layers) == (0, 2, 0)
    assert spec.mla is not None and spec.mla.q_lora_rank is None


B = 1e9
# (fixture, published total, published active or None, rel. tolerance, source): the fixtures of checkpoints without a
# preset, against their model cards' figures.
PUBLISHED_COUNTS = [
    ("olmoe-1b-7b", 6.9 * B, 1.3 * B, 0.02, "allenai/OLMoE-1B-7B-0924 card: 6.9B total, 1.3B active (1.28B)"),
    ("deepseek-v2-lite", 15.7 * B, None, 0.01, "deepseek-ai/DeepSeek-V2-Lite card: 15.7B"),
    ("qwen1.5-moe-a2.7b", 14.3 * B, 2.7 * B, 0.01, "Qwen/Qwen1.5-MoE-A2.7B card: 14.3B total, 2.7B activated"),
    ("seed-oss-36b", 36 * B, None, 0.01, "ByteDance-Seed/Seed-OSS-36B-Base card: 36B"),
    ("ernie4.5-0.3b", 0.36 * B, None, 0.01, "baidu/ERNIE-4.5-0.3B-PT card: 0.36B"),
    ("ernie4.5-21b-a3b", 21 * B, 3 * B, 0.12, "baidu/ERNIE-4.5-21B-A3B-PT card: 21B total, 3B activated (truncated: "
     "21.83B / 3.35B)"),
    ("smollm3-3b", 3 * B, None, 0.03, "HuggingFaceTB/SmolLM3-3B card: 3B (3.08B with its tied embedding)"),
    ("dots1-142b", 142 * B, 14 * B, 0.01, "rednote-hilab/dots.llm1.base card: 142B total, 14B activated"),
    ("hunyuan-a13b", 80 * B, 13 * B, 0.025, "tencent/Hunyuan-A13B-Instruct card: 80B total, 13B active (the fixture's "
     "embeddings untied: 80.92B / 13.27B)"),
]


@pytest.mark.parametrize("name, total, active, tol, source", PUBLISHED_COUNTS, ids=[p[0] for p in PUBLISHED_COUNTS])
def test_fixture_counts_match_their_cards(name, total, active, tol, source):
    spec = model_from_hf_config(FIXTURES / name)
    assert spec.num_params == pytest.approx(total, rel=tol), source
    if active is not None:
        assert spec.num_active_params == pytest.approx(active, rel=tol), source


def test_cards_that_count_without_embeddings():
    """EXAONE 4.0 32B's card counts 30.95B without embeddings; MiniMax-M2's 230B total and 10B active, the active
    figure without its (untied) embedding and output head (11.0B with them)."""
    exaone, minimax = model_from_hf_config(FIXTURES / "exaone4-32b"), model_from_hf_config(FIXTURES / "minimax-m2")
    embeddings = 2 * exaone.vocab_size * exaone.hidden_size  # untied
    assert round((exaone.num_params - embeddings) / B, 2) == 30.95
    assert minimax.num_params == pytest.approx(230 * B, rel=0.01)
    assert minimax.num_active_params - 2 * minimax.vocab_size * minimax.hidden_size == pytest.approx(10 * B, rel=0.03)
    assert minimax.rotary_fraction == 0.5 and minimax.qk_norm == "full"  # rotary_dim 64 of head_dim 128


def test_qwen2_moe_gates_its_shared_expert():
    """Qwen1.5-MoE-A2.7B: 60 experts of 1408, top-4, one shared expert of 5632 behind a sigmoid gate of hidden_size
    weights per layer (Qwen2MoeSparseMoeBlock.shared_expert_gate), q/k/v biases."""
    spec = model_from_hf_config(FIXTURES / "qwen1.5-moe-a2.7b")
    moe = spec.moe
    assert (moe.num_experts, moe.top_k, moe.expert_ffn_hidden_size, moe.num_shared_experts) == (60, 4, 1408, 1)
    assert moe.shared_width == 5632 and moe.shared_expert_gate and spec.qkv_bias and moe.router_pre_softmax
    ungated = dataclasses.replace(spec, moe=dataclasses.replace(moe, shared_expert_gate=False))
    assert spec.num_params - ungated.num_params == spec.num_layers * spec.hidden_size


def test_hunyuan_moe_refuses_what_transformers_does_not_build():
    """HunYuanMoEV1Moe builds the same experts on every layer, each and its one shared MLP intermediate_size wide."""
    cfg = _config("hunyuan-a13b")
    with pytest.raises(InputError, match="moe_topk"):
        model_from_hf_config(cfg | {"moe_topk": [8] * 31 + [4]})
    with pytest.raises(InputError, match="moe_intermediate_size"):
        model_from_hf_config(cfg | {"moe_intermediate_size": 1536})
    with pytest.raises(InputError, match="num_shared_expert"):
        model_from_hf_config(cfg | {"num_shared_expert": 2})
