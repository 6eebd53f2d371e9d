"""Model-state bytes of one GPU, per sharding scheme, as each engine actually holds them.

The engines (``autotune/engines``) choose the formula and its settings; these are the formulas.
ZeRO paper (Rajbhandari et al. 2020, Sec. 3.1 and 5): mixed-precision Adam keeps 2 bytes of 16-bit
weights, 2 of 16-bit gradients and K = 12 of fp32 master weights, momentum and variance per parameter.
Measured on DeepSpeed 0.19.8 (``tests/cost/test_ledger_vs_deepspeed.py``):

  DeepSpeed ZeRO-0 (bf16/fp16): 2 + 2 + K, unpartitioned (FP16_UnfusedOptimizer keeps fp32 master).
  DeepSpeed ZeRO-1/2: 2 + 2/Nd + K/Nd: stage_1_and_2.py reduces each gradient bucket into the
      rank's partition at once, so even ZeRO-1 keeps only a gradient partition after backward.
  DeepSpeed ZeRO-3: 2/Nd + 2/Nd + K/Nd, plus an eagerly allocated reduce bucket of
      ``reduce_bucket_size`` elements and the gathered (live) parameters of the running layers.
  Megatron-core (DDP + optimizer): 2 + 4 + K, gradients accumulated in an fp32 main-grad
      buffer; with the distributed optimizer (zero_stage=1) 2 + 4 + K/Nd ("6 + 12/d" bytes in
      Megatron's theoretical_memory_usage.py).
  DeepSpeed BF16_Optimizer (Megatron-DeepSpeed with bf16, BLOOM): 2 + (2 + 4) + K/Nd: the bf16 gradients
      stay allocated (clear_lp_grads zeroes them) and an fp32 accumulation buffer of the whole flat group
      (bf16_optimizer.py:191 ``torch.zeros_like(bf16_groups_flat[i], dtype=grad_acc_dtype)``).
  PyTorch FSDP2 (``fully_shard``, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)): the sharded
      parameters stay fp32 and are the optimizer's master weights: 4/Nd + 4/Nd + (K - 4)/Nd; the bf16
      unsharded parameters of the running blocks are buffers. Without sharding (DDP / replicate) 4 + 4 + K - 4.

Offload (ZeRO-Offload / ZeRO-Infinity): optimizer offload moves the K bytes and an fp32 copy
of the gradient partition (4/Nd) to host memory (or NVMe); parameter offload (ZeRO-3) moves
the 16-bit weight partition. FSDP2's CPUOffloadPolicy moves parameters, gradients and optimizer
states together.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from autotune.specs.frozen import builder
from autotune.specs.layout import stage_layers
from autotune.specs.model import ModelSpec
from autotune.specs.model_tensors import stage_tensors
from autotune.specs.plan import OPTIMIZER_STATE_BYTES, ParallelPlan

__all__ = ["ModelStateBytes", "zero_states", "megatron_states", "bf16_optimizer_states", "fsdp2_states",
           "ds_zero12_grad_elements", "megatron_grad_bytes"]


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


_model_state_bytes = builder(ModelStateBytes)


@functools.lru_cache(maxsize=4096)
def ds_zero12_grad_elements(model: ModelSpec, pp: int, stage: int, tp: int, nd: int, scheme: str = "megatron") -> float:
    """Gradient elements the most loaded rank of a DeepSpeed ZeRO-1/2 partitioning holds (dense params).

    DeepSpeed 0.19.8 (stage_1_and_2.py, ``get_partition_info`` and ``grads_in_partition``) flattens the
    parameters in module order, pads the total to a multiple of 2 * nd, gives each rank an equal slice,
    and sizes a rank's gradient buffer by the *whole* element count of every parameter that starts in
    its slice or straddles its start: a tensor crossing a slice boundary is held whole by both ranks.
    """
    first, count = stage_layers(model.num_layers, pp, stage, scheme)
    tensors = [n / tp if kind == "tp_sharded" else float(n)
               for n, kind in stage_tensors(model, first, count, has_embedding=stage == 0, has_output=stage == pp - 1)
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


def _partitioned(plan: ParallelPlan, dense: float, expert: float) -> float:
    """Parameters as seen by one rank of the ZeRO partitioning (dense over dp*cp, experts over dp*cp/ep)."""
    return dense / plan.zero_partitions + expert / plan.expert_zero_partitions


def zero_states(plan: ParallelPlan, dense: float, expert: float,
                dense_grad_elements: float | None = None) -> ModelStateBytes:
    """DeepSpeed ZeRO 0-3 with offload, as DeepSpeed 0.19.8 holds them (module docstring).

    ``dense_grad_elements``: the dense gradient elements a ZeRO-1/2 rank holds, if known
    (:func:`ds_zero12_grad_elements`); default an exact 1/Nd share.
    """
    k = OPTIMIZER_STATE_BYTES[plan.optimizer]
    psi, psi_part, z = dense + expert, _partitioned(plan, dense, expert), plan.zero_stage
    weights = 2 * (psi_part if z == 3 else psi)
    grads = 2 * (psi_part if z >= 1 else psi)
    if z in (1, 2) and dense_grad_elements is not None:
        grads = 2 * (dense_grad_elements + expert / plan.expert_zero_partitions)
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


def megatron_grad_bytes(plan: ParallelPlan) -> int:
    """Megatron accumulates and reduces gradients in fp32 ``main_grad`` buffers with bf16 (arguments.py
    forces ``accumulate_allreduce_grads_in_fp32`` for bf16), in 16 bits with fp16 by default, and in bf16 with
    ``--grad-reduce-in-bf16`` (arguments.py: it turns ``accumulate_allreduce_grads_in_fp32`` off; the DDP's
    ``grad_reduce_in_fp32`` False: ``main_grad`` buffers of the parameters' dtype)."""
    return 2 if plan.precision == "fp16" or plan.grad_dtype == "bf16" else 4


def megatron_states(plan: ParallelPlan, dense: float, expert: float) -> ModelStateBytes:
    """Megatron-core DDP + (distributed) optimizer: 2 + grad bytes + K (or K/Nd with zero_stage 1)."""
    k = OPTIMIZER_STATE_BYTES[plan.optimizer]
    psi = dense + expert
    owned = _partitioned(plan, dense, expert) if plan.zero_stage >= 1 else psi
    opt = k * owned
    # At the step the optimizer's fp32 main params get fp32 gradients: optimizer.py (and distrib_optimizer.py,
    # for the rank's shard) ``_copy_model_grads_to_main_grads``: ``main_param.grad = model_param.main_grad.float()``,
    # a new 4-byte copy of 16-bit (fp16) grads, an alias of fp32 main grads (bf16); activations are freed then.
    step = 4 * owned if megatron_grad_bytes(plan) == 2 else 0.0
    return ModelStateBytes(weights=2 * psi, gradients=megatron_grad_bytes(plan) * psi, optimizer_states=opt,
                           step_transient=step)


def bf16_optimizer_states(plan: ParallelPlan, dense: float, expert: float) -> ModelStateBytes:
    """DeepSpeed's BF16_Optimizer (ZeRO-1 over dp): 2 + (2 + 4) + K/Nd (module docstring)."""
    k = OPTIMIZER_STATE_BYTES[plan.optimizer]
    psi = dense + expert
    opt = k * (_partitioned(plan, dense, expert) if plan.zero_stage >= 1 else psi)
    return ModelStateBytes(weights=2 * psi, gradients=6 * psi, optimizer_states=opt)


def fsdp2_states(plan: ParallelPlan, dense: float, expert: float) -> ModelStateBytes:
    """FSDP2 ``fully_shard`` (zero_stage 2/3) or replicate (0): fp32 sharded parameters are the master weights.

    zero_stage 3: reshard_after_forward=True (FULL_SHARD); 2: False (SHARD_GRAD_OP, the unsharded bf16
    parameters stay from forward to backward: a buffer, see the engine); 0: no sharding.
    CPUOffloadPolicy (offload_param = offload_optimizer = cpu) keeps the sharded parameters, their
    gradients and the optimizer states in host memory.
    """
    k = OPTIMIZER_STATE_BYTES[plan.optimizer]
    share = _partitioned(plan, dense, expert) if plan.zero_stage >= 2 else dense + expert
    weights, grads, opt = 4 * share, 4 * share, (k - 4) * share
    # ModelStateBytes(weights, gradients, optimizer_states, host_weights, host_gradients, host_optimizer_states,
    # host_buffers, nvme, step_transient), made by a builder: the planner asks for ~10^4 of them
    if plan.offload_param == "cpu":
        return _model_state_bytes(0.0, 0.0, 0.0, weights, grads, opt, 0.0, 0.0, 0.0)
    return _model_state_bytes(weights, grads, opt, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
