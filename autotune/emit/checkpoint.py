"""Checkpoint settings as the engines' files write them, and pruning old checkpoint tags.

What to save and how often is decided by the checkpoint cost model (``autotune.cost.checkpoint``); this
module only says how DeepSpeed's ``checkpoint`` block and Megatron-LM's flags spell it, and keeps the
newest ``keep_last`` tags on disk (:func:`prune_old_tags`, called by the training scripts).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass

from autotune.errors import InputError

__all__ = ["CheckpointSettings", "prune_old_tags"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSettings:
    """Where, how often and how a plan saves (``autotune.cost.checkpoint.CheckpointPolicy.files()``)."""

    save_dir: str
    interval_steps: int
    async_save: bool
    """True only where the engine saves asynchronously (Megatron torch_dist, torch DCP)."""
    tag_validation: str = "Fail"
    """Abort a save whose tag differs across ranks (a mixed checkpoint cannot be resumed)."""
    parallel_write_pipeline_stage: bool = False
    """DeepSpeed pipeline engine: spread each stage's layer files over its data-parallel ranks."""
    gather_16bit_weights_on_model_save: bool = False
    """ZeRO-3: let ``engine.save_16bit_model()`` write a consolidated 16-bit model (for inference)."""
    load_universal: bool = False
    """DeepSpeed: resume from a universal checkpoint (a fallback plan resuming another layout's saves)."""
    local_interval_steps: int | None = None
    """Tier "local": steps between node-local saves (``interval_steps`` is then the durable saves' interval)."""
    local_dir: str = ""
    local_replication_jump: int = 0
    """Rank spacing of a rank's replica: the ranks of one node, so the replica lives on another node."""

    def ds_checkpoint_block(self, *, load_universal: bool = False) -> dict:
        """The ds_config ``checkpoint`` block (DeepSpeed 0.19.8 keys, runtime/config.py:387-406, 549-553).

        ``load_universal``: resume from a universal checkpoint (after ``ds_to_universal``; see
        ``CheckpointPolicy.resume_command_note``), which loads into a different parallel layout.
        """
        return {"tag_validation": self.tag_validation, "load_universal": load_universal or self.load_universal,
                "use_node_local_storage": False,  # a shared file system: any node can resume any rank
                "parallel_write": {"pipeline_stage": self.parallel_write_pipeline_stage}}

    def ds_zero_options(self) -> dict:
        """Keys these settings add to ``zero_optimization`` (ZeRO-3 only)."""
        if self.gather_16bit_weights_on_model_save:
            return {"stage3_gather_16bit_weights_on_model_save": True}
        return {}

    def megatron_flags(self) -> list[str]:
        """Megatron-LM checkpoint flags. Async needs both flags: without ``--use-persistent-ckpt-worker``
        ``validate_args`` silently drops ``--async-save`` (arguments.py:1817)."""
        flags = ["--save", self.save_dir, "--load", self.save_dir, "--save-interval", str(self.interval_steps),
                 "--ckpt-format", "torch_dist"]
        if self.async_save:
            flags += ["--async-save", "--use-persistent-ckpt-worker"]
        if self.local_interval_steps is not None:
            # Node-local saves with a replica on the next node (megatron/training/arguments.py validate_args: local
            # needs --non-persistent-local-ckpt-dir, --replication needs --replication-jump and type local).
            flags += ["--non-persistent-ckpt-type", "local", "--non-persistent-local-ckpt-dir", self.local_dir,
                      "--non-persistent-save-interval", str(self.local_interval_steps), "--replication",
                      "--replication-jump", str(self.local_replication_jump), "--replication-factor", "2"]
        return flags


# ---- keep_last ------------------------------------------------------------------------------
_TAG_MARKERS = ("model_states.pt", "optim_states.pt", ".metadata", "common.pt")
_LATEST_FILES = ("latest", "latest_universal", "latest_checkpointed_iteration.txt")


def _is_tag(path: str) -> bool:
    """A DeepSpeed tag folder (``*_states.pt``) or a Megatron torch_dist one (``.metadata``, ``common.pt``)."""
    return os.path.isdir(path) and any(f.endswith(_TAG_MARKERS) for f in os.listdir(path))


def _tag_order(save_dir: str, name: str) -> tuple[int, float]:
    """Newer sorts later: the step number at the end of the name (global_step120, iter_0000120), then mtime."""
    match = re.search(r"(\d+)(?:_universal)?$", name)
    return (int(match[1]) if match else -1, os.path.getmtime(os.path.join(save_dir, name)))


def prune_old_tags(save_dir: str, keep_last: int) -> list[str]:
    """Delete all but the newest ``keep_last`` checkpoint tags in ``save_dir``; return the deleted names.

    Call on one rank after every rank has finished saving (a barrier). The tag a ``latest`` file names
    is never deleted. Folders that are not checkpoint tags are left alone.
    """
    if keep_last < 1:
        raise InputError([f"keep_last must be >= 1, got {keep_last}"], subject="checkpoint pruning")
    tags = sorted((n for n in os.listdir(save_dir) if _is_tag(os.path.join(save_dir, n))),
                  key=lambda n: _tag_order(save_dir, n))
    protected = set()
    for name in _LATEST_FILES:
        path = os.path.join(save_dir, name)
        if os.path.isfile(path):
            value = open(path).read().strip()
            protected |= {value, f"iter_{value.zfill(7)}" if value.isdigit() else value}
    doomed = [t for t in tags[:-keep_last] if t not in protected]
    for tag in doomed:
        shutil.rmtree(os.path.join(save_dir, tag))
    return doomed
