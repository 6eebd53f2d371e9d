"""Save a DeepSpeed ZeRO checkpoint, then resume from it in a fresh process group (gloo, CPU).

Two invocations make one experiment::

    # run A: train 6 steps, save after steps 2, 3 and 4 (keeping the newest 2 tags), record every step
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 -m autotune.workloads.ds_checkpoint_resume \
        --mode train --ckpt-dir /tmp/ck --steps 6 --save-steps 2 3 4 --keep-last 2
    # run B: new processes, new engine, load the latest tag, train steps 5..6
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 -m autotune.workloads.ds_checkpoint_resume \
        --mode resume --ckpt-dir /tmp/ck --steps 6

Step ``n`` (1-based) is the n-th optimizer step; its batch is drawn from a generator seeded by
``n`` and the rank, so both runs see the same data. For each step the learning rate the update
uses (``engine.get_lr()`` before ``engine.step()``, a WarmupLR ramp, so it changes every step)
and the forward loss are recorded. The ``checkpoint`` block (and ZeRO-3's
``stage3_gather_16bit_weights_on_model_save``) come from ``--checkpoint-block`` /
``--zero-options`` as JSON, normally :class:`autotune.emit.checkpoint.CheckpointSettings`'s.
Rank 0 prints one ``RESULT {json}`` line. AdamW runs with ``torch_adam: true`` (no JIT build).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from autotune.specs.model import ModelSpec
from autotune.workloads.transformer import build_model

SEQ_LEN = 32
MICRO_BATCH = 2
TINY = ModelSpec(
    name="tiny-llama-ckpt", num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
    vocab_size=256, position_embedding="rope", activation="swiglu", norm="rmsnorm", tied_embeddings=False,
)


def ds_config(*, world_size: int, zero_stage: int, dtype: str, checkpoint_block: dict, zero_options: dict) -> dict:
    zero = {"stage": zero_stage, **zero_options}
    if zero_stage == 3:
        zero["stage3_param_persistence_threshold"] = 0  # partition every parameter, as for a large model
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "train_batch_size": MICRO_BATCH * world_size,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.1, "torch_adam": True}},
        # Linear warmup from 1e-3 to 1e-2 over 10 steps: a different learning rate at every step here.
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-3, "warmup_max_lr": 1e-2,
                                                     "warmup_num_steps": 10, "warmup_type": "linear"}},
        "zero_optimization": zero,
        "gradient_clipping": 1.0,
        "checkpoint": checkpoint_block,
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    ids = torch.randint(0, TINY.vocab_size, (MICRO_BATCH, SEQ_LEN + 1), generator=gen)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def train_step(engine, step: int, rank: int) -> dict:
    ids, labels = batch(step, rank)
    loss = engine(ids, labels)
    engine.backward(loss)
    lr = float(engine.get_lr()[0])  # the rate this step's update uses
    engine.step()
    return {"step": step, "lr": lr, "loss": float(loss.detach().float())}


def tag_of(step: int) -> str:
    return f"global_step{step}"


def folder_listing(ckpt_dir: str) -> dict:
    """Tag folders (sorted) with their files and bytes."""
    out = {}
    for name in sorted(os.listdir(ckpt_dir)):
        path = os.path.join(ckpt_dir, name)
        if os.path.isdir(path):
            out[name] = {f: os.path.getsize(os.path.join(path, f)) for f in sorted(os.listdir(path))}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("train", "resume"), required=True)
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--steps", type=int, default=6, help="last step to run")
    ap.add_argument("--save-steps", type=int, nargs="*", default=[4], help="steps after which run A saves")
    ap.add_argument("--keep-last", type=int, default=0, help="run A: keep this many newest tags (0: all)")
    ap.add_argument("--zero-stage", type=int, default=3)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--checkpoint-block", default="{}", help="JSON for ds_config['checkpoint']")
    ap.add_argument("--zero-options", default="{}", help="JSON merged into ds_config['zero_optimization']")
    ap.add_argument("--export-16bit", action="store_true", help="run A: also engine.save_16bit_model() at the end")
    args = ap.parse_args(argv)

    import deepspeed
    import deepspeed.comm as dist

    from autotune.emit.checkpoint import prune_old_tags

    t_start = time.time()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ds_config(world_size=world, zero_stage=args.zero_stage, dtype=args.dtype,
                    checkpoint_block=json.loads(args.checkpoint_block), zero_options=json.loads(args.zero_options))
    torch.manual_seed(0)
    model = build_model(TINY, seq_len=SEQ_LEN, dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    result: dict = {"mode": args.mode, "world_size": world, "zero_stage": args.zero_stage, "dtype": args.dtype,
                    "num_params": TINY.num_params, "ds_config": cfg, "versions": {"torch": torch.__version__,
                                                                                  "deepspeed": deepspeed.__version__}}
    records: list[dict] = []
    if args.mode == "train":
        first, saved, pruned = 1, [], []
        for step in range(first, args.steps + 1):
            records.append(train_step(engine, step, rank))
            if step in args.save_steps:
                engine.save_checkpoint(args.ckpt_dir, tag=tag_of(step), client_state={"step": step})
                saved.append(tag_of(step))
                dist.barrier()  # every rank's files are written before rank 0 prunes
                if args.keep_last and rank == 0:
                    pruned += prune_old_tags(args.ckpt_dir, args.keep_last)
                dist.barrier()
        if args.export_16bit:
            export_dir = os.path.join(args.ckpt_dir, "export")
            result["export_16bit_saved"] = bool(engine.save_16bit_model(export_dir))
            dist.barrier()
            if rank == 0:
                sd = torch.load(os.path.join(export_dir, "pytorch_model.bin"), map_location="cpu")
                result["export_16bit"] = {"numel": sum(t.numel() for t in sd.values()),
                                          "dtypes": sorted({str(t.dtype) for t in sd.values()})}
        result.update(saved=saved, pruned=pruned)
    else:
        load_path, client_state = engine.load_checkpoint(args.ckpt_dir)  # tag None: the one in 'latest'
        start = int(client_state["step"]) if client_state else 0
        result.update(load_path=load_path, client_state_step=client_state.get("step") if client_state else None)
        for step in range(start + 1, args.steps + 1):
            records.append(train_step(engine, step, rank))
    result["records"] = records
    if rank == 0 and os.path.isdir(args.ckpt_dir):
        result["folders"] = folder_listing(args.ckpt_dir)
        latest = os.path.join(args.ckpt_dir, "latest")
        result["latest"] = open(latest).read().strip() if os.path.exists(latest) else None
    result["wall_s"] = round(time.time() - t_start, 2)
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    engine.destroy()
    dist.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
