"""The estimate names the run settings it assumed, and assumes what the emitted files run.

- torchtitan files turn ``compile`` on with Float8 (``emit.torchtitan.torchtitan_compiles``); the FSDP engine's
  step time then fuses the memory-bound kernels, as ``TimeSettings(torch_compile=True)`` does, and says so; bf16
  plans run eager both in the files and in the estimate;
- `estimate` prints one "assumed run settings" line (and ``assumed_settings`` in --json): gradient dtype, FP8
  recipe, TP overlap, attention kernel, elementwise kernels, data-parallel overlap, pipeline schedule, CP kind,
  each as the engine's defaults or the plan's own setting.
"""

from __future__ import annotations

import json

import pytest

from autotune.api import make_plan
from autotune.cli import main
from autotune.cost.step_time import TimeSettings, estimate_step_time
from autotune.emit.torchtitan import torchtitan_job_config
from autotune.engines import engine_for
from autotune.report import assumed_settings
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

M = load_model_preset("llama3-8b")
C = load_cluster(gpu="h100-sxm-80gb", num_gpus=16)


def _fsdp(precision):
    return make_plan(M, C, engine="fsdp", tp=2, zero_stage=3, global_batch_size=64, seq_len=4096,
                     precision=precision, recompute="full")


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_fsdp_estimate_compiles_exactly_when_the_torchtitan_files_do(precision):
    plan = _fsdp(precision)
    files_compile = torchtitan_job_config(M, C, plan)["compile"]["enable"]
    assert files_compile == engine_for(plan).compiles(plan) == (precision == "fp8")
    default = estimate_step_time(M, C, plan)
    compiled = estimate_step_time(M, C, plan, TimeSettings(torch_compile=True))
    if files_compile:
        assert default.step_time_s == compiled.step_time_s
    else:
        assert default.step_time_s > compiled.step_time_s  # eager kernels move more bytes
    line = "; ".join(assumed_settings(plan, TimeSettings()))
    assert ("fused by torch.compile" in line) == files_compile and ("eager" in line) != files_compile


def test_megatron_names_its_defaults_and_the_plans_own_settings():
    plan = make_plan(load_model_preset("llama3-70b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=64),
                     engine="megatron", tp=4, pp=4, vpp=5, zero_stage=1, global_batch_size=256, seq_len=8192,
                     precision="fp8")
    said = assumed_settings(plan, TimeSettings())
    assert said[0] == "gradients reduced in fp32"
    assert "FP8 recipe te-delayed" in said and "pipeline schedule interleaved 1F1B" in said
    assert any(s.startswith("TP communication overlap: none") for s in said)
    assert any("updated weights gathered behind the next forward" in s for s in said)
    assert assumed_settings(plan.with_(grad_dtype="bf16"), TimeSettings())[0] == \
        "gradients reduced in 16 bits (--grad-dtype bf16)"
    assert "FP8 recipe te-current" in assumed_settings(plan, TimeSettings(fp8_recipe="te-current"))


def test_estimate_prints_and_returns_them(capsys):
    argv = ["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--tp", "2",
            "--zero", "3", "--global-batch", "64", "--engine", "fsdp", "--precision", "fp8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "assumed run settings (fsdp): gradients reduced in fp32; FP8 recipe torchao-tensorwise" in out
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["assumed_settings"]
    assert "elementwise kernels fused by torch.compile" in got
