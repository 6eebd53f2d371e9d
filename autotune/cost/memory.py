"""The per-GPU memory ledger of one training step, for the most loaded pipeline stage.

Model states follow the ZeRO paper (Rajbhandari et al. 2020, Sec. 3.1 and 5): mixed-precision
Adam keeps 2 bytes of 16-bit weights, 2 bytes of 16-bit gradients and K=12 bytes of fp32
master weights, momentum and variance per parameter; ZeRO-1 partitions the K bytes over the
Nd data-parallel ranks, ZeRO-2 the gradients too, ZeRO-3 the weights too. What each engine
actually holds (measured on DeepSpeed 0.19.8, see ``tests/cost/test_ledger_vs_deepspeed.py``):

  DeepSpeed ZeRO-0 (bf16/fp16): 2 + 2 + K, unpartitioned (FP16_UnfusedOptimizer keeps fp32 master).
  DeepSpeed ZeRO-1/2: 2 + 2/Nd + K/Nd: stage_1_and_2.py reduces each gradient bucket into the
      rank's partition at once, so even ZeRO-1 keeps only a gradient partition after backward.
  DeepSpeed ZeRO-3: 2/Nd + 2/Nd + K/Nd, plus an eagerly allocated reduce bucket of
      ``reduce_bucket_size`` elements and the gathered (live) parameters of the running layers.
  Megatron-core (DDP + optimizer): 2 + 4 + K, gradients accumulated in an fp32 main-grad
      buffer; with the distributed optimizer (zero_stage=1) 2 + 4 + K/Nd ("6 + 12/d" bytes in
      Megatron's theoretical_memory_usage.py).

Offload (ZeRO-Offload / ZeRO-Infinity): optimizer offload moves the K bytes and an fp32 copy
of the gradient partition (4/Nd) to host memory (or NVMe); parameter offload (ZeRO-3) moves
the 16-bit weight partition. Host bytes are reported per node.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from autotune.cost.activations import stage_activation_bytes
from autotune.specs.hardware import GIB, ClusterSpec
from autotune.specs.layout import representative_stages, stage_layers
from autotune.specs.model import ModelSpec, ParamGroups
from autotune.specs.plan import OPTIMIZER_STATE_BYTES, ParallelPlan

__all__ = ["MemorySettings", "MemoryEstimate", "ModelStateBytes", "estimate_memory", "stage_param_groups", "megatron_grad_bytes",
           "model_state_bytes"]


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


@functools.lru_cache(maxsize=4096)
def _ds_zero12_grad_elements(model: ModelSpec, pp: int, stage: int, tp: int, nd: int) -> float:
    """Gradient elements the most loaded rank of a DeepSpeed ZeRO-1/2 partitioning holds (dense params).

    DeepSpeed 0.19.8 (stage_1_and_2.py, ``get_partition_info`` and ``grads_in_partition``) flattens the
    parameters in module order, pads the total to a multiple of 2 * nd, gives each rank an equal slice,
    and sizes a rank's gradient buffer by the *whole* element count of every parameter that starts in
    its slice or straddles its start: a tensor crossing a slice boundary is held whole by both ranks.
    """
    first, count = stage_layers(model.num_layers, pp, stage)
    tensors = [n / tp if kind == "tp_sharded" else float(n)
               for n, kind in model.stage_tensors(first, count, has_embedding=stage == 0, has_output=stage == pp - 1)
               if kind != "expert"]
    total = sum(tensors)
    if nd == 1:
        return total
    align = 2 * nd
    part = math.ceil(total / align) * align / nd
    held = [0.0] * nd
    start = 0.0
    for size in tensors:
        end = start + size
        owner = min(int(start // part), nd - 1)
        held[owner] += size  # the rank whose slice the tensor starts in
        r = owner + 1
        while r < nd and r * part < end:  # ranks whose slice starts inside the tensor
            held[r] += size
            r += 1
        start = end
    return max(held)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelStateBytes:
    """Bytes of weights, gradients and optimizer states one GPU's rank owns, by where they live."""

    weights: float
    gradients: float
    optimizer_states: float
    host_weights: float = 0.0
    host_gradients: float = 0.0
    host_optimizer_states: float = 0.0
    host_buffers: float = 0.0
    """Pinned host staging DeepSpeed keeps for offload (ZeRO-1/2: a 16-bit copy of the partition)."""
    nvme: float = 0.0
    step_transient: float = 0.0
    """Extra bytes on the GPU while the optimizer steps (fp32 gradient copies); activations are freed then."""


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
    """Parameters of pipeline stage ``stage`` (layers split evenly, embedding first, output last)."""
    return _stage_param_groups(model, plan.pp, stage)


@functools.lru_cache(maxsize=4096)
def _stage_param_groups(model: ModelSpec, pp: int, stage: int) -> ParamGroups:
    first, count = stage_layers(model.num_layers, pp, stage)
    return model.stage_params(first, count, has_embedding=stage == 0, has_output=stage == pp - 1)


@functools.lru_cache(maxsize=256)
def _largest_layer(model: ModelSpec) -> ParamGroups:
    return max((model.layer_params(i) for i in range(model.num_layers)), key=lambda g: g.total)


def megatron_grad_bytes(plan: ParallelPlan) -> int:
    """Megatron accumulates and reduces gradients in fp32 ``main_grad`` buffers with bf16 (arguments.py
    forces ``accumulate_allreduce_grads_in_fp32`` for bf16), in 16 bits with fp16 by default."""
    return 2 if plan.precision == "fp16" else 4


