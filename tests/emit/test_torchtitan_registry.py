"""`--from config_registry.py:NAME`: one config of a torchtitan 0.3 module of several (torchtitan's own
models/<family>/config_registry.py, which `--module <family> --config NAME` picks from), read without running it
(autotune/emit/torchtitan_module_read.py). Before, such a file read as every function's values merged (Llama 3's
registry estimated as "tp8 ... mb8 ... seq 2048 ... fp8", no config of it) and validated clean; now a file of several
configs without NAME exits 2 naming them, and NAME reads that config (the configs it starts from first), checked
against what torchtitan 0.3.0's own ConfigManager builds from the same recipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_torchtitan03 import torchtitan03_path  # tests/emit is on sys.path (no __init__), as tests/

from autotune.cli import main
from autotune.cost import run_settings
from autotune.engines import engine_for
from autotune.job_files import read_job

GPU = "h100-sxm-80gb"

# A registry shaped as torchtitan 0.3.0's (models/llama3/config_registry.py): recipes built whole, one that starts
# from another and sets fields, one that replaces a section.
REGISTRY = '''
from torchtitan.config import ActivationCheckpointConfig, CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.trainer import Trainer
from torchtitan.models.llama3 import model_registry


def llama3_debugmodel() -> Trainer.Config:
    return Trainer.Config(model_spec=model_registry("debugmodel"),
                          training=TrainingConfig(local_batch_size=8, seq_len=2048),
                          parallelism=ParallelismConfig(tensor_parallel_degree=2))


def llama3_70b() -> Trainer.Config:
    model_spec = model_registry("70B")
    return Trainer.Config(model_spec=model_spec, training=TrainingConfig(local_batch_size=8, seq_len=8192),
                          parallelism=ParallelismConfig(tensor_parallel_degree=8, data_parallel_shard_degree=8),
                          activation_checkpoint=FullAC.Config())


def llama3_70b_short() -> Trainer.Config:
    config = llama3_70b()
    config.training.seq_len = 4096
    config.parallelism = ParallelismConfig(tensor_parallel_degree=4)
    return config
'''


@pytest.fixture
def registry(tmp_path):
    path = tmp_path / "models" / "llama3" / "config_registry.py"
    path.parent.mkdir(parents=True)
    path.write_text(REGISTRY)
    return path


def test_a_registry_without_a_name_is_refused_naming_its_configs(registry, capsys):
    for argv in (["estimate", "--from", str(registry), "--gpu", GPU, "--num-gpus", "64"],
                 ["validate", str(registry), "--world-size", "64"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "holds 3 torchtitan configs (llama3_debugmodel, llama3_70b, llama3_70b_short)" in err, err
        assert f"{registry}:NAME (torchtitan's --config NAME), e.g. {registry}:llama3_70b" in err


def test_a_named_config_reads_alone(registry):
    job = read_job([f"{registry}:llama3_70b"], gpu=GPU)  # 8 x 8 = 64 GPUs, its own degrees
    p = job.plan
    assert job.model.name == "llama3-70b" and job.cluster.num_gpus == 64
    assert (p.tp, p.dp, p.micro_batch_size, p.seq_len, p.recompute) == (8, 8, 8, 8192, "full")


def test_a_config_that_starts_from_another_reads_its_changes_over_it(registry):
    job = read_job([f"{registry}:llama3_70b_short"], gpu=GPU, num_gpus=64)
    p = job.plan  # the base's model, batch and recompute; its own sequence; its parallelism replaced whole
    assert job.model.name == "llama3-70b"
    assert (p.tp, p.dp, p.micro_batch_size, p.seq_len, p.recompute) == (4, 16, 8, 4096, "full")


def test_an_unknown_name_is_refused_and_validate_takes_a_name(registry, capsys):
    assert main(["estimate", "--from", f"{registry}:llama3_8b", "--gpu", GPU, "--num-gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert "has no torchtitan config 'llama3_8b': its configs are llama3_debugmodel, llama3_70b" in err, err
    assert main(["validate", f"{registry}:llama3_70b", "--world-size", "32"]) == 1  # 8 x 8 is 64
    assert "the degrees multiply to 64 GPUs, the job has 32" in capsys.readouterr().out


PROBE = """
import json, sys
import torchtitan.components.quantization.float8 as f8, torchtitan.components.quantization.mx as mx
from torchtitan.config import ConfigManager
f8.has_cuda_capability = lambda major, minor: True
mx.has_cuda_capability = lambda major, minor: True
out = {}
for module, config in json.loads(sys.argv[1]):
    cfg = ConfigManager().parse_args(["--module", module, "--config", config])
    p, t, c = cfg.parallelism, cfg.training, cfg.compile
    out[config] = [p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree,
                   p.expert_parallel_degree, t.local_batch_size, t.seq_len,
                   type(cfg.activation_checkpoint).__qualname__ if cfg.activation_checkpoint else None,
                   c.enable and "model" in c.components]
print(json.dumps(out))
"""
RECIPES = [("llama3", "llama3_8b", "llama3-8b"), ("llama3", "llama3_70b", "llama3-70b"),
           ("llama3", "llama3_405b", "llama3-405b"), ("qwen3", "qwen3_30b_a3b", "qwen3-30b-a3b"),
           ("gpt_oss", "gpt_oss_120b", "gpt-oss-120b"), ("deepseek_v3", "deepseek_v3_671b", "deepseek-v3")]
AC = {"FullAC.Config": "full", "SelectiveAC.Config": "selective", None: "none"}


@pytest.mark.slow
def test_torchtitans_own_recipes_read_as_its_config_manager_builds_them():
    tools = torchtitan03_path()
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps([[m, c] for m, c, _ in RECIPES])],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(tools)})
    assert run.returncode == 0, run.stderr[-3000:]
    built = json.loads(run.stdout.strip().splitlines()[-1])
    for module, config, preset in RECIPES:
        job = read_job([f"{tools}/torchtitan/models/{module}/config_registry.py:{config}"], gpu=GPU, num_gpus=64)
        p = job.plan
        tp, pp, cp, ep, local, seq, ac, compiled = built[config]
        assert job.model.name == preset, config
        assert (p.tp, p.pp, p.cp, p.ep, p.micro_batch_size, p.seq_len, p.recompute) == (
            tp, pp, cp, ep, local, seq, AC[ac]), config
        assert run_settings.compiled(p, None, engine_for(p)) == compiled, config  # unset: as the engine does
