"""Context parallelism as each engine runs it (autotune/cost/cp_ring.py): every term derived by hand for a small
case, and how the passes of a layer and the ledger use them."""

import dataclasses

import pytest

from autotune.cost import comm
from autotune.cost.activations import layer_activations
from autotune.cost.cp_ring import RingTime, ring_time, ring_transient_bytes
from autotune.cost.efficiency import DEFAULT_EFFICIENCY
from autotune.cost.layer_passes import layer_passes
from autotune.cost.layer_time import LayerTime
from autotune.cost.memory import estimate_memory
from autotune.cost.step_time import TimeSettings, estimate_step_time
from autotune.engines.fsdp import FSDPEngine
from autotune.specs.loading import load_cluster
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset
from autotune.specs.settings import MemorySettings

# 4 query heads of 64 (q width 256), 1 KV head (kv width 64); cp 4 over 4096 tokens: 1024 tokens per rank.
MODEL = ModelSpec(name="tiny", num_layers=2, hidden_size=256, num_attention_heads=4, num_kv_heads=1,
                  ffn_hidden_size=512, vocab_size=1000, activation="swiglu", norm="rmsnorm",
                  position_embedding="rope")
CLUSTER = load_cluster(gpu="h100-sxm-80gb", num_gpus=8, gpus_per_node=None, cluster_path=None)
PLAN = ParallelPlan(tp=1, pp=1, dp=2, cp=4, micro_batch_size=1, grad_accum_steps=1, global_batch_size=2,
                    seq_len=4096, engine="megatron")
HBM = 2e12
Q, KV = 1024 * 256, 1024 * 2 * 64  # elements of this rank's attention output; of its K and V chunks


def _link():
    return comm.group_link(CLUSTER, DEFAULT_EFFICIENCY, 4, 1)


def test_p2p_forward_hides_each_exchange_behind_one_step_and_the_backward_sends_twice_the_bytes():
    link = _link()
    bw, lat = link.bandwidth_bytes_per_s, link.latency_s
    one = KV * 2 / bw + lat  # one 16-bit K/V chunk
    two = 2 * KV * 2 / bw + lat  # K/V with dK/dV
    # a long attention: every exchange hides
    rt = ring_time(MODEL, CLUSTER, PLAN, DEFAULT_EFFICIENCY, HBM, 1.0, 2.5, "p2p")
    assert rt.fwd_exposed_s == 0 and rt.bwd_exposed_s == 0
    assert rt.fwd_hidden_s == pytest.approx(3 * one)
    assert rt.bwd_hidden_s == pytest.approx(one + 2 * two + one)
    # a short one (1 us per forward step, 2.5 us backward): the rest of each exchange waits
    a = 4e-6
    rt = ring_time(MODEL, CLUSTER, PLAN, DEFAULT_EFFICIENCY, HBM, a, 2.5 * a, "p2p")
    assert rt.fwd_exposed_s == pytest.approx(3 * max(0.0, one - a / 4))
    assert rt.bwd_exposed_s == pytest.approx(2 * max(0.0, one - 2.5 * a / 4) + 2 * max(0.0, two - 2.5 * a / 4))
    # merges: TE's fused corrections, forward 6 + 6 once and 10 per later step per output element; backward 6 per
    # dQ and dK/dV element per later step
    assert rt.merge_fwd_s == pytest.approx(Q * (12 + 3 * 10) / HBM)
    assert rt.merge_bwd_s == pytest.approx((Q + KV) * 3 * 6 / HBM)


def test_allgather_hides_only_behind_the_first_step_and_the_last_fp32_dkv_exchange_waits():
    link = _link()
    bw, lat = link.bandwidth_bytes_per_s, link.latency_s
    gather = 3 / 4 * (4 * KV * 2) / bw + 3 * lat  # every rank's K and V, 16-bit
    dkv = KV * 4 / bw + lat  # fp32 accumulators
    a = 40e-6
    rt = ring_time(MODEL, CLUSTER, PLAN, DEFAULT_EFFICIENCY, HBM, a, 2.5 * a, "allgather")
    assert rt.fwd_exposed_s == pytest.approx(max(0.0, gather - a / 4))
    assert rt.fwd_exposed_s + rt.fwd_hidden_s == pytest.approx(gather)
    step_b = 2.5 * a / 4
    assert rt.bwd_exposed_s == pytest.approx(max(0.0, gather - step_b) + 3 * max(0.0, dkv - step_b) + dkv)
    assert rt.comm_s == pytest.approx(2 * gather + 4 * dkv)
    # torch's eager fp32 merges (cp_ring's byte table): forward 12 once + 38 per later step per output element and
    # 4 per K/V element per step but the last; backward 10 + 10 per step per dQ, 28 + 25 per later step per dK/dV
    assert rt.merge_fwd_s == pytest.approx((Q * (12 + 3 * 38) + KV * 3 * 4) / HBM)
    assert rt.merge_bwd_s == pytest.approx((Q * (10 + 4 * 10) + KV * (28 + 3 * 25)) / HBM)


