"""Megatron-DeepSpeed bundles: the uneven PipelineModule split and Ulysses emit, and autotune validate takes them."""

import subprocess
import sys

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import write_bundle
from autotune.specs.loading import load_cluster, load_model


pytestmark = pytest.mark.slow  # runs `autotune validate` in a subprocess


@pytest.mark.parametrize("preset,num_gpus,plan_kw,flag", [
    # 36 layers on 8 stages: partition_uniform gives 4 stages of 5 and 4 of 4 (no Megatron-LM-style equal ends).
    ("megatron-gpt-7.5b", 64, dict(tp=2, pp=8, recompute="full", global_batch_size=512, seq_len=2048),
     ["--pipeline-model-parallel-size", "8"]),
    # cp on this engine is DeepSpeed-Ulysses: --ds-sequence-parallel-size.
    ("llama3-8b", 16, dict(tp=2, cp=2, global_batch_size=64, seq_len=4096), ["--ds-sequence-parallel-size", "2"]),
])
def test_bundle_emits_and_validates(preset, num_gpus, plan_kw, flag, tmp_path):
    model, cluster = load_model(preset), load_cluster(gpu="a100-80gb", num_gpus=num_gpus)
    plan = make_plan(model, cluster, zero_stage=1, engine="megatron-deepspeed", **plan_kw)
    write_bundle(estimate(model, cluster, plan), tmp_path / "job")
    args = (tmp_path / "job" / "megatron_deepspeed_args.sh").read_text()
    assert " ".join(flag) in args
    world = ["--world-size", str(num_gpus), "--tp", str(plan.tp), "--pp", str(plan.pp), "--cp", str(plan.cp)]
    proc = subprocess.run([sys.executable, "-m", "autotune", "validate", str(tmp_path / "job" / "megatron_deepspeed_args.sh"),
                           str(tmp_path / "job" / "ds_config.json"), *world], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
