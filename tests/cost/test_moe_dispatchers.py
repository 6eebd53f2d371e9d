"""The MoE token dispatchers (``ParallelPlan.moe_dispatcher``; autotune.cost.moe_time), derived by hand for a small
model of E = 8 experts, top-2, h = 64:

- allgather moves (3h, 3kh + 4 ep h) elements: the fp32 round trip of the combined rows on the token split; the
  local experts' permute (2kh), the unpermute into the gathered shape (kh + ep h) and its fp32 cast (3 ep h);
- flex permutes only the received rows, 2 (D + k) h, D = ep (1 - miss(E / ep)) the distinct destination ranks,
  miss(m) = prod_i (E - m - i) / (E - i): with ep = 2, miss(4) = 4/8 x 3/7 = 3/14, D = 11/7;
- allgather's communication is the ring all-gather of every rank's tokens, routing map and fp32 probabilities
  (2h + 5E bytes a row) and the fp32 reduce-scatter (4h) over the TP x EP group;
- DeepEP inside a node writes each token to its D destination GPUs at the kernel's measured rate (below H100's
  NVLink x 153/160, which carries the D (1 - 1/8) rows that leave the GPU), for dispatch and for combine; across two
  nodes it also sends it once to the other node (chance 1 - miss(E/2)) at the NIC's line rate, the slower bounding;
- HybridEP's domain is the whole NVLink domain: on an NVL72 rack EP 16 crosses no NIC, DeepEP's (8 GPUs) does;
- Megatron's rules refuse a dispatcher on a dense model, DeepEP with tp x ep = 1 or on GB200 (Bridge's GPU check),
  and the EP overlap with allgather;
  the files say each dispatcher and are read back to it, a file without the flag reads as Megatron's allgather.
"""

from __future__ import annotations

import dataclasses

import pytest

from autotune.cost import moe_time
from autotune.cost.step_time import TimeSettings
from autotune.emit.megatron import megatron_args
from autotune.emit.megatron_bridge import bridge_overrides
from autotune.emit.options import EmitOptions
from autotune.job_bridge import megatron_dispatcher
from autotune.rules import plan_problems
from autotune.specs.loading import load_cluster
from autotune.specs.model import ModelSpec, MoESpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset

H, K, E = 64, 2, 8
EFF = TimeSettings().efficiency


def _model(**changes) -> ModelSpec:
    base = ModelSpec(name="tiny-moe", num_layers=4, hidden_size=H, num_attention_heads=4, ffn_hidden_size=128,
                     vocab_size=256, activation="swiglu", norm="rmsnorm", position_embedding="rope",
                     moe=MoESpec(num_experts=E, top_k=K, expert_ffn_hidden_size=32))
    return dataclasses.replace(base, **changes)


def _plan(ep: int, dispatcher: str | None, dp: int = 8) -> ParallelPlan:
    return ParallelPlan(engine="megatron", dp=dp, ep=ep, seq_len=256, global_batch_size=dp,
                        moe_dispatcher=dispatcher)


def test_dispatch_elements_of_each_dispatcher_by_hand():
    m = _model()
    assert moe_time.dispatch_elements(m, _plan(2, "allgather")) == (3 * H, 3 * K * H + 4 * 2 * H)
    d = 2 * (1 - (4 / 8) * (3 / 7))
    assert d == pytest.approx(11 / 7)
    for flex in ("flex-deepep", "flex-hybridep"):
        permutes, sorts = moe_time.dispatch_elements(m, _plan(2, flex))
        assert permutes == 0 and sorts == pytest.approx(2 * (11 / 7 + K) * H, rel=1e-12)
    # the all-to-all dispatcher's, as before (tests/cost/test_moe_time.py)
    assert moe_time.dispatch_elements(m, _plan(2, None)) == moe_time.dispatch_elements(m, _plan(2, "alltoall"))


def test_flex_destinations_by_hand():
    ranks, remote = moe_time.flex_destinations(E, K, 8, 2)
    assert ranks == pytest.approx(8 * (1 - (7 / 8) * (6 / 7)), rel=1e-12)  # one expert per rank: 8 x 1/4
    assert remote == pytest.approx(1 - 3 / 14, rel=1e-12)  # the other node's 4 experts, hit by a pick
    assert moe_time.flex_destinations(E, K, 8, 1)[1] == 0.0


