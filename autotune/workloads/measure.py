"""Measure what real autograd and real DeepSpeed hold, to check the memory ledger against.

``saved_activation_bytes`` runs one forward/backward and reports activation memory two ways:

- *saved*: tensors autograd packs for backward, seen by ``torch.autograd.graph.saved_tensors_hooks``
  (unique storages, parameters and buffers excluded). Inside a non-reentrant
  ``torch.utils.checkpoint`` region the checkpoint installs its own hooks, so the tensors saved
  there are not seen (they are recomputed in backward); the region's inputs are saved by the
  checkpoint itself (``_CheckpointFrame.save_inputs``) outside its hooks, so they are seen.
- *retained*: storages created during the forward (seen by a ``TorchDispatchMode``) still alive
  after it returns, i.e. what the graph really keeps. It differs from *saved* only by tensors
  made before the forward (the input ids kept by the embedding, the labels kept by the loss) and
  by anything a region keeps without saving it (``checkpoint_held_bytes``; 0 for this model).

``activation_bytes`` is the union of both (unique storages): the number to compare with the ledger.

``deepspeed_model_state_bytes`` walks a DeepSpeed engine between ``backward`` and ``step`` and splits
every tensor storage it can reach into params / grads / optimizer_states / buffers, then checks
the split against every tensor storage alive in the process (``total``).
"""

from __future__ import annotations

import gc
import warnings
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["saved_activation_bytes", "deepspeed_model_state_bytes", "storage_key", "named_tensors"]


def storage_key(t: torch.Tensor) -> int:
    """Identity of ``t``'s storage (its data pointer; 0 for empty storages)."""
    return t.untyped_storage().data_ptr()


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def _model_storages(model: torch.nn.Module) -> set[int]:
    keys = {storage_key(p) for p in model.parameters()}
    keys |= {storage_key(b) for b in model.buffers()}
    for m in model.modules():  # buffers re-assigned as plain attributes (e.g. fp32 RoPE tables)
        for v in vars(m).values():
            if isinstance(v, torch.Tensor):
                keys.add(storage_key(v))
    keys.discard(0)
    return keys


