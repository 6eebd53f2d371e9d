"""A plain DeepSpeed user training script: the workload of ``bench/vs_deepspeed_autotuner.py``.

The model is the project's ``tiny-gpt`` preset built in plain PyTorch (GPT-2 style: learned
positions, LayerNorm, causal attention, GeLU MLP, tied embeddings; 4 layers x 256 wide, 4 heads,
FFN 1024, vocabulary 1024), trained on random tokens. Nothing in it knows about either tuner:

- the DeepSpeed config comes in as ``--deepspeed_config PATH`` (``deepspeed.add_config_arguments``),
  which is what ``deepspeed --autotuning`` (it passes the config base64-encoded, which
  ``deepspeed.initialize`` accepts) and ``autotune tune --workload script`` both give;
- ``--local_rank`` is accepted because the DeepSpeed launcher appends it;
- with an ``autotuning`` block in the config, DeepSpeed's engine times the profile steps, writes
  its metric file and ends the process itself (deepspeed/runtime/engine.py ``_autotuning_exit``);
  without one the script trains ``--max-steps`` optimizer steps and rank 0 prints one
  ``STEP_TIME <i> <seconds>`` line per optimizer step (wall clock, all micro-batches of the step),
  which the bench's common harness reads.

Run alone: ``torchrun --nproc_per_node 2 bench/workloads/ds_user_script.py --deepspeed_config ds.json``.
"""

import argparse
import math
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

import deepspeed

VOCAB, WIDTH, LAYERS, HEADS, FFN, MAX_POS = 1024, 256, 4, 4, 1024, 512  # autotune/presets/models/tiny-gpt.yaml


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.fc, self.out = nn.Linear(WIDTH, FFN), nn.Linear(FFN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, WIDTH))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(MAX_POS, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.size(1), device=ids.device))
        for block in self.blocks:
            x = block(x)
        logits = (self.ln_f(x) @ self.tok.weight.t()).float()  # tied embeddings
        return F.cross_entropy(logits.view(-1, VOCAB), labels.reshape(-1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default 128, at most 512)")
    parser.add_argument("--max-steps", type=int, default=50,
                        help="optimizer steps to train (default 50; an autotuning block in the config ends it sooner)")
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the DeepSpeed launcher")
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    if not 1 <= args.seq_len <= MAX_POS:
        parser.error(f"--seq-len must be 1..{MAX_POS}, got {args.seq_len}")
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = TinyGPT()
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    gen = torch.Generator().manual_seed(1000 + engine.global_rank)
    mbs, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    rank0 = engine.global_rank == 0
    for step in range(1, args.max_steps + 1):
        start = time.perf_counter()
        for _ in range(gas):
            ids = torch.randint(0, VOCAB, (mbs, args.seq_len + 1), generator=gen)
            loss = engine(ids[:, :-1], ids[:, 1:])
            engine.backward(loss)
            engine.step()
        if rank0:
            print(f"STEP_TIME {step} {time.perf_counter() - start:.6f} loss {loss.item():.4f}", flush=True)
    if rank0 and not math.isfinite(loss.item()):
        raise SystemExit(f"ds_user_script: the loss is {loss.item()}")
    if rank0:
        print(f"ds_user_script: trained {args.max_steps} steps (micro-batch {mbs} x accumulation {gas})", flush=True)
    engine.destroy()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
