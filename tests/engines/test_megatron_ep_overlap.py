"""Megatron's expert-parallel all-to-all overlap (``ParallelPlan.ep_overlap``: --overlap-moe-expert-parallel-comm,
--delay-wgrad-compute): the paired 1F1B schedule of autotune.cost.ep_overlap hides the all-to-alls behind the other
micro-batch's compute and no more; the micro-batches outside the steady phase still wait; the extra warm-up forward of
the interleaved schedule costs activations; what megatron-core refuses is refused with its rule; Bridge gets the
fields where its CommOverlapConfig would otherwise overwrite them, and both files read back.
(tests/engines/test_run_settings.py round-trips the setting through megatron_args.sh.)
"""

from __future__ import annotations

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.cli import main
from autotune.cost.ep_overlap import paired_layers_s, paired_share
from autotune.job_files import read_job
from autotune.rules import plan_problems
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset

GPU = "h100-sxm-80gb"
QWEN235 = load_model_preset("qwen3-235b-a22b")
QWEN30 = load_model_preset("qwen3-30b-a3b")
MIXTRAL = load_model_preset("mixtral-8x7b")
C128 = load_cluster(gpu=GPU, num_gpus=128)
C32 = load_cluster(gpu=GPU, num_gpus=32)

FWD, BWD = (0.7, 0.6), (1.1, 0.3, 0.7, 0.6)  # (attention side, experts) forward; backward data / weight gradients


@pytest.mark.parametrize("a2a", [0.0, 0.2, 0.6, 0.9, 1.2, 3.0])
def test_the_paired_schedule_hides_no_more_than_the_other_micro_batchs_compute(a2a):
    layers, compute = 12, sum(FWD) + sum(BWD)
    for delay in (False, True):
        t = paired_layers_s(layers, FWD, BWD, a2a, delay)
        # never faster than the compute or than the four all-to-alls of a layer pair on their one stream
        assert t >= layers * max(compute, 4 * a2a) - 1e-12
        assert t <= layers * (compute + 4 * a2a) + 1e-12  # never slower than without the overlap
    if 4 * a2a <= min(FWD[0], BWD[0]):  # each all-to-all shorter than the compute beside it: all hidden
        assert paired_layers_s(layers, FWD, BWD, a2a, False) == pytest.approx(layers * compute)
    # the weight gradients apart let the backward all-to-alls start sooner: never slower, faster in between
    assert paired_layers_s(layers, FWD, BWD, a2a, True) <= paired_layers_s(layers, FWD, BWD, a2a, False) + 1e-12


def test_delay_wgrad_shortens_a_schedule_the_data_gradients_hold_up():
    a2a = 0.9  # each all-to-all longer than the experts' data gradient, shorter than their whole backward
    assert BWD[2] < a2a < BWD[2] + BWD[3]
    assert paired_layers_s(12, FWD, BWD, a2a, True) < paired_layers_s(12, FWD, BWD, a2a, False)


def test_a_host_that_issues_nothing_changes_nothing():
    for a2a in (0.0, 0.4, 1.2):
        for delay in (False, True):
            assert paired_layers_s(12, FWD, BWD, a2a, delay, (0.0,) * 5) == \
                pytest.approx(paired_layers_s(12, FWD, BWD, a2a, delay))


@pytest.mark.parametrize("delay", [False, True])
def test_the_host_issue_bounds_the_pairs_from_below(delay):
    host = (0.05, 0.9, 0.05, 0.8, 0.7)  # the experts' calls outlast their GPU work (FWD / BWD experts: 0.6-0.7)
    for a2a in (0.0, 0.3, 0.9):
        t = paired_layers_s(12, FWD, BWD, a2a, delay, host)
        assert t >= 12 * sum(host) - 1e-12  # the host issues every node of every layer, one after another
        assert t >= paired_layers_s(12, FWD, BWD, a2a, delay) - 1e-12  # never faster than a free host


def test_the_dispatch_sync_holds_the_host_until_the_forwards_attention_side_ends():
    # one layer pair, the forward's attention side long, the experts' weight gradient and forward slow to issue:
    # the host may issue them only once the forward's pre-dispatch node (and its token counts) is done
    pre_f, exp_f, pre_dgrad, exp_dgrad, exp_wgrad = 2.0, 0.1, 0.1, 0.1, 0.1
    fwd, bwd = (pre_f, exp_f), (pre_dgrad, 0.0, exp_dgrad, exp_wgrad)
    host_w, host_f = 0.5, 0.5
    free = paired_layers_s(1, fwd, bwd, 0.0, True)
    assert free == pytest.approx(pre_f + exp_dgrad + exp_wgrad + exp_f + pre_dgrad)
    held = paired_layers_s(1, fwd, bwd, 0.0, True, (0.0, host_f, 0.0, 0.0, host_w))
    assert held == pytest.approx(pre_f + host_w + host_f + pre_dgrad)  # issued after the sync, one after the other


def _qwen235(ep_overlap=None, **kw) -> ParallelPlan:
    return make_plan(QWEN235, C128, engine="megatron", global_batch_size=512, tp=2, ep=8, pp=4, vpp=2,
                     sequence_parallel=True, zero_stage=1, seq_len=4096, ep_overlap=ep_overlap, **kw)


