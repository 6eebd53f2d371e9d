"""GPUSpec and ClusterSpec: what one accelerator and the machines around it can do.

Bandwidths are per GPU and one direction, in bytes/s inside the code (GB/s = 1e9 B/s in
files and flags). Memory capacities are GiB (2**30 B) as ``nvidia-smi`` reports them.
"""

from __future__ import annotations

import math
import re

from dataclasses import dataclass, field
from typing import Literal

from autotune.errors import require_no_problems

__all__ = ["GPUSpec", "ClusterSpec", "KernelFacts", "Precision", "GIB", "GB", "KERNEL_FACT_FIELDS",
           "OPTIONAL_KERNEL_FACT_FIELDS",
           "kernel_facts_from_dict"]

Precision = Literal["bf16", "fp16", "fp8", "fp4"]
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
class KernelFacts:
    """What real kernels and links reach on one GPU, as fractions of its datasheet numbers (measured, with
    sources, in ``autotune/presets/gpus.yaml``)."""

    gemm_fraction: dict[str, float]
    """Reachable fraction of dense peak for a large, well-shaped GEMM, per precision (cuBLAS, best shape)."""
    attention_fraction: dict[str, float]
    """Fraction of the 16-bit peak a causal attention kernel reaches, per kernel generation ("fa2", "fa3")."""
    hbm_fraction: float
    """Fraction of HBM bandwidth that memory-bound (elementwise, cast, reduction) kernels reach."""
    intra_node_bus_fraction: float
    """NCCL bus bandwidth of large collectives inside a node, as a fraction of the per-GPU link figure."""
    inter_node_bus_fraction: float
    intra_node_latency_us: float
    """Per ring step latency inside a node (small messages are latency-bound)."""
    inter_node_latency_us: float
    sfu_exp_tera_per_s: float | None = None
    """Exponentials per second of the special function units (SASS ``MUFU.EX2``, the softmax's exponential in
    a fused attention kernel), in 1e12/s, from the vendor's table; None: not stated."""
    attention_exp_tera_per_s: float | None = None
    """The ``sfu_exp_tera_per_s`` of the GPU whose attention kernel ``attention_fraction`` describes, where that
    is another GPU (a part whose own attention rate is not measured takes its sibling's): the attention time then
    moves by its exponentials' time at this GPU's rate minus at that one (``autotune.cost.kernels``); None: the
    fraction is this GPU's own."""
    host_issue_factor: float = 1.0
    """The host's time to issue one kernel from PyTorch, as a multiple of an x86 DGX host's (the Xeon hosts of H100 /
    B200 / B300 DGX systems: 1.0): what every eager launch of the step-time model costs on this GPU's host
    (``autotune.cost.launch``). A Grace host (GH200, GB200, GB300) is slower per issued op: Transformer Engine issue
    #2053 measured one ``torch.nn.Linear`` forward's CPU time at 37.08 us on GB200 against 13.48 us on an H100 DGX
    (Xeon Platinum 8480C), 2.75x."""
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "gemm_fraction", _FrozenMapping(self.gemm_fraction))
        object.__setattr__(self, "attention_fraction", _FrozenMapping(self.attention_fraction))
        problems = []
        for name in ("gemm_fraction", "attention_fraction"):
            table = getattr(self, name)
            if not table or any(not (0 < v <= 1) for v in table.values()):
                problems.append(f"kernels.{name} needs at least one entry, each in (0, 1], got {dict(table)}")
        for name in ("hbm_fraction", "intra_node_bus_fraction", "inter_node_bus_fraction"):
            if not 0 < getattr(self, name) <= 1.2:  # NVLS/SHARP all-reduce exceeds the ring figure (482 of 450)
                problems.append(f"kernels.{name} must be in (0, 1.2], got {getattr(self, name)}")
        for name in ("intra_node_latency_us", "inter_node_latency_us"):
            if not 0 <= getattr(self, name) < 1e4:
                problems.append(f"kernels.{name} must be in [0, 1e4) us, got {getattr(self, name)}")
        for name in ("sfu_exp_tera_per_s", "attention_exp_tera_per_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and 0 < value < 1e4):
                problems.append(f"kernels.{name} must be a rate in (0, 1e4) 1e12/s, or absent, got {value!r}")
        factor = self.host_issue_factor
        if isinstance(factor, bool) or not (isinstance(factor, (int, float)) and 0 < factor < 100):
            problems.append(f"kernels.host_issue_factor must be a multiple in (0, 100) of an x86 host's kernel issue "
                            f"time (1.0: x86, 2.75: Grace), got {self.host_issue_factor!r}")
        if self.attention_exp_tera_per_s is not None and self.sfu_exp_tera_per_s is None:
            problems.append("kernels.attention_exp_tera_per_s needs this GPU's own sfu_exp_tera_per_s")
        require_no_problems(problems, subject="gpu kernel facts")

    def gemm(self, precision: str) -> float:
        """Reachable GEMM fraction at ``precision`` (fp16 and bf16 share the tensor cores)."""
        if precision in self.gemm_fraction:
            return self.gemm_fraction[precision]
        twin = {"fp16": "bf16", "bf16": "fp16"}.get(precision)
        if twin in self.gemm_fraction:
            return self.gemm_fraction[twin]
        raise KeyError(precision)

    def attention(self, kernel: str) -> tuple[str, float]:
        """(kernel used, fraction): ``kernel`` if this GPU runs it, else the older generation it falls back to."""
        for name in (kernel, "fa2", *self.attention_fraction):
            if name in self.attention_fraction:
                return name, self.attention_fraction[name]
        raise KeyError(kernel)


KERNEL_FACT_FIELDS = ("gemm_fraction", "attention_fraction", "hbm_fraction", "intra_node_bus_fraction",
                      "inter_node_bus_fraction", "intra_node_latency_us", "inter_node_latency_us")
OPTIONAL_KERNEL_FACT_FIELDS = ("sfu_exp_tera_per_s", "attention_exp_tera_per_s", "host_issue_factor")
"""Kernel facts a GPU may leave out (``KernelFacts``: None; host_issue_factor 1.0, an x86 host)."""


def kernel_facts_from_dict(data: object, gpu_name: str, copy_from: str) -> KernelFacts:
    """KernelFacts from a ``kernels:`` mapping; a clear error naming every missing field and a preset to copy."""
    if not isinstance(data, dict):
        require_no_problems([f"gpu '{gpu_name}' has no kernel facts (kernels: {', '.join(KERNEL_FACT_FIELDS)}): "
                             f"the step-time model needs them and takes no other GPU's silently; copy the "
                             f"kernels: block of preset '{copy_from}' from autotune/presets/gpus.yaml and adjust "
                             f"it, or name the preset with kernels_like: {copy_from}"], subject=f"gpu '{gpu_name}'")
    missing = [f for f in KERNEL_FACT_FIELDS if f not in data]
    unknown = sorted(set(data) - set(KERNEL_FACT_FIELDS) - set(OPTIONAL_KERNEL_FACT_FIELDS) - {"source"})
    problems = [f"kernels: missing {', '.join(missing)} (copy them from preset '{copy_from}' in "
                f"autotune/presets/gpus.yaml)"] if missing else []
    problems += [f"kernels: unknown field {k!r} (known: {', '.join((*KERNEL_FACT_FIELDS, *OPTIONAL_KERNEL_FACT_FIELDS))})"
                 for k in unknown]
    require_no_problems(problems, subject=f"gpu '{gpu_name}'")
    return KernelFacts(**{k: data[k] for k in (*KERNEL_FACT_FIELDS, *OPTIONAL_KERNEL_FACT_FIELDS, "source")
                          if k in data})


@dataclass(frozen=True, slots=True, kw_only=True)
class GPUSpec:
    """One accelerator's datasheet numbers (dense, no sparsity)."""

    name: str
    memory_gib: float
    """Device memory as the driver reports it (GiB)."""
    peak_tflops: dict[str, float]
    """Dense peak TFLOP/s per precision (keys among bf16, fp16, fp8, fp4, tf32, fp32)."""
    hbm_bandwidth_gb_per_s: float
    source: str = ""
    """Where the numbers come from (datasheet)."""
    kernels: KernelFacts | None = None
    """What its kernels and links reach (presets carry them; an inline GPU must give them or name a preset)."""
    compute_capability: str | None = None
    """NVIDIA CUDA compute capability, "major.minor" ("9.0" Hopper, "10.0" Blackwell); None: not an NVIDIA GPU, or
    not stated (rules that need a generation then refuse what they cannot check)."""
    kernels_hint: str = field(default="h100-sxm-80gb", compare=False, repr=False)
    """The preset whose kernel facts an error without them suggests copying (the loader sets the nearest one)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "peak_tflops", _FrozenMapping(self.peak_tflops))
        if isinstance(self.kernels, dict):
            object.__setattr__(self, "kernels", kernel_facts_from_dict(self.kernels, self.name, "h100-sxm-80gb"))
        problems = []
        if not self.memory_gib > 0:
            problems.append(f"memory_gib must be > 0, got {self.memory_gib}")
        if not self.peak_tflops or any(not (v > 0) for v in self.peak_tflops.values()):
            problems.append(f"peak_tflops needs at least one precision with a value > 0, got {self.peak_tflops}")
        if not self.hbm_bandwidth_gb_per_s > 0:
            problems.append(f"hbm_bandwidth_gb_per_s must be > 0, got {self.hbm_bandwidth_gb_per_s}")
        cc = self.compute_capability
        if cc is not None and not (isinstance(cc, str) and re.fullmatch(r"\d{1,2}\.\d", cc)):
            problems.append(f"compute_capability must be a string \"major.minor\" such as \"9.0\", got {cc!r}")
        require_no_problems(problems, subject=f"gpu '{self.name}'")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def capability(self) -> tuple[int, int] | None:
        """:attr:`compute_capability` as (major, minor), None where unstated."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    @property
    def fp8_gemm_any_layout(self) -> bool:
        """Whether its FP8 GEMMs take either operand layout, so a per-tensor-scaled FP8 tensor serves both its
        row-wise and column-wise uses from one copy (no transposed FP8 copy): Transformer Engine d0067d0
        ``pytorch/utils.py`` ``is_non_tn_fp8_gemm_supported`` (compute capability 10.x, 11.x and >= 13.0), read by
        ``csrc/quantizer.cpp`` (``with_transpose = columnwise_usage && !is_non_tn_fp8_gemm_supported``) and
        ``module/base.py`` ``_is_weight_workspace_valid``. False where the capability is not stated."""
        cap = self.capability
        return cap is not None and ((10, 0) <= cap < (12, 0) or cap >= (13, 0))

    def supports(self, precision: str) -> bool:
        return precision in self.peak_tflops

    def peak_flops_per_s(self, precision: str) -> float:
        return self.peak_tflops[precision] * 1e12

    def kernel_facts(self) -> KernelFacts:
        """The kernel facts, or a clear error naming what is missing and a preset to copy them from."""
        if self.kernels is None:
            kernel_facts_from_dict(None, self.name, self.kernels_hint)
        assert self.kernels is not None
        return self.kernels


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
    gpu_mtbf_hours: float | None = None
    """Mean time between unexpected failures of one GPU with its share of host and network; None: the
    checkpoint policy's default (``autotune.emit.options.CheckpointOptions``)."""
    restart_s: float | None = None
    """Seconds from a failure to training again, checkpoint read excluded; None: the policy's default."""
    storage_bandwidth_gb_per_s: float | None = None
    """Checkpoint storage bandwidth, all writers together; None: the policy's default."""
    checkpoint_tier: str | None = None
    """Where checkpoints go: "shared" or "local" (autotune.cost.checkpoint_tiers); None: the policy's default."""
    local_storage_bandwidth_gb_per_s: float | None = None
    """One node's local checkpoint storage bandwidth (tier "local"); None: the policy's default."""
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
        if self.checkpoint_tier not in (None, "shared", "local"):
            problems.append(f"checkpoint_tier must be shared or local, got {self.checkpoint_tier!r}")
        for n, least in (("gpu_mtbf_hours", 0.0), ("restart_s", None), ("storage_bandwidth_gb_per_s", 0.0),
                         ("local_storage_bandwidth_gb_per_s", 0.0)):
            v = getattr(self, n)
            if v is not None and not (math.isfinite(v) and (v > least if least is not None else v >= 0)):
                problems.append(f"{n} must be a finite number {'> 0' if least is not None else '>= 0'}, got {v}")
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
