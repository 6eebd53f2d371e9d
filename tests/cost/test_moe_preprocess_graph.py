"""CUDA graph scope ``moe_preprocess`` (Megatron --cuda-graph-modules moe_router moe_preprocess, what NVIDIA's Qwen3
MoE recipes capture): the dispatcher's preprocess joins the router's graph, one launch instead of its kernels; the
rules megatron-core 0.19.2 holds for it (transformer_config.py:2473-2491, :2512-2520). Megatron-core's own verdict on
the written files: tests/emit/test_megatron_core_run_settings.py (qwen-te-graphs-router-preprocess,
preprocess-without-router)."""

from __future__ import annotations

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.cost.launch import graphed_parts, layer_launches
from autotune.errors import InputError
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset

MOE = load_model_preset("qwen3-30b-a3b")
DENSE = load_model_preset("llama3-8b")
CLUSTER = load_cluster(gpu="b200", num_gpus=8)


def _plan(model=MOE, **kw) -> ParallelPlan:
    kw = {"seq_len": 4096, "global_batch_size": 64} | kw
    return make_plan(model, CLUSTER, engine="megatron", ep=8 if model is MOE else 1, zero_stage=1, micro_batch_size=1,
                     recompute="none", **kw)


def test_the_preprocess_is_one_launch_when_graphed_and_its_kernels_when_not():
    router = _plan(cuda_graph="transformer_engine", cuda_graph_scope=("moe_router",))
    both = _plan(cuda_graph="transformer_engine", cuda_graph_scope=("moe_router", "moe_preprocess"))
    assert "moe_preprocess" not in graphed_parts(MOE, router, True)
    assert graphed_parts(MOE, both, True) == ("moe_router", "moe_preprocess")
    # the preprocess's two permutation kernels become the graph's one launch, forward and backward
    assert layer_launches(MOE, router, True)[0] - layer_launches(MOE, both, True)[0] == 1
    assert layer_launches(MOE, router, True)[1] - layer_launches(MOE, both, True)[1] == 1
    # the whole layer (no scope) leaves the dispatcher's parts to the host, as before
    whole = _plan(cuda_graph="local")
    assert not {"moe_rest", "moe_preprocess"} & set(graphed_parts(MOE, whole, True))


def test_megatrons_own_graphs_capture_router_and_preprocess_together():
    # local impl: either name brings the other (transformer_config.py:2473-2482 of megatron-core 0.19.2)
    for scope in (("moe_router",), ("moe_preprocess",)):
        plan = _plan(cuda_graph="local", cuda_graph_scope=scope)
        assert set(graphed_parts(MOE, plan, True)) == {"moe_router", "moe_preprocess"}


def test_graphing_the_preprocess_is_faster_where_the_host_sets_the_pace_and_the_files_say_it():
    # 64-token micro-batches: the layer's GPU work is shorter than its launches, so each launch saved counts
    short = dict(seq_len=64, global_batch_size=8)
    router = estimate(MOE, CLUSTER, _plan(cuda_graph="transformer_engine", cuda_graph_scope=("attn", "moe_router"),
                                          **short))
    both = estimate(MOE, CLUSTER, _plan(cuda_graph="transformer_engine",
                                        cuda_graph_scope=("attn", "moe_router", "moe_preprocess"), **short))
    assert both.time.step_time_s < router.time.step_time_s
    files = render_bundle(both).files
    assert "--cuda-graph-modules attn moe_router moe_preprocess" in " ".join(files["megatron_args.sh"].split())
    assert "moe_preprocess" in files["bridge_overrides.yaml"]


@pytest.mark.parametrize("kw, words", [
    (dict(cuda_graph="transformer_engine", cuda_graph_scope=("moe_preprocess",)),
     "moe_preprocess cuda graph is only supported with moe_router cuda graph"),
    (dict(cuda_graph="transformer_engine", cuda_graph_scope=("moe_router", "moe_preprocess"),
          moe_capacity_factor=1.0), "DtoH copies and synchronizations in the preprocess step"),
])
def test_what_megatron_refuses_is_refused_with_its_words(kw, words):
    with pytest.raises(InputError, match=words):
        _plan(**kw)


def test_padded_capacity_may_graph_the_preprocess_and_a_dense_model_may_not():
    _plan(cuda_graph="transformer_engine", cuda_graph_scope=("moe_router", "moe_preprocess"),
          moe_capacity_factor=1.0, moe_pad_to_capacity=True)  # static shapes: no sync in the preprocess
    with pytest.raises(InputError, match="moe cuda graph is only supported for MoE"):
        _plan(DENSE, cuda_graph="transformer_engine", cuda_graph_scope=("attn", "moe_preprocess"))
