"""`autotune emit --engine fsdp` for Qwen3, GPT-OSS and (v0.2.2) Llama 4: the torchtitan file names torchtitan's model and flavor,
carries the plan's expert parallelism, passes autotune's linter and `validate`, and loads with torchtitan's own
ConfigManager (v0.2.2 installed; 0.3.0 in the test tool's folder, slow); what a torchtitan release refuses for
these models (no pipelining in v0.2.2's Qwen3 / GPT-OSS TrainSpecs, GPT-OSS context parallelism, 0.3's experts
without TP) leaves the file out with the rule's message in plan.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import pytest
from test_torchtitan import TORCHTITAN  # the v0.2.2 loader's skip reason (None: it imports)
from test_torchtitan03 import PROBE, torchtitan03_path

from autotune.api import make_plan
from autotune.cli import main
from autotune.emit.torchtitan import TORCHTITAN_FLAVORS, torchtitan_toml
from autotune.emit.torchtitan_lint import torchtitan_config_problems
from autotune.emit.torchtitan_module import TORCHTITAN_03_RECIPES
from autotune.errors import InputError
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset

GPU = "h100-sxm-80gb"
# (id, preset, GPUs, emit flags): plans that fit an H100; the tp case has torchtitan 0.2's etp = tp
CASES_02 = [
    ("qwen3-8b", "qwen3-8b", 8, ["--zero", "3"]),
    ("qwen3-30b-a3b-ep8", "qwen3-30b-a3b", 16, ["--zero", "3", "--ep", "8"]),
    ("qwen3-30b-a3b-tp2-ep4", "qwen3-30b-a3b", 16, ["--zero", "3", "--ep", "4", "--tp", "2"]),
    ("qwen3-235b-a22b-ep32", "qwen3-235b-a22b", 256, ["--zero", "3", "--ep", "32", "--recompute", "full"]),
    ("gpt-oss-20b-ep8", "gpt-oss-20b", 8, ["--zero", "3", "--ep", "8"]),
    ("gpt-oss-120b-ep16", "gpt-oss-120b", 32, ["--zero", "3", "--ep", "16", "--recompute", "full"]),
    ("llama4-scout-ep8", "llama4-scout", 64, ["--zero", "3", "--ep", "8", "--recompute", "full"]),
    ("llama4-maverick-ep16", "llama4-maverick", 128, ["--zero", "3", "--ep", "16", "--recompute", "full"]),
]
CASES_03 = [
    ("qwen3-30b-a3b-ep8", "qwen3-30b-a3b", 16, ["--zero", "3", "--ep", "8"]),
    ("qwen3-30b-a3b-pp2", "qwen3-30b-a3b", 16, ["--zero", "3", "--ep", "8", "--pp", "2", "--global-batch", "32"]),
    ("qwen3-30b-a3b-fp8", "qwen3-30b-a3b", 16, ["--zero", "3", "--ep", "8", "--precision", "fp8",
                                                 "--fp8-recipe", "torchao-rowwise"]),
    ("gpt-oss-20b-ep8", "gpt-oss-20b", 8, ["--zero", "3", "--ep", "8"]),
    ("gpt-oss-120b-ep16", "gpt-oss-120b", 32, ["--zero", "3", "--ep", "16", "--recompute", "full"]),
    # the MoE mapped before these: its 0.3 module with ep > 1 now disables CUDA graphs too (trainer.py:179-210)
    ("deepseek-v3-ep8", "deepseek-v3", 256, ["--zero", "3", "--ep", "8", "--recompute", "full"]),
]
FILES = {"0.2": "torchtitan_job.toml", "0.3": "torchtitan_plan.py"}


def _emit(tmp_path, version: str, preset: str, num_gpus: int, flags: list[str]):
    """The bundle folder, its plan (plan.json) and plan.md's text."""
    out = tmp_path / f"bundle-{version}"
    assert main(["emit", "--model", preset, "--gpu", GPU, "--num-gpus", str(num_gpus), "--engine", "fsdp",
                 "--torchtitan-version", version, *flags, "--out", str(out)]) == 0
    plan = ParallelPlan(**json.loads((out / "plan.json").read_text())["plan"])
    return out, plan, (out / "plan.md").read_text()


@pytest.mark.parametrize("case", CASES_02, ids=lambda c: c[0])
def test_toml_names_the_flavor_carries_ep_and_is_clean(tmp_path, capsys, case):
    _, preset, num_gpus, flags = case
    out, plan, _ = _emit(tmp_path, "0.2", preset, num_gpus, flags)
    path = out / FILES["0.2"]
    data = tomllib.loads(path.read_text())
    assert (data["model"]["name"], data["model"]["flavor"]) == TORCHTITAN_FLAVORS[preset]
    p = data["parallelism"]
    assert p["expert_parallel_degree"] == plan.ep and p["pipeline_parallel_degree"] == 1
    if plan.ep > 1:  # the plan's experts: tp x ep (0.2.2's default etp 1 would lend the tp ranks to EP)
        assert p["expert_tensor_parallel_degree"] == plan.expert_tp == plan.tp
    else:
        assert "expert_tensor_parallel_degree" not in p
    assert torchtitan_config_problems(path, world_size=num_gpus) == []
    assert main(["validate", str(path), "--world-size", str(num_gpus)]) == 0, capsys.readouterr()


