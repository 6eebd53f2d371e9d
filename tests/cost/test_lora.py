"""LoRA fine-tuning (``ParallelPlan.peft``, autotune.cost.lora / autotune.specs.lora): frozen base weights in the
ledger, the adapters' GEMMs and the base layers' data-gradient-only backward in the step time, adapter-only data-
parallel traffic and optimizer step, and the inputs frozen linears no longer save."""

import dataclasses
import json

import pytest

from autotune.api import estimate, make_plan
from autotune.cost.activations import layer_activations
from autotune.cost.flops import step_flops
from autotune.engines.states import megatron_states
from autotune.errors import InputError
from autotune.rules import plan_problems
from autotune.specs.layout import stage_layers
from autotune.specs.lora import adapter_params_per_layer, lora_run, target_widths, trainable_stage_params
from autotune.specs.peft import LORA_DEFAULT_ALPHA, LORA_DEFAULT_RANK, LORA_TARGETS
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.plan import ParallelPlan

MODEL = load_model("llama3-70b")
CLUSTER = load_cluster(gpu="gb200", num_gpus=8)
BASE = dict(engine="megatron", zero_stage=1, pp=2, vpp=20, seq_len=4096, global_batch_size=32, recompute="none",
            precision="fp8", fp8_recipe="te-current", grad_dtype="bf16")
QKV16 = dict(peft="lora", lora_rank=16, lora_alpha=32, lora_targets=("linear_qkv",))


def _est(**kw):
    return estimate(MODEL, CLUSTER, make_plan(MODEL, CLUSTER, **{**BASE, **kw}))


def test_plan_checks_its_peft_fields_and_reads_back():
    plan = ParallelPlan(peft="lora", lora_targets=["linear_fc2", "linear_qkv"])
    assert plan.lora_targets == ("linear_qkv", "linear_fc2")  # a list from JSON, stored ordered
    assert ParallelPlan(**plan.to_dict()) == plan
    assert "peft" not in ParallelPlan().to_dict()  # full training: the fields are left out
    for bad, words in ((dict(peft="qlora"), "peft must be"), (dict(peft="lora", lora_rank=0), "lora_rank"),
                       (dict(peft="lora", lora_alpha=-1), "lora_alpha"),
                       (dict(peft="lora", lora_targets=("linear_q",)), "lora_targets"),
                       (dict(lora_rank=8), "add --peft lora")):
        with pytest.raises(InputError, match=words):
            ParallelPlan(**bad)


def test_defaults_are_bridges_and_the_adapter_shapes_follow_the_model():
    run = lora_run(ParallelPlan(peft="lora"))
    assert (run.rank, run.alpha, run.targets) == (LORA_DEFAULT_RANK, LORA_DEFAULT_ALPHA, LORA_TARGETS)
    assert lora_run(ParallelPlan()) is None
    h, f = MODEL.hidden_size, MODEL.ffn_hidden_size
    assert target_widths(MODEL, LORA_TARGETS) == [(h, MODEL.q_width + 2 * MODEL.kv_width),
                                                  (MODEL.attention_output_width, h), (h, 2 * f), (f, h)]
    one = ParallelPlan(peft="lora", lora_rank=16, lora_targets=("linear_qkv",))
    assert adapter_params_per_layer(MODEL, one) == 16 * (h + MODEL.q_width + 2 * MODEL.kv_width)
    assert adapter_params_per_layer(MODEL, one.with_(tp=4, dp=1)) == adapter_params_per_layer(MODEL, one) / 4
    layers = stage_layers(MODEL.num_layers, 2, 0)[1]
    assert trainable_stage_params(MODEL, one.with_(pp=2), "megatron", 0) == layers * adapter_params_per_layer(MODEL, one)


def test_ledger_freezes_the_base_weights():
    full, lora = _est(), _est(**QKV16)
    trained = trainable_stage_params(MODEL, lora.plan, "megatron", lora.memory.stage)
    states = megatron_states(lora.plan, trained, 0.0)
    assert lora.memory.gradients == pytest.approx(states.gradients)  # bf16 buffers of the adapters only
    assert lora.memory.optimizer_states == pytest.approx(states.optimizer_states)
    assert lora.memory.gradients < full.memory.gradients / 1000
    assert lora.memory.optimizer_states < full.memory.optimizer_states / 1000
    # the frozen weights stay, in the same bytes (FP8 parameters with the distributed optimizer), plus the adapters
    assert full.memory.weights < lora.memory.weights < full.memory.weights * 1.01
    assert lora.memory.fits and not full.memory.fits