def test_allgather_communication_by_hand():
    m, cluster, tokens = _model(), load_cluster(gpu="h100-sxm-80gb", num_gpus=8), 4096
    plan = _plan(8, "allgather")
    link_bw, lat = 369e9, 3.6e-6  # H100 NVLink 450 GB/s x the bus fraction x link efficiency; its step latency
    rows = tokens * 8
    expected = (7 / 8 * rows * (2 * H + 5 * E) / link_bw + 7 * lat) + (7 / 8 * rows * 4 * H / link_bw + 7 * lat)
    assert moe_time.dispatcher_comm_s(m, cluster, plan, EFF, tokens) == pytest.approx(expected, rel=1e-3)
    # every rank gathers all ep ranks' tokens: more than the all-to-all's k rows per token once ep > 2k or so
    assert moe_time.dispatcher_comm_s(m, cluster, plan, EFF, tokens) > moe_time.dispatcher_comm_s(
        m, cluster, _plan(8, None), EFF, tokens)


def test_deepep_inside_a_node_and_across_two_by_hand():
    m, tokens = _model(), 4096
    one = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    d8 = 8 * (1 - (7 / 8) * (6 / 7))
    kernel = [rate * 1e9 for rate in ((348 + 494) / 2, (302 + 420) / 2)]  # below 450 x 153/160 GB/s of NVLink
    row = 2 * H
    expected = sum(tokens * d8 * row / bw + 3.6e-6 for bw in kernel)  # every destination row at the kernel's rate
    assert moe_time.dispatcher_comm_s(m, one, _plan(8, "flex-deepep"), EFF, tokens) == pytest.approx(expected,
                                                                                                        rel=1e-9)
    two = load_cluster(gpu="h100-sxm-80gb", num_gpus=16)
    miss = (7.5 / 8) * (6.5 / 7)  # half an expert per rank
    d16 = 16 * (1 - miss)
    remote = 1 - (4 / 8) * (3 / 7)
    expected = sum(max(tokens * d16 * row / bw, tokens * remote * row / 50e9) + 6e-6 for bw in kernel)
    plan = _plan(16, "flex-deepep", dp=16)
    assert moe_time.dispatcher_comm_s(m, two, plan, EFF, tokens) == pytest.approx(expected, rel=1e-9)
    # the all-to-all sends every pick, half of them through the NIC: flex sends a token once per node
    assert moe_time.dispatcher_comm_s(m, two, plan, EFF, tokens) < moe_time.dispatcher_comm_s(
        m, two, _plan(16, None, dp=16), EFF, tokens)


def test_hybridep_spans_the_nvl72_domain_deepep_does_not():
    m, tokens = _model(moe=MoESpec(num_experts=64, top_k=8, expert_ffn_hidden_size=32)), 4096
    rack = load_cluster(gpu="gb200", num_gpus=72)
    plan = ParallelPlan(engine="megatron", dp=72, ep=16, seq_len=256, global_batch_size=72)
    hybrid = moe_time.dispatcher_comm_s(m, rack, plan.with_(moe_dispatcher="flex-hybridep"), EFF, tokens)
    deepep = moe_time.dispatcher_comm_s(m, rack, plan.with_(moe_dispatcher="flex-deepep"), EFF, tokens)
    d16, _ = moe_time.flex_destinations(64, 8, 16, 1)
    latency = moe_time.comm.group_link(rack, EFF, 16, 1).latency_s
    assert hybrid == pytest.approx(sum(tokens * d16 * 2 * 64 / (rate * 1e9) + latency
                                       for rate in (536, 531)), rel=1e-9)  # below GB200's 900 x 153/160 GB/s
    assert deepep > hybrid  # DeepEP's second group of 8 is reached through the NIC


def test_megatron_rules_of_the_dispatcher():
    dense = load_model_preset("llama3-8b")
    plan = ParallelPlan(engine="megatron", dp=8, seq_len=4096, global_batch_size=8)
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    assert "megatron:moe_dispatcher" in [r for r, _ in plan_problems(dense, cluster,
                                                                     plan.with_(moe_dispatcher="allgather"))]
    moe = load_model_preset("qwen3-30b-a3b")
    assert "megatron:moe_dispatcher" in [r for r, _ in plan_problems(moe, cluster,
                                                                     plan.with_(moe_dispatcher="flex-deepep"))]
    assert "megatron:moe_dispatcher" not in [r for r, _ in plan_problems(
        moe, cluster, plan.with_(ep=8, moe_dispatcher="flex-deepep"))]
    rack = load_cluster(gpu="gb200", num_gpus=8)  # Bridge runs DeepEP on B200 / B300 and Hopper, not GB200
    deepep = plan.with_(ep=8, moe_dispatcher="flex-deepep")
    assert "megatron:moe_dispatcher" in [r for r, _ in plan_problems(moe, rack, deepep)]
    assert "megatron:moe_dispatcher" not in [r for r, _ in plan_problems(
        moe, load_cluster(gpu="b200", num_gpus=8), deepep)]
    assert "megatron:moe_dispatcher" not in [r for r, _ in plan_problems(
        moe, rack, deepep.with_(moe_dispatcher="flex-hybridep"))]
    overlap = plan.with_(ep=8, ep_overlap="a2a")
    assert "megatron:ep_overlap" not in [r for r, _ in plan_problems(moe, cluster, overlap)]
    assert "megatron:ep_overlap" in [r for r, _ in plan_problems(moe, cluster,
                                                                 overlap.with_(moe_dispatcher="allgather"))]