def model_state_bytes(plan: ParallelPlan, dense_params: float, expert_params: float,
                      dense_grad_elements: float | None = None) -> ModelStateBytes:
    """Weights, gradients and optimizer states of one GPU (ZeRO paper Sec. 5; engine notes in the module doc).

    ``dense_params`` are partitioned over dp*cp ranks, ``expert_params`` over dp*cp/ep ranks.
    ``dense_grad_elements``: the dense gradient elements a DeepSpeed ZeRO-1/2 rank holds, if known
    (see ``_ds_zero12_grad_elements``); default: an exact 1/Nd share.
    """
    k = OPTIMIZER_STATE_BYTES[plan.optimizer]
    n_dense = plan.zero_partitions
    n_expert = max(1, plan.zero_partitions // plan.ep)
    psi = dense_params + expert_params
    # Parameters as seen by a partitioning of nd ranks (dense and expert partitioned separately).
    psi_part = dense_params / n_dense + expert_params / n_expert
    z = plan.zero_stage

    if plan.framework == "megatron":
        weights, grads = 2 * psi, megatron_grad_bytes(plan) * psi
        opt = k * (psi_part if z >= 1 else psi)
        return ModelStateBytes(weights=weights, gradients=grads, optimizer_states=opt)

    weights = 2 * (psi_part if z == 3 else psi)
    grads = 2 * (psi_part if z >= 1 else psi)
    if z in (1, 2) and dense_grad_elements is not None:
        grads = 2 * (dense_grad_elements + expert_params / n_expert)
    opt = k * (psi_part if z >= 1 else psi)
    # At the optimizer step DeepSpeed makes fp32 copies of the gradients it steps on (measured, 0.19.8):
    # ZeRO-0 all of them (+4 B/param); ZeRO-1/2 the partition, replacing the 16-bit one; ZeRO-3 the partition.
    transient = {0: 4 * psi, 1: 4 * psi_part - grads, 2: 4 * psi_part - grads, 3: 4 * psi_part}[z]
    host_w = host_g = host_o = host_buf = nvme = 0.0
    if plan.offload_optimizer != "none":
        # ZeRO-Offload: fp32 gradient partition and optimizer states in host memory; the GPU keeps only
        # the reduce buckets (counted under buffers). ZeRO-3 also keeps its 16-bit gradient partition on
        # the host; ZeRO-1/2 a 16-bit copy of the weight partition for the all-gather (measured).
        host_g, grads, transient = (6 if z == 3 else 4) * psi_part, 0.0, 0.0
        if z in (1, 2):
            host_buf = 2 * psi_part
        if plan.offload_optimizer == "nvme":
            nvme, opt = opt, 0.0
        else:
            host_o, opt = opt, 0.0
    if plan.offload_param != "none":
        if plan.offload_param == "nvme":
            nvme += weights
        else:
            host_w = weights
        weights = 0.0
    return ModelStateBytes(weights=weights, gradients=grads, optimizer_states=opt, host_weights=host_w,
                           host_gradients=host_g, host_optimizer_states=host_o, host_buffers=host_buf, nvme=nvme,
                           step_transient=max(0.0, transient))


def _buffer_bytes(model: ModelSpec, plan: ParallelPlan, groups: ParamGroups, settings: MemorySettings) -> dict[str, float]:
    """Communication and engine buffers on one GPU (DeepSpeed buckets, ZeRO-3 live parameters, FP8 casts)."""
    out: dict[str, float] = {}
    psi = groups.per_gpu(plan.tp, plan.ep)
    if plan.framework == "deepspeed" and plan.zero_stage in (1, 2):
        # Gradients are copied into a reduce bucket before the reduce-scatter; capped by the model size.
        # With overlap_comm two buckets are in flight (one filling, one reducing).
        out["reduce_bucket"] = 2 * min(settings.reduce_bucket_size, psi) * (2 if plan.overlap_comm else 1)
        out["allgather_bucket"] = 2 * min(settings.allgather_bucket_size, psi)
    elif plan.framework == "deepspeed" and plan.zero_stage == 3:
        out["reduce_bucket"] = 2 * settings.reduce_bucket_size  # allocated eagerly, whatever the model size
        layer = _largest_layer(model).per_gpu(plan.tp, plan.ep)
        out["live_parameters"] = 2 * min(settings.stage3_max_live_parameters, 2 * layer)
        out["prefetch_bucket"] = 2 * min(settings.stage3_prefetch_bucket_size, layer)
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
    settings = settings or MemorySettings()
    candidates = []
    for stage in representative_stages(model.num_layers, plan.pp):
        groups = stage_param_groups(model, plan, stage)
        dense = groups.tp_sharded / plan.tp + groups.replicated
        expert = groups.expert / (plan.ep * plan.tp)
        grad_elements = None
        if plan.framework == "deepspeed" and plan.zero_stage in (1, 2):
            grad_elements = _ds_zero12_grad_elements(model, plan.pp, stage, plan.tp, plan.zero_partitions)
        states = model_state_bytes(plan, dense, expert, grad_elements)
        activation_parts = stage_activation_bytes(model, plan, stage)
        if states.step_transient > sum(activation_parts.values()):
            # The optimizer step, not backward, is the peak: activations are gone, fp32 grads are not.
            activation_parts = {"optimizer_step_fp32_gradients": states.step_transient}
        buffer_parts = _buffer_bytes(model, plan, groups, settings)
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
