"""How each config.json's layers differ from a Llama layer, read into ModelSpec and written where an engine can:
the Q/K norm (per head: Qwen3; whole width: OLMo 2; weightless on the rotary layers: Llama 4 Scout, Maverick has
none), OLMo 2's norms on the outputs, GPT-NeoX / Falcon's parallel residual, RoPE on part of each head (GPT-NeoX
0.25, GLM-4.5 0.5). tests/workloads/test_transformer_vs_hf.py checks the built-in model computes each as transformers
does."""

from __future__ import annotations

import pytest

from autotune.errors import InputError
from autotune.specs.loading import load_model
from autotune.specs.model import ModelSpec

FIXTURES = "tests/fixtures/hf"


@pytest.mark.parametrize("config, kind", [("llama4-scout", "l2"), ("llama4-scout-text", "l2"),
                                          ("llama4-maverick", None), ("qwen3-8b", "head"), ("olmo2-13b", "full"),
                                          ("llama3-8b", None)])
def test_config_json_qk_norm(config, kind):
    assert load_model(f"{FIXTURES}/{config}/config.json").qk_norm == kind


def test_llama4_rotary_layers_are_its_chunked_ones():
    scout = load_model("llama4-scout")
    assert [scout.is_rotary_layer(i) for i in range(8)] == [True, True, True, False] * 2
    assert all(load_model("llama3-8b").is_rotary_layer(i) for i in range(32))
    assert not load_model("gpt3-175b").is_rotary_layer(0)


def test_l2_without_rope_is_refused():
    with pytest.raises(InputError, match="qk_norm l2 normalises the rotary layers"):
        ModelSpec(name="x", num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=96, vocab_size=128,
                  qk_norm="l2")


def test_olmo2_post_norm_is_read_and_refused_where_the_layer_is_pre_norm():
    from autotune.emit.megatron_bridge_recipes import bridge_model_problems
    from autotune.emit.megatron_deepspeed_model import megatron_deepspeed_model_problems
    from autotune.emit.megatron_model_flags import architecture_problems

    olmo2 = load_model(f"{FIXTURES}/olmo2-13b/config.json")
    assert olmo2.post_norm and not load_model(f"{FIXTURES}/llama3-8b/config.json").post_norm
    assert any("OLMo 2's post-norm" in p for p in architecture_problems(olmo2))
    assert any("outputs" in p for p in bridge_model_problems(olmo2))
    assert any("attention and MLP outputs" in p for p in megatron_deepspeed_model_problems(olmo2, 4096))
    with pytest.raises(InputError, match="post_norm"):
        ModelSpec(name="x", num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=96, vocab_size=128,
                  norms_per_layer=1, post_norm=True)


@pytest.mark.parametrize("config, fraction, parallel", [("gpt-neox-20b", 0.25, True), ("glm-4.5", 0.5, False),
                                                        ("falcon-40b", 1.0, True), ("llama3-8b", 1.0, False)])
def test_rotary_fraction_and_parallel_residual_are_read(config, fraction, parallel):
    model = load_model(f"{FIXTURES}/{config}/config.json")
    assert (model.rotary_fraction, model.parallel_residual) == (fraction, parallel)


def test_the_megatron_files_rotate_what_the_model_rotates():
    from autotune.emit.megatron_attention import position_and_attention_flags
    from autotune.emit.megatron_deepspeed_model import rope_theta_flags
    from autotune.emit.megatron_model_flags import layer_norms_problem

    glm = load_model("glm-4.5")
    flags = position_and_attention_flags(glm)
    assert flags[flags.index("--rotary-percent") + 1] == "0.5"
    assert "--rotary-percent" not in position_and_attention_flags(load_model("llama3-8b"))
    neox = load_model("gpt-neox-20b")
    assert rope_theta_flags(neox)[-2:] == ["--rotary-percent", "0.25"]
    assert "side by side" in layer_norms_problem(neox)  # neither Megatron builds a parallel residual
    with pytest.raises(InputError, match="rotary_fraction"):
        ModelSpec(name="x", num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=96, vocab_size=128,
                  position_embedding="rope", rotary_fraction=0.3)  # 16 x 0.3: not an even number of dimensions


def test_opt_is_relu_and_neither_megatron_writes_relu():
    from autotune.emit.megatron_deepspeed_model import megatron_deepspeed_model_problems
    from autotune.emit.megatron_model_flags import architecture_problems

    opt = load_model(f"{FIXTURES}/opt-175b/config.json")
    assert opt.activation == "relu" == load_model("opt-175b").activation
    assert any("ReLU" in p for p in architecture_problems(opt))
    assert any("ReLU" in p for p in megatron_deepspeed_model_problems(opt, 2048))
    assert load_model(f"{FIXTURES}/gpt2/config.json").activation == "gelu_tanh"  # gelu_new


GEMMA_FIELDS = dict(activation="geglu", attn_logit_softcap=50.0, final_logit_softcap=30.0, query_pre_attn_scalar=144.0,
                    scaled_embeddings=True, local_rope_theta=10000.0, sliding_window=4096)


PART_WORDS = {"activation": "GeGLU", "attn_logit_softcap": "scores capped", "final_logit_softcap": "logits capped",
              "query_pre_attn_scalar": "query_pre_attn_scalar", "scaled_embeddings": "sqrt(hidden_size)",
              "local_rope_theta": "RoPE base"}


