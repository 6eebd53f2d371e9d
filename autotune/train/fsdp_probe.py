"""What real FSDP2 holds on each rank, for the ledger test (tests/cost/test_ledger_vs_fsdp.py).

Run under torchrun (2 gloo ranks)::

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 -m autotune.train.fsdp_probe --model tiny-llama --out probe.json

For every config it builds the FSDP trainer's own model (:func:`autotune.train.fsdp.build`: fully_shard per
block and root, MixedPrecisionPolicy bf16/fp32, CPUOffloadPolicy when offloading), takes one optimizer step so
the optimizer states exist, then during the second step measures:

- *params*: the storages of the parameters' local shards (``DTensor.to_local()``, FSDP2's padded sharded
  data), unique by storage;
- *grads*: the local shards of ``param.grad`` after backward (fp32: reduce_dtype), before the step;
- *optimizer_states*: every tensor of ``optimizer.state`` (exp_avg, exp_avg_sq, step), local shards;
- *saved activations* of the forward: tensors autograd packs for backward (``saved_tensors_hooks``), unique by
  storage, leaving out parameters (FSDP2's unsharded parameters and views of them: the weights GEMMs keep)
  and tensors alive before the forward (the batch, the model's buffers), as ``autotune.workloads.measure`` does
  for DeepSpeed; plus what a checkpointed block keeps that those hooks do not see (inside a checkpoint region
  its own hooks pack): storages that ops output while a block's own forward runs and that are still alive, with
  their size, after the forward (op-level SAC's cache of the saved ops' outputs; none for full recompute).

Rank 0 writes ``{"world_size", "results": {config: {"per_rank": [...]}}}``.
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

__all__ = ["PROBE_CONFIGS", "probe_plan", "run_probe", "compare", "main"]

PROBE_CONFIGS = {
    "zero3": {"zero_stage": 3},
    "zero2": {"zero_stage": 2},
    "zero0": {"zero_stage": 0},
    "zero3-offload": {"zero_stage": 3, "offload_param": "cpu", "offload_optimizer": "cpu"},
    "zero3-full-recompute": {"zero_stage": 3, "recompute": "full"},
    "zero3-op-sac": {"zero_stage": 3, "recompute": "selective"},
}
MICRO_BATCH, SEQ_LEN = 2, 128


def probe_plan(config: str, world_size: int):
    from autotune.specs.plan import ParallelPlan

    return ParallelPlan(engine="fsdp", dp=world_size, micro_batch_size=MICRO_BATCH, seq_len=SEQ_LEN,
                        global_batch_size=MICRO_BATCH * world_size, **({"recompute": "none"} | PROBE_CONFIGS[config]))


def _local(t):
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = _local(t).untyped_storage()
        if st.data_ptr():
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _is_param_like(t) -> bool:
    """A parameter (FSDP2's unsharded parameter) or a view of one (the transposed weight addmm saves)."""
    base = t._base if t._base is not None else t
    return base.is_leaf and base.requires_grad


def _block_outputs_mode():
    """A ``TorchDispatchMode`` that weakly records the storage of every op output while a block's own forward runs
    (``inside`` > 0: :func:`_block_hooks`); ``alive()`` after the forward says which are still held."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Mode(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.inside, self.refs = 0, {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if self.inside and not getattr(func, "is_view", False):  # a view (of a weight, say) is no new storage
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor):
                        ref = StorageWeakRef(_local(t).untyped_storage())
                        self.refs.setdefault(ref.cdata, ref)
            return out

        def alive(self) -> dict[int, int]:
            """data_ptr -> bytes now of the recorded storages still alive (0-byte ones left out)."""
            found = {}
            for ref in self.refs.values():
                if not ref.expired():
                    st = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
                    if st.data_ptr() and st.nbytes():
                        found[st.data_ptr()] = st.nbytes()
            return found

    return Mode()


def _block_hooks(model, mode) -> list:
    """Forward pre/post hooks on each block's own module (inside checkpoint_wrapper and fully_shard, so FSDP2's
    gathers and reshards stay outside) that count ``mode.inside`` up and down."""
    handles = []
    for block in model.layers.values():
        inner = getattr(block, "_checkpoint_wrapped_module", block)

        def pre(module, args):
            mode.inside += 1

        def post(module, args, out):
            mode.inside -= 1

        handles += [inner.register_forward_pre_hook(pre), inner.register_forward_hook(post)]
    return handles


def _measure(model_spec, plan, device) -> dict:
    import torch

    from autotune.train import token_batches
    from autotune.train.fsdp import _optimizer, build
    from autotune.train.fsdp_model import lm_loss

    mesh, modules, _, _ = build(SimpleNamespace(model=model_spec, plan=plan), device, 1234)
    model = modules[0]
    optimizer = _optimizer(plan.optimizer, list(model.parameters()), 3e-4)
    batches = token_batches(model_spec.vocab_size, plan.micro_batch_size, plan.seq_len, seed=1234,
                            stream=mesh["dp_shard"].get_local_rank(), device=device)
    ids, labels = next(batches)
    lm_loss(model(ids), labels).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    ids, labels = next(batches)
    # alive before the forward: the batch and the model's buffers (RoPE tables: a checkpoint saves them as inputs)
    before = {t.untyped_storage().data_ptr() for t in (ids, labels, *model.buffers())}
    saved: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() and st.data_ptr() not in before and not _is_param_like(t):
            saved.setdefault(st.data_ptr(), st.nbytes())
        return t

    mode = _block_outputs_mode()
    hooks = _block_hooks(model, mode)
    with mode, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = lm_loss(model(ids), labels)
    for h in hooks:
        h.remove()
    kept = mode.alive()
    for ptr in (*before, loss.untyped_storage().data_ptr()):
        kept.pop(ptr, None)
    activations = sum((kept | saved).values())
    loss.backward()
    params = list(model.parameters())
    out = {"params": _bytes(params), "grads": _bytes(p.grad for p in params if p.grad is not None),
           "optimizer_states": _bytes(v for s in optimizer.state.values() for v in s.values()
                                      if isinstance(v, torch.Tensor)),
           "saved_activations": activations, "block_kept_unseen": sum(v for k, v in kept.items() if k not in saved),
           "param_dtypes": sorted({str(_local(p).dtype) for p in params}),
           "grad_dtypes": sorted({str(_local(p.grad).dtype) for p in params if p.grad is not None})}
    optimizer.zero_grad(set_to_none=True)
    return out


def run_probe(model_name: str, out_dir, *, world_size: int = 2, timeout_s: float = 600) -> dict:
    """Run this probe under torchrun on ``world_size`` gloo ranks; its JSON document."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = Path(out_dir) / f"fsdp_memory_{model_name}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world_size), "-m",
           "autotune.train.fsdp_probe", "--model", model_name, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    if not out.is_file():
        raise RuntimeError(f"FSDP probe for {model_name} wrote no result (exit {proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def compare(doc: dict) -> list[tuple[str, str, int, float]]:
    """(config, category, measured bytes of the most loaded rank, ledger bytes) for every config and category:
    params / grads / optimizer_states (``estimate_memory`` through the fsdp engine, host and device together:
    on this machine both are RAM) and saved_activations (the ledger's stored activations, as
    ``autotune.workloads.ledger_check.compare_activations`` counts them, with the fsdp engine's activation facts:
    selective is op-level SAC; CPU LayerNorm statistics made explicit)."""
    from autotune.cost.activations import stage_activation_bytes
    from autotune.cost.memory import estimate_memory
    from autotune.engines import engine_for
    from autotune.specs.loading import load_cluster
    from autotune.specs.presets import load_model_preset
    from autotune.workloads.ledger_check import CPU_LAYERNORM_STAT_BYTES, GPU_LAYERNORM_STAT_BYTES

    model, world = load_model_preset(doc["model"]), doc["world_size"]
    cluster = load_cluster(gpu="cpu", num_gpus=world, gpus_per_node=world, cluster_path=None)
    rows = []
    for name, result in doc["results"].items():
        plan = probe_plan(name, world)
        s = estimate_memory(model, cluster, plan).offloaded
        assert s is not None
        ledger = {"params": s.weights + s.host_weights, "grads": s.gradients + s.host_gradients,
                  "optimizer_states": s.optimizer_states + s.host_optimizer_states}
        parts = stage_activation_bytes(model, plan, 0, engine_for(plan).activation_facts(plan),
                                       engine_for(plan).layer_split_of(plan, model.num_layers))
        # what the forward leaves saved: the recompute working set and the loss's gradients come in backward
        act = sum(v for k, v in parts.items() if k not in ("recompute_working_set", "loss_backward"))
        if model.norm == "layernorm":  # blocks under full recompute or op-level SAC keep no norm statistics
            stored = model.num_layers * model.norms_per_layer if plan.recompute == "none" else 0
            act -= (stored + 1 + int(model.embedding_norm)) * plan.micro_batch_size * plan.seq_len * (
                GPU_LAYERNORM_STAT_BYTES - CPU_LAYERNORM_STAT_BYTES)
        ledger["saved_activations"] = act
        for category, predicted in ledger.items():
            rows.append((name, category, max(r[category] for r in result["per_rank"]), predicted))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a model preset (tiny-gpt, tiny-llama)")
    ap.add_argument("--configs", nargs="*", default=list(PROBE_CONFIGS), choices=list(PROBE_CONFIGS))
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    from autotune.specs.presets import load_model_preset

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    spec = load_model_preset(args.model)
    results = {}
    for name in args.configs:
        row = _measure(spec, probe_plan(name, world), torch.device("cpu"))
        per_rank: list = [None] * world
        dist.all_gather_object(per_rank, row)
        results[name] = {"per_rank": per_rank}
    if dist.get_rank() == 0:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"model": args.model, "world_size": world, "micro_batch_size": MICRO_BATCH,
                       "seq_len": SEQ_LEN, "results": results}, f, indent=2)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
