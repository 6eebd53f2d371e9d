"""Megatron-core 0.19.2 itself judges the run settings written into ``megatron_args.sh``: its ``parse_args()``,
``validate_args()`` and the ``TransformerConfig`` built from the arguments (``core_transformer_config_from_args``,
whose ``__post_init__`` checks the recompute modules, the CUDA graph scopes, the EP overlap and its dispatcher) accept every file autotune writes for them, and refuse what
autotune's own rules refuse (tests/emit/fixtures/megatron_core_config_probe.py; the megatron-core wheel of the test
tooling, tests/emit/bridge_tooling.py, ships ``megatron.training``).
"""

from __future__ import annotations


import pytest
from megatron_core_probe import core_verdicts  # tests/emit/ is on sys.path (no __init__)

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.emit.shell_args import parse_shell_args
from autotune.errors import InputError
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

pytestmark = pytest.mark.slow  # one process of megatron-core imports (~10 s)
GPU = "h100-sxm-80gb"

# (id, model, GPUs, plan) that autotune runs: megatron-core must accept each file as written.
ACCEPTED = [
    ("llama-mlp", "llama3-8b", 16, dict(tp=2, sequence_parallel=True, recompute="selective",
                                        recompute_modules=("core_attn", "mlp"))),
    ("mixtral-moe-act-layernorm", "mixtral-8x7b", 32, dict(tp=2, ep=8, sequence_parallel=True, recompute="selective",
                                                         recompute_modules=("core_attn", "moe_act", "layernorm"))),
    ("mixtral-fp8-current-moe-act", "mixtral-8x7b", 32, dict(tp=2, ep=8, sequence_parallel=True, precision="fp8",
                                                           fp8_recipe="te-current", recompute="selective",
                                                           recompute_modules=("moe_act",))),
    ("dsv3-mla-shared-moe", "deepseek-v3", 64, dict(tp=2, ep=8, sequence_parallel=True, recompute="selective",
                                                    recompute_modules=("mla_up_proj", "moe", "mlp"))),
    ("dsv3-shared", "deepseek-v3", 64, dict(tp=2, ep=8, sequence_parallel=True, recompute="selective",
                                            recompute_modules=("core_attn", "shared_experts"))),
    ("llama-te-graphs-attn", "llama3-8b", 16, dict(tp=2, sequence_parallel=True, recompute="selective",
                                                   cuda_graph="transformer_engine", cuda_graph_scope=("attn",))),
    ("llama-local-graphs", "llama3-8b", 16, dict(tp=2, sequence_parallel=True, cuda_graph="local")),
    ("llama-full-iteration-graph-full-recompute", "llama3-8b", 16, dict(tp=2, sequence_parallel=True,
                                                                        recompute="full",
                                                                        cuda_graph="full-iteration")),
    ("mixtral-te-graphs-router", "mixtral-8x7b", 32, dict(tp=2, ep=8, sequence_parallel=True,
                                                          cuda_graph="transformer_engine",
                                                          cuda_graph_scope=("attn", "moe_router"))),
    ("mixtral-ep-overlap", "mixtral-8x7b", 32, dict(tp=2, ep=8, sequence_parallel=True, ep_overlap="a2a")),
    ("qwen-ep-overlap-vpp-dw-graphs", "qwen3-30b-a3b", 32, dict(tp=2, ep=8, pp=2, vpp=2, sequence_parallel=True,
                                                                ep_overlap="a2a-delay-wgrad",
                                                                cuda_graph="transformer_engine",
                                                                cuda_graph_scope=("attn", "moe_router"))),
    ("qwen-allgather", "qwen3-30b-a3b", 32, dict(tp=2, ep=8, sequence_parallel=True, moe_dispatcher="allgather")),
    ("qwen-flex-deepep", "qwen3-30b-a3b", 32, dict(tp=2, ep=8, sequence_parallel=True, moe_dispatcher="flex-deepep")),
    ("qwen-flex-hybridep-ep-overlap", "qwen3-30b-a3b", 32, dict(tp=2, ep=8, sequence_parallel=True,
                                                                moe_dispatcher="flex-hybridep", ep_overlap="a2a")),
    # the rank budget, the op fuser it needs and the paged stash (autotune.specs.sync_free_moe)
    ("qwen-full-iteration-hybridep", "qwen3-30b-a3b", 32, dict(tp=2, ep=8, sequence_parallel=True,
                                                               moe_dispatcher="flex-hybridep",
                                                               cuda_graph="full-iteration")),
    # the router and the dispatcher's preprocess graphed (--cuda-graph-modules moe_router moe_preprocess)
    ("qwen-te-graphs-router-preprocess", "qwen3-30b-a3b", 32, dict(tp=2, ep=8, sequence_parallel=True,
                                                                   cuda_graph="transformer_engine",
                                                                   cuda_graph_scope=("attn", "moe_router",
                                                                                     "moe_preprocess"))),
    # token dropping: --moe-expert-capacity-factor [--moe-pad-expert-input-to-capacity] (transformer_config.py:888-896)
    ("qwen-token-drop-padded", "qwen3-30b-a3b", 32, dict(tp=2, ep=8, sequence_parallel=True, moe_capacity_factor=1.25,
                                                         moe_pad_to_capacity=True)),
    ("qwen-token-drop-hybridep", "qwen3-30b-a3b", 32, dict(tp=2, ep=8, sequence_parallel=True,
                                                           moe_dispatcher="flex-hybridep", moe_capacity_factor=1.0)),
]
# (id, model, GPUs, plan, file edit) that autotune refuses: megatron-core must refuse the file edited to say it.
REFUSED = [
    ("mla-up-proj-without-mla", "mixtral-8x7b", 32, dict(tp=2, ep=8, sequence_parallel=True, recompute="selective",
                                                         recompute_modules=("mla_up_proj",)),
     ("--recompute-granularity selective", "--recompute-granularity selective --recompute-modules mla_up_proj")),
    ("delayed-fp8-moe-act", "mixtral-8x7b", 32, dict(tp=2, ep=8, sequence_parallel=True, precision="fp8",
                                                     recompute="selective", recompute_modules=("moe_act",)),
     ("--recompute-granularity selective", "--recompute-granularity selective --recompute-modules moe_act")),
    ("graphs-with-full-recompute", "llama3-8b", 16, dict(tp=2, sequence_parallel=True, recompute="full",
                                                         cuda_graph="transformer_engine"),
     ("--recompute-granularity full", "--cuda-graph-impl transformer_engine --recompute-granularity full")),
    ("ep-overlap-with-full-recompute", "mixtral-8x7b", 32, dict(tp=2, ep=8, sequence_parallel=True, recompute="full",
                                                                ep_overlap="a2a"),
     ("--recompute-granularity full", "--overlap-moe-expert-parallel-comm --recompute-granularity full")),
    ("ep-overlap-pp-without-vpp", "qwen3-30b-a3b", 32, dict(tp=2, ep=8, pp=2, sequence_parallel=True,
                                                            ep_overlap="a2a"),
     ("--pipeline-model-parallel-size 2", "--overlap-moe-expert-parallel-comm --pipeline-model-parallel-size 2")),
    ("ep-overlap-with-allgather", "qwen3-30b-a3b", 32, dict(tp=2, ep=8, sequence_parallel=True,
                                                            moe_dispatcher="allgather", ep_overlap="a2a"),
     ("--moe-token-dispatcher-type allgather",
      "--moe-token-dispatcher-type allgather --overlap-moe-expert-parallel-comm")),
    # cuda_graph_rules: the preprocess graphed without the router (transformer_config.py:2488-2491)
    ("preprocess-without-router", "qwen3-30b-a3b", 32, dict(tp=2, ep=8, sequence_parallel=True,
                                                            cuda_graph="transformer_engine",
                                                            cuda_graph_scope=("moe_preprocess",)),
     ("--moe-token-dispatcher-type alltoall", "--moe-token-dispatcher-type alltoall --cuda-graph-impl "
                                              "transformer_engine --cuda-graph-modules moe_preprocess")),
    # autotune.engines.megatron_rules.token_drop_rules: padding without a capacity (:1686-1690), DeepEP padded (:1600-1608)
    ("pad-without-capacity", "qwen3-30b-a3b", 32, dict(tp=2, ep=8, sequence_parallel=True, moe_pad_to_capacity=True),
     ("--moe-token-dispatcher-type alltoall", "--moe-token-dispatcher-type alltoall --moe-pad-expert-input-to-capacity")),
    ("deepep-padded", "qwen3-30b-a3b", 32, dict(tp=2, ep=8, sequence_parallel=True, moe_dispatcher="flex-deepep",
                                                moe_capacity_factor=1.0, moe_pad_to_capacity=True),
     ("--moe-expert-capacity-factor 1", "--moe-expert-capacity-factor 1 --moe-pad-expert-input-to-capacity")),
    # fp8_output_proj_problems: the MXFP8 LM head under another FP8 recipe (transformer_config.py:1569-1575)
    ("fp8-head-without-mxfp8", "llama3-8b", 16, dict(tp=2, sequence_parallel=True, precision="fp8",
                                                     fp8_output_proj=True),
     ("--fp8-recipe delayed", "--fp8-recipe delayed --fp8-output-proj")),
]


