"""What the cost model says the Hugging Face Trainer does at a save under ZeRO-3 (autotune/cost/consolidated_save),
checked by the Trainer itself: with ``stage3_gather_16bit_weights_on_model_save`` as the emitted ds_config_hf.json
sets it, every checkpoint folder holds the consolidated model (model.safetensors) beside DeepSpeed's sharded
checkpoint; with it off (as the policy writes it where node 0 cannot hold the model), the folder holds DeepSpeed's
checkpoint and zero_to_fp32.py alone. 2 gloo ranks, transformers' tiny LlamaForCausalLM, one step, one save."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import pick_free_port, run_launcher  # tests/ is on sys.path (no __init__)
from test_user_script_bundles import _emit  # tests/engines is on sys.path

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("deepspeed_ops")]

SCRIPT = textwrap.dedent('''\
    import sys

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


    class RandomTokens(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            ids = torch.randint(0, 96, (17,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}


    config, out = sys.argv[1], sys.argv[2]
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64))
    args = TrainingArguments(output_dir=out, deepspeed=config, per_device_train_batch_size=1, bf16=True,
                             use_cpu=True, ddp_backend="gloo", save_strategy="steps", save_steps=1, max_steps=1,
                             report_to=[])
    Trainer(model=model, args=args, train_dataset=RandomTokens()).train()
    # the Trainer leaves the gloo group up; torn down here, its threads are joined before the interpreter exits
    # (a joinable thread destroyed at exit is the rare abort conftest.NATIVE_ABORT retries)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    ''')


def _train(tmp: Path, config: Path, out: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # a rank's rare C++ abort at exit is started once more (conftest.run_launcher), from an empty output folder
    proc = run_launcher([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                         str(pick_free_port()), str(tmp / "trainer.py"), str(config), str(out)],
                        before_retry=lambda: shutil.rmtree(out, ignore_errors=True), cwd=tmp, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def test_the_trainer_consolidates_at_each_save_as_the_flag_says(tmp_path):
    bundle = _emit(tmp_path, tmp_path, "--engine", "hf", "--zero", "3", "--micro-batch", "1", "--global-batch", "2")
    emitted = json.loads((bundle / "ds_config_hf.json").read_text())
    assert emitted["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True  # room on node 0
    off = json.loads(json.dumps(emitted))
    off["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = False
    (tmp_path / "off.json").write_text(json.dumps(off))
    (tmp_path / "trainer.py").write_text(SCRIPT)
    for name, config in (("gathered", bundle / "ds_config_hf.json"), ("sharded", tmp_path / "off.json")):
        _train(tmp_path, config, tmp_path / name)
    gathered, sharded = tmp_path / "gathered" / "checkpoint-1", tmp_path / "sharded" / "checkpoint-1"
    assert (gathered / "model.safetensors").is_file() and (gathered / "global_step1").is_dir()
    assert not any(sharded.glob("*.safetensors")) and not (sharded / "pytorch_model.bin").exists()
    assert (sharded / "global_step1").is_dir() and (sharded / "zero_to_fp32.py").is_file()
