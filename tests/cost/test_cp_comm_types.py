"""Megatron's --cp-comm-type as a plan setting: Transformer Engine's refusals (sliding windows and attention sinks
under the ring, heads per rank under the all-to-all), the hierarchical a2a+p2p split, and what each exchange costs."""

from __future__ import annotations

import pytest

from autotune.api import make_plan
from autotune.cost.cp_ring import ring_time
from autotune.cost.efficiency import DEFAULT_EFFICIENCY
from autotune.errors import InputError
from autotune.specs.context_parallel import hierarchical_cp_sizes
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

H100 = "h100-sxm-80gb"


def _plan(model: str, num_gpus: int, **kw):
    return make_plan(load_model_preset(model), load_cluster(gpu=H100, num_gpus=num_gpus), engine="megatron",
                     zero_stage=1, seq_len=32768, global_batch_size=num_gpus, **kw)


def test_attention_sinks_and_sliding_windows_need_the_all_to_all():
    with pytest.raises(InputError, match="attention sinks .* only with cp_comm_type a2a") as err:
        _plan("gpt-oss-120b", 16, cp=2, ep=8)  # Megatron's default exchange: the ring
    assert "sliding window attention" in str(err.value) and "context_parallel.py:5057" in str(err.value)
    assert _plan("gpt-oss-120b", 16, cp=2, ep=8, cp_comm_type="a2a").cp_comm_type == "a2a"
    with pytest.raises(InputError, match="sliding window attention"):
        _plan("phi3-mini", 16, cp=2, tp=2, sequence_parallel=True, cp_comm_type="a2a+p2p")  # sliding window 2047
    _plan("phi3-mini", 16, cp=2, tp=2, sequence_parallel=True, cp_comm_type="allgather")


def test_the_all_to_all_needs_heads_per_rank_divisible_by_its_size():
    # Llama-3-70B: 8 KV heads; at tp 8 each rank holds one, which 4 all-to-all ranks cannot split
    with pytest.raises(InputError, match=r"key/value 1\) divisible by its all-to-all size \(4\)"):
        _plan("llama3-70b", 64, tp=8, cp=4, sequence_parallel=True, cp_comm_type="a2a")
    assert _plan("llama3-70b", 64, tp=2, cp=4, sequence_parallel=True, cp_comm_type="a2a").cp == 4
    with pytest.raises(InputError, match="this plan has cp=1"):
        _plan("llama3-70b", 64, tp=8, sequence_parallel=True, cp_comm_type="p2p")


@pytest.mark.parametrize(("cp", "tp", "node", "split"), [(8, 4, 8, (2, 4)), (16, 1, 8, (8, 2)), (4, 8, 8, (1, 4)),
                                                         (6, 1, 8, (2, 3)), (8, 1, 72, (8, 1))])
def test_hierarchical_split_keeps_the_all_to_all_inside_the_node(cp, tp, node, split):
    inner, outer = hierarchical_cp_sizes(cp, tp, node)
    assert (inner, outer) == split and inner * outer == cp and tp * inner <= node


def _ring(plan, kind: str):
    model = load_model_preset("llama3-8b")
    cluster = load_cluster(gpu=H100, num_gpus=plan.world_size)
    return ring_time(model, cluster, plan, DEFAULT_EFFICIENCY, 3.35e12, 2e-3, 2.5 * 2e-3, kind)


def test_what_each_exchange_hides():
    plan = make_plan(load_model_preset("llama3-8b"), load_cluster(gpu=H100, num_gpus=8), engine="megatron", cp=8,
                     seq_len=65536, global_batch_size=8)
    p2p, a2a, gathered = _ring(plan, "p2p"), _ring(plan, "ulysses"), _ring(plan, "te-allgather")
    assert p2p.fwd_hidden_s > 0 and a2a.fwd_hidden_s == gathered.fwd_hidden_s == 0  # only the ring hides
    assert gathered.bwd_exposed_s > gathered.fwd_exposed_s > 0  # backward gathers again and reduce-scatters dK/dV
    # a2a+p2p inside one 8-GPU node is the all-to-all alone; over two nodes it adds a ring across them
    assert _ring(plan, "a2a+p2p") == a2a
    wide = make_plan(load_model_preset("llama3-8b"), load_cluster(gpu=H100, num_gpus=16), engine="megatron", cp=16,
                     seq_len=65536, global_batch_size=16)
    hierarchical = _ring(wide, "a2a+p2p")  # all-to-all over 8 in the node (exposed), ring over 2 nodes (hidden)
    assert hierarchical.fwd_exposed_s > 0 and hierarchical.fwd_hidden_s > 0
    assert hierarchical.fwd_hidden_s < _ring(wide, "p2p").fwd_hidden_s  # 1 step across nodes, not 15
