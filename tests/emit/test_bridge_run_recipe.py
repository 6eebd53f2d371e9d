"""A launch script running Megatron-Bridge's scripts/training/run_recipe.py, read by `autotune estimate --from` as
the recipe it loads and the overrides its arguments apply (autotune/emit/bridge_launch.py), checked against
megatron-bridge 0.6.2 applying those overrides to that recipe (``process_config_with_overrides``, what run_recipe.py's
``apply_cli_overrides`` calls, then ``runtime_config_update`` at the script's world size). Tooling, stand-ins and
hub: as test_megatron_bridge_applied.py."""

from __future__ import annotations

import json

import pytest
from bridge_probe import run_bridge_probe  # tests/emit/ is on sys.path

from autotune.cli import main
from autotune.emit.bridge_launch import recipe_command
from autotune.emit.validate_files import file_kind
from autotune.job_files import read_job

PROBE = r"""
import importlib, json, os, sys, types, typing
import typing_extensions
typing.override = typing_extensions.override  # megatron-core 0.19.2 megatron/training/models/gpt.py (Python 3.12)
import autotune_standins  # noqa: F401
import torch
from megatron.bridge.training.config import runtime_config_update
from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

torch.cuda.get_device_properties = lambda *_: types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0)
out = {}
for case, module, name, overrides, world in json.loads(sys.argv[1]):
    cfg = process_config_with_overrides(getattr(importlib.import_module(module), name)(), cli_overrides=overrides)
    os.environ.update(WORLD_SIZE=str(world), RANK="0", LOCAL_RANK="0")
    runtime_config_update(cfg)
    m, t = cfg.model, cfg.train
    out[case] = [m.tensor_model_parallel_size, m.pipeline_model_parallel_size,
                 m.virtual_pipeline_model_parallel_size or 1, m.context_parallel_size, m.expert_model_parallel_size,
                 bool(m.sequence_parallel), t.micro_batch_size, t.global_batch_size, cfg.dataset.seq_length,
                 bool(m.fp8), m.fp8_recipe if m.fp8 else None]
print("PROBE-RESULT " + json.dumps(out))
"""

LAUNCH = "torchrun --nnodes {nodes} --nproc-per-node 8 scripts/training/run_recipe.py {args}\n"
CASES = {  # case: (recipe module, recipe, run_recipe.py arguments, nodes)
    "70b-flags": ("megatron.bridge.recipes.llama.h100.llama3", "llama3_70b_pretrain_32gpu_h100_bf16_config",
                  "--recipe llama3_70b_pretrain_32gpu_h100_bf16_config -gb 256 --tensor_model_parallel_size 8 "
                  "model.context_parallel_size=1 mixed_precision=bf16_with_fp8_current_scaling_mixed", 8),
    "70b-recipe-alone": ("megatron.bridge.recipes.llama.h100.llama3", "llama3_70b_pretrain_32gpu_h100_bf16_config",
                         "--recipe llama3_70b_pretrain_32gpu_h100_bf16_config --mode pretrain", 4),
    "qwen3-moe": ("megatron.bridge.recipes.qwen.h100.qwen3_moe", "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config",
                  "--recipe qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config -mb 2 -ep 8 -sl 2048 "
                  "train.global_batch_size=512", 2),
}


def _read(tmp_path, case):
    _, _, args, nodes = CASES[case]
    script = tmp_path / f"{case}.sh"
    script.write_text("#!/bin/bash\n" + LAUNCH.format(nodes=nodes, args=args))
    assert file_kind(script) == "megatron-bridge"
    return read_job([str(script)], gpu="h100-sxm-80gb"), nodes * 8


