"""NVIDIA's Megatron-Bridge H100 performance recipes (bench/data/nvidia_h100_recipes.csv) are read with their sources,
and the memory ledger says every one that Megatron-core can lay out fits the 80 GB H100 it ran on
(bench/nvidia_h100_fit.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import nvidia_h100_fit as bench  # noqa: E402

RECIPES = bench.load_recipes()
SOURCE = re.compile(r"^NVIDIA-NeMo/Megatron-Bridge@067f987df03b:src/megatron/bridge/(perf_)?recipes/\S+\.py#L\d+$")


@pytest.fixture(scope="module")
def estimated():
    return {r.name: r for r in bench.all_recipes()}


def test_the_file_holds_each_estimated_familys_h100_recipes_each_setting_with_its_line():
    assert len(RECIPES) == 32
    prefixes = {bench.NAME.match(name)["model"] for name in RECIPES}
    assert prefixes == set(bench.MODELS)
    lines = [ln for ln in bench.DATA.read_text().splitlines() if not ln.startswith("#")][1:]
    assert all(SOURCE.match(line.rsplit(",", 1)[-1]) for line in lines), [
        line for line in lines if not SOURCE.match(line.rsplit(",", 1)[-1])][:3]


def test_a_recipe_reads_as_its_function_sets_it():
    # perf_recipes/gpt_oss/h100/gpt_oss.py:25-44 at 067f987: PP 4, EP 8, GBS 1280, MBS 1, selective recompute of
    # layernorm and moe_act over the base recipe's TP 2 / EP 16; _benchmark_common's 16-bit gradients and TE loss
    values = bench._short(RECIPES["gpt_oss_120b_pretrain_64gpu_h100_bf16_config"])
    assert (values["tensor_model_parallel_size"], values["pipeline_model_parallel_size"],
            values["expert_model_parallel_size"]) == ("1", "4", "8")
    assert (values["global_batch_size"], values["micro_batch_size"]) == ("1280", "1")
    assert values["recompute_modules"] == "layernorm moe_act"
    assert (values["grad_reduce_in_fp32"], values["cross_entropy_fusion_impl"]) == ("False", "te")
    # _with_global_batch_size(llama31_405b_pretrain_1024gpu_h100_bf16_config(), 768): the other recipe at 768
    scaled = bench._short(RECIPES["llama31_405b_pretrain_512gpu_h100_bf16_config"])
    full = bench._short(RECIPES["llama31_405b_pretrain_1024gpu_h100_bf16_config"])
    assert scaled["global_batch_size"] == "768" and full["global_batch_size"] == "1536"
    assert {k: v for k, v in scaled.items() if k not in ("global_batch_size", "env_vars")} == \
        {k: v for k, v in full.items() if k not in ("global_batch_size", "env_vars")}


def test_every_recipe_megatron_can_lay_out_fits_80_gb(estimated):
    refused = {name for name, r in estimated.items() if r.reason}
    # The 64-GPU DeepSeek-V3 recipes keep the 1024-GPU layout (EP 64 with PP 8): 8 GPUs a stage cannot hold an
    # expert group of 64, which Megatron-core refuses (parallel_state.py) and so does the tool, naming the rule.
    assert refused == {"deepseek_v3_pretrain_64gpu_h100_bf16_config", "deepseek_v3_pretrain_64gpu_h100_fp8cs_config"}
    assert all("must divide tp x dp x cp" in estimated[name].reason for name in refused)
    for name, r in estimated.items():
        if name not in refused:
            assert r.fits, f"{name}: {r.total_gib:.1f} of {r.capacity_gib:.1f} GiB ({' '.join(r.argv)})"
            assert r.total_gib > 0.3 * r.capacity_gib, name  # a ledger that counts the model at all


def test_nemotron4_340b_fits_with_the_16_bit_gradients_its_performance_recipe_reduces_in(estimated):
    r = estimated[bench.NEMOTRON4_340B[0]]
    assert r.fits
    argv = list(bench.NEMOTRON4_340B[1])
    at = argv.index("--grad-dtype")
    fp32 = bench.Recipe("fp32", argv=argv[:at] + argv[at + 2:])  # the tool's default: fp32 main gradients
    bench.estimate(fp32)
    assert not fp32.reason and not fp32.fits
    assert fp32.total_gib > r.total_gib + 5  # 2 more bytes a local parameter (5.3 B of them)


def test_the_bench_prints_each_recipe_and_the_count(capsys):
    assert bench.main() == 0
    out = capsys.readouterr().out
    assert "gpt_oss_120b_pretrain_64gpu_h100_bf16_config" in out and "(NeMo 2.0)" in out
    assert "31 of 31 estimated recipes fit (2 not estimated)" in out


@pytest.mark.parametrize("name", ["llama3_8b_pretrain_8gpu_h100_bf16_config", "llama3_70b_pretrain_64gpu_h100_bf16_config",
                                  "llama3_70b_pretrain_64gpu_h100_fp8cs_config",
                                  "llama31_405b_pretrain_1024gpu_h100_fp8cs_config", bench.NEMOTRON4_340B[0]])
def test_nvidias_dense_h100_plans_rank_in_the_planners_top_10(estimated, name):
    r = estimated[name]
    bench.rank(r, {})
    assert r.rank is not None and r.rank <= 10, (name, r.rank, r.first_plan)
    assert r.gain is not None and abs(r.gain) < 0.10, (name, r.gain)  # no large claimed gain over NVIDIA's own plan


def test_a_recipe_layout_with_the_tools_rank_loads_is_written_as_loss_slots(estimated):
    # Llama-3 70B FP8 (perf_recipes/llama/h100/llama3.py at 067f987): 'Et*2|(t*2|)*34,t*3|(t*2|)*3,tL' over pp 8 x vp 5
    # puts 10, 10, 10, 11, 10, 10, 10, 9 layers on the ranks, the loss beside the last rank's 9: --loss-slots 1 gives
    # the same loads (its extra layer on rank 1)
    r = estimated["llama3_70b_pretrain_64gpu_h100_fp8cs_config"]
    assert r.argv[r.argv.index("--loss-slots") + 1] == "1"
    assert not any(u.startswith("pipeline_model_parallel_layout") for u in r.unexpressed)
    assert bench.rank_loads_loss_slots("Et*2|(t*2|)*34,t*3|(t*2|)*3,tL", 80, 8, 5) == 1
    assert bench.rank_loads_loss_slots("Et*2|(t*2|)*38,t*2L", 80, 8, 5) is None  # 2 layers a stage, the last rank's too
    # Kimi-K2's 'Et|(tt|)*30L' is the tool's own split already: no --loss-slots
    assert "--loss-slots" not in estimated["kimi_k2_pretrain_1024gpu_h100_bf16_config"].argv