def _plan(model: str, gpus: int, kw: dict):
    m, c = load_model_preset(model), load_cluster(gpu=GPU, num_gpus=gpus)
    return m, c, make_plan(m, c, engine="megatron", zero_stage=1, global_batch_size=4 * gpus, seq_len=4096, **kw)


def _argv(text: str) -> list[str]:
    return parse_shell_args(text)[0]


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    jobs = []
    for case, model, gpus, kw in ACCEPTED:
        m, c, plan = _plan(model, gpus, kw)
        jobs.append((gpus, _argv(render_bundle(estimate(m, c, plan)).files["megatron_args.sh"])))
    for case, model, gpus, kw, (old, new) in REFUSED:
        base = {k: v for k, v in kw.items() if k not in ("recompute_modules", "cuda_graph", "ep_overlap",
                                                         "moe_pad_to_capacity", "cuda_graph_scope", "fp8_output_proj")} | {
            "fp8_recipe": None}
        m, c, plan = _plan(model, gpus, {k: v for k, v in base.items() if v is not None})
        text = render_bundle(estimate(m, c, plan)).files["megatron_args.sh"]
        assert old in text, (case, text)
        jobs.append((gpus, _argv(text.replace(old, new))))
    lines = core_verdicts(tmp_path_factory.mktemp("core019"), jobs)
    return dict(zip([c[0] for c in ACCEPTED] + [c[0] for c in REFUSED], lines))