def test_ulysses_all_to_alls_wait_and_repeat_kv_widens_the_exchange():
    link = _link()
    rt = ring_time(MODEL, CLUSTER, PLAN, DEFAULT_EFFICIENCY, HBM, 1.0, 2.5, "ulysses")
    a2a = comm.all_to_all_s((Q + KV) * 2, 4, link) + comm.all_to_all_s(Q * 2, 4, link)
    assert rt == RingTime(fwd_exposed_s=a2a, bwd_exposed_s=a2a)
    narrow = ring_time(MODEL, CLUSTER, PLAN, DEFAULT_EFFICIENCY, HBM, 1.0, 2.5, "p2p")
    wide = ring_time(MODEL, CLUSTER, PLAN, DEFAULT_EFFICIENCY, HBM, 1.0, 2.5, "p2p", repeat_kv=True)
    lat = link.latency_s
    assert (wide.fwd_hidden_s / 3 - lat) == pytest.approx(4 * (narrow.fwd_hidden_s / 3 - lat))  # 4 heads for 1
    assert ring_time(MODEL, CLUSTER, dataclasses.replace(PLAN, cp=1, dp=8), DEFAULT_EFFICIENCY, HBM, 1.0, 2.5,
                     "p2p") == RingTime()


def test_transient_buffers_by_hand():
    # allgather: gathered K/V 4 x KV x 2 B; forward + 2 fp32 outputs, backward fp32 dQ/dK/dV + 2 fp32 dK/dV buffers
    assert ring_transient_bytes(MODEL, PLAN, "allgather") == max(4 * KV * 2 + 2 * Q * 4,
                                                                 4 * KV * 2 + (Q + KV) * 4 + 2 * KV * 4)
    # p2p: forward every step's K/V chunk and partial output + fp32 output; backward 2 x (K/V, dK/dV) + dQ, dK/dV
    assert ring_transient_bytes(MODEL, PLAN, "p2p") == max(4 * KV * 2 + 4 * Q * 2 + Q * 4,
                                                           4 * KV * 2 + (Q + KV) * 2)
    assert ring_transient_bytes(MODEL, PLAN, "ulysses") == (2 * Q + KV) * 2
    assert ring_transient_bytes(MODEL, dataclasses.replace(PLAN, cp=1, dp=8), "p2p") == 0


def _lt(ring: RingTime) -> LayerTime:
    return LayerTime(gemm_s=1.0, attention_s=1.0, elementwise_s=0.5, elementwise_bwd_s=0.5, scores_s=0.0,
                     op_sac_recompute_s=0.25, tp_comm_s=0.0, cp_comm_s=ring.comm_s, moe_comm_s=0.0,
                     module_recompute_s=(("core_attn", 1.0),), ring=ring)


def test_every_forward_pass_of_the_attention_core_exchanges_again():
    ring = RingTime(fwd_exposed_s=0.1, fwd_hidden_s=0.2, bwd_exposed_s=0.3, bwd_hidden_s=0.4, merge_fwd_s=0.05,
                    merge_bwd_s=0.07)
    lt = _lt(ring)
    none = layer_passes(lt, PLAN, 1.0, "none", False)
    full = layer_passes(lt, dataclasses.replace(PLAN, recompute="full"), 1.0, "none", False)
    core = layer_passes(lt, dataclasses.replace(PLAN, recompute="selective"), 1.0, "none", False)
    sac = layer_passes(lt, dataclasses.replace(PLAN, recompute="selective"), 1.0, "none", False, "op-sac")
    assert none.cp_exposed_s == pytest.approx(0.1 + 0.3) and none.cp_hidden_s == pytest.approx(0.2 + 0.4)
    assert full.cp_exposed_s == core.cp_exposed_s == pytest.approx(2 * 0.1 + 0.3)
    assert sac.cp_exposed_s == pytest.approx(0.1 + 0.3)  # op-level SAC saves the attention's output
    base = _lt(RingTime())
    assert none.fwd_s - layer_passes(base, PLAN, 1.0, "none", False).fwd_s == pytest.approx(0.05)
    assert none.bwd_s - layer_passes(base, PLAN, 1.0, "none", False).bwd_s == pytest.approx(0.07)
    assert full.recompute_s == pytest.approx(none.fwd_s)  # the merge reruns with the forward
    assert core.recompute_s == pytest.approx(1.0 + 0.05)


def test_engines_run_their_own_kind_and_the_ledger_holds_the_buffers():
    model = load_model_preset("llama3-8b")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8, gpus_per_node=None, cluster_path=None)
    base = ParallelPlan(tp=1, pp=1, dp=2, cp=4, micro_batch_size=1, grad_accum_steps=1, global_batch_size=2,
                        seq_len=8192, zero_stage=1, engine="megatron")
    fsdp = dataclasses.replace(base, engine="fsdp", zero_stage=3)
    short = {p.engine: estimate_step_time(model, cluster, p).comm_parts_s["cp"] for p in (base, fsdp)}
    # at 2048 tokens per rank the all-gather hides behind one step only, the ring behind every step
    assert short["fsdp"] > short["megatron"]
    # the same tokens per rank without CP: the working set differs by what the buffers add beyond the MLP's
    full = dataclasses.replace(fsdp, recompute="full")
    wide = MemorySettings(cp_repeat_kv=True)  # K/V at the query width: buffers larger than the MLP's
    mem = estimate_memory(model, cluster, full, wide)
    no_cp = estimate_memory(model, cluster, dataclasses.replace(full, cp=1, dp=8, seq_len=2048), wide)
    mlp = layer_activations(model, full, 0, FSDPEngine().activation_facts(full)).mlp
    extra = max(0.0, ring_transient_bytes(model, full, "allgather", repeat_kv=True) - mlp)
    assert estimate_memory(model, cluster, full).activation_parts["recompute_working_set"] < \
        mem.activation_parts["recompute_working_set"]
    assert extra > 0
    assert mem.activation_parts["recompute_working_set"] - no_cp.activation_parts["recompute_working_set"] \
        == pytest.approx(extra)
    wide = estimate_step_time(model, cluster, fsdp, TimeSettings(cp_repeat_kv=True)).comm_parts_s["cp"]
    assert wide > short["fsdp"]
