"""Collective communication on a two-level network (NVLink-class in a node, IB-class across).

Ring algorithms (Thakur et al. 2005; NCCL's bus-bandwidth convention): for a buffer of
``M`` bytes over ``n`` ranks, all-gather and reduce-scatter move ``(n-1)/n * M`` bytes per
rank in ``n-1`` steps, all-reduce twice that. Time = volume / bus bandwidth + steps x latency.

Placement follows Megatron's rank order (tp innermost, then cp, then dp/ep, then pp): a
group whose members are ``stride`` ranks apart stays inside a node when
``size * stride <= gpus_per_node``; otherwise it crosses nodes. Across nodes each GPU has its own NIC
(rail-optimised); when ``g`` members share a node, NCCL moves only 1/g of the data per GPU over the
NICs (the rest over NVLink), so the bus bandwidth is ``g x NIC`` (nccl-tests: 4 nodes of 8 x 50 GB/s
B200 reach 377 GB/s, 8 H200 nodes' rings 365 GB/s), capped by the node's own bus bandwidth.
Bus fractions and per-step latencies are the GPU's kernel facts (``gpus.yaml`` ``kernels:``).

That aggregate holds for the ring collectives only. An all-to-all (MoE token dispatch, Ulysses) sends each peer
its own share: the share for the ``g - 1`` peers in the node moves over NVLink, the share for the ``n - g`` peers
on other nodes through the GPU's own NIC, both at once, so the NIC bounds it at ``(n - g)/n x M / NIC``. A
point-to-point send (pipeline stages, the context-parallel ring) that crosses nodes has one NIC too.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.cost.efficiency import Efficiency
from autotune.specs.hardware import GB, ClusterSpec

__all__ = ["Link", "group_link", "all_reduce_s", "all_gather_s", "reduce_scatter_s", "all_to_all_s", "p2p_s"]


@dataclass(frozen=True, slots=True)
class Link:
    """Achievable bus bandwidth (bytes/s per GPU, one direction) and per-step latency of a group."""

    bandwidth_bytes_per_s: float
    latency_s: float
    crosses_nodes: bool
    nic_bytes_per_s: float = 0.0
    """One GPU's NIC (achievable, one direction); 0 inside a node."""
    nvlink_bytes_per_s: float = 0.0
    """One GPU's NVLink-class bus bandwidth (achievable); 0: ``bandwidth_bytes_per_s``."""
    ranks_per_node: int = 0
    """Members of the group in one node; 0: all of them (a group inside a node)."""


_link_cache: dict[tuple, tuple[ClusterSpec, Efficiency, Link]] = {}


def group_link(cluster: ClusterSpec, eff: Efficiency, size: int, stride: int) -> Link:
    """The link a group of ``size`` ranks, ``stride`` ranks apart, communicates over (cached: the planner asks
    for the same few groups of every plan)."""
    key = (id(cluster), id(eff), size, stride)  # ids: the specs hash slowly (and are frozen)
    hit = _link_cache.get(key)
    if hit is None or hit[0] is not cluster or hit[1] is not eff:
        if len(_link_cache) > 4096:
            _link_cache.clear()
        hit = _link_cache[key] = (cluster, eff, _group_link(cluster, eff, size, stride))
    return hit[2]


def _group_link(cluster: ClusterSpec, eff: Efficiency, size: int, stride: int) -> Link:
    kf = cluster.gpu.kernel_facts()
    intra = cluster.intra_node_bandwidth_gb_per_s * GB * kf.intra_node_bus_fraction * eff.link_efficiency
    if size <= 1 or size * stride <= cluster.gpus_per_node:
        return Link(intra, kf.intra_node_latency_us * 1e-6, False)
    per_node = max(1, min(size, cluster.gpus_per_node // max(1, stride)))
    inter = cluster.inter_node_bandwidth_gb_per_s * GB * kf.inter_node_bus_fraction * eff.link_efficiency
    return Link(min(intra, per_node * inter), kf.inter_node_latency_us * 1e-6, True, nic_bytes_per_s=inter,
                nvlink_bytes_per_s=intra, ranks_per_node=per_node)


def all_gather_s(num_bytes: float, n: int, link: Link) -> float:
    """All-gather of a ``num_bytes`` result over ``n`` ranks (reduce-scatter costs the same)."""
    if n <= 1 or num_bytes <= 0:
        return 0.0
    return (n - 1) / n * num_bytes / link.bandwidth_bytes_per_s + (n - 1) * link.latency_s


reduce_scatter_s = all_gather_s


def all_reduce_s(num_bytes: float, n: int, link: Link) -> float:
    """Ring all-reduce = reduce-scatter + all-gather."""
    return 2 * all_gather_s(num_bytes, n, link)


def all_to_all_s(num_bytes: float, n: int, link: Link) -> float:
    """All-to-all where each rank holds ``num_bytes`` and keeps 1/n of it: across nodes the NVLink share and the
    NIC share move at once, the slower bounds it (module docstring)."""
    if n <= 1 or num_bytes <= 0:
        return 0.0
    steps = (n - 1) * link.latency_s
    if not link.crosses_nodes or link.nic_bytes_per_s <= 0:
        return (n - 1) / n * num_bytes / link.bandwidth_bytes_per_s + steps
    local = max(1, min(n, link.ranks_per_node))
    nvlink = (local - 1) / n * num_bytes / (link.nvlink_bytes_per_s or link.bandwidth_bytes_per_s)
    return max(nvlink, (n - local) / n * num_bytes / link.nic_bytes_per_s) + steps


def p2p_s(num_bytes: float, link: Link) -> float:
    """One point-to-point send (pipeline activations or their gradients)."""
    if num_bytes <= 0:
        return 0.0
    one_link = min(link.bandwidth_bytes_per_s, link.nic_bytes_per_s) if link.crosses_nodes and \
        link.nic_bytes_per_s > 0 else link.bandwidth_bytes_per_s
    return num_bytes / one_link + link.latency_s