@pytest.mark.skipif(TORCHTITAN is not None, reason=TORCHTITAN or "")
@pytest.mark.parametrize("case", CASES_02, ids=lambda c: c[0])
def test_torchtitans_own_config_manager_loads_the_toml(tmp_path, case):
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    _, preset, num_gpus, flags = case
    out, plan, _ = _emit(tmp_path, "0.2", preset, num_gpus, flags)
    cfg = ConfigManager().parse_args(["--job.config_file", str(out / FILES["0.2"])])
    pa = cfg.parallelism
    dims = ParallelDims(dp_shard=pa.data_parallel_shard_degree, dp_replicate=pa.data_parallel_replicate_degree,
                        cp=pa.context_parallel_degree, tp=pa.tensor_parallel_degree, pp=pa.pipeline_parallel_degree,
                        ep=pa.expert_parallel_degree, etp=pa.expert_tensor_parallel_degree, world_size=num_gpus)
    assert (cfg.model.name, cfg.model.flavor) == TORCHTITAN_FLAVORS[preset]
    assert (dims.tp, dims.pp, dims.cp, dims.ep, dims.etp) == (plan.tp, 1, plan.cp, plan.ep, plan.expert_tp)
    # the expert mesh (parallel_dims.py:136-157): efsdp x ep x etp covers dp_shard x cp x tp
    assert dims.dp_shard * dims.cp * dims.tp % (dims.ep * dims.etp) == 0


@pytest.mark.parametrize("case", CASES_03, ids=lambda c: c[0])
def test_module_names_the_recipe_and_validates(tmp_path, capsys, case):
    _, preset, num_gpus, flags = case
    out, plan, _ = _emit(tmp_path, "0.3", preset, num_gpus, flags)
    text = (out / FILES["0.3"]).read_text()
    package, recipe_fn, flavor = TORCHTITAN_03_RECIPES[preset][:3]
    assert f"from torchtitan.models.{package}.config_registry import {recipe_fn}" in text
    assert f"model_registry({flavor!r}" in text and f"expert_parallel_degree={plan.ep}," in text
    compile(text, FILES["0.3"], "exec")
    assert main(["validate", str(out / FILES["0.3"]), "--world-size", str(num_gpus)]) == 0, capsys.readouterr()


@pytest.mark.slow
def test_torchtitan_03_config_manager_builds_the_modules(tmp_path):
    tools = torchtitan03_path()
    jobs, plans = [], {}
    for case, preset, num_gpus, flags in CASES_03:
        out, plan, _ = _emit(tmp_path / case, "0.3", preset, num_gpus, flags)
        jobs.append([str(out), num_gpus, []])
        plans[str(out)] = (preset, plan)
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps(jobs)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tools)}, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(run.stdout.strip().splitlines()[-1])
    for folder, (preset, plan) in plans.items():
        got = data[folder]
        assert got["flavor"] == TORCHTITAN_03_RECIPES[preset][2]
        assert got["dims"] == [1, plan.dp, plan.cp, plan.tp, plan.pp, plan.ep]
        assert got["layers"] == load_model_preset(preset).num_layers
        if plan.precision == "fp8":  # the block linears in float8; lm_head and the router gates not
            assert got["float8"] and not any("router" in f for f in got["float8"]), got["float8"]
            assert all(f.startswith("layers.*.attention") for f in got["float8"]), got["float8"]


@pytest.mark.parametrize("preset,flags", [
    ("qwen3-30b-a3b", ["--ep", "8"]), ("gpt-oss-20b", ["--ep", "8"]), ("qwen3-8b", [])])
def test_v022_refuses_pipelining_for_qwen3_and_gpt_oss(tmp_path, capsys, preset, flags):
    args = ["--zero", "3", "--pp", "2", "--global-batch", "32", *flags]
    name = TORCHTITAN_FLAVORS[preset][0]
    if "--ep" in flags:  # torchtitan alone runs the plan's expert parallelism: emit refuses it at 0.2 (fsdp:release)
        assert main(["emit", "--model", preset, "--gpu", GPU, "--num-gpus", "16", "--engine", "fsdp",
                     "--torchtitan-version", "0.2", *args, "--out", str(tmp_path / "refused")]) == 2
        md = capsys.readouterr().err
        assert not (tmp_path / "refused").exists()
        plan = make_plan(load_model_preset(preset), load_cluster(gpu=GPU, num_gpus=16), engine="fsdp", zero_stage=3,
                         pp=2, ep=8, global_batch_size=32, seq_len=4096)
    else:  # the built-in trainer runs it: the bundle is written, without the TOML
        out, plan, md = _emit(tmp_path, "0.2", preset, 16, args)
        assert plan.pp == 2 and not (out / FILES["0.2"]).exists()
        assert (f"torchtitan_job.toml is not written: pp 2: torchtitan 0.2.2's {name} TrainSpec has "
                "pipelining_fn=None") in md
    assert f"{name} TrainSpec has pipelining_fn=None" in md
    assert "does not support pipelining\\\": use --pp 1" in md.replace('"', '\\"')
    # 0.3 pipelines them (pipeline_llm): named as the fix only where autotune writes a 0.3 module for the preset
    assert ("--engine-version fsdp=0.3" in md) == (preset in TORCHTITAN_03_RECIPES)
    with pytest.raises(InputError, match="does not support pipelining"):
        torchtitan_toml(load_model_preset(preset), load_cluster(gpu=GPU, num_gpus=16), plan)
    if preset in TORCHTITAN_03_RECIPES:
        out, _, _ = _emit(tmp_path, "0.3", preset, 16, ["--zero", "3", "--pp", "2", "--global-batch", "32", *flags])
        assert "pipeline_parallel_degree=2," in (out / FILES["0.3"]).read_text()


