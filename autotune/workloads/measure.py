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

What DeepSpeed's engine holds (model states) is measured by :mod:`autotune.workloads.ds_state_bytes`.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["saved_activation_bytes", "storage_key", "storage_bytes", "add_bytes", "live_tensors"]


def storage_key(t: torch.Tensor) -> int:
    """Identity of ``t``'s storage (its data pointer; 0 for empty storages)."""
    return t.untyped_storage().data_ptr()


def storage_bytes(t: torch.Tensor) -> int:
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


def add_bytes(d: dict, key: str, n: int) -> None:
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
    preexisting = {storage_key(t) for t in live_tensors()} | {storage_key(input_ids)}
    if isinstance(labels, torch.Tensor):
        preexisting.add(storage_key(labels))
    saved: dict[int, tuple[int, str, str, str, tuple]] = {}

    tracker = _ModuleTracker(model)

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key and key not in exclude and key not in saved:
            creator = t.grad_fn.name() if t.grad_fn is not None else "leaf"
            saved[key] = (storage_bytes(t), str(t.dtype).replace("torch.", ""), tracker.current, creator,
                          tuple(t.shape))
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
            add_bytes(d, v[idx], v[0])
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
            add_bytes(d, v[idx], v[0])
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
        add_bytes(d, v[1], v[0])
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
        out["param_grad_bytes"] = sum(storage_bytes(p.grad) for p in model.parameters() if p.grad is not None)
    return out


# ---------------------------------------------------------------------------------------------
# DeepSpeed model states
# ---------------------------------------------------------------------------------------------


def live_tensors() -> list[torch.Tensor]:
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
