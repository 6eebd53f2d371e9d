"""Measure DeepSpeed's per-rank model-state bytes for tiny models, to check the memory ledger.

Run with two processes (gloo, CPU)::

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 -m autotune.workloads.ds_memory_probe \
        --model tiny-gpt --configs zero0 zero1 zero2 zero3 zero1-offload zero2-offload zero3-offload \
        --out ds_memory_tiny-gpt.json

For each config, in the same process: build the model from its ModelSpec, ``deepspeed.initialize``,
run two steps and measure model states after the 2nd ``backward`` (before its ``step``) and again
after that ``step``; then ``engine.destroy()`` and go on. Rank 0 writes one JSON with the bytes per
category, bytes per parameter, the exact ds_config and per-rank values where ranks differ, and
prints a ``RESULT`` line. The offload configs use DeepSpeedCPUAdam (JIT-built once, ~60 s cold;
keep ``TORCH_EXTENSIONS_DIR`` stable); the others use ``torch.optim.AdamW`` (``torch_adam``).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import time

import torch

from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model_preset
from autotune.workloads.ds_state_bytes import deepspeed_model_state_bytes
from autotune.workloads.transformer import build_model

SEQ_LEN = 128
MICRO_BATCH = 2
BUCKET = 100_000  # elements; reduce / allgather / prefetch buckets kept small and known

MODELS = ("tiny-gpt", "tiny-llama")  # project presets small enough for CPU (any model preset is accepted)


def model_spec(name: str) -> ModelSpec:
    """The project's model preset ``name`` (autotune/presets/models/<name>.yaml)."""
    return load_model_preset(name)


CONFIGS = ("zero0", "zero1", "zero2", "zero3", "zero1-offload", "zero2-offload", "zero3-offload")


def ds_config(name: str, world_size: int) -> dict:
    stage = int(name[4])
    offload = name.endswith("-offload")
    zero: dict = {
        "stage": stage,
        "contiguous_gradients": True,
        "overlap_comm": False,
        "reduce_scatter": True,
        "reduce_bucket_size": BUCKET,
        "allgather_bucket_size": BUCKET,
    }
    if stage == 3:
        zero.update({
            "stage3_prefetch_bucket_size": BUCKET,
            "stage3_param_persistence_threshold": 0,  # else params < 1e5 elements stay gathered
            "stage3_model_persistence_threshold": 0,
            "stage3_max_live_parameters": BUCKET,
            "stage3_max_reuse_distance": 0,
        })
        del zero["allgather_bucket_size"]  # not a stage-3 key (stage 3 gathers per module)
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    params = {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}
    if not offload:
        params["torch_adam"] = True
    return {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "train_batch_size": MICRO_BATCH * world_size,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": params},
        "zero_optimization": zero,
        "gradient_clipping": 0.0,
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }


def run_config(spec: ModelSpec, name: str, rank: int, world_size: int) -> dict:
    import deepspeed

    cfg = ds_config(name, world_size)
    torch.manual_seed(0)
    model = build_model(spec, seq_len=SEQ_LEN)
    n_params = sum(p.numel() for p in model.parameters())
    t0 = time.time()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=copy.deepcopy(cfg))
    init_s = time.time() - t0
    gen = torch.Generator().manual_seed(100 + rank)
    losses, before, after = [], None, None
    in_step: list[dict] = []  # measured when the inner optimizer's step() starts (fp32 grads exist)
    for step in range(2):
        ids = torch.randint(0, spec.vocab_size, (MICRO_BATCH, SEQ_LEN), generator=gen)
        loss = engine(ids, ids)
        engine.backward(loss)
        losses.append(float(loss.detach()))
        del loss
        handle = None
        if step == 1:
            gc.collect()
            before = deepspeed_model_state_bytes(engine)
            handle = _hook_inner_step(engine, in_step)
        engine.step()
        if handle is not None:
            handle.remove()
    gc.collect()
    after = deepspeed_model_state_bytes(engine, detail=False)
    result = {
        "config": cfg,
        "num_params": n_params,
        "losses": losses,
        "init_s": round(init_s, 2),
        "before_step": before,
        "after_step": after,
        "in_step": max(in_step, key=lambda r: r["total"]) if in_step else None,
        "bytes_per_param_before_step": {k: round(before[k] / n_params, 4)
                                        for k in ("params", "grads", "optimizer_states", "buffers", "total")},
        "device_bytes_per_param_before_step": {k: round(v / n_params, 4) for k, v in before["device"].items()},
    }
    engine.destroy()
    _release(engine, model)
    del engine, model
    gc.collect()
    return result


