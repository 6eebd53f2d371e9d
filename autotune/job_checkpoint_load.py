"""Reading the files of a training checkpoint without running code from them (``autotune.job_checkpoint``).

A checkpoint is pickles: ``torch.load(weights_only=False)`` and torch.distributed.checkpoint's own index reader
(``FileSystemReader.read_metadata``: ``pickle.load``) import and call whatever a file names. Here the files are
read with torch's weights-only unpickler (tensors never materialised: ``mmap``), every class it does not allow
(Megatron's enums, ``argparse.Namespace``, a Trainer's arguments) rebuilt as an inert :class:`StandIn` that only
records its arguments; the modules torch blocks (``os``, ``subprocess``, ...) refused; and a torch_dist index read
by :class:`IndexUnpickler`, which allows only what such an index holds.
"""

from __future__ import annotations

import argparse
import importlib
import io
import pickle
import re
import warnings
from pathlib import Path

from autotune.emit.job_args import FROM_SUBJECT as _SUBJECT
from autotune.errors import InputError

__all__ = ["COMMON_STATE_KEY", "IndexUnpickler", "Refused", "StandIn", "dcp_entry", "safe_load"]

COMMON_STATE_KEY = "common_state/shard_0_1"
"""The torch_dist common state's key: ShardedObject("common_state", None, (1,), (0,)).unique_key."""


def dcp_entry(save: Path, key: str) -> object | None:
    """The pickled entry ``key`` of the torch.distributed.checkpoint files in ``save`` (None: the index has no such
    entry), read without running code: the index by :class:`IndexUnpickler`, the entry by :func:`safe_load`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import StorageMeta

    class RawBytes(DefaultLoadPlanner):
        """Keeps a pickled entry's bytes: the default planner unpickles them with torch.load(weights_only=False),
        which would import (and run) whatever classes they name."""

        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            if read_item.dest_index.fqn == key:
                kept.append(io.BytesIO(value.read()))

    class SafeMetadata(dcp.FileSystemReader):
        """Reads the ``.metadata`` index with :class:`IndexUnpickler`: torch's reader takes it with ``pickle.load``,
        which would run whatever the file names."""

        def read_metadata(self, *args, **kwargs):
            with open(Path(str(self.path)) / ".metadata", "rb") as f:
                metadata = IndexUnpickler(f).load()
            metadata.storage_meta = metadata.storage_meta or StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    kept: list[io.BytesIO] = []
    try:
        index = SafeMetadata(str(save)).read_metadata()  # refused here, before torch's loader wraps (and logs) it
        if key not in (getattr(index, "state_dict_metadata", None) or {}):
            return None
        with warnings.catch_warnings():  # no_dist's "torch.distributed is disabled ... single process": as meant
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            dcp.load({key: io.BytesIO()}, storage_reader=SafeMetadata(str(save)),
                     planner=RawBytes(flatten_state_dict=False), no_dist=True)
    except Refused as refused:
        raise InputError([f"{save}/.metadata: names {refused}, which a checkpoint index has no use for, and was not "
                          f"loaded: give the job's argument file to --from instead"], subject=_SUBJECT) from None
    except (Exception, CheckpointException) as err:  # noqa: BLE001 - CheckpointException is a BaseException
        raise InputError([f"{save}: a torch.distributed.checkpoint save whose {key!r} does not read "
                          f"({type(err).__name__}): give the job's argument file to --from instead"],
                         subject=_SUBJECT) from None
    if not kept:
        return None
    loaded = safe_load(kept[0], name=str(save))
    if isinstance(loaded, io.BytesIO):  # serialised once more (Megatron's torch_dist loader allows both)
        loaded = safe_load(loaded, name=str(save))
    return loaded


class Refused(Exception):
    """A global a checkpoint index may not name (its ``module.name``)."""


class IndexUnpickler(pickle.Unpickler):
    """Unpickles a torch.distributed.checkpoint ``.metadata`` index allowing only what such an index holds: the
    checkpoint module's own classes and enums, torch's Size, dtypes, memory formats and layout decoder, plain
    containers and paths; any other global (a function, another module) raises :class:`Refused` before it is
    imported."""

    def find_class(self, module: str, name: str):
        import torch

        if module.startswith("torch.distributed.checkpoint.") and module.count(".") == 3:
            obj = getattr(importlib.import_module(module), name, None)
            if isinstance(obj, type):
                return obj
        elif module == "torch" and name == "Size":
            return torch.Size
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype | torch.memory_format):
            return getattr(torch, name)
        elif (module, name) in (("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
                                ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"),
                                ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath")):  # the checkpoint's id
            return getattr(importlib.import_module(module), name)
        raise Refused(f"{module}.{name}")


class StandIn:
    """An object of a class autotune does not import, rebuilt from a checkpoint without running its code."""

    qualified_name = "?"

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state):
        self.state = state


def safe_load(source: Path | io.BytesIO, name: str | None = None) -> object:
    """torch.load with the weights-only unpickler; the classes it does not allow become :class:`StandIn`\\ s."""
    import torch

    name = name or str(source)
    try:
        if isinstance(source, io.BytesIO):
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(source)
            source.seek(0)
        else:
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(source))
        allowed = [argparse.Namespace] + [(type(n.rsplit(".", 1)[-1], (StandIn,), {"qualified_name": n}), n)
                                          for n in unsafe if n != "argparse.Namespace"]
        with torch.serialization.safe_globals(allowed):
            if isinstance(source, io.BytesIO):
                return torch.load(source, map_location="cpu", weights_only=True)
            return torch.load(str(source), map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # noqa: BLE001 - a damaged or foreign file raises many kinds
        blocked = re.search(r"unsupported GLOBAL (\S+) whose module \S+ is blocked", str(err))
        if blocked:  # torch's loader refuses even to name it (os, subprocess, ...): nothing of it ran
            raise InputError([f"{name}: names {blocked.group(1)}, code a file of training state has no use for, "
                              f"and was not loaded: give the job's config files to --from instead"],
                             subject=_SUBJECT) from None
        raise InputError([f"{name}: does not read as a torch checkpoint ({type(err).__name__}: "
                          f"{str(err).splitlines()[0][:200] if str(err) else ''}): is the save complete?"],
                         subject=_SUBJECT) from None
