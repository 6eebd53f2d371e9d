"""`--from CHECKPOINT_FOLDER` on checkpoints the engines themselves wrote (autotune.job_checkpoint):

* Megatron-LM: megatron-core 0.19.2's own ``parse_args`` and ``validate_args`` (megatron/training/arguments.py) on
  the arguments of examples/jobs/megatron_args_llama3_70b.sh, saved by its own ``dist_checkpointing.save`` in the
  torch_dist format a 0.19 run writes (the common state inside the torch.distributed.checkpoint files), with the
  tracker file ``save_checkpoint`` writes beside it. CPU stand-ins: the GPU generation validate_args asks for, and
  the device synchronise / current device the save calls (it saves host tensors over gloo). autotune must read the
  same job from the checkpoint as from the argument file: the same plan and the same estimate; and `validate` the
  folder clean (what validate_args derived included).
* DeepSpeed 0.19.8: two ranks train one step with the ds_config.json autotune writes and ``save_checkpoint``, a
  Hugging Face model config saved beside it by transformers' ``save_pretrained`` as a Trainer checkpoint keeps it.
  autotune must read DeepSpeed's config, the world size and the model from the folder alone.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_launcher

from autotune.api import deepspeed_config_for

ROOT = Path(__file__).resolve().parents[1]
ARGS_FILE = ROOT / "examples" / "jobs" / "megatron_args_llama3_70b.sh"

MEGATRON_SAVE = r'''
import json, os, sys, types, importlib.abc, importlib.machinery
from unittest import mock
import torch, torch._dynamo, torch._inductor.compile_fx

class Inert(importlib.abc.MetaPathFinder, importlib.abc.Loader):  # triton: absent without a GPU
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name.split(".")[0] == "triton" else None
    def create_module(self, spec):
        m = mock.MagicMock(name=spec.name); m.__path__, m.__spec__, m.__version__ = [], spec, "3.4.0"; return m
    def exec_module(self, module): pass

def main():
    sys.meta_path.insert(0, Inert())
    import typing, typing_extensions
    typing.override = getattr(typing, "override", typing_extensions.override)  # Python 3.12's, which megatron uses
    argv, out, port, world = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], sys.argv[4]
    os.environ.update(WORLD_SIZE=world, RANK="0", LOCAL_RANK="0")
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # CPU stand-ins (module docstring)
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(major=9, minor=0, name="H100")
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    saved, sys.argv = sys.argv, ["pretrain_gpt.py", *argv]
    from megatron.training.arguments import parse_args, validate_args
    args = parse_args()
    validate_args(args)
    sys.argv = saved
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor
    folder = os.path.join(out, "iter_0000100")
    os.makedirs(folder)
    state = {"args": args, "checkpoint_version": 3.0, "iteration": 100,  # generate_state_dict's keys, :1310-1314
             "model": {"w": ShardedTensor.from_rank_offsets("w", torch.zeros(4), replica_id=0)}}
    dist_checkpointing.save(state, folder)
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("100")  # what save_checkpoint writes after a save (checkpointing.py:1012)
    print("SAVED", sorted(os.listdir(folder)), flush=True)

if __name__ == "__main__":  # the save starts worker processes that import this file again
    main()
'''


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", *argv], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, check=False)


def _estimate_json(*source: str) -> dict:
    run = _cli("estimate", "--from", *source, "--gpu", "h100-sxm-80gb", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.mark.slow
def test_a_checkpoint_megatron_core_saved_reads_as_the_argument_file_it_ran(tmp_path, free_port):
    sys.path.insert(0, str(ROOT / "tests" / "emit"))
    from bridge_tooling import bridge_path  # megatron-core 0.19.2 in the test tooling

    from autotune.emit.shell_args import read_megatron_args_file

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "megatron").symlink_to(bridge_path() / "megatron")
    (tmp_path / "argv.json").write_text(json.dumps(read_megatron_args_file(ARGS_FILE)))
    (tmp_path / "save.py").write_text(MEGATRON_SAVE)
    save = tmp_path / "checkpoints"
    run = subprocess.run([sys.executable, str(tmp_path / "save.py"), str(tmp_path / "argv.json"), str(save),
                          str(free_port), "64"], capture_output=True, text=True, timeout=600, cwd=tree,
                         env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
                              "CUDA_DEVICE_MAX_CONNECTIONS": "1"}, check=False)  # as the launch line sets it
    assert run.returncode == 0 and "SAVED" in run.stdout, (run.stdout + run.stderr)[-3000:]
    files = set(os.listdir(save / "iter_0000100"))
    assert {".metadata", "metadata.json"} <= files and "common.pt" not in files  # 0.19's torch_dist, no common.pt

    from_checkpoint, from_args = _estimate_json(str(save)), _estimate_json(str(ARGS_FILE))
    assert from_checkpoint["plan"] == from_args["plan"]
    assert from_checkpoint["plan"]["tp"] == 8 and from_checkpoint["plan"]["pp"] == 4
    assert from_checkpoint["plan"]["vpp"] == 4 and from_checkpoint["plan"]["dp"] == 2  # 64 GPUs: args.world_size
    assert from_checkpoint["time"]["tokens_per_s"] == from_args["time"]["tokens_per_s"]
    assert from_checkpoint["memory"]["total"] == from_args["memory"]["total"]
    # `validate FOLDER`: the arguments megatron-core parsed and validated, read back, pass the linter and its rules
    checked = _cli("validate", str(save))
    assert checked.returncode == 0 and "no problems for world size 64" in checked.stdout, checked.stdout + checked.stderr
    assert "the arguments saved in" in checked.stderr and "UserWarning" not in checked.stderr


DEEPSPEED_SAVE = r'''
import json, sys, torch, deepspeed
deepspeed.init_distributed(dist_backend="gloo")
config = json.load(open(sys.argv[1]))
config["optimizer"]["params"]["torch_adam"] = True  # no CPU Adam JIT build for one step
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=config)
for _ in range(engine.gradient_accumulation_steps()):
    loss = engine(torch.randn(config["train_micro_batch_size_per_gpu"], 8).to(torch.bfloat16)).float().sum()
    engine.backward(loss)
    engine.step()
engine.save_checkpoint(sys.argv[2], tag="global_step1")
print("SAVED", flush=True)
'''


@pytest.mark.slow
def test_a_checkpoint_deepspeed_saved_reads_with_its_config_world_size_and_model(tmp_path, free_port):
    transformers = pytest.importorskip("transformers")
    config = deepspeed_config_for("phi3-mini", "h100-sxm-80gb", 2, seq_len=4096, global_batch=8, zero_stage=2,
                                  micro_batch_size=2)
    assert config["zero_optimization"]["stage"] == 2 and config["gradient_accumulation_steps"] == 2
    (tmp_path / "ds_config.json").write_text(json.dumps(config))
    (tmp_path / "save.py").write_text(DEEPSPEED_SAVE)
    folder = tmp_path / "checkpoint-1"  # a Trainer checkpoint: the model's config.json beside DeepSpeed's folders
    run = run_launcher([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                        str(free_port), str(tmp_path / "save.py"), str(tmp_path / "ds_config.json"), str(folder)],
                       timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0 and "SAVED" in run.stdout, (run.stdout + run.stderr)[-3000:]
    assert (folder / "latest").read_text().strip() == "global_step1"
    transformers.Phi3Config().save_pretrained(folder)  # its defaults: Phi-3-mini's shape

    got = _estimate_json(str(folder))
    assert got["plan"]["zero_stage"] == 2 and got["plan"]["micro_batch_size"] == 2
    assert got["plan"]["dp"] == 2 and got["plan"]["global_batch_size"] == 8  # dp_world_size x mp_world_size
    assert got["model"]["spec"]["num_layers"] == 32 and got["model"]["spec"]["hidden_size"] == 3072
    same = _estimate_json(str(tmp_path / "ds_config.json"), "--model", str(folder / "config.json"), "--num-gpus", "2")
    assert got["plan"] == same["plan"] and got["time"]["tokens_per_s"] == same["time"]["tokens_per_s"]
    # `validate FOLDER`: the config DeepSpeed saved, for the world size it saved (2), checks clean as the file did
    from autotune.cli import main

    assert main(["validate", str(folder)]) == 0 and main(["validate", str(tmp_path / "ds_config.json"),
                                                           "--world-size", "2"]) == 0


TRAINER_SAVE = r'''
import sys, torch, transformers
config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
model = transformers.LlamaForCausalLM(config)
data = [{"input_ids": torch.randint(0, 256, (32,)), "labels": torch.randint(0, 256, (32,))} for _ in range(8)]
args = transformers.TrainingArguments(output_dir=sys.argv[1], use_cpu=True, report_to=[], max_steps=1, save_steps=1,
                                      per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                      activation_checkpointing=True, logging_steps=1)
transformers.Trainer(model=model, args=args, train_dataset=data).train()
print("SAVED", flush=True)
'''


@pytest.mark.slow
def test_a_checkpoint_the_trainer_saved_reads_with_its_batch_checkpointing_and_model(tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "save.py").write_text(TRAINER_SAVE)
    run = subprocess.run([sys.executable, str(tmp_path / "save.py"), str(tmp_path / "out")], capture_output=True,
                         text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    assert run.returncode == 0 and "SAVED" in run.stdout, (run.stdout + run.stderr)[-3000:]
    folder = tmp_path / "out" / "checkpoint-1"
    assert {"training_args.bin", "config.json"} <= set(os.listdir(folder))
    got = _estimate_json(str(folder), "--seq-len", "32")
    plan = got["plan"]
    assert (plan["engine"], plan["zero_stage"], plan["recompute"]) == ("fsdp", 0, "full")  # plain DDP, checkpointed
    assert (plan["micro_batch_size"], plan["global_batch_size"], plan["dp"]) == (2, 4, 1)  # one CPU process
    spec = got["model"]["spec"]
    assert (spec["num_layers"], spec["hidden_size"], spec["vocab_size"]) == (2, 64, 256)
