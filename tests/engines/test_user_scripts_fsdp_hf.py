"""plan.md is enough to bring one's own script, for FSDP2, the HF Trainer and accelerate (issue 21): each test emits
a bundle with a relative `--script`, writes that script from the plan.md section "Your own training script" alone
(the values it needs are read out of plan.md's sentences, so a plan.md that stops saying them fails here), with its
own model (a two-block PairLM; transformers' LlamaForCausalLM at a tiny size: not autotune's model), and starts the
emitted launch script from another folder. What each run must show: every rank trained, the world the plan says,
and the plan's sharding (FSDP2: each rank holds half of every parameter; DeepSpeed: the ZeRO stage)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import pick_free_port, run_launcher  # tests/ is on sys.path (no __init__)
from test_user_script_bundles import _model_yaml, _script_section  # tests/engines is on sys.path

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("default_port_taken")]

PAIR_LM = textwrap.dedent('''\
    import torch
    from torch import nn


    class PairBlock(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.norm = nn.LayerNorm(width)
            self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

        def forward(self, h):
            return h + self.mlp(self.norm(h))


    class PairLM(nn.Module):
        """Not autotune's model: an embedding, two residual MLP blocks and an output layer."""

        def __init__(self, vocab=96, width=32, depth=2):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.blocks = nn.ModuleList(PairBlock(width) for _ in range(depth))
            self.head = nn.Linear(width, vocab)

        def forward(self, ids):
            h = self.embed(ids[:, :-1])
            for block in self.blocks:
                h = block(h)
            logits = self.head(h).float()
            return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
    ''')

TINY_LLAMA = ("LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, "
              "num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)")


def _emit(tmp: Path, script: str, *flags: str) -> tuple[Path, str]:
    """Emit from tmp with the script named relatively; returns the bundle and plan.md's user-script section."""
    out = tmp / "bundle"
    cmd = [sys.executable, "-m", "autotune", "emit", "--model", str(_model_yaml(tmp)), "--gpu", "cpu",
           "--num-gpus", "2", "--gpus-per-node", "2", "--seq-len", "64", "--recompute", "none", "--out", str(out),
           "--script", script, *flags]
    proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, _script_section((out / "plan.md").read_text())


def _said(section: str, pattern: str) -> re.Match:
    found = re.search(pattern, section)
    assert found, f"plan.md no longer says {pattern!r}:\n{section}"
    return found


def _launch(bundle: Path, launcher: str, tmp: Path) -> list[str]:
    """Start the launcher from another folder; the records the ranks wrote (one file each: ranks share stdout)."""
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_PORT=str(pick_free_port()))

    def clear_records():
        for record in tmp.glob("records-rank*.txt"):
            record.unlink()

    proc = run_launcher(["bash", str(bundle / launcher)], before_retry=clear_records, cwd=elsewhere, env=env,
                        timeout=600)
    lines = [ln for f in sorted(tmp.glob("records-rank*.txt")) for ln in f.read_text().splitlines()]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    return lines


def _record(tmp: Path) -> str:
    """The user script's own log line, one file per rank (its `rank` variable)."""
    return (f"open({str(tmp)!r} + f'/records-rank{{rank}}.txt', 'a').write(")


def _fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split()[1:])


def test_user_fsdp2_script_from_plan_md_shards_and_trains_from_another_folder(tmp_path):
    bundle, section = _emit(tmp_path, "user_fsdp.py", "--engine", "fsdp", "--zero", "3", "--micro-batch", "2")
    mesh = _said(section, r"init_device_mesh\('cpu', \((\d+), (\d+), (\d+), (\d+)\), "
                          r"mesh_dim_names=\('pp', 'dp_replicate', 'dp_shard', 'tp'\)\)")
    shard = _said(section, r"fully_shard\(block, (mesh=mesh\['dp_shard'\], reshard_after_forward=True, "
                           r"mp_policy=MixedPrecisionPolicy\(param_dtype=torch\.bfloat16, "
                           r"reduce_dtype=torch\.float32\))\) on every transformer block, then the same call on the "
                           r"root module")
    micro = int(_said(section, r"micro-batch (\d+), 1 micro-batch\(es\) per optimizer step").group(1))
    _said(section, r"each of the 2 data-parallel ranks .* reads its own batches")
    assert "accelerate_fsdp.yaml is not written: accelerate 1.16.0 runs FSDP on GPUs" in section
    (tmp_path / "user_fsdp.py").write_text(PAIR_LM + textwrap.dedent(f'''\
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh('cpu', {tuple(int(g) for g in mesh.groups())},
                                mesh_dim_names=('pp', 'dp_replicate', 'dp_shard', 'tp'))
        torch.manual_seed(0)
        model = PairLM()
        full = model.embed.weight.numel()
        for block in model.blocks:
            fully_shard(block, {shard.group(1)})
        fully_shard(model, {shard.group(1)})
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        rank = dist.get_rank()
        local = model.embed.weight.to_local().numel()
        stream = torch.Generator().manual_seed(rank)  # each data-parallel rank reads its own batches
        for step in range(2):
            loss = model(torch.randint(0, 96, ({micro}, 17), generator=stream))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            {_record(tmp_path)}f"USER_STEP rank={{rank}} world={{dist.get_world_size()}} step={{step}} "
                  f"loss={{loss.item():.4f}} shard={{local}}/{{full}}\\n")
        dist.destroy_process_group()
        '''))
    steps = [_fields(ln) for ln in _launch(bundle, "launch_torchrun.sh", tmp_path)]
    assert sorted((s["rank"], s["step"]) for s in steps) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert {s["world"] for s in steps} == {"2"} and {s["shard"] for s in steps} == {"1536/3072"}  # 96 x 32 in halves
    first = {s["rank"]: float(s["loss"]) for s in steps if s["step"] == "0"}
    assert first["0"] != first["1"]  # each rank its own batch
    assert all(0 < float(s["loss"]) < 10 for s in steps)  # ln(96) = 4.56 at the start


def test_user_hf_trainer_script_from_plan_md_trains_from_another_folder(tmp_path):
    bundle, section = _emit(tmp_path, "user_trainer.py", "--engine", "hf", "--zero", "2", "--micro-batch", "2")
    config_name = _said(section, r"TrainingArguments\(deepspeed='<bundle>/(\w+\.json)' \(its absolute path").group(1)
    micro = _said(section, r"per_device_train_batch_size=(\d+)").group(1)
    accum = _said(section, r"gradient_accumulation_steps=(\d+)").group(1)
    saving = _said(section, r"save_strategy='steps', save_steps=(\d+), save_total_limit=(\d+), output_dir=")
    _said(section, r"use_cpu=True, ddp_backend='gloo'\)")
    (tmp_path / "user_trainer.py").write_text(textwrap.dedent(f'''\
        import torch
        import torch.distributed as dist
        from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


        class RandomTokens(torch.utils.data.Dataset):
            def __len__(self):
                return 64

            def __getitem__(self, i):
                ids = torch.randint(0, 96, (17,), generator=torch.Generator().manual_seed(i))
                return {{"input_ids": ids, "labels": ids}}


        model = LlamaForCausalLM({TINY_LLAMA})
        args = TrainingArguments(output_dir={str(tmp_path / "trainer_out")!r},
                                 deepspeed={str(bundle / config_name)!r}, per_device_train_batch_size={micro},
                                 gradient_accumulation_steps={accum}, bf16=True, use_cpu=True, ddp_backend='gloo',
                                 save_strategy='steps', save_steps={saving.group(1)}, save_total_limit={saving.group(2)},
                                 max_steps=2, logging_steps=1, report_to=[])
        trainer = Trainer(model=model, args=args, train_dataset=RandomTokens())
        result = trainer.train()
        zero = trainer.accelerator.deepspeed_config["zero_optimization"]["stage"]
        rank = dist.get_rank()
        {_record(tmp_path)}f"USER_RESULT rank={{rank}} world={{dist.get_world_size()}} steps={{result.global_step}} "
              f"loss={{result.training_loss:.4f}} zero={{zero}}\\n")
        '''))
    results = [_fields(ln) for ln in _launch(bundle, "launch_torchrun.sh", tmp_path)]
    assert sorted(r["rank"] for r in results) == ["0", "1"]
    assert all((r["world"], r["steps"], r["zero"]) == ("2", "2", "2") for r in results), results
    assert all(0 < float(r["loss"]) < 10 for r in results)


def test_user_accelerate_script_from_plan_md_trains_from_another_folder(tmp_path):
    bundle, section = _emit(tmp_path, "user_accelerate.py", "--engine", "hf", "--zero", "2", "--micro-batch", "2")
    for needed in ("accelerate.utils.DummyOptim(model.parameters())", "DummyScheduler(optimizer)",
                   "accelerator.prepare(model, optimizer, scheduler)", "accelerator.accumulate(model)",
                   "split the data by torch.distributed.get_rank() and get_world_size()"):
        assert needed in section, needed
    (tmp_path / "user_accelerate.py").write_text(textwrap.dedent(f'''\
        import accelerate.utils
        import torch
        import torch.distributed as dist
        from accelerate import Accelerator
        from accelerate.utils import DummyScheduler
        from transformers import LlamaConfig, LlamaForCausalLM

        accelerator = Accelerator()
        torch.manual_seed(0)
        model = LlamaForCausalLM({TINY_LLAMA})
        optimizer = accelerate.utils.DummyOptim(model.parameters())
        scheduler = DummyScheduler(optimizer)
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        ds = accelerator.state.deepspeed_plugin.deepspeed_config
        rank, world = dist.get_rank(), dist.get_world_size()
        stream = torch.Generator().manual_seed(rank)  # the data split by torch.distributed's rank
        for step in range(2 * ds["gradient_accumulation_steps"]):
            with accelerator.accumulate(model):
                ids = torch.randint(0, 96, (ds["train_micro_batch_size_per_gpu"], 17), generator=stream)
                loss = model(input_ids=ids, labels=ids).loss
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            {_record(tmp_path)}f"USER_STEP rank={{rank}} world={{world}} type={{accelerator.distributed_type}} "
                  f"zero={{ds['zero_optimization']['stage']}} step={{step}} loss={{loss.item():.4f}}\\n")
        '''))
    steps = [_fields(ln) for ln in _launch(bundle, "launch_accelerate.sh", tmp_path)]
    assert sorted(s["rank"] for s in steps) == ["0", "0", "1", "1"], steps
    assert {(s["world"], s["type"], s["zero"]) for s in steps} == {("2", "DistributedType.DEEPSPEED", "2")}
    first = {s["rank"]: float(s["loss"]) for s in steps if s["step"] == "0"}
    assert first["0"] != first["1"] and all(0 < float(s["loss"]) < 10 for s in steps)
