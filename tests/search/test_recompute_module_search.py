"""The planner searches the ``--recompute-modules`` sets NVIDIA's recipes run on MoE / MLA models
(``Engine.searched_recompute_modules``) beside the default attention core: NVIDIA's DeepSeek-V3 GB200 plan
(tp1 pp4 vp4 ep64, micro-batch 1, Megatron-Bridge's DEEPSEEK_V3 GB200 MXFP8 recipe with mla_up_proj) fits only with
``mla_up_proj`` (moe_act, the narrower set searched first, does not), so a search of the default set alone cannot
reach it."""

from dataclasses import replace

from autotune.cost.memory import estimate_memory
from autotune.engines import engine_for
from autotune.rules import plan_problems
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster, load_model

DEEPSEEK = load_model("deepseek-v3")
GB200 = load_cluster(gpu="gb200", num_gpus=256, gpus_per_node=64)
# NVIDIA's plan's layout and run settings (bench/accuracy_nvidia_recipes.py's row 26.08 DeepSeekV3 DGX-GB200)
NVIDIA = dict(engines=("megatron",), tp=1, pp=4, vpp=4, ep=64, zero_stages=(1,), precisions=("fp8",),
              fp8_recipe="te-mxfp8", grad_dtype="bf16", mtp_layers=1, uneven_layouts=True, allow_offload=False,
              cuda_graph="full-iteration", moe_dispatcher="flex-hybridep", ep_overlap="a2a-delay-wgrad",
              micro_batch_size=1)


def _search(**kw):
    return search_plans(DEEPSEEK, GB200, seq_len=4096, global_batch_size=4096,
                        constraints=SearchConstraints(**(NVIDIA | kw)), top_k=50)


def test_megatron_searches_mla_up_proj_on_an_mla_model_and_nothing_more_on_a_dense_one():
    megatron = engine_for("megatron")
    assert ("mla_up_proj",) in megatron.searched_recompute_modules(DEEPSEEK, "fp8", "te-mxfp8")
    assert megatron.searched_recompute_modules(load_model("llama3-70b"), "bf16", None) == ()
    # Delayed scaling refuses moe_act / layernorm recompute (transformer_config.py:1820-1826): not searched there.
    assert ("moe_act", "layernorm") in megatron.searched_recompute_modules(DEEPSEEK, "fp8", "te-mxfp8")
    assert ("moe_act", "layernorm") not in megatron.searched_recompute_modules(DEEPSEEK, "fp8", "te-delayed")


def test_nvidias_deepseek_v3_gb200_plan_is_reached_with_mla_up_proj_alone():
    found = _search()
    reached = [e for e in found.ranked if e.plan.loss_slots is None and e.plan.dp == 64]
    assert reached and {e.plan.recompute_modules for e in reached} == {("mla_up_proj",)}
    for e in found.ranked:  # every plan ranked passes every rule, the searched module sets' included
        assert plan_problems(DEEPSEEK, GB200, e.plan, uneven_layouts=True) == [], e.plan
    # The default set alone (what the planner searched before) does not fit NVIDIA's layout at dp 64.
    default_only = _search(recompute_modules=("core_attn",))
    assert not [e for e in default_only.ranked if e.plan.loss_slots is None and e.plan.dp == 64]
    assert found.candidates[0].time.tokens_per_s > 1.05 * default_only.candidates[0].time.tokens_per_s


def test_each_mode_is_counted_once():
    found = _search()
    assert found.num_enumerated == found.num_feasible + sum(found.rejections.values())
    # none, selective (core_attn), full and the three sets Megatron searches on an MLA + MoE model
    assert found.num_enumerated == 6 * _search(recompute_modules=("core_attn",)).num_enumerated
    assert found.rejections.get("recompute_unneeded", 0) > 0


def test_a_searched_set_is_ranked_only_where_no_recompute_and_no_narrower_set_fits():
    found = _search(micro_batch_size=None, tp=None, pp=None, vpp=None, ep=None, uneven_layouts=False)
    sets = engine_for("megatron").searched_recompute_modules(DEEPSEEK, "fp8", "te-mxfp8")
    ranked = [e for e in found.ranked if e.plan.recompute_modules in sets]
    assert ranked
    for e in ranked:
        narrower = sets[:sets.index(e.plan.recompute_modules)]
        for recompute, modules in [("none", None), *(("selective", m) for m in narrower)]:
            other = replace(e.plan, recompute=recompute, recompute_modules=modules)
            assert not estimate_memory(DEEPSEEK, GB200, other).fits, (e.plan, modules)