@pytest.mark.parametrize("case", [c[0] for c in ACCEPTED])
def test_megatron_core_accepts_what_autotune_writes(verdicts, case):
    kw = next(c[3] for c in ACCEPTED if c[0] == case)
    got = verdicts[case]
    assert got["ok"], got
    config = got["config"]
    if kw.get("recompute") == "selective":
        assert config["recompute_granularity"] == "selective"
        assert sorted(config["recompute_modules"]) == sorted(kw.get("recompute_modules", ("core_attn",)))
    assert config["cuda_graph_impl"] == kw.get("cuda_graph", "none").replace("full-iteration", "full_iteration")
    if "cuda_graph" in kw:  # the parts captured (CudaGraphModule members); none listed: the whole layer
        assert sorted(m.split(".")[-1] for m in config["cuda_graph_modules"]) == sorted(kw.get("cuda_graph_scope", ()))
    assert config["overlap_moe_expert_parallel_comm"] == ("ep_overlap" in kw)
    assert config["delay_wgrad_compute"] == (kw.get("ep_overlap") == "a2a-delay-wgrad")
    kind, _, backend = kw.get("moe_dispatcher", "alltoall").partition("-")
    assert config["moe_token_dispatcher_type"] == (kind if kw.get("ep", 1) > 1 else "allgather")  # dense: untold
    if backend:
        assert config["moe_flex_dispatcher_backend"] == backend
    assert config["moe_expert_capacity_factor"] == kw.get("moe_capacity_factor")
    assert config["moe_pad_expert_input_to_capacity"] == kw.get("moe_pad_to_capacity", False)


@pytest.mark.parametrize("case", [c[0] for c in REFUSED])
def test_megatron_core_refuses_what_autotune_refuses(verdicts, case):
    _, model, gpus, kw, _ = next(c for c in REFUSED if c[0] == case)
    got = verdicts[case]
    assert not got["ok"] and got["stage"] == "TransformerConfig", got
    if "moe_preprocess" in kw.get("cuda_graph_scope", ()):  # the same requirement in both refusals
        words = "moe_preprocess cuda graph is only supported with moe_router cuda graph"
        with pytest.raises(InputError, match=words):
            _plan(model, gpus, kw)
        assert words in got["error"], got
        return
    if kw.get("fp8_output_proj"):  # the MXFP8 head off MXFP8: the same field named in both refusals
        with pytest.raises(InputError, match="fp8_output_proj runs the output layer in MXFP8"):
            _plan(model, gpus, kw)
        assert "fp8_output_proj" in got["error"] and "mxfp8" in got["error"], got
        return
    if kw.get("moe_pad_to_capacity"):  # token dropping: the same field named in both refusals
        with pytest.raises(InputError, match="moe_pad_expert_input_to_capacity"):
            _plan(model, gpus, kw)
        assert "moe_pad_expert_input_to_capacity" in got["error"], got
        return
    with pytest.raises(InputError, match="recompute" if "ep_overlap" not in kw else
                       "EP A2A overlap|recomputation|alltoall/flex token dispatcher"):
        _plan(model, gpus, kw)
    if "ep_overlap" in kw:  # the same requirement, in megatron-core's words
        assert any(words in got["error"] for words in ("EP A2A overlap", "full recomputation",
                                                       "alltoall/flex token dispatcher")), got
    if "cuda_graph" in kw:
        assert "full recompute is only supported with full iteration CUDA graph" in got["error"]
