"""Where checkpoints are written and read back, and what a restart costs at a given world size.

Two tiers:

- ``shared``: a parallel file system every node reaches (Lustre, GPFS, a cloud file store). Every save is
  durable; writes and reads share its aggregate bandwidth (``CheckpointOptions.storage_bandwidth_gb_per_s``).
- ``local``: each node writes its ranks' shards to its own storage (NVMe) and sends a replica to a peer node, so
  losing one node loses no checkpoint; saves are frequent and cheap, and a restart reads from local storage in
  parallel on every node (the replaced node fetches its shards from the peer). Durable saves to the shared
  tier still happen, less often, for what a node-local copy cannot survive (losing a node and its replica, a
  job moved to other nodes). Megatron-LM spells it ``--non-persistent-ckpt-type local
  --non-persistent-local-ckpt-dir DIR --non-persistent-save-interval N --replication --replication-jump J
  --replication-factor 2`` (megatron/training/arguments.py and config/training_config.py at d98e8a6; the local
  checkpoint manager comes from nvidia-resiliency-ext). An engine lists the tiers it can use in
  ``Engine.checkpoint_tiers``.

Restart at a world size: the rendezvous before any collective is a TCPStore every rank connects to. PyTorch
measured its initialisation with the libuv backend (the default since 2.4) from 1,024 to 98,304 ranks:
100 s at 96K ranks, where the legacy backend timed out after 30 min (pytorch/tutorials,
intermediate_source/TCPStore_libuv_backend.rst). :func:`rendezvous_s` scales that figure linearly with the rank
count (the server accepts connections one by one), which makes it ~17 s at 16,384 ranks and ~1 s at 1,024.
NCCL communicators are created lazily at each group's first collective and are not counted separately.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.emit.options import CheckpointOptions
from autotune.engines import ENGINES, engine_for
from autotune.errors import InputError
from autotune.specs.hardware import GB

__all__ = ["REPLICATION_FACTOR", "rendezvous_s", "LocalTier", "local_tier", "local_tier_problems", "local_tier_for"]

REPLICATION_FACTOR = 2
"""Copies of each node's shards on distinct nodes (Megatron-LM's ``--replication-factor`` default)."""
TCPSTORE_INIT_S = 100.0
TCPSTORE_INIT_RANKS = 98_304
"""TCPStore initialisation, libuv backend: 100 s at 98,304 ranks (PyTorch's published benchmark, above)."""


def rendezvous_s(world_size: int) -> float:
    """Seconds for every rank to join the job's TCPStore (linear in the rank count, see the module text)."""
    return TCPSTORE_INIT_S * world_size / TCPSTORE_INIT_RANKS


@dataclass(frozen=True, slots=True)
class LocalTier:
    """What a save and a load cost on node-local storage with a peer replica (seconds, bytes)."""

    node_bytes: float
    """Every local rank's shard: what one node writes, replicates and reads back."""
    write_s: float
    """Writing ``node_bytes`` at the node's local storage bandwidth."""
    replicate_s: float
    """Sending the replica to the peer node over the node's network links."""
    load_s: float
    """Reading back after a restart: local storage on the surviving nodes, the network for the replaced one."""
    replication_jump: int
    """Rank spacing between a rank and its replica: one node's worth of ranks puts it on the next node."""

    @property
    def persist_s(self) -> float:
        return self.write_s + self.replicate_s


def local_tier_problems(*, num_nodes: int, local_bandwidth_gb_per_s: float) -> list[str]:
    """Why the local tier cannot hold this job's checkpoints (empty: it can)."""
    out = []
    if num_nodes < REPLICATION_FACTOR or num_nodes % REPLICATION_FACTOR:
        out.append(f"checkpoint tier 'local' keeps a replica of each node's checkpoint on another node "
                   f"(replication factor {REPLICATION_FACTOR}): it needs a node count divisible by "
                   f"{REPLICATION_FACTOR}, got {num_nodes} node(s)")
    if not local_bandwidth_gb_per_s > 0:
        out.append(f"local_storage_bandwidth_gb_per_s must be > 0, got {local_bandwidth_gb_per_s}")
    return out


def local_tier(*, per_rank_bytes: float, gpus_per_node: int, local_bandwidth_gb_per_s: float,
               inter_node_bandwidth_gb_per_s: float) -> LocalTier:
    """The local tier's figures for a node of ``gpus_per_node`` ranks each holding ``per_rank_bytes``."""
    node_bytes = gpus_per_node * per_rank_bytes
    network = gpus_per_node * inter_node_bandwidth_gb_per_s * GB  # a NIC per GPU, one direction
    write_s = node_bytes / (local_bandwidth_gb_per_s * GB)
    replicate_s = (REPLICATION_FACTOR - 1) * node_bytes / network
    return LocalTier(node_bytes=node_bytes, write_s=write_s, replicate_s=replicate_s,
                     load_s=max(write_s, node_bytes / network), replication_jump=gpus_per_node)


def local_tier_for(options: CheckpointOptions, estimate, per_rank_bytes: float) -> LocalTier | str:
    """The local tier's figures where the plan can use it. Where it cannot (the engine, the node count): an
    InputError when the tier was asked for (``options.tier_required``: a flag), else the reason as a note (the
    cluster file offers local storage; the plan saves to the shared tier)."""
    plan, cluster = estimate.plan, estimate.cluster
    engine = engine_for(plan)
    nodes = plan.world_size // cluster.gpus_per_node
    problems = local_tier_problems(num_nodes=nodes, local_bandwidth_gb_per_s=options.local_storage_bandwidth_gb_per_s)
    if "local" not in engine.checkpoint_tiers:
        able = [e.title for e in ENGINES.values() if "local" in e.checkpoint_tiers]
        problems.insert(0, f"checkpoint tier 'local' (node-local storage with a peer replica): the {engine.title} "
                           f"engine's files cannot use it, only {', '.join(able)}'s")
    if problems and options.tier_required:
        raise InputError([*problems, "use tier 'shared' (--checkpoint-tier shared), a parallel file system every "
                                     "node reaches"], subject="checkpoint policy")
    if problems:  # the cluster file offers local storage; this plan cannot use it
        return f"Checkpoint tier shared: the cluster offers local storage, but {problems[0]}."
    return local_tier(per_rank_bytes=per_rank_bytes, gpus_per_node=cluster.gpus_per_node,
                      local_bandwidth_gb_per_s=options.local_storage_bandwidth_gb_per_s,
                      inter_node_bandwidth_gb_per_s=cluster.inter_node_bandwidth_gb_per_s)
