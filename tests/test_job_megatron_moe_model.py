"""The model a Megatron-LM argument list states, MoE and MLA included (autotune.job_megatron_model): the emitted
arguments of DeepSeek-V3 read back as a 702B model without MLA, shared experts, dense first layers or its router, so
`estimate --from` (without --model) put its plan at 136 GiB per GPU where the plan says 171. Now each preset's
arguments read back as the preset, and a model no preset has keeps what the flags say."""
from __future__ import annotations

import dataclasses

import pytest

from autotune.emit.megatron import megatron_args
from autotune.emit.megatron_attention import YARN_DEFAULTS
from autotune.errors import InputError
from autotune.job_megatron_model import megatron_runs, megatron_model, moe_layer_flags
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.plan import ParallelPlan

CLUSTER = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)


def _flags(model) -> dict:
    plan = ParallelPlan(engine="megatron", dp=8, ep=8 if model.is_moe else 1, global_batch_size=8, grad_accum_steps=1,
                        seq_len=4096, zero_stage=1)
    argv = megatron_args(model, CLUSTER, plan)
    out, i = {}, 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]] = argv[i + 1]
            i += 2
        else:
            out[argv[i]] = True
            i += 1
    return out


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2", "moonlight-16b-a3b", "glm-4.5", "llama4-maverick",
                                  "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b"])
def test_a_presets_arguments_read_back_as_the_preset(name):
    notes: list[str] = []
    read = megatron_model(_flags(load_model(name)), "megatron_args.sh", notes)
    if name == "kimi-k2":  # its YaRN beta_fast 1 has no Megatron-LM flag under MLA: the file runs the config's 32
        assert read == dataclasses.replace(load_model(name), yarn_beta_fast=32.0)
        return
    assert read == load_model(name)
    if name == "deepseek-v3":  # YaRN x40 with MLA's mscale_all_dim 1, as transformers and Bridge build it
        flags = _flags(load_model(name))
        assert (flags["--rope-type"], flags["--rotary-scaling-factor"], flags["--mscale-all-dim"]) == ("yarn", "40",
                                                                                                      "1")
        assert flags["--position-embedding-type"] == "rope"  # (MTP needs rope: arguments.py:881-886)


def test_a_model_no_preset_has_keeps_its_moe_and_mla():
    """DeepSeek-V3 with 59 layers: no preset; the flags' MoE layout, shared expert, router and MLA stay."""
    v3 = load_model("deepseek-v3")
    model = dataclasses.replace(v3, num_layers=59, name="mine")
    read = megatron_model(_flags(model), "mine.sh", [])
    assert read.mla == v3.mla
    moe = read.moe
    assert (moe.num_dense_layers, moe.moe_layer_step, moe.num_shared_experts, moe.shared_width) == (3, 1, 1, 2048)
    assert (moe.router_score, moe.router_bias, moe.router_groups, moe.router_group_topk,
            moe.router_scaling_factor) == ("sigmoid", True, 8, 4, 2.5)
    # all of it: the MTP modules are a plan's (--mtp-num-layers), the KV heads MLA's own
    assert dataclasses.replace(read, num_kv_heads=128, num_mtp_layers=1) == model


@pytest.mark.parametrize("value, want", [(None, (0, 1)), ("2", (0, 2)), ("([0]*3+[1]*5)", (3, 1)),
                                         ("[0,1,0,1,0,1,0,1]", (0, 2)), ("[1]*8", (0, 1))])
def test_moe_layer_freq_forms(value, want):
    assert moe_layer_flags(value, 8, "a.sh") == want


@pytest.mark.parametrize("value", ["__import__('os')", "[0]*3+[1]*4", "[1,0,0,1,1,1,1,1]", "[2]*8", "[0]*10**9"])
def test_moe_layer_freq_nonsense_is_named(value):
    with pytest.raises(InputError, match="--moe-layer-freq"):
        moe_layer_flags(value, 8, "a.sh")


@pytest.mark.parametrize("name", ["gpt-oss-20b", "qwen3-8b"])
def test_attention_and_mlp_variants_read_back(name):
    """Two layers fewer than the preset (no preset then): GPT-OSS's windows, sinks, YaRN, clamped GLU and biased
    softmax router, Qwen3's per-head Q/K norms come back from the flags as they were written."""
    preset = load_model(name)
    kept = None if preset.sliding_window_layers is None else tuple(
        i for i in preset.sliding_window_layers if i < preset.num_layers - 2)
    model = dataclasses.replace(preset, name="mine", num_layers=preset.num_layers - 2, sliding_window_layers=kept)
    read = megatron_model(_flags(model), "mine.sh", [])
    # YaRN values equal to Megatron's defaults are not written (their --yarn-* flags are 0.19's): the same run
    yarn = {k: megatron_runs(model, k) for k in YARN_DEFAULTS}
    assert dataclasses.replace(read, **yarn) == dataclasses.replace(model, **yarn)
    assert {k: megatron_runs(read, k) for k in YARN_DEFAULTS} == yarn


