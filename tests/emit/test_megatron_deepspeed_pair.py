"""`autotune validate` on a Megatron-DeepSpeed argument file with its DeepSpeed JSON checks the two together
(autotune.emit.megatron_deepspeed_pair): the micro-batch both state, ZeRO-3's build (``--zero-stage`` against the
JSON's stage) and, for MoE under the pipeline engine with tp > 1, DeepSpeed's pipeline partitioning. An emitted
bundle passes; each file alone passes too, so only the pair shows what stops the run."""

from __future__ import annotations

import json

import pytest

from autotune.api import make_plan
from autotune.bundle.writer import render_bundle
from autotune.cli import main
from autotune.cost.estimate import estimate
from autotune.specs.loading import load_cluster, load_model

ARGS = "megatron_deepspeed_args.sh"


def _bundle(tmp_path, model="mixtral-8x7b", **kw):
    m, cluster = load_model(model), load_cluster(gpu="h100-sxm-80gb", num_gpus=32)
    plan = make_plan(m, cluster, engine="megatron-deepspeed", global_batch_size=512, seq_len=4096,
                     **({"tp": 2, "pp": 4, "ep": 4, "zero_stage": 1, "sequence_parallel": True} | kw))
    files = render_bundle(estimate(m, cluster, plan)).files
    for name in (ARGS, "ds_config.json"):
        (tmp_path / name).write_text(files[name])
    return tmp_path / ARGS, tmp_path / "ds_config.json"


def _validate(capsys, *paths, flags=()) -> tuple[int, list[dict]]:
    code = main(["validate", *map(str, paths), "--world-size", "32", "--json", *flags])
    return code, json.loads(capsys.readouterr().out)


def test_an_emitted_pair_passes(tmp_path, capsys):
    assert _validate(capsys, *_bundle(tmp_path)) == (0, [])


@pytest.mark.parametrize("change, path, words", [
    # a consistent triple on its own (micro 2 x accumulation 64 x dp 4 = 512), not the arguments' micro-batch
    (lambda d: d.update(train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=64),
     "$.train_micro_batch_size_per_gpu",
     ["--micro-batch-size 1", "set_train_batch_size"]),
    (lambda d: d["pipeline"].pop("pipe_partitioned"), "$.pipeline.pipe_partitioned",
     ["MoE layers (8 experts)", "tp 2", "engine.py:736"]),
])
def test_what_only_the_pair_shows(tmp_path, capsys, change, path, words):
    args, ds = _bundle(tmp_path)
    data = json.loads(ds.read_text())
    change(data)
    ds.write_text(json.dumps(data, indent=2))
    assert _validate(capsys, ds, flags=("--tp", "2", "--pp", "4")) == (0, [])  # the JSON alone passes
    code, found = _validate(capsys, args, ds)
    assert code == 1 and [p["path"] for p in found] == [path], found
    assert all(w in found[0]["message"] for w in words) and found[0]["file"] == str(ds) and found[0]["line"]


def test_zero3_build_follows_the_zero_stage_flag(tmp_path, capsys):
    # ZeRO-3 with --no-pipeline-parallel (pp 1): the JSON at stage 3, the flag edited back to 1, then dropped (default 1)
    args, ds = _bundle(tmp_path, model="llama3-8b", tp=1, pp=1, ep=1, zero_stage=3, sequence_parallel=False)
    assert _validate(capsys, args, ds) == (0, [])
    text = args.read_text()
    assert "--zero-stage 3" in text
    for edited, said in ((text.replace("--zero-stage 3", "--zero-stage 1"), "--zero-stage 1"),
                         (text.replace("--zero-stage 3", ""), "no --zero-stage (default 1)")):
        args.write_text(edited)
        code, found = _validate(capsys, args, ds)
        assert code == 1 and [p["path"] for p in found] == ["$.zero_optimization.stage"], found
        assert said in found[0]["message"] and "deepspeed.zero.Init" in found[0]["message"]