def test_frozen_linears_save_no_inputs_and_adapters_save_theirs():
    plan = make_plan(MODEL, CLUSTER, **BASE)
    full = layer_activations(MODEL, plan)
    qkv = layer_activations(MODEL, plan.with_(**QKV16))
    sb, h, f = plan.seq_len * plan.micro_batch_size, MODEL.hidden_size, MODEL.ffn_hidden_size
    # FP8: fc1 and fc2 no longer save their 1-byte inputs, nor the output projection its cast
    assert full.mlp - qkv.mlp == pytest.approx(sb * (h + f))
    # QKV: the adapter's 16-bit input replaces the 1-byte FP8 cast, plus its rank-16 intermediate; the projection's
    # FP8 cast goes
    assert qkv.attention - full.attention == pytest.approx(sb * h + 2 * sb * 16 - sb * MODEL.attention_output_width)
    assert layer_activations(MODEL, plan.with_(**QKV16, precision="bf16", fp8_recipe=None)).mlp < layer_activations(
        MODEL, plan.with_(precision="bf16", fp8_recipe=None)).mlp


def test_step_drops_weight_gradients_and_pays_the_adapters():
    full, lora = _est(), _est(**QKV16)
    # backward without the base GEMMs' weight gradients: at least a sixth of the step (a third of 6N of the GEMMs)
    assert lora.time.step_time_s < full.time.step_time_s * 0.85
    assert lora.time.optimizer_s < full.time.optimizer_s / 100  # Adam over the adapters only
    wide = _est(**{**QKV16, "lora_rank": 256, "lora_targets": LORA_TARGETS})
    assert wide.time.step_time_s > lora.time.step_time_s  # more and wider adapters cost more
    assert lora.time.comm_parts_s["dp"] <= full.time.comm_parts_s["dp"]


def test_model_flops_count_no_frozen_weight_gradients():
    base = step_flops(MODEL, 4096, 4096.0, "none")
    frozen = step_flops(MODEL, 4096, 4096.0, "none", lora_params=0.0)
    assert frozen.model < base.model * 0.75 and frozen.model > base.model * 0.6
    assert step_flops(MODEL, 4096, 4096.0, "none", lora_params=1e9).model == pytest.approx(frozen.model + 6e9 * 4096)


def test_engines_without_lora_refuse_it_naming_megatron():
    for engine in ("deepspeed", "fsdp", "hf"):
        plan = ParallelPlan(engine=engine, dp=8, zero_stage=3, global_batch_size=8, peft="lora")
        found = dict(plan_problems(MODEL, CLUSTER, plan))
        assert "--engine megatron" in found.get(f"{engine}:peft", "") and "--peft" in found[f"{engine}:peft"], found
    assert not [r for r, _ in plan_problems(MODEL, CLUSTER, ParallelPlan(engine="megatron", dp=8, zero_stage=1,
                                                                        global_batch_size=8, peft="lora"))]
    moe = load_model("mixtral-8x7b")
    plan = ParallelPlan(engine="megatron", dp=8, zero_stage=1, global_batch_size=8, peft="lora")
    assert any("MoE" in message for _, message in plan_problems(moe, CLUSTER, plan))


def test_caches_tell_lora_plans_from_full_ones():
    """A LoRA plan estimated after its full-training twin (and back) gets its own figures: every cache key reads
    the PEFT fields."""
    full, lora, again = _est(), _est(**QKV16), _est()
    assert dataclasses.astuple(full.time) == dataclasses.astuple(again.time)
    assert full.memory.total == again.memory.total and lora.memory.total != full.memory.total


LORA_ARGV = ["--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--engine", "megatron", "--zero",
             "1", "--global-batch", "16", "--seq-len", "4096"]


def test_estimate_and_plan_take_the_peft_flags(capsys):
    from autotune.cli import main

    assert main(["estimate", *LORA_ARGV, "--peft", "lora", "--lora-rank", "8", "--lora-targets", "linear_qkv",
                 "linear_proj", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["peft"] == "lora" and doc["plan"]["lora_rank"] == 8
    assert doc["plan"]["lora_targets"] == ["linear_qkv", "linear_proj"]
    assert any("LoRA rank 8" in s for s in doc["assumed_settings"])
    assert main(["estimate", *LORA_ARGV, "--json"]) == 0
    assert "peft" not in json.loads(capsys.readouterr().out)["plan"]
    # an engine without LoRA: exit 2, naming the way out
    assert main(["estimate", *LORA_ARGV[:-8], "--engine", "fsdp", "--zero", "2", "--global-batch", "16",
                 "--peft", "lora"]) == 2
    err = capsys.readouterr().err
    assert "--engine megatron" in err and "drop --peft" in err
    assert main(["estimate", *LORA_ARGV, "--lora-rank", "8"]) == 2
    assert "add --peft lora" in capsys.readouterr().err
    # the planner searches LoRA plans: every plan it lists fine-tunes
    assert main(["plan", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--global-batch", "16",
                 "--seq-len", "4096", "--peft", "lora", "--top", "3", "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["candidates"]
    assert plans and all(p["plan"]["peft"] == "lora" and p["plan"]["engine"] == "megatron" for p in plans)
