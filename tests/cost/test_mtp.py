"""Multi-token prediction (``ParallelPlan.mtp_layers``, ``autotune.cost.mtp``): the modules' parameters, saved
activations, time and FLOPs land on the last pipeline stage, each as one more layer like the last plus its own
projection, output layer and loss."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.api import estimate, make_plan
from autotune.cost.activations import stage_activation_bytes
from autotune.cost.flops import layer_flops_per_token, logits_flops_per_token
from autotune.cost.kernels import rates
from autotune.cost.mtp import mtp_head_s
from autotune.cost.step_time import TimeSettings
from autotune.engines import engine_for
from autotune.specs.layout import stage_layers, stage_param_groups
from autotune.specs.loading import load_cluster
from autotune.specs.model_parts import ParamGroups
from autotune.specs.presets import load_model_preset

DSV3 = load_model_preset("deepseek-v3")
QWEN = load_model_preset("qwen3-30b-a3b")
LLAMA = load_model_preset("llama3-8b")
B200 = load_cluster(gpu="b200", num_gpus=64)


def _plan(model, mtp=None, **kw):
    args = dict(global_batch_size=256, tp=1, pp=1, ep=8 if model.is_moe else 1, seq_len=4096, micro_batch_size=1,
                engine="megatron", precision="bf16", recompute="none")
    return make_plan(model, B200, **(args | kw), mtp_layers=mtp)


def test_module_params_are_a_last_layer_a_projection_and_three_norms():
    h = DSV3.hidden_size
    one = DSV3.mtp_module_params()
    assert one.total - DSV3.layer_params(DSV3.num_layers - 1).total == 2 * h * h + 3 * h  # RMSNorms: h weights each
    assert DSV3.mtp_params() == DSV3.num_mtp_layers * one.total
    assert DSV3.layer_params(DSV3.num_layers - 1).expert > 0 and one.expert > 0  # DeepSeek-V3's last layer is MoE


@pytest.mark.parametrize("pp", [1, 4])
def test_stage_params_gain_the_modules_on_the_last_stage_only(pp):
    without, with_ = _plan(DSV3, pp=pp), _plan(DSV3, 1, pp=pp)
    for stage in range(pp):
        delta = stage_param_groups(DSV3, with_, stage, "megatron").total - \
            stage_param_groups(DSV3, without, stage, "megatron").total
        if stage < pp - 1:
            assert delta == 0
        else:  # a pipelined last stage builds an embedding for the shifted tokens too (gpt_model.py:173-181)
            embedding = DSV3.embedding_params().total if pp > 1 else 0
            assert delta == DSV3.mtp_module_params().total + embedding


def test_tied_model_keeps_one_table_on_the_last_stage():
    tied = dataclasses.replace(LLAMA, tied_embeddings=True)
    without, with_ = _plan(tied, pp=4), _plan(tied, 2, pp=4)
    delta = stage_param_groups(tied, with_, 3).total - stage_param_groups(tied, without, 3).total
    assert delta == 2 * tied.mtp_module_params().total
    assert isinstance(tied.mtp_module_params(), ParamGroups)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_activations_add_a_last_layer_and_a_second_output(recompute):
    facts = engine_for("megatron").activation_facts(_plan(QWEN))
    without = stage_activation_bytes(QWEN, _plan(QWEN, recompute=recompute), 0, facts)
    with_ = stage_activation_bytes(QWEN, _plan(QWEN, 1, recompute=recompute), 0, facts)
    assert with_["layers"] == without["layers"] and with_["output_and_loss"] == without["output_and_loss"]
    per_layer = without["layers"] / QWEN.num_layers  # every layer of Qwen3-30B-A3B is MoE: the same bytes
    sb, h = 4096, QWEN.hidden_size
    extra = 2 * (2 * h + 4) * sb + 2 * sb * 2 * h + without["output_and_loss"]  # two norms, 2h input, head
    assert with_["mtp"] == pytest.approx(per_layer + extra, rel=1e-9)
    if recompute == "full":  # the MTP layer reruns too: its input alone stays
        assert with_["mtp"] - extra == pytest.approx(2 * sb * h)


def test_pipelined_first_stages_hold_no_mtp_activations():
    plan = _plan(DSV3, 1, pp=4)
    facts = engine_for("megatron").activation_facts(plan)
    assert "mtp" not in stage_activation_bytes(DSV3, plan, 0, facts)
    assert stage_activation_bytes(DSV3, plan, 3, facts)["mtp"] > 0


def test_model_flops_follow_megatrons_count():
    """training.py:1288-1303 at d98e8a6: the MTP layer with the others, 3h + 2h^2 (norms, projection) per module
    and the logits (mtp + 1) times; 3x forward for forward and backward."""
    without, with_ = estimate(QWEN, B200, _plan(QWEN)), estimate(QWEN, B200, _plan(QWEN, 1))
    tokens = 256 * 4096
    last = layer_flops_per_token(QWEN, 4096, QWEN.num_layers - 1)
    h = QWEN.hidden_size
    expected = 3 * tokens * (last.gemm + last.attention + 4 * h * h + logits_flops_per_token(QWEN))
    gained = (with_.time.model_tflops_per_gpu * with_.time.step_time_s
              - without.time.model_tflops_per_gpu * without.time.step_time_s) * 1e12 * 64
    assert gained == pytest.approx(expected, rel=1e-9)


def test_time_grows_by_one_more_last_layer_and_the_head_at_pp1():
    """At pp 1 the MTP module costs what one more decoder layer of the last kind costs, plus, per micro-batch, its
    2h -> h projection's GEMMs and a second output layer and loss (``mtp_head_s``, at the output layer's own rates)."""
    plan = _plan(QWEN, 1)
    without = estimate(QWEN, B200, _plan(QWEN)).time
    with_ = estimate(QWEN, B200, plan).time
    deeper = dataclasses.replace(QWEN, num_layers=QWEN.num_layers + 1)
    one_more_layer = estimate(deeper, B200, _plan(deeper)).time
    assert without.step_time_s < one_more_layer.step_time_s < with_.step_time_s
    engine = engine_for(plan)
    r = rates(B200, "bf16", TimeSettings().efficiency, engine.comm.attention_kernel, None)
    tokens, h, v = 4096, QWEN.hidden_size, QWEN.vocab_size
    logits_s = r.bf16_s(logits_flops_per_token(QWEN) * tokens, tokens, h, v)
    head = sum(mtp_head_s(QWEN, plan, r, logits_s, tokens * 26 * v / r.hbm))
    # compute alone (the longer last stage also hides more of the data-parallel reduction: exposed comm differs);
    # the rest: the gradient accumulation of the projection's parameters and the contention of hidden collectives
    assert with_.compute_s - one_more_layer.compute_s == pytest.approx(plan.num_microbatches * head, rel=0.06)


def test_pipelined_mtp_takes_slots_of_the_last_stage():
    """DeepSeek-V3 on pp 16: without MTP the slot split is E+3 | 14 x 4 | 2+L; with it NVIDIA's layout, E+4 | 14 x 4 |
    1+m+L (Megatron-Bridge recipes/deepseek/h100/deepseek_v3.py:50-68 at 067f987): the last stage gives two layers'
    slots to the module, so the step is no faster, and the module's FLOPs count."""
    cluster = load_cluster(gpu="b200", num_gpus=256)

    def run(mtp):
        plan = make_plan(DSV3, cluster, global_batch_size=1024, pp=16, ep=8, seq_len=4096, micro_batch_size=1,
                         engine="megatron", precision="bf16", recompute="full", mtp_layers=mtp)
        scheme = engine_for(plan).layer_split_of(plan, DSV3.num_layers)
        return estimate(DSV3, cluster, plan), [stage_layers(DSV3.num_layers, 16, s, scheme)[1] for s in (0, 1, 15)]

    (plain, plain_layers), (mtp, mtp_layers) = run(None), run(1)
    assert plain_layers == [3, 4, 2] and mtp_layers == [4, 4, 1]
    assert mtp.time.step_time_s >= plain.time.step_time_s
    assert mtp.time.model_tflops_per_gpu * mtp.time.step_time_s > plain.time.model_tflops_per_gpu * plain.time.step_time_s
    assert mtp.memory.total >= plain.memory.total


def test_estimate_names_the_modules_it_costs_and_the_checkpoints_it_leaves_out(capsys):
    from autotune.cli import main

    argv = ["estimate", "--model", "deepseek-v3", "--gpu", "b200", "--num-gpus", "256", "--seq-len", "4096",
            "--global-batch", "1024", "--pp", "16", "--ep", "8", "--engine", "megatron", "--recompute", "full"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "not trained: the checkpoint's 1 multi-token-prediction module (--mtp-layers 1" in out
    assert main([*argv, "--mtp-layers", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 multi-token-prediction module on the last pipeline stage (--mtp-layers)" in out
    assert "not trained" not in out and " mtp1 " in out
