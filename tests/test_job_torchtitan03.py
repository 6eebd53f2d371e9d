"""`estimate --from torchtitan_plan.py`: a torchtitan 0.3 config module read without running it
(autotune/emit/torchtitan_module_read.py): the modules autotune emits read back to the plan they were written for,
with the same estimate; `validate` checks the module's degrees against the job; what it cannot read it says."""

from __future__ import annotations

import json

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.cli import main
from autotune.cost.step_time import TimeSettings
from autotune.emit.options import EmitOptions
from autotune.engines import engine_for
from autotune.job_files import read_job
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset
from autotune.specs.settings import MemorySettings

GPU = "h100-sxm-80gb"
MODEL, CLUSTER = load_model_preset("llama3-8b"), load_cluster(gpu=GPU, num_gpus=16)
CASES = {
    "tp2-pp2-vpp2-fp8-rowwise": dict(tp=2, pp=2, vpp=2, sequence_parallel=True, zero_stage=3, precision="fp8",
                                     fp8_recipe="torchao-rowwise", recompute="selective"),
    "tp2-full": dict(tp=2, sequence_parallel=True, zero_stage=3, recompute="full"),
    "zero2-compiled": dict(zero_stage=2, torch_compile=True, recompute="none"),
    "hsdp": dict(zero_stage=3, dp_replicate=2, recompute="selective"),
}


# What torchtitan 0.3's code does that the plan does not say (its SelectiveAC save set): the estimate of its module.
RELEASE = engine_for("fsdp").release_cost_settings("0.3")


def _module(tmp_path, case: str):
    plan = make_plan(MODEL, CLUSTER, global_batch_size=64, seq_len=4096, engine="fsdp", **CASES[case])
    est = estimate(MODEL, CLUSTER, plan, MemorySettings(**RELEASE), TimeSettings(**RELEASE))
    path = tmp_path / "torchtitan_plan.py"
    path.write_text(render_bundle(est, EmitOptions(torchtitan_version="0.3")).files[path.name])
    return est, path


@pytest.mark.parametrize("case", sorted(CASES))
def test_emitted_module_reads_back_to_the_same_plan_and_estimate(tmp_path, case):
    est, path = _module(tmp_path, case)
    job = read_job([str(path)], gpu=GPU)
    assert job.plan == est.plan and job.cluster.num_gpus == 16 and job.model == MODEL
    assert job.settings.selective_policy == RELEASE["selective_policy"]  # read as that release's module
    again = estimate(job.model, job.cluster, job.plan, job.settings, TimeSettings(**RELEASE))
    assert again.time.step_time_s == pytest.approx(est.time.step_time_s, rel=1e-9)
    assert again.memory.total == pytest.approx(est.memory.total, rel=1e-9)


def test_cli_estimate_and_validate_read_the_module(tmp_path, capsys):
    est, path = _module(tmp_path, "tp2-full")
    assert main(["estimate", "--from", str(path), "--gpu", GPU, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["time"]["step_time_s"] == pytest.approx(est.time.step_time_s, rel=1e-9)
    assert main(["validate", str(path), "--world-size", "16"]) == 0
    capsys.readouterr()
    assert main(["validate", str(path), "--world-size", "32"]) == 1  # the degrees make 16
    assert "multiply to 16 GPUs" in capsys.readouterr().out


def test_values_that_are_not_literals_are_named(tmp_path):
    _, path = _module(tmp_path, "tp2-full")
    path.write_text("TP = 2\n" + path.read_text().replace("tensor_parallel_degree=2", "tensor_parallel_degree=TP"))
    job = read_job([str(path)], gpu=GPU)
    assert any("tensor_parallel_degree" in n and "not literal" in n for n in job.notes)


def test_a_file_that_is_not_python_is_exit_2(tmp_path, capsys):
    path = tmp_path / "torchtitan_plan.py"
    path.write_text("def plan(:\n")
    code = main(["estimate", "--from", str(path), "--gpu", GPU, "--num-gpus", "8"])
    err = capsys.readouterr().err
    assert code == 2 and "not a Python module" in err and "Traceback" not in err


def test_a_moe_module_with_tp_and_ep_is_exit_2_naming_the_fix(tmp_path, capsys):
    # torchtitan 0.3 runs experts without TP when ep > 1 (EP borrows the tp ranks); the FSDP engine models experts
    # split tp x ep, so a hand-edited module with both is refused, not estimated as another program
    model, cluster = load_model_preset("qwen3-30b-a3b"), load_cluster(gpu=GPU, num_gpus=16)
    plan = make_plan(model, cluster, global_batch_size=64, seq_len=4096, engine="fsdp", ep=4, zero_stage=3,
                     recompute="full")
    path = tmp_path / "torchtitan_plan.py"
    text = render_bundle(estimate(model, cluster, plan), EmitOptions(torchtitan_version="0.3")).files[path.name]
    path.write_text(text)
    assert main(["estimate", "--from", str(path), "--gpu", GPU]) == 0  # tp 1: read as written
    capsys.readouterr()
    path.write_text(text.replace("data_parallel_shard_degree=16", "data_parallel_shard_degree=8")
                    .replace("tensor_parallel_degree=1", "tensor_parallel_degree=2"))
    assert main(["estimate", "--from", str(path), "--gpu", GPU]) == 2
    err = capsys.readouterr().err
    assert "tp 2 with ep 4" in err and "moe_sharding.py" in err and "tensor_parallel_degree = 1" in err
    assert "Traceback" not in err
