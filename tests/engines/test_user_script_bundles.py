"""plan.md is enough to bring one's own script (issue 21): a DeepSpeed user script written from plan.md's
instructions alone (its own tiny model, argparse + deepspeed.add_config_arguments + deepspeed.initialize(args=...)),
emitted with a relative `--script`, trains when the emitted launch script is started from another folder; plan.md
says what each engine's files run (Megatron-LM's pretrain_gpt.py and where it comes from; the HF Trainer's CPU
flags; DeepSpeed's AutoTP policy rule and PipelineModule)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import run_launcher  # tests/ is on sys.path (no __init__)

from autotune.resources import data_path

# Written from plan.md's "Your own training script" section only: no autotune import, its own model class.
USER_SCRIPT = textwrap.dedent('''\
    import argparse

    import deepspeed
    import deepspeed.comm as dist
    import torch
    from torch import nn


    class PairLM(nn.Module):
        """Not autotune's model: an embedding, one MLP and an output layer."""

        def __init__(self, vocab=97, width=32):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
            self.head = nn.Linear(width, vocab)

        def forward(self, ids):
            h = self.embed(ids[:, :-1])
            logits = self.head(h + self.mlp(h)).float()
            return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))


    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    model = PairLM()
    engine, optimizer, _, scheduler = deepspeed.initialize(args=args, model=model,
                                                           model_parameters=model.parameters())
    rank = dist.get_rank()
    stream = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        ids = torch.randint(0, 97, (engine.train_micro_batch_size_per_gpu(), 17), generator=stream)
        loss = engine(ids)
        engine.backward(loss)
        engine.step()
        print(f"USER_STEP rank={rank} world={dist.get_world_size()} step={step} loss={loss.item():.4f}", flush=True)
    ''')


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model_yaml(tmp: Path) -> Path:
    doc = yaml.safe_load(data_path("presets", "models/tiny-llama.yaml").read_text())
    doc["num_layers"] = 2
    path = tmp / "model.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _emit(tmp: Path, cwd: Path, *flags: str) -> Path:
    out = tmp / "bundle"
    cmd = [sys.executable, "-m", "autotune", "emit", "--model", str(_model_yaml(tmp)), "--gpu", "cpu",
           "--num-gpus", "2", "--gpus-per-node", "2", "--seq-len", "64", "--recompute", "none", "--out", str(out),
           *flags]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _script_section(plan_md: str) -> str:
    start = plan_md.index("## Your own training script")
    return plan_md[start:]


@pytest.mark.slow
def test_user_deepspeed_script_from_plan_md_trains_from_another_folder(tmp_path):
    user, elsewhere = tmp_path / "user", tmp_path / "elsewhere"
    user.mkdir()
    elsewhere.mkdir()
    (user / "train.py").write_text(USER_SCRIPT)
    port = _free_port()
    bundle = _emit(tmp_path, user, "--engine", "deepspeed", "--zero", "1", "--micro-batch", "2",
                   "--global-batch", "4", "--script", "train.py", "--master-port", str(port))
    needs = _script_section((bundle / "plan.md").read_text())
    # What the script above does is what plan.md tells: the launcher's arguments and the calls that read them.
    for said in ("--deepspeed --deepspeed_config", "deepspeed.add_config_arguments(parser)",
                 "deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())",
                 "engine.backward(loss); engine.step()"):
        assert said in needs, said
    launch = (bundle / "launch_deepspeed.sh").read_text()
    assert str(user / "train.py") in launch  # stored absolute: the script is found from any folder
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_PORT=str(port))
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    proc = run_launcher(["bash", str(bundle / "launch_deepspeed.sh")], cwd=elsewhere, timeout=500, env=env)
    steps = re.findall(r"USER_STEP rank=(\d) world=(\d) step=(\d) loss=([0-9.]+)", proc.stdout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    assert sorted((r, s) for r, _, s, _ in steps) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")], proc.stdout
    assert all(w == "2" and 2.0 < float(loss) < 8.0 for _, w, _, loss in steps)  # ln(97) = 4.57 at the start


@pytest.mark.slow
def test_relative_script_is_stored_absolute(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    bundle = _emit(tmp_path, user, "--engine", "deepspeed", "--zero", "2", "--micro-batch", "2",
                   "--script", "sub/train.py")
    for name in ("launch_torchrun.sh", "launch_deepspeed.sh", "launch_slurm.sbatch"):
        text = (bundle / name).read_text()
        assert str(user / "sub" / "train.py") in text, name
        assert not re.search(r"^\s+sub/train\.py", text, re.M), name


@pytest.mark.slow
def test_plan_md_user_script_needs_match_the_launcher(tmp_path):
    bundle = _emit(tmp_path, tmp_path, "--engine", "deepspeed", "--zero", "1", "--micro-batch", "2")
    md = (bundle / "plan.md").read_text()
    assert "config='ds_config.json'" not in md and "deepspeed.initialize(config=" not in md
    launch = (bundle / "launch_torchrun.sh").read_text()
    assert "--deepspeed-config" in launch  # the built-in trainer's flag; a user script gets DeepSpeed's own


@pytest.mark.slow
def test_autotp_and_pipeline_needs_say_the_rules(tmp_path):
    md = (_emit(tmp_path, tmp_path, "--engine", "deepspeed", "--tp", "2", "--zero", "1", "--micro-batch", "2")
          / "plan.md").read_text()
    needs = _script_section(md)
    # deepspeed/module_inject/auto_tp.py: AutoTP.supported's regexes and tp_parser's row-parallel names.
    for said in ("Not able to determine model policy automatically", "Model", "Stack", "nn.ModuleList",
                 "o_proj", "out_proj", "down_proj", "gpt2"):
        assert said in needs, said
    pp = tmp_path / "pp"
    pp.mkdir()
    md = (_emit(pp, pp, "--engine", "deepspeed", "--pp", "2", "--zero", "1", "--global-batch", "4")
          / "plan.md").read_text()
    assert "deepspeed.pipe.PipelineModule" in _script_section(md)


def test_deepspeed_config_for_docstring_names_pipeline_module():
    from autotune.api import deepspeed_config_for

    assert "PipelineModule" in deepspeed_config_for.__doc__ and "AutoTP" in deepspeed_config_for.__doc__


@pytest.mark.parametrize("engine,project,url", [
    ("megatron", "Megatron-LM", "https://github.com/NVIDIA/Megatron-LM"),
    ("megatron-deepspeed", "Megatron-DeepSpeed", "https://github.com/deepspeedai/Megatron-DeepSpeed"),
])
@pytest.mark.slow
def test_megatron_plan_md_says_what_runs_and_where_it_comes_from(tmp_path, engine, project, url):
    md = (_emit(tmp_path, tmp_path, "--engine", engine, "--tp", "2") / "plan.md").read_text()
    assert "autotune's built-in trainer (`python -m" not in md
    section = md[md.index("## The training program"):]
    assert f"git clone {url}" in section and f"--script /path/to/{project}/pretrain_gpt.py" in section
    assert f"cd /path/to/{project}" in section  # where to start the scripts when emitted without --script


@pytest.mark.slow
def test_hf_plan_md_says_use_cpu_on_a_cpu_cluster(tmp_path):
    md = (_emit(tmp_path, tmp_path, "--engine", "hf", "--zero", "2", "--micro-batch", "2") / "plan.md").read_text()
    needs = _script_section(md)
    assert "use_cpu=True" in needs and "ddp_backend='gloo'" in needs
    assert "deepspeed='<bundle>/ds_config_hf.json'" in needs
