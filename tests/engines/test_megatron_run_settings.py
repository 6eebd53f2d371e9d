"""Megatron's run settings that depend on the model (tests/engines/test_run_settings.py walks the ones a dense Llama
has): each of Megatron-core's selective recompute modules on a model that has the module (DeepSeek-V3: MLA, MoE with
a shared expert, dense first layers) keeps fewer activations and costs recompute time, is written into
megatron_args.sh and the Bridge overrides and read back from both to the same plan and estimate; what Megatron refuses,
or what would recompute nothing in the model, is refused with its rule.
"""

from __future__ import annotations

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.errors import InputError
from autotune.job_files import read_job
from autotune.rules import plan_problems
from autotune.specs.loading import load_cluster
from autotune.specs.plan import RECOMPUTE_MODULES, ParallelPlan
from autotune.specs.presets import load_model_preset

GPU = "h100-sxm-80gb"
DSV3 = load_model_preset("deepseek-v3")
LLAMA = load_model_preset("llama3-8b")
C64 = load_cluster(gpu=GPU, num_gpus=64)
C16 = load_cluster(gpu=GPU, num_gpus=16)


def _dsv3(modules, **kw) -> ParallelPlan:
    return make_plan(DSV3, C64, engine="megatron", global_batch_size=64, tp=2, ep=8, sequence_parallel=True,
                     zero_stage=1, seq_len=4096, recompute="selective", recompute_modules=modules, **kw)


@pytest.mark.parametrize("module", [m for m in RECOMPUTE_MODULES if m != "core_attn"])
def test_each_module_saves_memory_costs_time_and_reads_back(tmp_path, module):
    default, plan = _dsv3(None), _dsv3(("core_attn", module))
    before, after = estimate(DSV3, C64, default), estimate(DSV3, C64, plan)
    assert after.memory.activations < before.memory.activations
    assert after.time.compute_s > before.time.compute_s  # the module's forward runs again in backward
    files = render_bundle(after).files
    assert "--recompute-modules core_attn " + module in files["megatron_args.sh"].replace("\\\n", " ").replace(
        "  ", " ")
    for names in (("megatron_args.sh", "launch_torchrun.sh"), ("bridge_overrides.yaml",), ("bridge_overrides.args",)):
        for name in names:
            (tmp_path / name).write_text(files[name])
        job = read_job([str(tmp_path / n) for n in names], gpu=GPU, num_gpus=64, model="deepseek-v3")
        assert job.plan.recompute_modules == plan.recompute_modules, names
        again = estimate(job.model, job.cluster, job.plan, job.settings)
        assert again.time.step_time_s == pytest.approx(after.time.step_time_s, rel=1e-9), names
        assert again.memory.total == pytest.approx(after.memory.total, rel=1e-9), names


def test_mlp_recompute_of_a_dense_llama_in_numbers():
    """Llama-3-8B, 16 H100, tp 2 + SP, seq 4096: the MLP's saved tensors (SwiGLU fc1 output 2 x 2f and fc2 input f,
    16-bit, per token over tp) go, and the two MLP GEMMs rerun in backward."""
    base = make_plan(LLAMA, C16, engine="megatron", global_batch_size=64, tp=2, sequence_parallel=True, zero_stage=1,
                     seq_len=4096, recompute="selective")
    a, b = estimate(LLAMA, C16, base), estimate(LLAMA, C16, base.with_(recompute_modules=("core_attn", "mlp")))
    f, tokens = LLAMA.ffn_hidden_size, 4096
    per_layer = tokens * (2 * 2 * f + 2 * f) / 2
    lse = 4 * tokens * LLAMA.num_attention_heads / 2  # the recompute working set was the attention core's fp32 LSE
    # one micro-batch in flight (pp 1), every layer; the recomputed MLP of one layer lives during its backward
    assert a.memory.activations - b.memory.activations == pytest.approx(per_layer * (LLAMA.num_layers - 1) + lse,
                                                                        rel=1e-9)
    assert b.time.step_time_s > a.time.step_time_s and b.time.hfu > a.time.hfu


@pytest.mark.parametrize(("model", "modules", "why"), [
    ("llama3-8b", ("mla_up_proj",), "only supported with multi_latent_attention"),
    ("llama3-8b", ("moe_act",), "has none"),
    ("llama3-8b", ("layernorm",), "recomputes nothing"),
    ("mixtral-8x7b", ("shared_experts",), "no shared experts"),
])
def test_what_megatron_refuses_or_would_not_recompute_is_refused_with_the_rule(model, modules, why):
    m = load_model_preset(model)
    plan = ParallelPlan(engine="megatron", tp=2, dp=8, ep=8 if m.moe else 1, sequence_parallel=True, zero_stage=1,
                        global_batch_size=64, grad_accum_steps=8, seq_len=4096, recompute="selective",
                        recompute_modules=modules)
    problems = plan_problems(m, C16, plan)
    assert any(rule == "megatron:recompute_modules" and why in text for rule, text in problems), problems


def test_delayed_fp8_scaling_refuses_moe_act_as_megatron_does():
    with pytest.raises(InputError, match="Delayed scaling does not support moe_act"):
        _dsv3(("moe_act",), precision="fp8")
    assert not plan_problems(DSV3, C64, _dsv3(("moe_act",), precision="fp8", fp8_recipe="te-current"))


