"""A plan that names no ZeRO stage gets its engine's: 1 (DeepSpeed ZeRO-1, Megatron's distributed optimizer), 3 for
FSDP2 (which has no stage 1: ``autotune emit --engine fsdp`` without --zero used to be refused for asking it)."""

from __future__ import annotations

import json

import pytest

from autotune.api import make_plan
from autotune.cli import main
from autotune.engines import ENGINES
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

MODEL, CLUSTER = load_model_preset("llama3-8b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=8)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_the_default_is_a_stage_the_engine_runs(engine):
    stage = ENGINES[engine].default_zero_stage
    assert stage in ENGINES[engine].support.zero_stages
    assert stage == (1 if 1 in ENGINES[engine].support.zero_stages else 3)


def test_make_plan_takes_the_engines_default():
    assert make_plan(MODEL, CLUSTER, engine="fsdp").zero_stage == 3
    assert make_plan(MODEL, CLUSTER, engine="deepspeed").zero_stage == 1
    assert make_plan(MODEL, CLUSTER, engine="fsdp", zero_stage=None).zero_stage == 3
    assert make_plan(MODEL, CLUSTER, engine="fsdp", zero_stage=2).zero_stage == 2


@pytest.mark.parametrize("engine, stage", [("fsdp", 3), ("megatron", 1), ("deepspeed", 1)])
def test_estimate_and_emit_without_zero(engine, stage, tmp_path, capsys):
    argv = ["--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--engine", engine]
    assert main(["estimate", *argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["zero_stage"] == stage
    assert main(["emit", *argv, "--allow-unfit", "--out", str(tmp_path / "job")]) == 0
    doc = json.loads((tmp_path / "job" / "plan.json").read_text())
    assert doc["plan"]["zero_stage"] == stage