def test_the_plan_read_is_the_config_megatron_bridge_builds(tmp_path):
    jobs = [[case, module, name, recipe_command(args.split()).overrides, nodes * 8]
            for case, (module, name, args, nodes) in CASES.items()]
    built = run_bridge_probe(tmp_path, PROBE, json.dumps(jobs))
    for case in CASES:
        job, world = _read(tmp_path, case)
        p = job.plan
        assert job.cluster.num_gpus == world  # the torchrun line's nodes x 8
        fp8 = {"te-current": "tensorwise", "te-delayed": "delayed"}.get(p.fp8_recipe) if p.precision == "fp8" else None
        assert [p.tp, p.pp, p.vpp, p.cp, p.ep, p.sequence_parallel, p.micro_batch_size, p.global_batch_size,
                p.seq_len, p.precision == "fp8", fp8] == built[case], case
    assert built["70b-flags"][:4] == [8, 4, 5, 1] and built["70b-recipe-alone"][:4] == [4, 4, 5, 2]


@pytest.mark.parametrize("args,refused", [
    ("-gb 256", "one of the arguments --model --recipe is required"),
    ("--recipe llama3_70b_pretrain_32gpu_h100_bf16_config --tp 8", "Unknown option: --tp"),
    ("--recipe llama3_70b_pretrain_32gpu_h100_bf16_config tp8", "Expected override in KEY=VALUE form"),
    ("--recipe llama3_70b_pretrain_32gpu_h100_bf16_config --mode lora", "is incompatible with recipe"),
    ("--recipe llama3_70b_pretrain_32gpu_h100_bf16_config -gb many", "invalid int value"),
])
def test_arguments_run_recipe_refuses_exit_2_with_its_words(tmp_path, capsys, args, refused):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n" + LAUNCH.format(nodes=1, args=args))
    assert main(["estimate", "--from", str(script), "--gpu", "h100-sxm-80gb"]) == 2
    err = capsys.readouterr().err
    assert "run_recipe.py refuses its arguments" in err and refused in err and "Traceback" not in err


def test_a_recipe_autotune_does_not_hold_reads_the_command_alone(tmp_path, capsys):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n" + LAUNCH.format(nodes=1, args="--model llama3_8b -tp 2 -gb 64 -sl 4096 "
                                                                    "--mode pretrain"))
    job = read_job([str(script)], gpu="h100-sxm-80gb", model="llama3-8b")
    assert (job.plan.tp, job.plan.global_batch_size, job.plan.seq_len, job.cluster.num_gpus) == (2, 64, 4096, 8)
    assert any("llama3_8b_pretrain_config is not one whose values autotune holds" in n for n in job.notes)


def test_validate_reads_the_launch_and_judges_the_batch_on_the_recipes_layout(tmp_path, capsys):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n" + LAUNCH.format(nodes=8, args=CASES["70b-recipe-alone"][2] + " -gb 101"))
    assert main(["validate", str(script)]) == 1  # the world size is the launch line's 64
    out = capsys.readouterr()
    # the recipe's tp 4 x pp 4 x cp 2 on 64 GPUs leave 2 data-parallel ranks, which 101 sequences do not divide
    assert "assuming 64" in out.err and "global batch 101 is not a multiple of micro batch 1 x data parallel 2" in out.out
    script.write_text("#!/bin/bash\n" + LAUNCH.format(nodes=8, args=CASES["70b-recipe-alone"][2] + " -gb 102"))
    assert main(["validate", str(script)]) == 0


def test_a_script_that_runs_another_program_is_no_bridge_file(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\ntorchrun --nproc-per-node 8 train.py --lr 1e-4\n")
    assert file_kind(script) != "megatron-bridge"


@pytest.mark.parametrize("overrides,said", [
    ("mixed_precision=bf16_mixed mixed_precision.fp8=hybrid", "mixed_precision.fp8 sets a field of mixed_precision"),
    ("model.tensor_model_parallel_size=[1", "its value '[1' does not read"),
    ("model=3", "model is set to 3: it is a ConfigContainer section"),
])
def test_overrides_that_do_not_make_a_config_exit_2_naming_the_override(tmp_path, capsys, overrides, said):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n" + LAUNCH.format(
        nodes=1, args=f"--recipe llama3_70b_pretrain_32gpu_h100_bf16_config {overrides}"))
    assert main(["estimate", "--from", str(script), "--gpu", "h100-sxm-80gb"]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