def _hook_inner_step(engine, sink: list):
    """Measure once more when the wrapped torch optimizer's ``step`` begins: DeepSpeed has then
    made the fp32 gradients the update reads (ZeRO-0 bf16: all of them at once)."""
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    if not isinstance(inner, torch.optim.Optimizer):
        return None

    def pre_hook(opt, args, kwargs):
        sink.append(deepspeed_model_state_bytes(engine, detail=True))

    return inner.register_step_pre_hook(pre_hook)


def _release(engine, model: torch.nn.Module) -> None:
    """Drop the tensors a destroyed engine still reaches.

    DeepSpeed 0.19.8's ZeRO-3 engine stays alive after ``destroy()`` (hook closures registered on
    autograd nodes and modules keep the optimizer reachable from C++, where the cycle collector
    cannot see it), and with it its fp32 partitions, Adam states, bf16 partitions and grad buffer
    (measured: 27.6 MB for tiny-gpt, the whole ZeRO-3 state). Emptying the objects' attribute dicts
    frees those tensors even though the (now empty) objects themselves leak.
    """
    optimizer = getattr(engine, "optimizer", None)
    for obj in (getattr(optimizer, "optimizer", None), optimizer):
        if obj is None:
            continue
        if isinstance(getattr(obj, "state", None), dict):
            obj.state.clear()
        vars(obj).clear()
    for p in model.parameters():
        p.grad = None
        vars(p).clear()  # ds_tensor, ds_* attributes, _z3_optimizer
        p.data = torch.empty(0, dtype=p.dtype)
    for m in model.modules():
        for name, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[name] = b.new_empty(0)
        for name, v in list(vars(m).items()):
            if isinstance(v, torch.Tensor):
                setattr(m, name, v.new_empty(0))


def _differs(values: list) -> bool:
    return any(json.dumps(v, sort_keys=True) != json.dumps(values[0], sort_keys=True) for v in values[1:])


def _numbers(res: dict) -> dict:
    keys = ("params", "grads", "optimizer_states", "buffers", "total", "unattributed", "host")
    return {w: {k: res[w][k] for k in keys} for w in ("before_step", "in_step", "after_step") if res.get(w)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-gpt",
                    help=f"model preset ({', '.join(MODELS)} fit a CPU; any preset name is accepted)")
    ap.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    ap.add_argument("--out", default=None, help="JSON path (default ds_memory_<model>.json)")
    args = ap.parse_args(argv)

    import deepspeed
    import deepspeed.comm as dist

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = model_spec(args.model)
    results: dict[str, dict] = {}
    for name in args.configs:
        res = run_config(spec, name, rank, world)
        gathered: list = [None] * world
        torch.distributed.all_gather_object(gathered, _numbers(res))
        if _differs(gathered):
            res["per_rank"] = gathered
        results[name] = res
        if rank == 0:
            b = res["bytes_per_param_before_step"]
            print(f"[ds_memory_probe] {args.model} {name}: {b}", flush=True)
    if rank == 0:
        out = {
            "model": spec.to_dict(),
            "num_params": spec.num_params,
            "world_size": world,
            "micro_batch_size": MICRO_BATCH,
            "seq_len": SEQ_LEN,
            "bucket_elements": BUCKET,
            "versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__},
            "results": results,
        }
        path = args.out or f"ds_memory_{args.model}.json"
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
        summary = {n: r["bytes_per_param_before_step"] for n, r in results.items()}
        print(f"RESULT model={args.model} num_params={spec.num_params} out={path} "
              f"bytes_per_param_before_step={json.dumps(summary)}", flush=True)
    dist.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
