"""NVIDIA's recipe settings (bench/data/nvidia_recipe_settings.csv, bench/nvidia_recipe_settings.py) become the
`autotune estimate` flags the accuracy bench runs each row with; what the tool cannot express is listed by name."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import nvidia_recipe_settings as nrs  # noqa: E402

from accuracy_nvidia_recipes import load_rows  # noqa: E402

ROWS = load_rows()
SETTINGS = nrs.load_settings()


def test_the_file_holds_the_settings_the_bench_turns_into_flags():
    lines = [ln for ln in nrs.DATA.read_text(encoding="utf-8").splitlines() if not ln.startswith("#")]
    names = {r["setting"].rsplit(".", 1)[-1] for r in csv.DictReader(lines) if r["setting"]}
    assert names >= {"recompute_granularity", "cuda_graph_impl", "tp_comm_overlap", "overlap_moe_expert_parallel_comm"}


def _settings(**values) -> nrs.RecipeSettings:
    return nrs.RecipeSettings(recipe="x_config", values={k: (str(v), "f.py#L1") for k, v in values.items()})


def test_recipe_settings_become_estimate_flags_and_the_rest_are_listed():
    f = nrs.flags_for(_settings(recompute_granularity="selective", recompute_modules="layernorm moe_act",
                                cuda_graph_impl="transformer_engine", cuda_graph_scope="attn moe_router moe_preprocess",
                                overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True,
                                moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep"), tp=1, ep=8)
    assert f.recompute_set
    a = f.argv
    assert a[a.index("--recompute") + 1] == "selective"
    assert a[a.index("--recompute-modules") + 1: a.index("--recompute-modules") + 3] == ["layernorm", "moe_act"]
    assert a[a.index("--cuda-graph") + 1] == "transformer_engine"
    scope = a.index("--cuda-graph-scope")
    assert a[scope + 1: scope + 4] == ["attn", "moe_router", "moe_preprocess"]  # every part expressed
    assert a[a.index("--ep-overlap") + 1] == "a2a-delay-wgrad" and "--tp-overlap" not in a  # tp 1: no TP overlap
    assert not any("CUDA graph scope" in u for u in f.unexpressed)
    assert a[a.index("--moe-dispatcher") + 1] == "flex-hybridep" and not any("dispatcher" in u for u in f.unexpressed)
    # flex without a backend runs Megatron-core's default, DeepEP; no dispatcher flag without expert parallelism
    deepep = nrs.flags_for(_settings(moe_token_dispatcher_type="flex"), tp=1, ep=8).argv
    assert deepep[deepep.index("--moe-dispatcher") + 1] == "flex-deepep"
    assert "--moe-dispatcher" not in nrs.flags_for(_settings(moe_token_dispatcher_type="flex"), tp=1, ep=1).argv
    none = nrs.flags_for(_settings(recompute_granularity=None, tp_comm_overlap=True), tp=4, ep=1)
    assert none.argv[:2] == ["--recompute", "none"] and none.argv[none.argv.index("--tp-overlap") + 1] == "userbuffers"
    assert not none.unexpressed
    assert nrs.flags_for(None, tp=4, ep=1).argv == [] and not nrs.flags_for(None, tp=4, ep=1).recompute_set
    # account-for-embedding/loss is the tool's own split where megatron_layout says so; else it is listed
    acc = _settings(recompute_granularity=None, account_for_embedding_in_pipeline_split=True)
    assert not nrs.flags_for(acc, tp=1, ep=1, split_accounts=True).unexpressed
    assert nrs.flags_for(acc, tp=1, ep=1).unexpressed == ["account_for_embedding_in_pipeline_split=True"]
    # a release whose base recipe is not read: no recompute or TP overlap flag, and the bench's fallback says so
    unread = nrs.flags_for(_settings(cuda_graph_impl="local"), tp=4, ep=1)
    assert not unread.recompute_set and "--recompute" not in unread.argv and "--tp-overlap" not in unread.argv
    assert any("recompute not read" in u for u in unread.unexpressed)


def test_full_iteration_rows_ask_for_the_whole_iteration_graph():
    # Bridge 0.6 recipes set cuda_graph_impl full_iteration; earlier ones local with the full_iteration scope
    for s in (_settings(cuda_graph_impl="full_iteration"),
              _settings(cuda_graph_impl="local", cuda_graph_scope="full_iteration")):
        f = nrs.flags_for(s, tp=2, ep=8)
        assert f.argv[f.argv.index("--cuda-graph") + 1] == "full-iteration" and "--cuda-graph-scope" not in f.argv
        assert not any("CUDA graph" in u for u in f.unexpressed)


def test_a_recipe_layout_the_tools_split_spells_is_expressed():
    """NVIDIA's DeepSeek-V3 layout on 16 virtual stages (Megatron-Bridge recipes/deepseek/h100/deepseek_v3.py:50-68
    at 067f987, as the settings file records it) is what the tool writes for pp 2 x vpp 8 with the MTP module; a
    layout it does not write stays listed as not expressed."""
    from autotune.emit.megatron_layout import megatron_split

    recipe = _settings(pipeline_model_parallel_layout="Et*4|(t*4|)*14tmL")
    ours = megatron_split(61, 2, 8, mtp_layers=1).layout
    assert nrs.expanded_layout("Et*4|(t*4|)*14tmL") == nrs.expanded_layout(ours)
    assert not any("layout" in u for u in nrs.flags_for(recipe, 1, 32, split_layout=ours).unexpressed)
    without_mtp = megatron_split(61, 2, 8).layout
    assert any("layout" in u for u in nrs.flags_for(recipe, 1, 32, split_layout=without_mtp).unexpressed)
    assert any("layout" in u for u in nrs.flags_for(recipe, 1, 32).unexpressed)


def test_fp8_attention_maps_to_its_flag_and_a_helpers_parameter_to_what_the_caller_passes():
    assert "--fp8-attention" in nrs.flags_for(_settings(fp8_dot_product_attention=True), tp=1, ep=1).argv
    assert "--fp8-attention" not in nrs.flags_for(_settings(fp8_dot_product_attention=False), tp=1, ep=1).argv
    # DeepSeek-V3's MXFP8 recipes set it from _enable_deepseek_full_iteration_mxfp8's parameter (deepseek/common.py:75
    # at 51885cf): GB300's call passes True (gb300/deepseek_v3.py:157), GB200's none (gb200/deepseek_v3.py:160)
    by_recipe = {s.recipe: s for s in SETTINGS.values()}
    gb300 = by_recipe["deepseek_v3_pretrain_256gpu_gb300_fp8mx_config"]
    gb200 = by_recipe["deepseek_v3_pretrain_256gpu_gb200_fp8mx_config"]
    assert gb300.get("fp8_dot_product_attention") == gb200.get("fp8_dot_product_attention") == \
        "fp8_dot_product_attention"
    assert "--fp8-attention" in nrs.flags_for(gb300, tp=1, ep=64).argv
    assert "--fp8-attention" not in nrs.flags_for(gb200, tp=1, ep=64).argv
    unknown = nrs.flags_for(_settings(fp8_dot_product_attention="fp8_dot_product_attention"), tp=1, ep=8)
    assert "--fp8-attention" not in unknown.argv and any("caller" in u for u in unknown.unexpressed)
    # every row whose recipe turns it on: an MXFP8 row
    on = [r for r in ROWS if "--fp8-attention" in nrs.flags_for(SETTINGS[r["source"]], tp=1, ep=8).argv]
    assert on and {r["precision"] for r in on} <= {"MXFP8", "FP8-MX"}, {r["precision"] for r in on}


def test_the_mxfp8_head_maps_to_its_flag_and_a_helpers_parameter_to_what_the_caller_passes():
    assert "--fp8-output-proj" in nrs.flags_for(_settings(fp8_output_proj=True), tp=1, ep=1).argv
    assert "--fp8-output-proj" not in nrs.flags_for(_settings(fp8_output_proj=False), tp=1, ep=1).argv
    # DeepSeek-V3's MXFP8 recipes set it from _enable_deepseek_full_iteration_mxfp8's parameter (deepseek/common.py:71
    # at 51885cf): GB300's call passes True (gb300/deepseek_v3.py:157), and so does GB200's (gb200/deepseek_v3.py:160)
    by_recipe = {s.recipe: s for s in SETTINGS.values()}
    for name in ("deepseek_v3_pretrain_256gpu_gb300_fp8mx_config", "deepseek_v3_pretrain_256gpu_gb200_fp8mx_config"):
        assert by_recipe[name].get("fp8_output_proj") == "fp8_output_proj"
        assert "--fp8-output-proj" in nrs.flags_for(by_recipe[name], tp=1, ep=64).argv
    unknown = nrs.flags_for(_settings(fp8_output_proj="fp8_output_proj"), tp=1, ep=8)
    assert "--fp8-output-proj" not in unknown.argv and any("caller" in u for u in unknown.unexpressed)
    # every row whose recipe turns it on: an MXFP8 row (Megatron-core refuses it otherwise), of GPT-OSS or DeepSeek-V3
    on = [r for r in ROWS if "--fp8-output-proj" in nrs.flags_for(SETTINGS[r["source"]], tp=1, ep=8).argv]
    assert on and {r["precision"] for r in on} <= {"MXFP8", "FP8-MX"}, {r["precision"] for r in on}
    assert {r["model"] for r in on} == {"DeepSeekV3", "GPT OSS 120B"}, {r["model"] for r in on}
