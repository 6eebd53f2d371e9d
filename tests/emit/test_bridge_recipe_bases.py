"""A Megatron-Bridge override file read on its base recipe: what the file leaves unsaid is the recipe's, as
run_recipe.py merges the file onto the recipe's ConfigContainer (autotune/emit/bridge_recipe_bases.py). The recipes' values
(autotune/data/bridge_recipe_bases.json) are checked against megatron-bridge 0.6.2 building each recipe
(tests/emit/bridge_recipe_bases.py; tooling as test_megatron_bridge_applied.py)."""

from __future__ import annotations

import pytest

from autotune.emit.megatron_bridge_recipes import GENERIC, RECIPES
from autotune.emit.validate_files import file_kind
from autotune.job_bridge import layout_text
from autotune.emit.bridge_recipe_bases import load_bases, with_base
from autotune.job_files import read_job


def test_the_shipped_bases_are_what_megatron_bridge_builds():
    from bridge_recipe_bases import bridge_bases  # tests/emit/ is on sys.path

    assert bridge_bases() == load_bases()
    assert set(load_bases()) == {r.name for r in (*RECIPES.values(), GENERIC)}


def _override(tmp_path, recipe: str, body: str) -> str:
    path = tmp_path / "my_overrides.yaml"
    path.write_text(f"# Base recipe: {recipe}\n{body}")
    return str(path)


def test_a_file_that_sets_only_the_batch_trains_at_the_recipes_layout(tmp_path):
    # Bridge r0.6.0 recipes/llama/h100/llama3.py:734-745: TP 4, PP 4, VPP 5, CP 2, SP, sequence 8192, and its
    # CommOverlapConfig with TP overlap
    path = _override(tmp_path, "llama3_70b_pretrain_32gpu_h100_bf16_config", "train:\n  global_batch_size: 256\n")
    assert file_kind(path) == "megatron-bridge"  # by its base-recipe line: it has no model section
    job = read_job([path], num_gpus=64, gpu="h100-sxm-80gb")
    p = job.plan
    assert (p.tp, p.pp, p.vpp, p.cp, p.dp, p.sequence_parallel) == (4, 4, 5, 2, 2, True)
    assert (p.micro_batch_size, p.global_batch_size, p.seq_len) == (1, 256, 8192)
    assert p.tp_overlap == "userbuffers" and p.zero_stage == 1 and job.model.name == "llama3-70b"
    assert any("base recipe llama3_70b_pretrain_32gpu_h100_bf16_config" in n and "tensor_model_parallel_size 4" in n
               for n in job.notes)


def test_the_file_wins_over_its_recipe(tmp_path):
    path = _override(tmp_path, "llama3_70b_pretrain_32gpu_h100_bf16_config",
                     "model:\n  context_parallel_size: 1\n  tensor_model_parallel_size: 8\n"
                     "mixed_precision: bf16_with_fp8_current_scaling_mixed\n")
    job = read_job([path], num_gpus=64, gpu="h100-sxm-80gb")
    p = job.plan
    assert (p.tp, p.pp, p.vpp, p.cp, p.global_batch_size) == (8, 4, 5, 1, 512)
    assert (p.precision, p.fp8_recipe) == ("fp8", "te-current")
    assert not any("tensor_model_parallel_size" in n for n in job.notes)  # the file states it


def test_moe_recipes_bring_their_dispatcher_and_cuda_graph_scope(tmp_path):
    # qwen3_30b_a3b's recipe: EP 16, the flex dispatcher on HybridEP, TE CUDA graphs on the router and the
    # dispatcher's pre-processing, set through the deprecated cuda_graph_scope that TransformerConfig moves into
    # cuda_graph_modules (transformer_config.py:2383-2406 of core 0.19)
    path = _override(tmp_path, "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", "train:\n  micro_batch_size: 2\n")
    p = read_job([path], num_gpus=16, gpu="h100-sxm-80gb").plan
    assert (p.ep, p.micro_batch_size, p.global_batch_size) == (16, 2, 1024)
    assert p.moe_dispatcher == "flex-hybridep"
    assert p.cuda_graph == "transformer_engine" and p.cuda_graph_scope == ("moe_router", "moe_preprocess")


