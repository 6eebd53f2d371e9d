"""The terms of a step's time that do not read the micro-batch, the accumulation or the recompute: the data-parallel
reductions and gathers, hybrid sharding's replica all-reduce, gradient accumulation outside the GEMMs, the offload
traffic and the optimizer step (``autotune.cost.step_time`` composes them with the critical stage's per-micro-batch
time; its docstring has the model). Cached over every other plan field, so the planner's recompute modes and
micro-batches of a variant compute them once.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Protocol

from autotune.cost import comm
from autotune.cost.efficiency import Efficiency
from autotune.specs.lora import trainable_stage_params
from autotune.engines import Engine
from autotune.specs.hardware import GB, ClusterSpec
from autotune.specs.layout import split_vpp_key, stage_param_groups
from autotune.specs.model import ModelSpec
from autotune.specs.plan import OPTIMIZER_STATE_BYTES, ParallelPlan
from autotune.specs.stage_mix import model_representative_stages

__all__ = ["variant_terms"]


class TimeSettings(Protocol):
    """What these terms read of ``autotune.cost.step_time.TimeSettings``."""

    efficiency: Efficiency
    host_memory_bandwidth_gb_per_s_per_node: float


# Every plan field but the ones the planner's inner loop varies (micro-batch, accumulation, recompute), none of which
# the data-parallel, offload and optimizer terms read (``variant_terms``): a variant's plans share them; nor vpp,
# which they do not read either (they follow from a stage's parameters, not its chunks: tests/cost/
# test_memory_caches.py), so a layout's virtual-stage counts share them too.
_VARIANT_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(ParallelPlan) if f.name not in (
    "micro_batch_size", "grad_accum_steps", "recompute", "recompute_num_layers", "vpp")))
_variant_cache: dict[tuple, tuple] = {}


def variant_terms(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, settings: TimeSettings,
                  engine: Engine, hbm: float, stage_params: tuple[float, float] | None) -> tuple:
    """The terms of ``estimate_step_time`` that read neither the micro-batch nor the accumulation nor the recompute,
    cached over ``_VARIANT_FIELDS`` (unless ``stage_params`` are given)."""
    # ids: the specs hash slowly; vpp where MTP modules make the split depend on it (layout.split_scheme)
    key = (id(model), id(cluster), id(settings), hbm, _VARIANT_FIELDS(plan), split_vpp_key(plan))
    hit = None if stage_params is not None else _variant_cache.get(key)
    if hit is None or hit[0] is not model or hit[1] is not cluster or hit[2] is not settings:
        if len(_variant_cache) > 65536:
            _variant_cache.clear()
        hit = (model, cluster, settings, _uncached_variant_terms(model, cluster, plan, settings, engine, hbm,
                                                                 stage_params))
        if stage_params is None:
            _variant_cache[key] = hit
    return hit[3]


def _uncached_variant_terms(model, cluster, plan, settings, engine, hbm, stage_params) -> tuple:
    eff = settings.efficiency
    sched = engine.comm
    t = plan.tp
    # Parameters this GPU holds (largest stage): dense over tp, experts over tp*ep.
    if stage_params is None:
        stage_params = _largest_stage_params(model, plan, engine.layer_split_of(plan, model.num_layers))
    held_params = stage_params  # what ZeRO-3 / FSDP gathers per block: frozen weights too (megatron_fsdp.py)
    if plan.peft:  # LoRA: only the adapters train (reduce, gather, step: autotune.cost.lora)
        stage_params = (trainable_stage_params(model, plan, engine.layer_split_of(plan, model.num_layers)), 0.0)
    dense_psi, expert_psi = stage_params
    psi = dense_psi + expert_psi

    # Data-parallel traffic (group: the sharding group of dp*cp / dp_replicate ranks, members tp apart).
    n_dp = plan.zero_partitions
    n_ep_dp = plan.expert_zero_partitions  # world / (etp x ep x pp), parallel_state.py:880
    dp_link = comm.group_link(cluster, eff, n_dp, t)
    edp_link = comm.group_link(cluster, eff, n_ep_dp, plan.expert_tp * plan.ep)  # expert grid: parallel_state.py:887
    grad_bytes = engine.grad_reduce_bytes(plan)

    def reduce_scatter(bytes_per_param: float) -> float:
        return (comm.reduce_scatter_s(dense_psi * bytes_per_param, n_dp, dp_link)
                + comm.reduce_scatter_s(expert_psi * bytes_per_param, n_ep_dp, edp_link))

    # Hybrid sharding: the replicas all-reduce their shards' gradients once per step.
    replicate_s = 0.0
    if plan.dp_replicate > 1 and plan.zero_stage >= 2:
        rep_link = comm.group_link(cluster, eff, plan.dp_replicate, t * n_dp)
        replicate_s = comm.all_reduce_s(psi / n_dp * grad_bytes, plan.dp_replicate, rep_link)

    # Gradients accumulated outside the GEMMs after every micro-batch's backward (memory-bound, on the critical path).
    accumulate_s = psi * engine.grad_accumulate_bytes(plan) / hbm
    per_mb_sync = sched.grad_sync_every_microbatch or plan.zero_stage >= 2
    per_block = plan.zero_stage == 3 or (plan.zero_stage == 2 and sched.param_gather == "fsdp2")
    # ZeRO-1/2: the updated 16-bit weights are all-gathered after the optimizer step.
    param_gather = reduce_scatter(2) if plan.zero_stage in (1, 2) and not per_block else 0.0
    gathers = None
    if per_block:
        # Per-block gathers (16-bit, or FP8 with FP8 all-gather): see estimate_step_time.
        gather_bytes = 1.0 if plan.precision == "fp8" and engine.fp8_param_gather(plan) else 2.0
        latency = (n_dp - 1) * dp_link.latency_s * (n_dp > 1) + (n_ep_dp - 1) * edp_link.latency_s * (expert_psi > 0)
        # One flat all-gather per block (FSDP2, Megatron-FSDP's per-unit buckets), or DeepSpeed's per submodule.
        held_dense, held_expert = held_params
        gathered = (comm.reduce_scatter_s(held_dense * gather_bytes, n_dp, dp_link)
                    + comm.reduce_scatter_s(held_expert * gather_bytes, n_ep_dp, edp_link))
        gathers = (gathered, latency, 1 if sched.param_gather in ("fsdp2", "megatron-fsdp") else 4)
    reduce = reduce_scatter(grad_bytes)
    pp_link = comm.group_link(cluster, eff, plan.pp, t * plan.cp * plan.dp) if plan.pp > 1 else None

    # Offload (ZeRO-Offload): gradients down and weights up over PCIe, CPU Adam at host-memory speed.
    pcie = cluster.pcie_bandwidth_gb_per_s * GB
    psi_part = dense_psi / n_dp + expert_psi / n_ep_dp if plan.zero_stage >= 1 else psi
    offload = 0.0
    k_bytes = OPTIMIZER_STATE_BYTES[plan.optimizer]
    if plan.offload_optimizer != "none":
        offload += (2 * psi_part + 2 * psi_part) / pcie
        # CPU Adam reads fp32 param, grad, m, v and writes param, m, v (28 B/param) plus the 16-bit copy.
        host_bw = settings.host_memory_bandwidth_gb_per_s_per_node * GB / cluster.gpus_per_node
        offload += psi_part * (k_bytes / 12 * 28 + 2) / host_bw
        if plan.offload_optimizer == "nvme":
            nvme_bw = max(cluster.nvme_bandwidth_gb_per_s, 1e-9) * GB / cluster.gpus_per_node
            offload += 2 * k_bytes * psi_part / nvme_bw
    optimizer = 0.0
    if plan.offload_optimizer == "none":
        # Fused Adam on the GPU: read master, m, v, grad; write master, m, v, 16-bit weights; and the engine's
        # passes around it (gradient norm, fp16 unscale, master-to-model copy).
        optimizer = psi_part * (k_bytes / 12 * 24 + grad_bytes + 2 + engine.optimizer_pass_bytes(plan)) / hbm
    return (accumulate_s, per_mb_sync, per_block, param_gather, gathers, reduce, replicate_s, pp_link, pcie, psi_part,
            offload, optimizer, _sixteen_peak(cluster, plan))


# Pure functions of a few plan fields, cached by the specs' ids (they are frozen and hash slowly); each entry keeps
# its specs so a reused id cannot match.
_largest_cache: dict[tuple, tuple[ModelSpec, tuple[float, float]]] = {}
_peak_cache: dict[tuple, tuple[ClusterSpec, float]] = {}


def _largest_stage_params(model: ModelSpec, plan: ParallelPlan, scheme: str) -> tuple[float, float]:
    """(dense, expert) parameters per GPU of the stage holding the most (dense over tp, experts over tp*ep)."""
    key = (id(model), plan.pp, plan.tp, plan.ep, plan.expert_tp, scheme, plan.mtp_layers)
    hit = _largest_cache.get(key)
    if hit is None or hit[0] is not model:
        if len(_largest_cache) > 4096:
            _largest_cache.clear()
        groups = [stage_param_groups(model, plan, s, scheme)
                  for s in model_representative_stages(model, plan.pp, scheme, plan.vpp)]
        g = max(groups, key=lambda x: x.per_gpu(plan.tp, plan.ep))
        hit = _largest_cache[key] = (model, (g.tp_sharded / plan.tp + g.replicated, g.expert / (plan.expert_tp * plan.ep)))
    return hit[1]


def _sixteen_peak(cluster: ClusterSpec, plan: ParallelPlan) -> float:
    """The datasheet 16-bit peak MFU is quoted against (FP8 runs too, as the sources quote them)."""
    key = (id(cluster), plan.precision == "fp16")
    hit = _peak_cache.get(key)
    if hit is None or hit[0] is not cluster:
        if len(_peak_cache) > 4096:
            _peak_cache.clear()
        hit = _peak_cache[key] = (cluster, _uncached_sixteen_peak(cluster, plan))
    return hit[1]


def _uncached_sixteen_peak(cluster: ClusterSpec, plan: ParallelPlan) -> float:
    gpu = cluster.gpu
    for prec in ("fp16" if plan.precision == "fp16" else "bf16", "fp16", "bf16"):
        if gpu.supports(prec):
            return gpu.peak_flops_per_s(prec)
    return max(gpu.peak_tflops.values()) * 1e12
