"""A plan over the GPU only by the caching allocator's reserve (``MemoryEstimate.cache_bound``): what `estimate`
says about it, the way out `emit` names, and the allocator setting the emitted launch scripts then export.

The plan is NVIDIA's Megatron-FSDP Llama 3 70B recipe on 64 GB200 (FP8 current scaling, micro-batch 2, the first 40
layers' activations offloaded; bench/data/nvidia_recipes_blackwell.csv, containers 25.11-26.04), which ran without
expandable segments (Megatron-Bridge@c810129341a8 scripts/performance/perf_plugins.py:265-320 sets them for other
Llama 3 70B runs only)."""

import json

import pytest

from autotune.cli import main

NVIDIA_FSDP = ["--model", "llama3-70b", "--gpu", "gb200", "--num-gpus", "64", "--engine", "megatron", "--zero", "3",
               "--seq-len", "8192", "--global-batch", "256", "--micro-batch", "2", "--tp", "1", "--pp", "1",
               "--precision", "fp8", "--fp8-recipe", "te-current", "--recompute", "none",
               "--activation-offload-layers", "40", "--cuda-graph", "none"]


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def estimate_json(argv, capsys) -> dict:
    code, out, _ = run(["estimate", *argv, "--json"], capsys)
    assert code == 0
    return json.loads(out)["memory"]


def test_nvidias_fsdp_recipe_is_over_only_by_the_reserve(capsys):
    memory = estimate_json(NVIDIA_FSDP, capsys)
    assert not memory["fits"] and memory["fits_with_expandable_segments"]
    assert not memory["expandable_segments"]
    over = memory["total"] - memory["capacity"]
    reserve = memory["reserved"] - memory["allocated"]
    assert 0 < over < reserve  # the reserve alone takes it over

    code, out, _ = run(["estimate", *NVIDIA_FSDP], capsys)
    assert code == 0
    assert "fits: NO" in out and "caching allocator's reserve" in out and "--expandable-segments" in out

    expandable = estimate_json([*NVIDIA_FSDP, "--expandable-segments"], capsys)
    assert expandable["fits"] and expandable["expandable_segments"]
    assert expandable["total"] == pytest.approx(memory["total"] - reserve, abs=2)


def test_a_plan_over_by_more_than_the_reserve_is_not_cache_bound(capsys):
    i = NVIDIA_FSDP.index("--activation-offload-layers")
    argv = NVIDIA_FSDP[:i] + NVIDIA_FSDP[i + 2:]  # every layer's activations kept on the GPU
    memory = estimate_json(argv, capsys)
    assert not memory["fits"] and not memory["fits_with_expandable_segments"]
    assert memory["total"] - memory["capacity"] > memory["reserved"] - memory["allocated"]
    code, out, _ = run(["estimate", *argv], capsys)
    assert "fits: NO" in out and "caching allocator's reserve" not in out


def test_emit_names_expandable_segments_and_the_scripts_export_it(tmp_path, capsys):
    code, _, err = run(["emit", *NVIDIA_FSDP, "--out", str(tmp_path / "plain")], capsys)
    assert code == 2 and "--expandable-segments makes it fit" in err
    assert not (tmp_path / "plain").exists()

    out = tmp_path / "expandable"
    code, _, err = run(["emit", *NVIDIA_FSDP, "--expandable-segments", "--out", str(out)], capsys)
    assert code == 0, err
    for name in ("launch_torchrun.sh", "launch_slurm.sbatch", "megatron_args.sh"):
        assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in (out / name).read_text(), name
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in (out / ".deepspeed_env").read_text()
    assert json.loads((out / "plan.json").read_text())["memory"]["expandable_segments"] is True


def _emit(tmp_path, name, capsys, *flags) -> str:
    out = tmp_path / name
    code, _, err = run(["emit", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--seq-len",
                        "4096", *flags, "--out", str(out)], capsys)
    assert code == 0, err
    return (out / "launch_torchrun.sh").read_text()


EXPORT = "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


def test_each_engine_launches_with_its_own_launchers_allocator_setting(tmp_path, capsys):
    # torchtitan's run_train.sh sets expandable segments: the fsdp bundle does too, and its ledger leaves the reserve
    # out; DeepSpeed's launcher does not, nor does its bundle
    assert EXPORT in _emit(tmp_path, "fsdp", capsys, "--engine", "fsdp")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in _emit(tmp_path, "ds", capsys, "--engine", "deepspeed")
    # the user's word wins either way
    assert "PYTORCH_CUDA_ALLOC_CONF" not in _emit(tmp_path, "fsdp-off", capsys, "--engine", "fsdp",
                                                  "--no-expandable-segments")
    assert EXPORT in _emit(tmp_path, "ds-on", capsys, "--engine", "deepspeed", "--expandable-segments")

    fsdp = estimate_json(["--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--engine", "fsdp"],
                         capsys)
    off = estimate_json(["--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--engine", "fsdp",
                         "--no-expandable-segments"], capsys)
    assert fsdp["expandable_segments"] and not off["expandable_segments"]
    assert off["total"] - fsdp["total"] == pytest.approx(off["reserved"] - off["allocated"], abs=2)
    assert fsdp["reserved"] == off["reserved"]  # what max_memory_reserved shows is the same either way


def test_the_users_own_allocator_setting_wins(tmp_path, capsys):
    out = tmp_path / "own"
    code, _, err = run(["emit", *NVIDIA_FSDP, "--expandable-segments", "--out", str(out), "--nccl-env",
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:512"], capsys)
    assert code == 0, err
    text = (out / "launch_torchrun.sh").read_text()
    assert text.count("PYTORCH_CUDA_ALLOC_CONF") == 1 and "max_split_size_mb:512" in text


def test_every_megatron_fsdp_row_nvidia_ran_fits_or_is_over_only_by_the_reserve():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import accuracy_nvidia_recipes as bench

    cases = [bench.express(r) for r in bench.load_rows() if bench.count(r["fsdp"], 0) > 0]
    for c in cases:
        if not c.reason:
            bench.estimate_case(c)
    estimated = [c for c in cases if c.predicted is not None]
    assert len(estimated) >= 6
    cache = [c for c in estimated if c.result.memory.cache_bound]
    assert len(cache) >= 5  # the FP8 micro-batch-2 recipe with 40 layers offloaded, in each container
    for c in estimated:
        assert c.fits or c.result.memory.cache_bound, c.row["source"]
        assert bench._fit_word(c) == ("yes" if c.fits else "cache")