def test_gemma2_is_read_with_its_layer_and_no_megatron_builds_it_without_saying_so():
    from dataclasses import replace

    from autotune.emit.megatron_bridge_recipes import bridge_model_problems, generic_model_fields
    from autotune.emit.megatron_deepspeed_model import megatron_deepspeed_model_problems
    from autotune.emit.megatron_model_flags import architecture_problems, shape_flags
    from autotune.engines.builtin_trainer import hf_model_family
    from autotune.specs.plan import ParallelPlan

    gemma2 = load_model(f"{FIXTURES}/gemma2-9b/config.json")  # query_pre_attn_scalar 256 = head_dim: not carried
    assert (gemma2.activation, gemma2.attn_logit_softcap, gemma2.final_logit_softcap) == ("geglu", 50.0, 30.0)
    assert gemma2.scaled_embeddings and gemma2.norm_zero_centered and gemma2.query_pre_attn_scalar is None
    assert gemma2.num_params == load_model(f"{FIXTURES}/gemma2-9b/config.json").num_params
    # each Gemma part on an otherwise Llama-like layer: named by all three Megatron writers and no HF family
    llama = load_model("llama3-8b")
    for field, value in GEMMA_FIELDS.items():
        if field == "sliding_window":
            continue
        model = replace(llama, **{field: value}, **({"sliding_window": 4096} if field == "local_rope_theta" else {}))
        word = PART_WORDS[field]
        for problems in (architecture_problems(model), megatron_deepspeed_model_problems(model, 4096),
                         bridge_model_problems(model)):
            assert any(word in p for p in problems), (field, problems)
        assert not any(word in p for p in architecture_problems(llama) + bridge_model_problems(llama))
        assert hf_model_family(model) is None
    # (1 + weight) norms: Megatron-core builds them (--apply-layernorm-1p, layernorm_zero_centered_gamma)
    zero = replace(llama, norm_zero_centered=True)
    assert not architecture_problems(zero) and not bridge_model_problems(zero)
    assert "--apply-layernorm-1p" in shape_flags(zero, ParallelPlan(dp=8, global_batch_size=8, micro_batch_size=1, grad_accum_steps=1, seq_len=4096), [])
    assert generic_model_fields(zero)["layernorm_zero_centered_gamma"] is True
    assert any("(1 + weight)" in p for p in megatron_deepspeed_model_problems(zero, 4096))
    with pytest.raises(InputError, match="local_rope_theta"):
        replace(llama, local_rope_theta=10000.0)  # no local layers to give it to


def test_each_plain_activation_is_written_as_each_megatron_runs_it():
    """GeLU exact or in its tanh form, squared ReLU: Megatron-LM's fused bias-GeLU is the tanh form, F.gelu the exact
    one (--no-bias-gelu-fusion where there are biases), and without biases it has no tanh form; Megatron-DeepSpeed's
    --openai-gelu is; Bridge names the function (fast_gelu, squared_relu) with the fusion off."""
    from dataclasses import replace

    from autotune.emit.megatron import megatron_deepspeed_args
    from autotune.emit.megatron_bridge_recipes import generic_model_fields
    from autotune.emit.megatron_model_flags import activation_flags, architecture_problems
    from autotune.specs.loading import load_cluster
    from autotune.specs.plan import ParallelPlan

    gpt3 = load_model("gpt3-175b")  # GPT-2's gelu_new, biases: Megatron's default fused bias-GeLU
    assert gpt3.activation == "gelu_tanh" and activation_flags(gpt3) == [] and not architecture_problems(gpt3)
    exact = replace(gpt3, activation="gelu")
    assert activation_flags(exact) == ["--no-bias-gelu-fusion"]
    assert activation_flags(replace(exact, linear_bias=False)) == []
    assert any("tanh form without biases" in p for p in architecture_problems(replace(gpt3, linear_bias=False)))
    nemotron = load_model("nemotron-4-340b")  # squared ReLU, RoPE on half of each head, (1 + weight) LayerNorms
    assert (nemotron.activation, nemotron.rotary_fraction, nemotron.norm_zero_centered) == ("squared_relu", 0.5, True)
    assert activation_flags(nemotron) == ["--squared-relu"]
    assert activation_flags(replace(nemotron, linear_bias=True)) == ["--squared-relu", "--no-bias-gelu-fusion"]
    fields = generic_model_fields(nemotron)
    assert (fields["activation_func"], fields["bias_activation_fusion"]) == ("squared_relu", False)
    assert generic_model_fields(gpt3)["activation_func"] == "fast_gelu"
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    plan = ParallelPlan(dp=8, global_batch_size=8, micro_batch_size=1, grad_accum_steps=1, seq_len=2048,
                        engine="megatron-deepspeed")
    mds = {name: megatron_deepspeed_args(m, cluster, plan, None, "ds.json") for name, m in (
        ("tanh-nobias", replace(gpt3, linear_bias=False)), ("exact-bias", exact), ("tanh-bias", gpt3))}
    assert "--openai-gelu" in mds["tanh-nobias"] and "--no-bias-gelu-fusion" in mds["exact-bias"]
    assert not {"--openai-gelu", "--no-bias-gelu-fusion"} & set(mds["tanh-bias"])
