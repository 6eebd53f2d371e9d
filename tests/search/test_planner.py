"""The planner against brute force: pruning loses no feasible plan, ranking is by throughput."""

import itertools

import pytest

from autotune.cost.memory import estimate_memory
from autotune.cost.step_time import estimate_step_time
from autotune.engines import engine_for
from autotune.report import plan_summary
from autotune.rules import plan_problems
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints, dimension_values
from autotune.specs.loading import load_cluster
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

MODEL = ModelSpec(name="m", num_layers=24, hidden_size=2048, num_attention_heads=16, num_kv_heads=4,
                  ffn_hidden_size=5632, vocab_size=32000, activation="swiglu", norm="rmsnorm",
                  position_embedding="rope")
CLUSTER = load_cluster(gpu="a100-40gb", num_gpus=16, gpus_per_node=None, cluster_path=None)
SEQ, GB = 4096, 64
SPACE = SearchConstraints(max_micro_batch_size=8)


def brute_force():
    d = dimension_values(MODEL, CLUSTER, SEQ, GB, SPACE)
    feasible = {}
    enumerated = 0
    for fw, tp, cp, pp, vpp, ep, z, oo, op, prec, rc, mb in itertools.product(
            d.engines, d.tp, d.cp, d.pp, d.vpp, d.ep, d.zero_stages, d.offload_optimizer, d.offload_param,
            d.precisions, d.recompute, d.micro_batch_sizes):
        if CLUSTER.num_gpus % (tp * cp * pp):
            continue
        enumerated += 1
        dp = CLUSTER.num_gpus // (tp * cp * pp)
        plan = ParallelPlan(engine=fw, tp=tp, cp=cp, pp=pp, dp=dp, vpp=vpp, ep=ep, zero_stage=z,
                            offload_optimizer=oo, offload_param=op, precision=prec, recompute=rc,
                            micro_batch_size=mb, grad_accum_steps=max(1, GB // (mb * dp)), global_batch_size=GB,
                            seq_len=SEQ, sequence_parallel=tp > 1 and engine_for(fw).support.sequence_parallel)
        # The default space keeps to the classic Megatron splits (uneven layouts are opt-in: SearchConstraints).
        if (plan_problems(MODEL, CLUSTER, plan, uneven_layouts=SPACE.uneven_layouts)
                or not estimate_memory(MODEL, CLUSTER, plan).fits):
            continue
        feasible[plan] = estimate_step_time(MODEL, CLUSTER, plan).tokens_per_s
    return enumerated, feasible


@pytest.fixture(scope="module")
def result():
    return search_plans(MODEL, CLUSTER, seq_len=SEQ, global_batch_size=GB, constraints=SPACE, top_k=5)


def test_pruning_loses_no_feasible_plan(result):
    enumerated, feasible = brute_force()
    assert result.num_enumerated == enumerated
    assert {e.plan for e in result.ranked} == set(feasible)
    assert result.num_enumerated == result.num_feasible + sum(result.rejections.values())


def test_ranked_by_throughput_then_headroom(result):
    keys = [(e.time.tokens_per_s, e.memory.headroom) for e in result.ranked]
    assert keys == sorted(keys, reverse=True)
    _, feasible = brute_force()
    # The first candidates are the leading tie group, simplest first (autotune.search.ties): it holds the fastest.
    assert max(e.time.tokens_per_s for e in result.candidates[:max(1, result.tied)]) == max(feasible.values())
    # the winner explained, or the tie it leads named by its summary
    assert result.explanation.startswith("tp") or f"#1 is {plan_summary(result.candidates[0].plan)}" in result.explanation


def test_constraints_are_respected():
    res = search_plans(MODEL, CLUSTER, seq_len=SEQ, global_batch_size=GB, top_k=50,
                       constraints=SearchConstraints(tp=2, zero_stages=(1,), engines=("megatron",),
                                                     min_headroom_gib=8.0, allow_offload=False))
    assert res.candidates
    for est in res.candidates:
        assert est.plan.tp == 2 and est.plan.zero_stage == 1 and est.plan.engine == "megatron"
        assert est.memory.headroom >= 8 * 2**30
        assert est.plan.offload_optimizer == "none"


def test_infeasible_space_reports_reasons():
    # RoPE like MODEL: with the default learned table (2,048 rows) every plan at SEQ would break seq_positions first.
    big = ModelSpec(name="big", num_layers=96, hidden_size=12288, num_attention_heads=96, ffn_hidden_size=49152,
                    vocab_size=51200, position_embedding="rope")
    res = search_plans(big, CLUSTER, seq_len=SEQ, global_batch_size=GB, constraints=SPACE)
    assert res.num_feasible == 0 and not res.candidates
    assert res.rejections.get("gpu_memory", 0) + res.rejections.get("host_memory", 0) > 0


@pytest.mark.parametrize("gpu,num_gpus,model_name,batch", [("h100-sxm-80gb", 64, "llama3-70b", 128),
                                                           ("a100-80gb", 16, "llama3-8b", 16)])
def test_pruned_rule_checks_rank_exactly_what_the_full_check_does(monkeypatch, gpu, num_gpus, model_name, batch):
    # The inner loop checks only the rules that read micro-batch, accumulation and recompute, and a layout that
    # breaks a layout rule is counted without building its variants; with every rule checked on every plan
    # instead, the search must find the same plans with the same rejection counts. Batch 16 on 16
    # GPUs: pipelined FSDP plans whose larger micro-batches leave fewer micro-batches than stages (an engine rule
    # of the inner loop, fsdp:pp_microbatches).
    import autotune.search.planner as planner
    from autotune.rules import plan_problems as full
    from autotune.search.space import SearchConstraints
    from autotune.specs.presets import load_model_preset

    model, cluster = load_model_preset(model_name), load_cluster(gpu=gpu, num_gpus=num_gpus)
    space = SearchConstraints(precisions=("bf16", "fp8") if gpu.startswith("h100") else ("bf16",),
                              allow_offload=True, engines=("megatron", "deepspeed", "megatron-deepspeed", "fsdp", "hf"))
    fast = planner.search_plans(model, cluster, seq_len=4096, global_batch_size=batch, constraints=space)
    monkeypatch.setattr(planner, "inner_plan_problems", full)
    monkeypatch.setattr(planner, "_LAYOUT_RULES", frozenset())  # and every variant of a broken layout built
    slow = planner.search_plans(model, cluster, seq_len=4096, global_batch_size=batch, constraints=space)
    assert [e.plan for e in fast.ranked] == [e.plan for e in slow.ranked] and fast.num_feasible > 0
    assert fast.rejections == slow.rejections and fast.num_enumerated == slow.num_enumerated
    assert sum(fast.rejections.values()) + fast.num_feasible == fast.num_enumerated
