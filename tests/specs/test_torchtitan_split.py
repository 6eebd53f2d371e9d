"""The fsdp engine's pipeline split ("any": torch.distributed.pipelining / torchtitan) against torchtitan's own split
function, read from its source (the installed v0.2.2 and, where the test tools cache has it, 0.3.0): the same layers
per (virtual) stage where torchtitan counts the embedding and the output as a layer each, and refused exactly where
torchtitan raises. The function is executed from torchtitan's file (its module imports need torchdata)."""

from __future__ import annotations

import pytest
from torchtitan_source import split_sources, torchtitan_split_function  # tests/ is on sys.path (no __init__)

from autotune.rules import vpp_problems
from autotune.specs.layout import layer_counts, torchtitan_split, virtual_layout

SOURCES = split_sources()


@pytest.mark.skipif(not SOURCES, reason="no torchtitan source here (pip's 0.2.2 or the 0.3.0 test tool)")
@pytest.mark.parametrize("path", SOURCES, ids=[str(p.parents[2].name) for p in SOURCES])
def test_the_split_is_torchtitans_and_refused_where_it_raises(path):
    split = torchtitan_split_function(path)
    for layers in range(1, 20):
        for stages in range(2, 24):
            try:
                names = split(stages, layers, 1, 1)
            except ValueError:
                names = None
            ours = torchtitan_split(layers, stages)
            if names is None:
                assert ours is None, (layers, stages)
                continue
            assert ours == tuple(sum(n.startswith("layers.") for n in part) for part in names), (layers, stages)
            assert names[0][0] == "tok_embeddings" and names[-1][0 if ours[-1] == 0 else -2] == "norm"
            if layers < stages:  # the fsdp engine's scheme uses torchtitan's where every stage cannot have a layer
                assert layer_counts(layers, stages, "any") == ours
    # Llama 3 405B (paper Sec. 3.3.2): 126 layers on 16 x 8 virtual stages, the first chunk the embedding alone.
    names = split(128, 126, 1, 1)
    assert names[0] == ["tok_embeddings"] and names[-1][0] == "norm" and len(names[-1]) == 2


def test_llama3_405b_virtual_stages_embedding_and_output_alone():
    counts = layer_counts(126, 16 * 8, "any")
    assert counts[0] == 0 and counts[-1] == 0 and set(counts[1:-1]) == {1}
    # rank s holds virtual stages s, s + 16, ...: the ends 7 layers and the embedding / the output, as Megatron's 7+14x8+7
    assert [sum(counts[s::16]) for s in range(16)] == list(layer_counts(126, 16, "any"))
    assert vpp_problems(126, 16, 8, "any", False) == []


@pytest.mark.parametrize("layers, pp, vpp, fix", [(126, 16, 9, "use vpp=8"), (5, 2, 4, "use vpp=3"),
                                                  (2, 4, 2, "use vpp=1"), (2, 8, 2, "lower pp")])
def test_more_stages_than_layers_plus_two_are_refused_with_the_way_out(layers, pp, vpp, fix):
    (rule, message), = vpp_problems(layers, pp, vpp, "any", False)
    assert rule == "layers_vpp" and "cannot be greater than effective layers" in message and message.endswith(fix)
    assert torchtitan_split(layers, pp * vpp) is None


def test_layers_at_least_the_stages_keep_the_planners_split():
    # torchtitan splits by module names, so the Megatron / uniform split where each stage has a layer stays.
    assert layer_counts(24, 5, "any") == (5, 5, 5, 5, 4) and layer_counts(10, 4, "any") == (2, 3, 3, 2)
    assert layer_counts(7, 8, "any") == (1, 1, 1, 1, 1, 1, 1, 0)  # 7 + 2 effective layers over 8: the output alone


@pytest.mark.parametrize("layers, pp, vpp", [(126, 16, 8), (127, 16, 8), (32, 4, 3), (34, 8, 4), (10, 2, 2),
                                             (62, 4, 4)])
def test_every_rank_keeps_the_layers_the_cost_model_gives_its_stage(layers, pp, vpp):
    counts = virtual_layout(layers, pp, vpp, "any")
    assert counts is not None and sum(counts) == layers and min(counts[1:-1]) >= 1
    stage = list(layer_counts(layers, pp, "any"))
    if all(n + (s == 0) + (s == pp - 1) >= vpp for s, n in enumerate(stage)):
        assert [sum(counts[s::pp]) for s in range(pp)] == stage
    else:  # a rank with fewer slots than chunks: torchtitan's own split over pp x vpp (34 on 8 x 4: 2 + 1 slot < 4)
        assert counts == layer_counts(layers, pp * vpp, "any")


def test_the_embedding_only_chunk_weighs_nothing_in_the_first_stages_activations():
    from autotune.cost.stage_chunks import uneven_chunks
    from autotune.specs.plan import ParallelPlan

    plan = ParallelPlan(tp=8, pp=16, vpp=8, dp=1, micro_batch_size=1, global_batch_size=16, grad_accum_steps=16,
                        seq_len=8192, engine="fsdp")
    first = uneven_chunks(126, plan, 0, "any")
    assert first[0] == (0, 0) and all(b - a == 1 for a, b in first[1:])  # chunk 0: the embedding alone
    last = uneven_chunks(126, plan, 15, "any")
    assert last[-1] == (126, 126)  # the last chunk: the norm + output alone
    assert uneven_chunks(126, plan, 5, "any") is None  # a middle rank: 8 chunks of one layer
