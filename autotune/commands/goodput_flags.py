"""The goodput flags of ``plan`` / ``estimate`` / ``emit``: failures, restarts and checkpoint storage, read into
``CheckpointOptions`` (``autotune.cost.goodput``); re-exported by :mod:`autotune.commands`."""

from __future__ import annotations

import argparse

__all__ = ["add_goodput", "add_reliability_flags", "reliability_flags", "goodput_inputs"]


def add_goodput(p: argparse.ArgumentParser) -> None:
    """Failure and checkpoint inputs of the goodput figures (``autotune.cost.goodput``)."""
    g = p.add_argument_group("goodput: failures, restarts and checkpoints")
    add_reliability_flags(g)
    g.add_argument("--no-async-save", action="store_true", help="blocking checkpoint writes (default: asynchronous "
                   "where the engine saves so: Megatron torch_dist, torch DCP)")


def add_reliability_flags(g) -> None:
    """The failure, restart and checkpoint-storage flags (``plan``/``estimate --objective goodput`` and ``emit``);
    :func:`reliability_flags` reads them. Defaults: the cluster file's figures, else CheckpointOptions'."""
    g.add_argument("--gpu-mtbf-hours", type=float, help="mean time between unexpected failures of one GPU with its "
                   "share of host and network; the job's MTBF is this over the GPU count (default: the cluster "
                   "file's, else 50000: Llama 3's 419 in 54 days on 16,384 GPUs)")
    g.add_argument("--restart-s", type=float, help="seconds from a failure to training again, checkpoint read and "
                   "rendezvous excluded: requeue, node replacement, process start (default: the cluster file's, else "
                   "300, assumed; the rendezvous is modelled from the rank count)")
    g.add_argument("--storage-gb-per-s", type=float, help="checkpoint storage bandwidth, all writers together "
                   "(default: the cluster file's, else 5)")
    g.add_argument("--checkpoint-tier", choices=("shared", "local"), help="where checkpoints go: shared (a parallel "
                   "file system) or local (node-local storage with a replica on a peer node, durable saves to the "
                   "shared tier less often; Megatron-LM only) (default: the cluster file's, else shared)")
    g.add_argument("--local-storage-gb-per-s", type=float, help="one node's local checkpoint storage bandwidth, "
                   "tier local (default: the cluster file's, else 10)")


def reliability_flags(args: argparse.Namespace) -> dict:
    """The CheckpointOptions fields :func:`add_reliability_flags`' flags set (only those given)."""
    pairs = (("gpu_mtbf_hours", args.gpu_mtbf_hours), ("relaunch_s", args.restart_s),
             ("storage_bandwidth_gb_per_s", args.storage_gb_per_s), ("tier", args.checkpoint_tier),
             ("local_storage_bandwidth_gb_per_s", args.local_storage_gb_per_s))
    return {k: v for k, v in pairs if v is not None}


def goodput_inputs(args: argparse.Namespace, cluster):
    """CheckpointOptions from :func:`add_goodput`'s flags, else the cluster file's figures, else the defaults
    (ranges: :func:`flag_problems`)."""
    from autotune.cost.checkpoint import options_for_cluster
    from autotune.emit.options import CheckpointOptions

    given = reliability_flags(args)
    options = CheckpointOptions(**given, async_save=not args.no_async_save)
    return options_for_cluster(options, cluster, explicit=set(given))
