"""The per-GPU memory ledger's result (``autotune.cost.memory.estimate_memory`` builds it): the contract's ``memory``
block, its three peaks (allocated, reserved, the device total) and whether it fits."""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.engines.states import ModelStateBytes

__all__ = ["MemoryEstimate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """Per-GPU memory of the most loaded pipeline stage, in bytes (the contract's ``memory`` block)."""

    weights: float
    gradients: float
    optimizer_states: float
    activations: float
    """The backward peak's saved activations (and the transient of the largest op)."""
    buffers: float
    overhead: float
    """Allocator reserve beyond allocated (none with expandable segments), CUDA context and NCCL buffers."""
    capacity: float
    stage: int
    """Index of the most loaded pipeline stage."""
    host_per_node: float
    """Host memory the offloaded states (and pinned buffers) take per node."""
    nvme_per_node: float
    host_capacity_per_node: float
    activation_parts: dict[str, float] = field(default_factory=dict)
    buffer_parts: dict[str, float] = field(default_factory=dict)
    offloaded: ModelStateBytes | None = None
    optimizer_step: float = 0.0
    """What the optimizer step's peak (fp32 gradient copies, activations freed) adds beyond the activations."""
    reserve: float = 0.0
    """Caching-allocator bytes reserved beyond the allocated peak (part of ``overhead`` unless ``expandable_segments``)."""
    expandable_segments: bool = False
    """The allocator setting this ledger assumes (``MemorySettings.expandable_segments``): the run must set
    ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (the emitted launch scripts export it) for ``fits`` to hold."""

    @property
    def allocated(self) -> float:
        """Peak bytes of live tensors (``torch.cuda.max_memory_allocated``)."""
        return (self.weights + self.gradients + self.optimizer_states + self.activations + self.optimizer_step
                + self.buffers)

    @property
    def reserved(self) -> float:
        """Peak bytes the caching allocator holds (``torch.cuda.max_memory_reserved``)."""
        return self.allocated + self.reserve

    @property
    def total(self) -> float:
        """The device total (``nvidia-smi``): reserved plus CUDA context and NCCL buffers."""
        return self.allocated + self.overhead

    @property
    def fits_gpu(self) -> bool:
        return self.total <= self.capacity

    @property
    def cache_bound(self) -> bool:
        """Over the GPU's capacity only by the allocator's reserve: the tensors, the CUDA context and NCCL's buffers
        fit, the reserve (``fragmentation_fraction`` of the tensors, as unpressed runs hold it) does not. Such a run
        fits with expandable segments (``MemorySettings.expandable_segments``); without them it depends on how much
        of the reserve is free space inside segments still in use: before it reports out of memory, PyTorch's
        allocator frees cached blocks large enough, then every wholly free ("non-split") segment, and retries
        (PyTorch c10/cuda/CUDACachingAllocator.cpp, ``DeviceCachingAllocator::malloc``:
        ``release_available_cached_blocks`` then ``release_cached_blocks``), a share the reserve's fit (on runs nothing pressed) does not measure."""
        return not self.fits_gpu and not self.expandable_segments and self.total - self.reserve <= self.capacity

    @property
    def fits_host(self) -> bool:
        return self.host_per_node <= self.host_capacity_per_node

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_host

    @property
    def headroom(self) -> float:
        return self.capacity - self.total

    def terms(self) -> dict[str, float]:
        out = {"weights": self.weights, "gradients": self.gradients, "optimizer_states": self.optimizer_states,
               "activations": self.activations}
        if self.optimizer_step:
            out["optimizer_step"] = self.optimizer_step
        out.update(buffers=self.buffers, overhead=self.overhead)
        return out

    def to_dict(self) -> dict:
        out = {k: int(round(v)) for k, v in self.terms().items()}
        out.update(total=int(round(self.total)), capacity=int(self.capacity), fits=self.fits,
                   host_per_node=int(round(self.host_per_node)), nvme_per_node=int(round(self.nvme_per_node)),
                   stage=self.stage, fits_gpu=self.fits_gpu, fits_host=self.fits_host,
                   optimizer_step=int(round(self.optimizer_step)), allocated=int(round(self.allocated)),
                   reserved=int(round(self.reserved)), expandable_segments=self.expandable_segments,
                   fits_with_expandable_segments=self.fits_host and (self.fits_gpu or self.cache_bound),
                   total_is="device total as nvidia-smi shows it: reserved "
                   "(caching allocator) + CUDA context + NCCL buffers",
                   activation_parts={k: int(round(v)) for k, v in self.activation_parts.items()},
                   buffer_parts={k: int(round(v)) for k, v in self.buffer_parts.items()})
        return out