@pytest.mark.parametrize("version,message", [
    ("0.2", "CP support for gpt-oss model is still in progress."),
    ("0.3", "Variable-length attention CP is not yet supported")])
def test_gpt_oss_context_parallelism_is_refused(tmp_path, capsys, version, message):
    # with ep: emit refuses the plan (torchtitan alone runs its EP); without: the bundle, without torchtitan's file
    assert main(["emit", "--model", "gpt-oss-20b", "--gpu", GPU, "--num-gpus", "16", "--engine", "fsdp",
                 "--torchtitan-version", version, "--zero", "3", "--ep", "8", "--cp", "2",
                 "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert message in err and "use --cp 1" in err
    out, plan, md = _emit(tmp_path, version, "gpt-oss-20b", 16, ["--zero", "3", "--cp", "2"])
    assert plan.cp == 2 and not (out / FILES[version]).exists()
    assert message in md and "use --cp 1" in md


def test_03_refuses_tp_with_ep_and_02_writes_etp(tmp_path, capsys):
    flags = ["--zero", "3", "--ep", "4", "--tp", "2"]
    assert main(["emit", "--model", "qwen3-30b-a3b", "--gpu", GPU, "--num-gpus", "16", "--engine", "fsdp",
                 "--torchtitan-version", "0.3", *flags, "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert "torchtitan 0.3 has no expert tensor parallelism" in err and "--engine-version fsdp=0.2" in err
    out, _, _ = _emit(tmp_path, "0.2", "qwen3-30b-a3b", 16, flags)
    assert tomllib.loads((out / FILES["0.2"]).read_text())["parallelism"]["expert_tensor_parallel_degree"] == 2


def test_v022_gpt_oss_is_refused_where_its_parallelize_ignores_the_plan():
    m, cluster = load_model_preset("gpt-oss-20b"), load_cluster(gpu=GPU, num_gpus=8)
    for kw, message in ((dict(precision="fp8"), "never compiles the model"),
                        (dict(torch_compile=True), "never compiles the model"),
                        (dict(tp=2, tp_overlap="async-tp", sequence_parallel=True), "enable_async_tp=False")):
        plan = make_plan(m, cluster, engine="fsdp", zero_stage=3, global_batch_size=8, seq_len=4096, **kw)
        with pytest.raises(InputError, match=message):
            torchtitan_toml(m, cluster, plan)


def test_v022_expert_mesh_must_divide_dp_shard():
    # HSDP 2 x 8 with ep 16: torchtitan 0.2.2 lends EP only dp_shard x cp x tp = 8 ranks
    m, cluster = load_model_preset("qwen3-30b-a3b"), load_cluster(gpu=GPU, num_gpus=16)
    # the planner's rule (fsdp:ep_mesh) refuses the plan with the writer's own message...
    with pytest.raises(InputError, match="efsdp x ep x etp"):
        make_plan(m, cluster, engine="fsdp", zero_stage=3, dp_replicate=2, ep=16, global_batch_size=16, seq_len=4096)
    # ...and the writer refuses it too, given it anyway
    from autotune.specs.plan import ParallelPlan

    plan = ParallelPlan(engine="fsdp", zero_stage=3, dp=16, dp_replicate=2, ep=16, global_batch_size=16,
                        grad_accum_steps=1, seq_len=4096)
    with pytest.raises(InputError, match="efsdp x ep x etp"):
        torchtitan_toml(m, cluster, plan)


@pytest.mark.parametrize("version,preset,num_gpus,flags", [
    ("0.2", "qwen3-30b-a3b", 16, ["--zero", "3", "--ep", "4", "--tp", "2"]),
    ("0.3", "gpt-oss-20b", 8, ["--zero", "3", "--ep", "8"])])
def test_the_files_read_back_to_their_plan(tmp_path, version, preset, num_gpus, flags):
    from autotune.job_files import read_job  # what estimate --from / validate read

    out, plan, _ = _emit(tmp_path, version, preset, num_gpus, flags)
    job = read_job([str(out / FILES[version])], gpu=GPU)
    assert job.model.name == preset and job.plan == plan