def test_dropout_is_what_megatron_runs():
    """--hidden-dropout as written, else Megatron-LM's default 0.1: a Llama preset's shape read from a file that says
    nothing of dropout is that preset with Megatron's dropout (its masks are activations the ledger counts)."""
    flags = _flags(load_model("llama3-8b"))
    assert flags["--hidden-dropout"] == "0"
    notes: list[str] = []
    assert megatron_model(flags, "a.sh", notes) == load_model("llama3-8b")
    del flags["--hidden-dropout"]
    read = megatron_model(flags, "a.sh", notes)
    assert read.dropout == 0.1 and read == dataclasses.replace(load_model("llama3-8b"), dropout=0.1)
    assert any("dropout 0.1, RoPE scaling none, swiglu as a.sh runs it" in n for n in notes)
    flags["--hidden-dropout"] = "1.5"
    with pytest.raises(InputError, match="dropout"):
        megatron_model(flags, "a.sh", [])


def test_rope_scaling_is_what_the_file_runs():
    """--use-rope-scaling (Megatron-core's llama3 scaling, Llama 3.1's parameters) is read back; the 405B shape in a
    file without it is the 405B preset without scaling, as Megatron runs it."""
    flags = _flags(load_model("llama3-405b"))
    assert flags["--rope-scaling-factor"] == "8" and flags["--use-rope-scaling"] is True
    assert megatron_model(flags, "a.sh", []) == load_model("llama3-405b")
    del flags["--use-rope-scaling"], flags["--rope-scaling-factor"]
    notes: list[str] = []
    read = megatron_model(flags, "a.sh", notes)
    assert read.rope_scaling is None and read.rope_low_freq_factor is None and read.num_params == load_model(
        "llama3-405b").num_params
    assert any("RoPE scaling none, swiglu as a.sh runs it (the preset has dropout 0, RoPE scaling llama3 x8" in n
               for n in notes)


def test_the_activation_and_partial_rope_are_what_the_file_runs():
    """Nemotron-4-340B's shape read from a file: --squared-relu and --rotary-percent 0.5 give the preset; without
    them the file runs GeLU (the fused bias-GeLU's tanh form needs biases: F.gelu here, exact) over whole heads."""
    flags = _flags(load_model("nemotron-4-340b"))
    assert megatron_model(flags, "n.sh", []) == load_model("nemotron-4-340b")
    del flags["--squared-relu"], flags["--rotary-percent"]
    notes: list[str] = []
    read = megatron_model(flags, "n.sh", notes)
    assert (read.activation, read.rotary_fraction) == ("gelu", 1.0)
    assert any("gelu, (1 + weight) norms as n.sh runs it" in n and "squared_relu, RoPE on 0.5 of each head" in n
               for n in notes)


def test_pre_softmax_beside_a_sigmoid_router_is_what_megatron_runs():
    """Megatron-LM's Megatron-FSDP DeepSeek-V3 example passes --moe-router-pre-softmax with the sigmoid score; Megatron
    reads the flag under the softmax score only (moe_utils.py topk_routing_with_score_function), so the file runs
    DeepSeek-V3's router: it read back as the preset, where it was refused ("moe.router_pre_softmax applies to a
    softmax router only")."""
    flags = _flags(load_model("deepseek-v3")) | {"--moe-router-pre-softmax": True}
    assert flags["--moe-router-score-function"] == "sigmoid"
    read = megatron_model(flags, "megatron_args.sh", [])
    assert read == load_model("deepseek-v3")


def test_a_gated_shared_expert_is_what_the_file_runs():
    """Qwen1.5-MoE-A2.7B's shared expert behind its sigmoid gate: --moe-shared-expert-gate (Megatron-core
    SharedExpertMLP's gate_weight, TransformerConfig.moe_shared_expert_gate), read back with the gate."""
    from pathlib import Path

    from autotune.specs.hf_config import model_from_hf_config

    model = model_from_hf_config(Path(__file__).parent / "fixtures" / "hf" / "qwen1.5-moe-a2.7b")
    flags = _flags(model)
    assert flags["--moe-shared-expert-gate"] is True and flags["--moe-shared-expert-intermediate-size"] == "5632"
    read = megatron_model(flags, "qwen.sh", [])
    assert read.moe.shared_expert_gate and read.num_params == model.num_params
    ungated = dataclasses.replace(model, moe=dataclasses.replace(model.moe, shared_expert_gate=False))
    assert "--moe-shared-expert-gate" not in _flags(ungated)
