"""MoE under a whole-iteration CUDA graph (autotune.specs.sync_free_moe): Megatron's dropless dispatchers copy
token counts to the host, so only HybridEP with its static rank budget is graphable; autotune writes the budget and
the paged stash with it, and counts their memory (autotune.cost.sync_free_moe_memory).

The memory, derived by hand for a 4-layer model of h = 64, experts of f = 32 (SwiGLU), top-2, bf16, s = 256, b = 1:
one layer's grouped MLP keeps per routed pair its permuted input (2 h = 128 bytes), fc1's output (2 x 2 f = 128) and
fc2's input (2 f = 64): 320 bytes x 512 pairs = 163840 bytes. The stash holds 4 layers of one micro-batch at
1.2 x; the layer at work holds its tensors at the 1.5 x budget: 0.2 x 4 x 163840 + 0.5 x 163840 = 212992 bytes.
"""

from __future__ import annotations

import dataclasses

import pytest

from autotune.cost.sync_free_moe_memory import sync_free_moe_bytes
from autotune.emit.checkpoint import CheckpointSettings
from autotune.emit.megatron import megatron_args
from autotune.emit.megatron_bridge import bridge_overrides
from autotune.emit.options import EmitOptions
from autotune.errors import InputError
from autotune.rules import plan_problems
from autotune.specs.loading import load_cluster
from autotune.specs.model import ModelSpec, MoESpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset
from autotune.specs.sync_free_moe import PAGED_STASH_CUDA_FACTOR, RANK_CAPACITY_FACTOR

RULE = "megatron:full_iteration_moe"


def _tiny() -> ModelSpec:
    return ModelSpec(name="tiny-moe", num_layers=4, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
                     vocab_size=256, activation="swiglu", norm="rmsnorm", position_embedding="rope",
                     moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=32))


def _graphed(**changes) -> ParallelPlan:
    base = ParallelPlan(engine="megatron", dp=8, ep=8, seq_len=256, micro_batch_size=1, global_batch_size=8,
                        cuda_graph="full-iteration", moe_dispatcher="flex-hybridep")
    return dataclasses.replace(base, **changes)


def test_only_hybridep_runs_moe_in_a_full_iteration_graph():
    moe, cluster = load_model_preset("qwen3-30b-a3b"), load_cluster(gpu="gb200", num_gpus=8)
    plan = _graphed(seq_len=4096)
    for dispatcher in (None, "alltoall", "allgather", "flex-deepep"):
        assert RULE in [r for r, _ in plan_problems(moe, cluster, plan.with_(moe_dispatcher=dispatcher))]
    assert RULE not in [r for r, _ in plan_problems(moe, cluster, plan)]
    # per-layer graphs leave the dispatcher outside them, a dense model has none
    te = plan.with_(cuda_graph="transformer_engine", cuda_graph_scope=("attn", "moe_router"), moe_dispatcher="alltoall")
    assert RULE not in [r for r, _ in plan_problems(moe, cluster, te)]
    dense = load_model_preset("llama3-8b")
    assert RULE not in [r for r, _ in plan_problems(dense, cluster, plan.with_(ep=1, moe_dispatcher=None))]


def test_the_static_budget_and_paged_stash_are_written():
    moe, cluster = load_model_preset("qwen3-30b-a3b"), load_cluster(gpu="gb200", num_gpus=8)
    plan = _graphed(seq_len=4096, global_batch_size=64)
    args = megatron_args(moe, cluster, plan)
    at = args.index("--moe-expert-rank-capacity-factor")
    assert float(args[at + 1]) == RANK_CAPACITY_FACTOR
    assert float(args[args.index("--moe-paged-stash-buffer-size-factor-cuda") + 1]) == PAGED_STASH_CUDA_FACTOR
    assert "--moe-paged-stash" in args and "--use-transformer-engine-op-fuser" in args
    te = plan.with_(cuda_graph="transformer_engine", cuda_graph_scope=("attn", "moe_router"))
    assert "--moe-paged-stash" not in megatron_args(moe, cluster, te)
    with pytest.raises(InputError, match="moe-expert-rank-capacity-factor") as refused:  # no such flag before 0.18
        megatron_args(moe, cluster, plan, EmitOptions(megatron_version="0.17"))
    said = [p for p in refused.value.problems if "rank budget" in p]  # one problem naming the way out, not one a flag
    assert len(said) == 1 and "--engine-version megatron=0.19" in said[0]
    checkpoint = CheckpointSettings(save_dir="/ckpt/run1", interval_steps=250, async_save=True)
    model_keys = bridge_overrides(moe, cluster, plan, EmitOptions(), checkpoint)["model"]
    assert model_keys["moe_expert_rank_capacity_factor"] == RANK_CAPACITY_FACTOR
    assert model_keys["moe_paged_stash"] and model_keys["use_transformer_engine_op_fuser"]


def test_paged_stash_and_budget_memory_by_hand():
    model = _tiny()
    assert sync_free_moe_bytes(model, _graphed(), 0, "megatron") == pytest.approx(
        (PAGED_STASH_CUDA_FACTOR - 1) * 4 * 163840 + (RANK_CAPACITY_FACTOR - 1) * 163840)
    # routed experts recomputed: nothing stashed, the budget's working layer stays
    recompute = _graphed(recompute="selective", recompute_modules=("moe",))
    assert sync_free_moe_bytes(model, recompute, 0, "megatron") == pytest.approx(0.5 * 163840)
    # moe_act drops fc2's input (64 bytes a pair) from what is stashed
    act = _graphed(recompute="selective", recompute_modules=("moe_act",))
    assert sync_free_moe_bytes(model, act, 0, "megatron") == pytest.approx(0.2 * 4 * 256 * 512 + 0.5 * 163840)
    # off the path: nothing
    assert sync_free_moe_bytes(model, _graphed(cuda_graph="transformer_engine"), 0, "megatron") == 0.0


def test_the_stash_holds_every_micro_batch_in_flight():
    model = _tiny()
    one = sync_free_moe_bytes(model, _graphed(), 0, "megatron")
    piped = _graphed(pp=2, dp=4, ep=4, grad_accum_steps=2, global_batch_size=8)  # stage 0: 2 layers x 2 in flight
    assert sync_free_moe_bytes(model, piped, 0, "megatron") == pytest.approx(one)
    assert sync_free_moe_bytes(model, piped, 1, "megatron") == pytest.approx(
        0.2 * 2 * 1 * 163840 + 0.5 * 163840)