def test_files_say_each_dispatcher_and_read_back():
    moe, cluster = load_model_preset("qwen3-30b-a3b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    plan = ParallelPlan(engine="megatron", dp=8, ep=8, seq_len=4096, global_batch_size=8, zero_stage=1)
    for name, flags in ((None, ["alltoall"]), ("allgather", ["allgather"]),
                        ("flex-hybridep", ["flex", "--moe-flex-dispatcher-backend", "hybridep"])):
        args = megatron_args(moe, cluster, plan.with_(moe_dispatcher=name), EmitOptions())
        i = args.index("--moe-token-dispatcher-type")
        assert args[i + 1:i + 1 + len(flags)] == flags
    model = bridge_overrides(moe, cluster, plan.with_(moe_dispatcher="flex-deepep"), EmitOptions(),
                             _checkpoint())["model"]
    assert model["moe_token_dispatcher_type"] == "flex" and model["moe_flex_dispatcher_backend"] == "deepep"
    notes: list[str] = []
    assert megatron_dispatcher({}, 8, "args", notes) == {"moe_dispatcher": "allgather"}  # Megatron's default
    assert megatron_dispatcher({}, 1, "args", notes) == {}
    assert megatron_dispatcher({"--moe-token-dispatcher-type": "alltoall"}, 8, "args", notes) == {}
    assert megatron_dispatcher({"--moe-token-dispatcher-type": "flex", "--moe-enable-deepep": True}, 8, "args",
                               notes) == {"moe_dispatcher": "flex-deepep"}
    assert megatron_dispatcher({"--moe-token-dispatcher-type": "flex", "--moe-flex-dispatcher-backend": "ncclep"},
                               8, "args", notes) == {} and "not modelled" in notes[-1]


def _checkpoint():
    from autotune.emit.checkpoint import CheckpointSettings

    return CheckpointSettings(save_dir="/ckpt/run1", interval_steps=250, async_save=True)


def test_expert_parallel_groups_sit_on_the_experts_own_rank_grid():
    """Megatron's experts have their own rank grid (parallel_state.py:870-895: tp = etp, cp = 1): an EP group is
    ep ranks etp apart. On 8-GPU nodes, ep 8 under tp 2 with etp 1 (parallel folding) or under cp 2 is one node's
    8 GPUs, so it costs what ep 8 of a tp 1 cp 1 plan costs on the same per-rank tokens; strided over tp or cp it
    would reach into the next node and wait for the NIC."""
    m, cluster, tokens = _model(), load_cluster(gpu="h100-sxm-80gb", num_gpus=16), 4096
    plain = moe_time.dispatcher_comm_s(m, cluster, _plan(8, None, dp=16), EFF, tokens)
    folded = ParallelPlan(engine="megatron", tp=2, dp=8, ep=8, etp=1, sequence_parallel=True, seq_len=256,
                          global_batch_size=8)
    assert moe_time.dispatcher_comm_s(m, cluster, folded, EFF, 2 * tokens) == pytest.approx(plain, rel=1e-12)
    with_cp = ParallelPlan(engine="megatron", cp=2, dp=8, ep=8, seq_len=256, global_batch_size=8)
    assert moe_time.dispatcher_comm_s(m, cluster, with_cp, EFF, tokens) == pytest.approx(plain, rel=1e-12)
    # etp = tp = 2 spreads the 8 EP ranks over 16 GPUs: two nodes, through the NIC
    unfolded = folded.with_(etp=2)
    assert moe_time.dispatcher_comm_s(m, cluster, unfolded, EFF, 2 * tokens) > 1.5 * plain


def test_step_time_reads_the_expert_tp():
    """The layer-time cache keys on the expert TP too: the folded plan's all-to-alls stay in the node."""
    from autotune.cost.step_time import estimate_step_time

    m, cluster = _model(), load_cluster(gpu="h100-sxm-80gb", num_gpus=16)
    plan = ParallelPlan(engine="megatron", tp=2, dp=8, ep=8, etp=1, sequence_parallel=True, seq_len=256,
                        global_batch_size=8)
    folded = estimate_step_time(m, cluster, plan).comm_parts_s["moe"]
    unfolded = estimate_step_time(m, cluster, plan.with_(etp=2)).comm_parts_s["moe"]
    assert 0 < folded < unfolded
