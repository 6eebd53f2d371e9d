"""`autotune estimate` answers for the same model as the library and the benches: no CLI default that differs
from the cost model's (the --fragmentation flag defaulted to 0.05 while the model's fitted value is 0.10)."""

from __future__ import annotations

import json

import pytest

from autotune.api import estimate, make_plan
from autotune.cli import main
from autotune.specs.loading import load_cluster, load_model


@pytest.mark.parametrize("engine,flags,kw", [
    ("megatron", ["--tp", "8", "--pp", "2", "--zero", "1"], dict(tp=8, pp=2, zero_stage=1)),
    ("deepspeed", ["--zero", "3"], dict(zero_stage=3)),
])
def test_cli_estimate_is_the_library_estimate(engine, flags, kw, capsys):
    argv = ["estimate", "--model", "llama3-70b", "--gpu", "h100-sxm-80gb", "--num-gpus", "64", "--seq-len", "8192",
            "--global-batch", "512", "--micro-batch", "1", "--recompute", "selective", "--engine", engine, *flags,
            "--json"]
    assert main(argv) == 0
    cli = json.loads(capsys.readouterr().out)
    model, cluster = load_model("llama3-70b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=64)
    plan = make_plan(model, cluster, seq_len=8192, global_batch_size=512, micro_batch_size=1, recompute="selective",
                     engine=engine, **kw)
    lib = estimate(model, cluster, plan).to_dict()
    assert cli["memory"]["total"] == pytest.approx(lib["memory"]["total"], rel=1e-12)
    assert cli["time"]["step_time_s"] == pytest.approx(lib["time"]["step_time_s"], rel=1e-12)