def test_a_recipe_layout_list_reads_as_megatrons_layout_string(tmp_path):
    layout = load_bases()["deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config"]["model"][
        "pipeline_model_parallel_layout"]
    text = layout_text(layout)
    assert text.startswith("Etttttttt|tttttttt|") and text.endswith("|tttttmL") and text.count("|") == 7
    assert layout_text([["decoder", "unknown"]]) is None and layout_text("Et|tL") == "Et|tL"
    path = _override(tmp_path, "deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config", "train:\n  global_batch_size: 2048\n")
    p = read_job([path], num_gpus=256, gpu="h100-sxm-80gb").plan
    assert (p.tp, p.pp, p.ep, p.recompute, p.mtp_layers, p.global_batch_size) == (2, 8, 32, "full", 1, 2048)


@pytest.mark.parametrize("model,flags", [
    ("llama3-70b", ["--tp", "8", "--pp", "2", "--micro-batch", "1", "--global-batch", "512", "--seq-len", "8192"]),
    ("qwen3-30b-a3b", ["--ep", "8", "--micro-batch", "1", "--global-batch", "256", "--seq-len", "4096"]),
])
def test_autotunes_own_files_read_as_their_plan(tmp_path, model, flags):
    """An emitted override file states every field its plan sets: on its recipe's base it still reads as that plan."""
    import json

    from autotune.cli import main

    out = tmp_path / "job"
    assert main(["emit", "--model", model, "--gpu", "h100-sxm-80gb", "--num-gpus", "64", "--engine", "megatron",
                 "--zero", "1", *flags, "--out", str(out)]) == 0
    emitted = json.loads((out / "plan.json").read_text())["plan"]
    job = read_job([str(out / "bridge_overrides.yaml")], num_gpus=64, gpu="h100-sxm-80gb")
    assert "Base recipe:" in (out / "bridge_overrides.yaml").read_text()
    read, keys = job.plan.to_dict(), ("tp", "pp", "vpp", "cp", "ep", "micro_batch_size", "global_batch_size",
                                      "seq_len", "recompute", "precision", "sequence_parallel", "moe_dispatcher",
                                      "tp_overlap", "cuda_graph", "zero_stage")
    assert {k: read.get(k) for k in keys} == {k: emitted.get(k) for k in keys}


@pytest.mark.parametrize("base,over,merged", [
    ({"a": {"x": 1, "y": 2}, "p": "bf16_mixed"}, {"a": {"y": 3}}, {"a": {"x": 1, "y": 3}, "p": "bf16_mixed"}),
    ({"p": "bf16_mixed"}, {"p": {"fp8": "hybrid"}}, {"p": {"fp8": "hybrid"}}),
    ({"a": {"l": [1, 2]}}, {"a": {"l": [3]}}, {"a": {"l": [3]}}),
])
def test_merge(base, over, merged):
    assert with_base(base, over) == merged


def test_tp_userbuffers_asked_for_are_judged_on_the_recipes_tp_and_sequence_parallelism(tmp_path):
    """A file that turns on comm_overlap.tp_comm_overlap and leaves tp / sequence parallelism to its recipe: on the
    70B recipe (tp 4, sequence parallel) Bridge keeps the overlap; it was warned that Bridge turns it off at tp < 2,
    reading the file's missing tp as 1. On a tp-1 recipe, or with tp 1 in the file, the warning stands."""
    from autotune.emit.megatron_bridge_lint import bridge_overrides_problems

    def warned(recipe: str, body: str) -> bool:
        path = _override(tmp_path, recipe, "comm_overlap:\n  tp_comm_overlap: true\n" + body)
        return any(p.path == "$.comm_overlap.tp_comm_overlap" for p in bridge_overrides_problems(path, world_size=64))

    assert not warned("llama3_70b_pretrain_32gpu_h100_bf16_config", "")
    assert warned("llama3_8b_pretrain_2gpu_h100_bf16_config", "")
    assert warned("llama3_70b_pretrain_32gpu_h100_bf16_config", "model:\n  tensor_model_parallel_size: 1\n")
