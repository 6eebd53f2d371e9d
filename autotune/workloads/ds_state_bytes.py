"""Measure what a real DeepSpeed engine holds, to check the model-state ledger against.

``deepspeed_model_state_bytes`` walks a DeepSpeed engine between ``backward`` and ``step`` and splits
every tensor storage it can reach into params / grads / optimizer_states / buffers, then checks
the split against every tensor storage alive in the process (``total``). Activations:
:mod:`autotune.workloads.measure`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch

from autotune.workloads.measure import add_bytes, live_tensors, storage_bytes, storage_key

__all__ = ["deepspeed_model_state_bytes", "named_tensors"]


def named_tensors(obj: Any, prefix: str, *, depth: int = 6,
                  _seen: set | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor (and tensor ``.grad``) reachable from ``obj`` through attributes, dicts, lists
    and tuples, with an attribute path. ``nn.Module`` children are not entered."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen or depth < 0:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
        if obj.grad is not None:
            yield prefix + ".grad", obj.grad
        ds_tensor = getattr(obj, "ds_tensor", None)
        if isinstance(ds_tensor, torch.Tensor):
            yield from named_tensors(ds_tensor, prefix + ".ds_tensor", depth=depth - 1, _seen=seen)
        return
    if isinstance(obj, torch.nn.Module):
        return
    if isinstance(obj, dict):
        for k, v in list(obj.items()):
            key = k if isinstance(k, (str, int)) else type(k).__name__
            yield from named_tensors(v, f"{prefix}[{key!r}]", depth=depth - 1, _seen=seen)
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from named_tensors(v, f"{prefix}[{i}]", depth=depth - 1, _seen=seen)
        return
    mod = type(obj).__module__ or ""
    if (mod.startswith("deepspeed") or mod.startswith("torch.optim")) and hasattr(obj, "__dict__"):
        for k, v in list(vars(obj).items()):
            yield from named_tensors(v, f"{prefix}.{k}", depth=depth - 1, _seen=seen)


# Attribute names (last path component before any index) holding each category.
_MASTER = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups",
           "fp32_groups_flat_partition", "fp32_groups_flat")
_GRADS = ("averaged_gradients", "grads_in_partition", "grad_partitions_flat_buffer", "accumulated_grads_in_cpu",
          "fp32_groups_gradients_flat", "fp32_groups_gradients", "fp32_groups_gradient_dict",
          "__param_id_to_grad_partition")


# With ``offload_optimizer: {device: cpu}`` these live in host memory on a GPU machine (DeepSpeed
# allocates them on its ``self.device``, which is "cpu" under optimizer offload); everything else on
# the accelerator. On this CPU-only machine all tensors are on the CPU, so the split is by name.
_OFFLOADED = ("optimizer.single_partition_of_fp32_groups", "optimizer.fp32_partitioned_groups_flat",
              "optimizer.optimizer.state", "optimizer.optimizer.param_groups",
              "optimizer.param_buffer_of_bit16_for_cpu_offload_groups", "optimizer.temp_grad_buffer_for_cpu_offload",
              "optimizer.accumulated_grads_in_cpu", "optimizer.grad_partitions_flat_buffer",
              "optimizer.param_groups_fp16_flat_cpu_memory")


def _offloads_optimizer(engine: Any) -> bool:
    try:
        return bool(engine.zero_cpu_offload())
    except Exception:  # noqa: BLE001 (not a DeepSpeed engine: nothing is offloaded)
        return False


def deepspeed_model_state_bytes(engine: Any, *, detail: bool = True, storages: bool = False) -> dict:
    """Bytes this rank holds for model states, split by category, between backward and step.

    params: storages of the module's parameters (ZeRO-1/2: the flat bf16 buffers they view; ZeRO-3:
    the ``ds_tensor`` partitions plus whatever is still gathered). optimizer_states: fp32 master
    weights and the inner optimizer's ``state`` (exp_avg, exp_avg_sq, step). grads: ``param.grad``,
    DeepSpeed's gradient partitions (``averaged_gradients``, ``grads_in_partition``, ZeRO-3 grad
    partitions, offload fp32 grads: the ``.grad`` of master partitions). buffers: every other storage
    reachable from the engine and optimizer (named in ``buffers_detail``), plus module buffers.
    total: every tensor storage alive in the process (gc walk, with ``.grad``); ``unattributed`` is
    ``total`` minus the categories (tensors that are not the engine's, e.g. the input batch).
    """
    module = engine.module
    optimizer = engine.optimizer
    inner = getattr(optimizer, "optimizer", optimizer)
    owner: dict[int, tuple[str, str, int, str]] = {}  # key -> (category, path, bytes, dtype)

    def claim(category: str, path: str, t: torch.Tensor) -> None:
        key = storage_key(t)
        if key == 0 or key in owner:
            return
        owner[key] = (category, path, storage_bytes(t), str(t.dtype).replace("torch.", ""))

    # 1. parameters
    for name, p in module.named_parameters():
        ds = getattr(p, "ds_tensor", None)
        if isinstance(ds, torch.Tensor):
            claim("params", f"{name}.ds_tensor", ds)
        claim("params", name, p)
    for name, p in module.named_parameters():
        if p.grad is not None:
            claim("grads", f"{name}.grad", p.grad)
        ds = getattr(p, "ds_tensor", None)
        if isinstance(ds, torch.Tensor) and ds.grad is not None:
            claim("grads", f"{name}.ds_tensor.grad", ds.grad)
    # 2. optimizer states: master copies and the inner optimizer's state
    for attr in _MASTER:
        if hasattr(optimizer, attr):
            for path, t in named_tensors(getattr(optimizer, attr), f"optimizer.{attr}"):
                claim("grads" if path.endswith(".grad") else "optimizer_states", path, t)
    for path, t in named_tensors(getattr(inner, "state", {}), "optimizer.optimizer.state"):
        claim("optimizer_states", path, t)
    # 3. gradient holders
    for path, t in named_tensors(optimizer, "optimizer"):
        last = path.split(".")[-1].split("[")[0]
        if any(last == g or last.endswith(g) for g in _GRADS) or path.endswith(".grad"):
            claim("grads", path, t)
    for path, t in named_tensors(inner, "optimizer.optimizer"):  # param_groups of the inner optimizer
        if path.endswith(".grad"):
            claim("grads", path, t)
        else:
            claim("optimizer_states", path, t)
    # 4. buffers: module buffers and everything else the engine / optimizer reach
    for name, b in module.named_buffers():
        claim("buffers", f"module.{name}", b)
    for m_name, m in module.named_modules():
        for k, v in vars(m).items():
            if isinstance(v, torch.Tensor):
                claim("buffers", f"module.{m_name}.{k}".replace("..", "."), v)
    for path, t in named_tensors(optimizer, "optimizer"):
        claim("buffers", path, t)
    seen_objs: set[int] = {id(module), id(optimizer)}
    for k, v in vars(engine).items():  # the engine is an nn.Module: walk its own attributes
        if k not in ("_modules", "_parameters", "_buffers"):
            for path, t in named_tensors(v, f"engine.{k}", _seen=seen_objs):
                claim("buffers", path, t)

    # 5. everything alive
    total = 0
    other: dict[int, tuple[int, str, tuple]] = {}
    seen: set[int] = set()
    for t in live_tensors():
        if t.device.type == "meta":
            continue
        key = storage_key(t)
        if key == 0 or key in seen:
            continue
        seen.add(key)
        total += storage_bytes(t)
        if key not in owner:
            other[key] = (storage_bytes(t), str(t.dtype).replace("torch.", ""), tuple(t.shape))
    # storages claimed but not found by the gc walk (held only from C++) still count
    for key, (_, _, n, _) in owner.items():
        if key not in seen:
            total += n

    out: dict[str, Any] = {c: 0 for c in ("params", "grads", "optimizer_states", "buffers")}
    offload = _offloads_optimizer(engine)
    host: dict[str, int] = {c: 0 for c in ("params", "grads", "optimizer_states", "buffers")}
    by_dtype: dict[str, dict[str, int]] = defaultdict(dict)
    detail_map: dict[str, dict[str, int]] = defaultdict(dict)
    for category, path, n, dtype in owner.values():
        out[category] += n
        if offload and path.startswith(_OFFLOADED):
            host[category] += n
        add_bytes(by_dtype[category], dtype, n)
        group = _path_group(path)
        add_bytes(detail_map[category], group, n)
    out["total"] = total
    out["unattributed"] = total - sum(out[c] for c in ("params", "grads", "optimizer_states", "buffers"))
    out["host"] = host  # what a GPU machine would hold in host memory (optimizer offload); 0 otherwise
    out["device"] = {c: out[c] - host[c] for c in host}
    out["device"]["total"] = sum(out["device"].values())
    out["by_dtype"] = {k: dict(v) for k, v in by_dtype.items()}
    if detail:
        out["detail"] = {k: dict(sorted(v.items(), key=lambda kv: -kv[1])) for k, v in detail_map.items()}
        biggest = sorted(other.values(), key=lambda v: -v[0])[:8]
        out["unattributed_largest"] = [{"bytes": n, "dtype": d, "shape": list(s)} for n, d, s in biggest]
    if storages:  # every claimed storage, largest first
        out["storages"] = sorted(({"category": c, "path": p, "bytes": n, "dtype": d} for c, p, n, d in owner.values()),
                                 key=lambda r: -r["bytes"])
    out["optimizer_class"] = type(optimizer).__name__
    out["inner_optimizer_class"] = type(inner).__name__
    return out


def _path_group(path: str) -> str:
    """Collapse per-parameter / per-index paths into an attribute name for the breakdown."""
    if path.startswith("optimizer.optimizer.state"):
        return "optimizer.optimizer.state[" + path.rsplit("[", 1)[-1] if path.endswith("]") else path
    if not path.startswith(("optimizer", "engine", "module.")):
        return "module.parameters" + (".grad" if path.endswith(".grad") else "") + (
            " (ds_tensor)" if ".ds_tensor" in path else "")
    import re

    return re.sub(r"\[[^\]]*\]", "[]", path)
