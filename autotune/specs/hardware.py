"""GPUSpec and ClusterSpec: what one accelerator and the machines around it can do.

Bandwidths are per GPU and one direction, in bytes/s inside the code (GB/s = 1e9 B/s in
files and flags). Memory capacities are GiB (2**30 B) as ``nvidia-smi`` reports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from autotune.errors import require_no_problems

__all__ = ["GPUSpec", "ClusterSpec", "Precision", "GIB", "GB"]

Precision = Literal["bf16", "fp16", "fp8"]
GIB = 2**30
GB = 1e9


class _FrozenMapping(dict):
    """A read-only, hashable dict, so specs holding one stay hashable (and cacheable)."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))

    def _readonly(self, *args, **kwargs):
        raise TypeError("GPU peak table is read-only; build a new GPUSpec instead")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _readonly  # type: ignore[assignment]


@dataclass(frozen=True, slots=True, kw_only=True)
class GPUSpec:
    """One accelerator's datasheet numbers (dense, no sparsity)."""

    name: str
    memory_gib: float
    """Device memory as the driver reports it (GiB)."""
    peak_tflops: dict[str, float]
    """Dense peak TFLOP/s per precision (keys among bf16, fp16, fp8, tf32, fp32)."""
    hbm_bandwidth_gb_per_s: float
    source: str = ""
    """Where the numbers come from (datasheet)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "peak_tflops", _FrozenMapping(self.peak_tflops))
        problems = []
        if not self.memory_gib > 0:
            problems.append(f"memory_gib must be > 0, got {self.memory_gib}")
        if not self.peak_tflops or any(not (v > 0) for v in self.peak_tflops.values()):
            problems.append(f"peak_tflops needs at least one precision with a value > 0, got {self.peak_tflops}")
        if not self.hbm_bandwidth_gb_per_s > 0:
            problems.append(f"hbm_bandwidth_gb_per_s must be > 0, got {self.hbm_bandwidth_gb_per_s}")
        require_no_problems(problems, subject=f"gpu '{self.name}'")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    def supports(self, precision: str) -> bool:
        return precision in self.peak_tflops

    def peak_flops_per_s(self, precision: str) -> float:
        return self.peak_tflops[precision] * 1e12


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """Nodes of identical GPUs on a two-level network (NVLink-class inside, IB-class across)."""

    gpu: GPUSpec
    num_nodes: int
    gpus_per_node: int
    intra_node_bandwidth_gb_per_s: float
    """Per GPU, one direction (NVLink 4 on H100: 450)."""
    inter_node_bandwidth_gb_per_s: float
    """Per GPU, one direction (one 400 Gb/s NIC per GPU: 50)."""
    host_memory_gib_per_node: float = 1024.0
    pcie_bandwidth_gb_per_s: float = 25.0
    """GPU <-> host, per GPU, one direction, achievable (PCIe 4 x16 ~25, PCIe 5 x16 ~50)."""
    nvme_bandwidth_gb_per_s: float = 0.0
    """Aggregate NVMe read/write per node; 0 means no NVMe for offload."""
    nvme_capacity_gib_per_node: float = 0.0
    name: str = field(default="")

    def __post_init__(self) -> None:
        problems = []
        for n in ("num_nodes", "gpus_per_node"):
            v = getattr(self, n)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                problems.append(f"{n} must be a positive integer, got {v!r}")
        for n in ("intra_node_bandwidth_gb_per_s", "inter_node_bandwidth_gb_per_s", "host_memory_gib_per_node",
                  "pcie_bandwidth_gb_per_s"):
            if not getattr(self, n) > 0:
                problems.append(f"{n} must be > 0, got {getattr(self, n)}")
        for n in ("nvme_bandwidth_gb_per_s", "nvme_capacity_gib_per_node"):
            if getattr(self, n) < 0:
                problems.append(f"{n} must be >= 0, got {getattr(self, n)}")
        require_no_problems(problems, subject="cluster")

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def host_memory_bytes_per_node(self) -> int:
        return int(self.host_memory_gib_per_node * GIB)

    def to_dict(self) -> dict:
        return {"gpu": self.gpu.name, "num_gpus": self.num_gpus, "gpus_per_node": self.gpus_per_node,
                "num_nodes": self.num_nodes,
                "intra_node_bandwidth_gb_per_s": self.intra_node_bandwidth_gb_per_s,
                "inter_node_bandwidth_gb_per_s": self.inter_node_bandwidth_gb_per_s,
                "host_memory_gib_per_node": self.host_memory_gib_per_node}
