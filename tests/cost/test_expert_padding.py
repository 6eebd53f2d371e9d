"""The routed experts' padding rows on the sync-free MoE path (autotune.cost.expert_padding).

By hand: the op fuser's grouped kernels take each expert's rows in multiples of 256, so an expert's segment grows by
(256 - 1) / 2 = 127.5 rows on average; the expert GEMMs of a layer then run (m + 127.5) / m of their rows (m the
rows per local expert) at the shape of m + 127.5 rows, and their FP8 casts cover the padded rows; nothing changes
off the path (per-layer TE graphs, another dispatcher, a dense model). The padding weighs most where each expert
gets few rows: Qwen3-30B-A3B on 8 GB200, ep2 at micro-batch 2 (64 experts of 1,024 rows) loses more of its speed
than ep8 at micro-batch 4 (16 of 8,192).
"""

from __future__ import annotations

import dataclasses

import pytest

import autotune.cost.step_time as step_time
from autotune.cost.expert_padding import OP_FUSER_ROW_ALIGNMENT, expert_padding_rows
from autotune.cost.kernels import rates
from autotune.cost.layer_time import layer_time, time_key
from autotune.cost.moe_time import busiest_rank_factor
from autotune.cost.step_time import TimeSettings, estimate_step_time
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset


def _graphed(**changes) -> ParallelPlan:
    base = ParallelPlan(engine="megatron", dp=8, ep=8, seq_len=4096, micro_batch_size=4, global_batch_size=512,
                        precision="fp8", fp8_recipe="te-mxfp8", cuda_graph="full-iteration",
                        moe_dispatcher="flex-hybridep", ep_overlap="a2a-delay-wgrad")
    return dataclasses.replace(base, **changes)


def test_padding_rows_only_on_the_sync_free_path():
    moe = load_model_preset("qwen3-30b-a3b")
    assert OP_FUSER_ROW_ALIGNMENT == 256
    assert expert_padding_rows(moe, _graphed()) == 127.5
    assert expert_padding_rows(moe, _graphed(cuda_graph="transformer_engine", cuda_graph_scope=("moe_router",))) == 0
    assert expert_padding_rows(moe, _graphed(moe_dispatcher="alltoall")) == 0
    dense = load_model_preset("llama3-8b")
    assert expert_padding_rows(dense, _graphed(ep=1, moe_dispatcher=None)) == 0


def test_expert_gemms_run_the_padded_rows_by_hand():
    moe, cluster = load_model_preset("qwen3-30b-a3b"), load_cluster(gpu="gb200", num_gpus=8)
    plan = time_key(_graphed(ep=2, micro_batch_size=2))
    eff = TimeSettings().efficiency
    r = rates(cluster, "fp8", eff, "fa3", "te-mxfp8")
    h, f, k, e = moe.hidden_size, moe.moe.expert_ffn_hidden_size, moe.moe.top_k, moe.moe.num_experts
    tokens = plan.seq_len * plan.micro_batch_size
    m = tokens * k * plan.ep / e  # rows per local expert: 1,024
    busiest = busiest_rank_factor(tokens, plan.ep, e, k)

    def experts_by_hand(pad: float) -> float:
        rows = m + pad
        pairs = tokens * k * rows / m
        return busiest * (r.grouped_s(2 * pairs * h * 2 * f, rows, h, 2 * f) + r.grouped_s(2 * pairs * f * h, rows, f, h))

    bare = layer_time(moe, cluster, plan, True, eff, r)
    padded = layer_time(moe, cluster, plan, True, eff, r, expert_pad_rows=127.5)
    assert bare.experts_s[0] == pytest.approx(experts_by_hand(0.0), rel=1e-12)
    assert padded.experts_s[0] == pytest.approx(experts_by_hand(127.5), rel=1e-12)
    assert padded.gemm_s - bare.gemm_s == pytest.approx(padded.experts_s[0] - bare.experts_s[0], rel=1e-9)
    assert padded.attention_s == bare.attention_s
    # the padded rows are quantized too: FP8 casts of fc1's and fc2's inputs and output gradients, half per pass
    casts = tokens * k * (h + f + 2 * f + h) * (127.5 / m) * r.cast_bytes / 2 / r.hbm
    assert padded.elementwise_s - bare.elementwise_s == pytest.approx(casts, rel=1e-9)
    assert padded.elementwise_bwd_s - bare.elementwise_bwd_s == pytest.approx(casts, rel=1e-9)


def test_padding_weighs_on_many_small_experts(monkeypatch):
    moe, cluster = load_model_preset("qwen3-30b-a3b"), load_cluster(gpu="gb200", num_gpus=8)

    def speeds() -> tuple[float, float]:
        step_time._stage_time_cache.clear()
        return tuple(estimate_step_time(moe, cluster, p).tokens_per_s
                     for p in (_graphed(ep=2, micro_batch_size=2), _graphed(ep=8, micro_batch_size=4)))

    with_padding = speeds()
    monkeypatch.setattr(step_time, "expert_padding_rows", lambda model, plan: 0.0)
    without = speeds()
    step_time._stage_time_cache.clear()
    loss_ep2, loss_ep8 = (1 - a / b for a, b in zip(with_padding, without))
    assert 0 < loss_ep8 < loss_ep2