class _ModuleTracker:
    """Keeps the dotted name of the innermost module whose forward is running."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.names = {id(m): (n or "<root>") for n, m in model.named_modules()}
        self.stack: list[str] = []
        self.handles: list[Any] = []

    def __enter__(self) -> _ModuleTracker:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        def pre(module, args):
            self.stack.append(self.names.get(id(module), type(module).__name__))

        def post(module, args, out):
            if self.stack:
                self.stack.pop()

        self.handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else "<outside>"


class _AllocTracker(TorchDispatchMode):
    """Records every storage an op outputs (weakly), with the op and module that made it."""

    def __init__(self, modules: _ModuleTracker | None = None, track_live: bool = False) -> None:
        super().__init__()
        self.modules = modules
        # cdata -> (weak ref, bytes, op, module, dtype, data_ptr)
        self.records: dict[int, tuple[StorageWeakRef, int, str, str, str, int]] = {}
        self.track_live = track_live
        self.live_timeline: list[tuple[int, ...]] = []  # cdatas alive after each op (backward peak)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten(out)
        for t in flat:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                ref = StorageWeakRef(st)
                if ref.cdata not in self.records:
                    module = self.modules.current if self.modules else ""
                    self.records[ref.cdata] = (ref, st.nbytes(), str(func.overloadpacket.__name__), module,
                                               str(t.dtype).replace("torch.", ""), st.data_ptr())
        if self.track_live:
            self.live_timeline.append(tuple(c for c, r in self.records.items() if not r[0].expired()))
        return out


def _add(d: dict, key: str, n: int) -> None:
    d[key] = d.get(key, 0) + n


def saved_activation_bytes(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor, *,
                           backward: bool = True, items: bool = False) -> dict:
    """Activation memory of one forward (and, with ``backward``, the live peak during backward).

    Returns bytes: ``saved_bytes`` (saved-tensor hooks) with ``saved_by_dtype``, ``saved_by_module``
    (the module whose forward was running when the tensor was saved) and ``saved_by_creator`` (the
    ``grad_fn`` that produced it; ``leaf`` for inputs); ``retained_bytes`` (storages created in the
    forward and still alive after it) with ``retained_by_dtype``/``retained_by_op``/``retained_by_module``;
    ``activation_bytes`` (union of both) with ``activation_by_dtype``; ``checkpoint_held_bytes``
    (retained but never seen by the hooks; 0 when every kept tensor is a saved tensor);
    ``backward_peak_bytes``
    (most bytes alive at once during backward among storages made in forward or backward, excluding
    storages that end up as parameter ``.grad``) and ``param_grad_bytes``.
    """
    model.zero_grad(set_to_none=True)
    exclude = _model_storages(model)
    # storages alive before the forward (inputs, anything else in the process): views of them made in
    # the forward (e.g. labels.reshape) are not activations the forward created
    preexisting = {storage_key(t) for t in _live_tensors()} | {storage_key(input_ids)}
    if isinstance(labels, torch.Tensor):
        preexisting.add(storage_key(labels))
    saved: dict[int, tuple[int, str, str, str, tuple]] = {}

    tracker = _ModuleTracker(model)

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key and key not in exclude and key not in saved:
            creator = t.grad_fn.name() if t.grad_fn is not None else "leaf"
            saved[key] = (_nbytes(t), str(t.dtype).replace("torch.", ""), tracker.current, creator, tuple(t.shape))
        return t

    alloc = _AllocTracker(tracker)
    with tracker, alloc, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids, labels)
    loss_key = storage_key(loss)

    out: dict[str, Any] = {"loss": float(loss.detach())}
    out["saved_bytes"] = sum(v[0] for v in saved.values())
    for name, idx in (("saved_by_dtype", 1), ("saved_by_module", 2), ("saved_by_creator", 3)):
        d: dict[str, int] = {}
        for v in saved.values():
            _add(d, v[idx], v[0])
        out[name] = dict(sorted(d.items(), key=lambda kv: -kv[1]))

    # still-alive storages made in the forward, keyed by data pointer (unique among live storages)
    retained: dict[int, tuple[int, str, str, str]] = {}
    for ref, nbytes, op, module, dtype, ptr in alloc.records.values():
        if not ref.expired() and ptr != 0 and ptr not in exclude and ptr not in preexisting and ptr != loss_key:
            retained[ptr] = (nbytes, op, module, dtype)
    out["retained_bytes"] = sum(v[0] for v in retained.values())
    for name, idx in (("retained_by_op", 1), ("retained_by_module", 2), ("retained_by_dtype", 3)):
        d = {}
        for v in retained.values():
            _add(d, v[idx], v[0])
        out[name] = dict(sorted(d.items(), key=lambda kv: -kv[1]))

    union: dict[int, tuple[int, str]] = {k: (v[0], v[1]) for k, v in saved.items()}
    held = 0
    for p, v in retained.items():
        if p not in union:
            union[p] = (v[0], v[3])
            held += v[0]
    out["checkpoint_held_bytes"] = held
    out["activation_bytes"] = sum(v[0] for v in union.values())
    d = {}
    for v in union.values():
        _add(d, v[1], v[0])
    out["activation_by_dtype"] = d
    if items:
        out["saved_items"] = [
            {"bytes": v[0], "dtype": v[1], "module": v[2], "creator": v[3], "shape": list(v[4])}
            for v in saved.values()
        ]
    del union, retained

    if backward:
        fwd_alive = {c for c, r in alloc.records.items() if not r[0].expired()}
        bwd = _AllocTracker(None, track_live=True)
        bwd.records = {c: alloc.records[c] for c in fwd_alive}
        with bwd:
            loss.backward()
        grad_cdatas = set()
        for p in model.parameters():
            if p.grad is not None:
                grad_cdatas.add(StorageWeakRef(p.grad.untyped_storage()).cdata)
        sizes = {c: r[1] for c, r in bwd.records.items()}
        excluded_cdata = {c for c, r in bwd.records.items() if r[5] in exclude or r[5] in preexisting}
        peak = 0
        for live in bwd.live_timeline:
            peak = max(peak, sum(sizes[c] for c in live if c not in grad_cdatas and c not in excluded_cdata))
        out["backward_peak_bytes"] = peak
        out["param_grad_bytes"] = sum(_nbytes(p.grad) for p in model.parameters() if p.grad is not None)
    return out


# ---------------------------------------------------------------------------------------------
# DeepSpeed model states
# ---------------------------------------------------------------------------------------------
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


def _live_tensors() -> list[torch.Tensor]:
    """Every tensor object the garbage collector tracks, plus their ``.grad``."""
    found = []
    with warnings.catch_warnings():  # isinstance() on deprecated module attributes warns
        warnings.simplefilter("ignore")
        for o in gc.get_objects():
            try:
                if isinstance(o, torch.Tensor):
                    found.append(o)
                    if o.grad is not None:
                        found.append(o.grad)
            except Exception:  # noqa: BLE001 (weak proxies and lazy modules can raise on isinstance)
                continue
    return found


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
        owner[key] = (category, path, _nbytes(t), str(t.dtype).replace("torch.", ""))

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
    for t in _live_tensors():
        if t.device.type == "meta":
            continue
        key = storage_key(t)
        if key == 0 or key in seen:
            continue
        seen.add(key)
        total += _nbytes(t)
        if key not in owner:
            other[key] = (_nbytes(t), str(t.dtype).replace("torch.", ""), tuple(t.shape))
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
        _add(by_dtype[category], dtype, n)
        group = _path_group(path)
        _add(detail_map[category], group, n)
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