def test_the_overlap_hides_the_steady_phases_all_to_alls_and_keeps_one_more_forward():
    plain, a2a, dw = (estimate(QWEN235, C128, _qwen235(v)) for v in (None, "a2a", "a2a-delay-wgrad"))
    moe = [e.time.comm_parts_s["moe"] for e in (plain, a2a, dw)]
    assert moe[1] < moe[0] and moe[2] <= moe[1]
    assert dw.time.step_time_s <= a2a.time.step_time_s < plain.time.step_time_s
    # the warm-up forwards and cool-down backwards run alone: their all-to-alls wait as before
    share = paired_share(_qwen235("a2a"))
    assert 0 < share < 1 and moe[1] >= (1 - share) * moe[0] - 1e-12
    # interleaved: one chunk-micro-batch forward more before the steady phase (schedules.py:939-943)
    assert a2a.memory.activations > plain.memory.activations
    assert dw.memory.total == pytest.approx(a2a.memory.total, rel=1e-12)


def test_without_pipelining_all_but_one_micro_batch_pair_up_and_memory_stays():
    def plan(v):
        return make_plan(MIXTRAL, C32, engine="megatron", global_batch_size=128, tp=2, ep=8, sequence_parallel=True,
                         zero_stage=1, seq_len=4096, ep_overlap=v)

    assert paired_share(plan("a2a")) == pytest.approx(1 - 1 / plan("a2a").num_microbatches)
    plain, over = estimate(MIXTRAL, C32, plan(None)), estimate(MIXTRAL, C32, plan("a2a"))
    assert over.time.comm_parts_s["moe"] < plain.time.comm_parts_s["moe"]
    assert over.memory.total == pytest.approx(plain.memory.total, rel=1e-12)
    assert paired_share(plan("none")) == 0 and paired_share(plan(None)) == 0


@pytest.mark.parametrize(("model", "kw", "why"), [
    ("mixtral-8x7b", dict(ep=1), "only supported with expert model parallelism"),
    ("qwen3-30b-a3b", dict(pp=2), "virtual_pipeline_model_parallel_size must be specified"),
    ("qwen3-30b-a3b", dict(recompute="full"), "disable full recomputation"),
    ("qwen3-30b-a3b", dict(recompute="selective", recompute_modules=("moe",)), "disable moe in recompute_modules"),
    ("qwen3-30b-a3b", dict(cuda_graph="transformer_engine"), "captures the whole MLP/MoE part"),
    ("qwen3-30b-a3b", dict(cuda_graph="local"), "replays Transformer Engine layer graphs only"),
    ("gpt-oss-20b", dict(cuda_graph="transformer_engine", cuda_graph_scope=("attn",), ep_overlap="a2a-delay-wgrad"),
     "doesn't support attn bias"),
    ("deepseek-v3", dict(mtp_layers=2), "MTP supports at most one layer"),  # the plan's --mtp-num-layers
])
def test_what_megatron_refuses_of_the_overlap_is_refused_with_the_rule(model, kw, why):
    m = load_model_preset(model)
    c = load_cluster(gpu=GPU, num_gpus=64)
    kw = {"ep": 8, "ep_overlap": "a2a", **kw}
    plan = ParallelPlan(engine="megatron", tp=2, dp=32 // kw.get("pp", 1), sequence_parallel=True, zero_stage=1,
                        global_batch_size=256, grad_accum_steps=8, seq_len=4096, **kw)
    problems = plan_problems(m, c, plan)
    assert any(rule == "megatron:ep_overlap" and why in text for rule, text in problems), problems
    # the same plan without the overlap breaks none of them
    assert not any(rule == "megatron:ep_overlap" for rule, _ in plan_problems(m, c, plan.with_(ep_overlap=None)))


def test_graphs_of_the_attention_and_router_run_with_the_overlap():
    plan = make_plan(QWEN30, C32, engine="megatron", global_batch_size=128, tp=2, ep=8, sequence_parallel=True,
                     zero_stage=1, seq_len=4096, ep_overlap="a2a-delay-wgrad", cuda_graph="transformer_engine",
                     cuda_graph_scope=("attn", "moe_router"))
    assert not plan_problems(QWEN30, C32, plan)


@pytest.mark.parametrize(("model", "section"), [("qwen3-30b-a3b", "comm_overlap"), ("mixtral-8x7b", "model")])
def test_bridge_sets_the_overlap_where_setup_keeps_it_and_reads_it_back(tmp_path, model, section):
    m = load_model_preset(model)
    plan = make_plan(m, C32, engine="megatron", global_batch_size=128, tp=2, ep=8, sequence_parallel=True,
                     zero_stage=1, seq_len=4096, ep_overlap="a2a-delay-wgrad")
    files = render_bundle(estimate(m, C32, plan)).files
    args = files["bridge_overrides.args"].splitlines()
    assert f"{section}.overlap_moe_expert_parallel_comm=true" in args and f"{section}.delay_wgrad_compute=true" in args
    assert "model.overlap_moe_expert_parallel_comm=true" in args  # the TransformerConfig field itself
    path = tmp_path / "bridge_overrides.yaml"
    path.write_text(files["bridge_overrides.yaml"])
    back = read_job([str(path)], gpu=GPU, num_gpus=32, model=model).plan
    assert back.ep_overlap == "a2a-delay-wgrad"
    flags = files["megatron_args.sh"]
    assert "--overlap-moe-expert-parallel-comm" in flags and "--delay-wgrad-compute" in flags


def test_cli_flag_reaches_the_plan_and_other_engines_refuse_it(capsys):
    base = ["estimate", "--model", "qwen3-30b-a3b", "--gpu", GPU, "--num-gpus", "32", "--global-batch", "128",
            "--tp", "2", "--ep", "8", "--sequence-parallel", "--zero", "1", "--seq-len", "4096"]
    assert main([*base, "--engine", "megatron", "--ep-overlap", "a2a"]) == 0
    out = capsys.readouterr().out
    assert "ep-overlap" in out and "(--ep-overlap)" in out
    assert main([*base, "--engine", "deepspeed", "--ep-overlap", "a2a"]) == 2
    assert "drop --ep-overlap" in capsys.readouterr().err