def test_modules_need_selective_recompute_and_other_engines_refuse_them():
    with pytest.raises(InputError, match="use --recompute selective or drop --recompute-modules"):
        ParallelPlan(recompute="full", recompute_modules=("mlp",))
    with pytest.raises(InputError, match="not one of"):
        ParallelPlan(recompute="selective", recompute_modules=("attention",))
    assert ParallelPlan(recompute="selective", recompute_modules=["mlp", "core_attn"]).recompute_modules == (
        "core_attn", "mlp")  # a plan.json list, in the one order


def _llama_tp8(seq_len: int, **kw) -> ParallelPlan:
    return make_plan(LLAMA, C64, engine="megatron", global_batch_size=64, tp=8, sequence_parallel=True, zero_stage=1,
                     seq_len=seq_len, recompute="none", **kw)


def test_cuda_graphs_hide_the_launches_small_work_waits_for_and_keep_static_buffers():
    # seq 256 over tp 8: a layer's forward GEMMs take less time than the host needs to launch its ~15 kernels
    eager, graphed = estimate(LLAMA, C64, _llama_tp8(256)), estimate(LLAMA, C64, _llama_tp8(256, cuda_graph="local"))
    assert graphed.time.compute_s < eager.time.compute_s
    # seq 4096: the GPU work hides the launches; the graphs cost only their static input / output buffers
    eager, graphed, te = (estimate(LLAMA, C64, _llama_tp8(4096, **kw))
                          for kw in ({}, {"cuda_graph": "local"}, {"cuda_graph": "transformer_engine"}))
    assert graphed.time.step_time_s == pytest.approx(eager.time.step_time_s, rel=1e-12)
    layer_input = 2 * 4096 * LLAMA.hidden_size / 8  # 16-bit, sequence-parallel over tp 8
    # local: 4 buffers per graphed part (attention, MLP) of each layer, one micro-batch in flight (pp 1)
    assert graphed.memory.buffer_parts["cuda_graphs"] == pytest.approx(4 * layer_input * 2 * LLAMA.num_layers)
    assert graphed.memory.total > eager.memory.total
    # Transformer Engine's graphs share their input / output buffers along the layers: one layer's 4 per stage
    assert te.memory.buffer_parts["cuda_graphs"] == pytest.approx(4 * layer_input)


@pytest.mark.parametrize(("model", "kw", "why"), [
    ("llama3-8b", dict(recompute="full", cuda_graph="transformer_engine"), "full recompute is only supported"),
    ("llama3-8b", dict(cuda_graph="local", cuda_graph_scope=("moe_router",)), "only supported for MoE"),
    ("qwen3-30b-a3b", dict(cuda_graph="local", cuda_graph_scope=("mlp",)), "every layer of"),
])
def test_cuda_graphs_megatron_refuses_are_refused_with_the_rule(model, kw, why):
    m = load_model_preset(model)
    plan = ParallelPlan(engine="megatron", tp=2, dp=8, ep=8 if m.moe else 1, sequence_parallel=True, zero_stage=1,
                        global_batch_size=64, grad_accum_steps=8, seq_len=4096, **kw)
    problems = plan_problems(m, C16, plan)
    assert any(rule == "megatron:cuda_graph" and why in text for rule, text in problems), problems


def test_bridge_takes_te_graphs_and_leaves_local_ones_to_megatron_args():
    te = render_bundle(estimate(LLAMA, C64, _llama_tp8(4096, cuda_graph="transformer_engine",
                                                       cuda_graph_scope=("attn",)))).files
    assert "model.cuda_graph_impl=transformer_engine" in te["bridge_overrides.args"]
    assert "model.cuda_graph_modules=[attn]" in te["bridge_overrides.args"]
    local = render_bundle(estimate(LLAMA, C64, _llama_tp8(4096, cuda_graph="local"))).files
    assert "bridge_overrides.yaml" not in local and "--cuda-graph-impl local" in local["megatron_args.sh"]
    assert "full iterations only" in local["plan.md"]


@pytest.mark.parametrize(("release", "flag"), [("0.16", "--cuda-graph-scope"), ("0.17", "--cuda-graph-scope"),
                                               ("0.18", "--cuda-graph-modules"), ("0.19", "--cuda-graph-modules")])
def test_the_graph_scope_flag_follows_the_release(tmp_path, release, flag):
    from autotune.emit.megatron import megatron_args
    from autotune.emit.options import EmitOptions

    plan = _llama_tp8(4096, cuda_graph="transformer_engine", cuda_graph_scope=("attn",))
    argv = megatron_args(LLAMA, C64, plan, EmitOptions(megatron_version=release))
    assert argv[argv.index(flag) + 1] == "attn" and argv[argv.index("--cuda-graph-impl") + 1] == "transformer_engine"
    path = tmp_path / "megatron_args.sh"
    path.write_text("MEGATRON_ARGS=(\n  " + " ".join(argv) + "\n)\n")
    back = read_job([str(path)], gpu=GPU, num_gpus=64, model="llama3-8b").plan
    assert (back.cuda_graph, back.cuda_graph_scope) == ("transformer_engine", ("attn",))
