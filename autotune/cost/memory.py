"""The per-GPU memory ledger of one training step, for the most loaded pipeline stage.

Model states and engine buffers come from the plan's engine (``autotune/engines``, formulas in
``autotune.cost.model_states``); activations from ``autotune.cost.activations``; the overhead (CUDA
context, allocator fragmentation) is added last. Host memory is reported per node.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from autotune.cost.activations import stage_activation_bytes
from autotune.cost.model_states import ModelStateBytes, megatron_grad_bytes
from autotune.specs.hardware import GIB, ClusterSpec
from autotune.specs.layout import representative_stages, stage_layers
from autotune.specs.model import ModelSpec, ParamGroups
from autotune.specs.plan import ParallelPlan

__all__ = ["MemorySettings", "MemoryEstimate", "ModelStateBytes", "estimate_memory", "stage_param_groups",
           "megatron_grad_bytes", "model_state_bytes", "split_scheme", "largest_layer"]


def split_scheme(plan: ParallelPlan) -> str:
    """How the plan's engine splits layers over pipeline stages (``autotune.specs.layout``)."""
    from autotune.engines import engine_for

    return engine_for(plan).support.layer_split


def model_state_bytes(plan: ParallelPlan, dense_params: float, expert_params: float, *,
                      model: ModelSpec | None = None, stage: int = 0) -> ModelStateBytes:
    """Weights, gradients and optimizer states of one GPU, as the plan's engine holds them.

    ``dense_params`` are partitioned over dp*cp ranks, ``expert_params`` over dp*cp/ep ranks. With
    ``model`` the engine may use the exact tensor layout of ``stage`` (DeepSpeed ZeRO-1/2 slices)."""
    from autotune.engines import engine_for

    return engine_for(plan).model_states(model, plan, stage, dense_params, expert_params)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemorySettings:
    """Engine settings and overheads the ledger needs. Defaults are DeepSpeed's and Megatron's."""

    reduce_bucket_size: int = 500_000_000
    """DeepSpeed ``zero_optimization.reduce_bucket_size`` (elements)."""
    allgather_bucket_size: int = 500_000_000
    """DeepSpeed ``zero_optimization.allgather_bucket_size`` (elements)."""
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_max_live_parameters: int = 1_000_000_000
    cuda_context_bytes: int | None = None
    """CUDA context, cuBLAS/cuDNN workspaces and NCCL communicator buffers. None: 1 GiB on a
    GPU (a CUDA 12 context is ~0.5 GiB on H100, NCCL's buffers a few hundred MiB), 0 on ``cpu``."""
    fragmentation_fraction: float = 0.05
    """Allocator fragmentation as a fraction of all tensor bytes (PyTorch caching allocator;
    typically 2-10%, worse with varying shapes)."""
    offload_buffer_bytes: int = 5 * 100_000_000 * 2
    """Pinned host/GPU buffers of NVMe offload: ``buffer_count`` 5 x ``buffer_size`` 1e8 x 2 B."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """Per-GPU memory of the most loaded pipeline stage, in bytes (the contract's ``memory`` block)."""

    weights: float
    gradients: float
    optimizer_states: float
    activations: float
    buffers: float
    overhead: float
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

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer_states + self.activations + self.buffers + self.overhead

    @property
    def fits_gpu(self) -> bool:
        return self.total <= self.capacity

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
        return {"weights": self.weights, "gradients": self.gradients, "optimizer_states": self.optimizer_states,
                "activations": self.activations, "buffers": self.buffers, "overhead": self.overhead}

    def to_dict(self) -> dict:
        out = {k: int(round(v)) for k, v in self.terms().items()}
        out.update(total=int(round(self.total)), capacity=int(self.capacity), fits=self.fits,
                   host_per_node=int(round(self.host_per_node)), nvme_per_node=int(round(self.nvme_per_node)),
                   stage=self.stage, fits_gpu=self.fits_gpu, fits_host=self.fits_host,
                   activation_parts={k: int(round(v)) for k, v in self.activation_parts.items()},
                   buffer_parts={k: int(round(v)) for k, v in self.buffer_parts.items()})
        return out


def stage_param_groups(model: ModelSpec, plan: ParallelPlan, stage: int) -> ParamGroups:
    """Parameters of pipeline stage ``stage`` (layers split as the engine does, embedding first, output last)."""
    return _stage_param_groups(model, plan.pp, stage, split_scheme(plan))


@functools.lru_cache(maxsize=4096)
def _stage_param_groups(model: ModelSpec, pp: int, stage: int, scheme: str = "megatron") -> ParamGroups:
    first, count = stage_layers(model.num_layers, pp, stage, scheme)
    return model.stage_params(first, count, has_embedding=stage == 0, has_output=stage == pp - 1)


@functools.lru_cache(maxsize=256)
def largest_layer(model: ModelSpec) -> ParamGroups:
    return max((model.layer_params(i) for i in range(model.num_layers)), key=lambda g: g.total)


def _common_buffer_bytes(plan: ParallelPlan, groups: ParamGroups, settings: MemorySettings) -> dict[str, float]:
    """Buffers whatever the engine: the FP8 weight cache and NVMe staging."""
    out: dict[str, float] = {}
    if plan.precision == "fp8":
        # Transformer Engine caches each GEMM weight in FP8, row- and column-wise (2 x 1 byte).
        out["fp8_weight_cache"] = 2 * groups.tp_sharded / plan.tp + 2 * groups.expert / (plan.ep * plan.tp)
    if "nvme" in (plan.offload_optimizer, plan.offload_param):
        out["nvme_staging"] = float(settings.offload_buffer_bytes)
    return out


def _overhead_bytes(cluster: ClusterSpec, settings: MemorySettings, tensor_bytes: float) -> float:
    context = settings.cuda_context_bytes
    if context is None:
        context = 0 if cluster.gpu.name == "cpu" else GIB
    return context + settings.fragmentation_fraction * tensor_bytes


def estimate_memory(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                    settings: MemorySettings | None = None) -> MemoryEstimate:
    """The per-GPU ledger of the most loaded pipeline stage (the first or the last).

    The plan is assumed valid (see ``autotune.specs.rules``); every term is finite and >= 0.
    """
    from autotune.engines import engine_for

    settings = settings or MemorySettings()
    engine = engine_for(plan)
    candidates = []
    for stage in representative_stages(model.num_layers, plan.pp, engine.support.layer_split):
        groups = stage_param_groups(model, plan, stage)
        dense = groups.tp_sharded / plan.tp + groups.replicated
        expert = groups.expert / (plan.ep * plan.tp)
        states = engine.model_states(model, plan, stage, dense, expert)
        activation_parts = stage_activation_bytes(model, plan, stage)
        if states.step_transient > sum(activation_parts.values()):
            # The optimizer step, not backward, is the peak: activations are gone, fp32 grads are not.
            activation_parts = {"optimizer_step_fp32_gradients": states.step_transient}
        buffer_parts = engine.buffers(model, plan, groups, settings) | _common_buffer_bytes(plan, groups, settings)
        tensors = states.weights + states.gradients + states.optimizer_states + sum(activation_parts.values()) \
            + sum(buffer_parts.values())
        candidates.append((tensors, stage, states, activation_parts, buffer_parts))
    tensors, stage, states, activation_parts, buffer_parts = max(candidates, key=lambda c: c[0])

    # Host memory per node: every GPU of a node offloads its own partition (worst stage assumed for all).
    host_per_gpu = states.host_weights + states.host_gradients + states.host_optimizer_states + states.host_buffers
    if "nvme" in (plan.offload_optimizer, plan.offload_param):
        host_per_gpu += settings.offload_buffer_bytes
    return MemoryEstimate(
        weights=states.weights,
        gradients=states.gradients,
        optimizer_states=states.optimizer_states,
        activations=sum(activation_parts.values()),
        buffers=sum(buffer_parts.values()),
        overhead=_overhead_bytes(cluster, settings, tensors),
        capacity=float(cluster.gpu.memory_bytes),
        stage=stage,
        host_per_node=host_per_gpu * cluster.gpus_per_node,
        nvme_per_node=states.nvme * cluster.gpus_per_node,
        host_capacity_per_node=float(cluster.host_memory_bytes_per_node),
        activation_parts=activation_parts,
        buffer_parts=buffer_parts,
        offloaded=states,
    )
