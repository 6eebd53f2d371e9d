"""`autotune estimate` names what a lighter last pipeline stage (--loss-slots K) would gain where the last stage, which
carries the output layer and loss, is the slowest (autotune.search.last_stage_hint)."""

import json

import pytest

from autotune.api import make_plan
from autotune.cli import main
from autotune.cost.estimate import estimate
from autotune.search.last_stage_hint import LOSS_SLOTS_TRIED, MIN_GAIN, last_stage_hint
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

QWEN = ["--model", "qwen3-235b-a22b", "--gpu", "gb200", "--num-gpus", "256", "--gpus-per-node", "64",
        "--engine", "megatron", "--zero", "1", "--seq-len", "4096", "--global-batch", "8192", "--micro-batch", "1",
        "--ep", "32", "--precision", "fp8", "--fp8-recipe", "te-mxfp8", "--recompute", "none", "--pp", "8",
        "--vpp", "3", "--ep-overlap", "a2a"]


def _json(capsys, *argv):
    assert main(["estimate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_hint_is_the_fastest_k_and_names_its_gain(capsys):
    plain = _json(capsys, *QWEN)
    stages = {s["stage"]: s["s_per_microbatch"] for s in plain["time"]["stage_times_s"]}
    assert max(stages, key=stages.get) == 7  # the output layer's stage is the slowest
    hint = plain["last_stage_hint"]
    speeds = {}
    for k in LOSS_SLOTS_TRIED:
        code = main(["estimate", *QWEN, "--loss-slots", str(k), "--json"])
        out = capsys.readouterr().out
        if code == 0:
            speeds[k] = json.loads(out)["time"]["tokens_per_s"]
    best = max(speeds, key=speeds.get)
    assert hint["loss_slots"] == best and hint["tokens_per_s"] == pytest.approx(speeds[best], rel=1e-12)
    assert hint["gain"] == pytest.approx(speeds[best] / plain["time"]["tokens_per_s"] - 1, rel=1e-12)
    assert hint["gain"] > MIN_GAIN
    with_k = _json(capsys, *QWEN, "--loss-slots", str(best))
    assert with_k["last_stage_hint"] is None  # a plan with loss slots set gets no hint
    assert main(["estimate", *QWEN]) == 0
    assert f"lighter last stage: this plan with --loss-slots {best}" in capsys.readouterr().out


def test_no_hint_without_a_pipeline_or_where_the_last_stage_is_not_the_slowest():
    model, cluster = load_model_preset("llama3-8b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    flat = estimate(model, cluster, make_plan(model, cluster, engine="megatron", seq_len=4096, global_batch_size=64))
    assert last_stage_hint(flat) is None
    deep = estimate(model, cluster, make_plan(model, cluster, engine="deepspeed", pp=2, zero_stage=1, seq_len=4096,
                                              global_batch_size=64))
    assert last_stage_hint(deep) is None  # an engine that cannot write the split


PLAN_8B = ["plan", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--seq-len", "8192",
           "--global-batch", "256", "--engine", "megatron", "--pp", "4"]


def test_plan_names_it_for_its_first_plan(capsys):
    assert main([*PLAN_8B, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    first, hint = doc["candidates"][0], doc["last_stage_hint"]
    assert first["plan"]["pp"] == 4 and hint["loss_slots"] in LOSS_SLOTS_TRIED and hint["gain"] > MIN_GAIN
    assert hint["tokens_per_s"] == pytest.approx(first["time"]["tokens_per_s"] * (1 + hint["gain"]), rel=1e-9)
    assert main(PLAN_8B) == 0
    assert f"lighter last stage: #1 with --loss-slots {hint['loss_slots']}" in capsys.readouterr().out
    assert main([*PLAN_8B, "--uneven-layouts", "--json"]) == 0  # the search tries the loss slots itself
    assert json.loads(capsys.readouterr().out)["last_stage_hint"] is None


def test_a_request_only_the_split_refuses_says_so(capsys):
    argv = ["plan", "--model", "qwen3-235b-a22b", "--gpu", "gb200", "--num-gpus", "256", "--gpus-per-node", "64",
            "--engine", "megatron", "--seq-len", "4096", "--global-batch", "8192", "--pp", "8", "--vpp", "3"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot fill" in err and "--uneven-layouts" in err and "does not fit on any number" not in err
