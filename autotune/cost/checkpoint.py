"""Checkpoint policy: what one save of a plan weighs, how long it stalls training, how often to save.

Why it matters: at scale a job fails every few hours. Llama 3 405B saw 419 unexpected
interruptions in 54 days on 16,384 H100s, one every ~3.1 h (Llama 3 paper, Dubey et al. 2024,
Sec. 3.3.4, Table 5); OPT-175B's hardware failures caused at least 35 manual restarts and the
cycling of over 100 hosts in two months on 992 A100s (Zhang et al. 2022, Sec. 2.5, and the
metaseq OPT-175B logbook). 419 failures x 16,384 GPUs over 1,296 h is ~51,000 GPU-hours per
failure, the source of ``CheckpointOptions.gpu_mtbf_hours = 50,000``: a 1,024-GPU job then
fails every ~49 h, a 16,384-GPU job every ~3 h.

What a checkpoint holds (and what is counted here), Psi = parameters, K = optimizer bytes per
parameter with the fp32 master weights (``OPTIMIZER_STATE_BYTES``, 12 for AdamW):

- DeepSpeed ZeRO-0/1/2 (``save_checkpoint``): data-parallel rank 0 of each model-parallel rank
  writes the 16-bit module weights (``mp_rank_XX_model_states.pt``, 2 Psi in all); the fp32 master
  weights and Adam moments are written once, partitioned (``zero_pp_rank_D_mp_rank_XX_optim_states.pt``,
  K Psi in all; ZeRO-0 keeps them whole in rank 0's model-states file). Total (2 + K) Psi.
- DeepSpeed ZeRO-3: each rank writes only its fp32/optimizer partition (K Psi in all); the
  16-bit weights are not written (the model-states files hold empty placeholders) and are rebuilt
  from the fp32 master on load. Total K Psi. ``stage3_gather_16bit_weights_on_model_save``
  additionally lets ``engine.save_16bit_model()`` write a consolidated 2 Psi model for inference;
  that export is not part of a DeepSpeed job's periodic checkpoint and is not counted there.
- The Hugging Face Trainer (engine ``hf``) also writes that consolidated 2 Psi model at every save, from
  rank 0: :mod:`autotune.cost.consolidated_save`.
- Megatron ``--ckpt-format torch_dist``: the 16-bit weights and the fp32 master + optimizer states,
  each tensor written once, (2 + K) Psi; the fully parallel save (on by default) spreads the
  replicated tensors over the data-parallel ranks, so each rank writes ZeRO-3's share.

Not counted: RNG/scheduler/client state (kilobytes), pickle headers, the per-TP-rank copies of
replicated norms that DeepSpeed writes (< 0.1% of a large model), the pipeline's second copy of
tied embeddings. Per-rank bytes are those of the rank that writes the most (the most loaded
pipeline stage, data-parallel rank 0), taken from the memory ledger's
:func:`~autotune.cost.memory.model_state_bytes` with offload undone (where states live does not
change what is saved).
"""

from __future__ import annotations

import math
from dataclasses import replace

from autotune.cost.availability import (
    PLANNED_GPU_HOURS,
    availability_optimal_interval_s,
    expected_detection_s,
)
from autotune.cost.checkpoint_record import CheckpointPolicy, fmt_bytes
from autotune.cost.checkpoint_sizes import CheckpointBytes, checkpoint_bytes
from autotune.cost.checkpoint_tiers import local_tier_for, rendezvous_s
from autotune.cost.consolidated_save import consolidated_save
from autotune.emit.options import CheckpointOptions
from autotune.engines import engine_for
from autotune.errors import require_no_problems
from autotune.specs.hardware import GB

__all__ = ["CheckpointBytes", "CheckpointPolicy", "checkpoint_bytes", "checkpoint_policy", "young_daly_interval_s",
           "DEFAULT_RELAUNCH_S", "options_for_cluster"]

DEFAULT_RELAUNCH_S = CheckpointOptions().relaunch_s
"""Seconds from a failure to training again, checkpoint read excluded (``CheckpointOptions.relaunch_s``)."""


def options_for_cluster(options: CheckpointOptions, cluster, *, explicit: frozenset[str] | set[str] = frozenset()
                        ) -> CheckpointOptions:
    """``options`` with the cluster file's failure and storage figures (``ClusterSpec.gpu_mtbf_hours``,
    ``restart_s``, ``storage_bandwidth_gb_per_s``, ``checkpoint_tier``, ``local_storage_bandwidth_gb_per_s``) where
    the cluster gives one and ``explicit`` (the option names a
    flag or a recipe set) does not name it: flags > cluster file > defaults."""
    given = {"gpu_mtbf_hours": cluster.gpu_mtbf_hours, "relaunch_s": cluster.restart_s,
             "storage_bandwidth_gb_per_s": cluster.storage_bandwidth_gb_per_s, "tier": cluster.checkpoint_tier,
             "local_storage_bandwidth_gb_per_s": cluster.local_storage_bandwidth_gb_per_s}
    taken = {k: v for k, v in given.items() if v is not None and k not in explicit}
    return replace(options, **taken, **({"tier_required": False} if "tier" in taken else {}))


def young_daly_interval_s(delta_s: float, mtbf_s: float) -> float:
    """Compute time between checkpoints that minimises lost time, for a checkpoint costing ``delta_s``.

    Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart dumps",
    first-order form: tau = sqrt(2 delta M) - delta for delta < 2M, else M; Young (1974) is
    sqrt(2 delta M). Assumes exponentially distributed failures with mean M (the job's MTBF).
    """
    assert delta_s >= 0 and mtbf_s > 0
    if delta_s >= 2 * mtbf_s:
        return mtbf_s
    return math.sqrt(2 * delta_s * mtbf_s) - delta_s


def checkpoint_policy(estimate, options: CheckpointOptions) -> CheckpointPolicy:
    """The checkpoint policy of one estimated plan (``estimate``: :class:`autotune.api.Estimate`)."""
    relaunch_s = options.relaunch_s
    plan, cluster = estimate.plan, estimate.cluster
    step_time_s = estimate.time.step_time_s
    problems = [] if step_time_s > 0 else [f"step time must be > 0 to size a checkpoint interval, got {step_time_s}"]
    if not (options.storage_bandwidth_gb_per_s > 0 and options.gpu_mtbf_hours > 0):
        problems.append("storage_bandwidth_gb_per_s and gpu_mtbf_hours must be > 0, got "
                        f"{options.storage_bandwidth_gb_per_s} and {options.gpu_mtbf_hours}")
    if options.keep_last < 1 or (options.interval_steps is not None and options.interval_steps < 1):
        problems.append(f"keep_last and interval_steps must be >= 1, got {options.keep_last} and "
                        f"{options.interval_steps}")
    require_no_problems(problems, subject="checkpoint policy")
    sizes = checkpoint_bytes(estimate.model, plan)
    storage_bytes_per_s = options.storage_bandwidth_gb_per_s * GB
    write_time_s = sizes.total / storage_bytes_per_s
    notes = []
    fmt = engine_for(plan).checkpoint_format
    async_save = options.async_save and fmt in ("torch_dist", "dcp")
    if options.async_save and not async_save:
        notes.append("Async save is off: DeepSpeed's default checkpoint engine (torch.save) writes synchronously, so "
                     "the whole write blocks. DeepSpeed 0.19.8's decoupled writer (checkpoint.writer.decoupled, a "
                     "background process) is not emitted: untested here.")
    # Async: each rank copies its shard into pinned host memory (torch DCP async_save with pinned memory,
    # torchtitan's async_with_pinned_mem; Megatron's async save likewise stages on the host) and persists it in
    # the background. That staging must fit beside what offload already keeps on the host, else a blocking save.
    staging = cluster.gpus_per_node * sizes.per_rank
    host_free = estimate.memory.host_capacity_per_node - estimate.memory.host_per_node
    if async_save and staging > host_free:
        async_save = False
        notes.append(f"Async save is off: staging each rank's shard in pinned host memory needs "
                     f"{fmt_bytes(staging)} per node and {fmt_bytes(max(host_free, 0.0))} is free beside the "
                     f"offloaded states; saves block instead (more host memory, fewer GPUs per node, or ZeRO-3 / "
                     f"more sharding make the shards smaller).")
    # Async: only the snapshot into host memory stalls training (PCIe, per GPU, in parallel).
    blocking_s = sizes.per_rank / (cluster.pcie_bandwidth_gb_per_s * GB) if async_save else write_time_s
    gather_16bit = fmt == "deepspeed" and plan.zero_stage == 3
    consolidation = consolidated_save(
        sizes.consolidated_bytes, zero3=plan.zero_stage == 3, host_free=host_free,
        link_gb_per_s=cluster.inter_node_bandwidth_gb_per_s if plan.world_size > cluster.gpus_per_node
        else cluster.intra_node_bandwidth_gb_per_s,
        writer_gb_per_s=min(options.storage_bandwidth_gb_per_s, cluster.inter_node_bandwidth_gb_per_s))
    if consolidation.note:
        notes.append(consolidation.note)
    if sizes.consolidated_bytes and not consolidation.written:
        sizes, gather_16bit = replace(sizes, consolidated_bytes=0.0), False
    write_time_s += consolidation.write_s
    blocking_s += consolidation.stall_s
    job_mtbf_s = options.gpu_mtbf_hours * 3600 / plan.world_size
    planned_s = PLANNED_GPU_HOURS * 3600 / plan.world_size
    load_time_s = sizes.total / storage_bytes_per_s
    detection_s = expected_detection_s()
    rendezvous = rendezvous_s(plan.world_size)
    before_load_s = detection_s + relaunch_s + rendezvous
    optimal_s = availability_optimal_interval_s(
        delta_s=blocking_s, mtbf_s=job_mtbf_s, restart_s=before_load_s + load_time_s,
        lag_s=write_time_s if async_save else 0.0, planned_s=planned_s,
        planned_restart_s=relaunch_s + rendezvous + load_time_s)
    steps = _interval_steps(options.interval_steps if options.tier == "shared" else None, optimal_s, step_time_s,
                            write_time_s if async_save else 0.0)
    if options.interval_steps is not None and async_save and steps * step_time_s < write_time_s:
        notes.append(f"The interval ({steps * step_time_s:,.0f} s) is shorter than one write "
                     f"({write_time_s:,.0f} s): each save waits for the previous one.")
    local = None
    durable = {}
    if options.tier == "local":
        local = local_tier_for(options, estimate, sizes.per_rank)
    if isinstance(local, str):
        notes.append(local)
        local = None
    if local is not None:
        durable = {"durable_interval_steps": steps, "durable_blocking_s": blocking_s}
        if not async_save:
            blocking_s = local.persist_s
        load_time_s = local.load_s
        optimal_s = availability_optimal_interval_s(
            delta_s=blocking_s, mtbf_s=job_mtbf_s, restart_s=before_load_s + load_time_s,
            lag_s=local.persist_s if async_save else 0.0, planned_s=planned_s,
            planned_restart_s=relaunch_s + rendezvous + load_time_s)
        steps = min(steps, _interval_steps(options.interval_steps, optimal_s, step_time_s,
                                           local.persist_s if async_save else 0.0))
    return CheckpointPolicy(
        engine=plan.engine, format=fmt, save_dir=options.save_dir, zero_stage=plan.zero_stage, pp=plan.pp,
        num_gpus=plan.world_size, sizes=sizes, storage_bandwidth_gb_per_s=options.storage_bandwidth_gb_per_s,
        pcie_bandwidth_gb_per_s=cluster.pcie_bandwidth_gb_per_s, gpu_mtbf_hours=options.gpu_mtbf_hours,
        write_time_s=write_time_s, blocking_s=blocking_s,
        load_time_s=load_time_s, restart_s=before_load_s + load_time_s, job_mtbf_s=job_mtbf_s,
        planned_interval_s=planned_s, relaunch_s=relaunch_s, rendezvous_s=rendezvous, detection_s=detection_s,
        optimal_interval_s=optimal_s, step_time_s=step_time_s, interval_steps=steps,
        interval_overridden=options.interval_steps is not None, keep_last=options.keep_last, async_save=async_save,
        staging_host_bytes_per_node=staging if async_save else 0.0,
        gather_16bit_weights_on_model_save=gather_16bit, consolidation_s=consolidation.stall_s,
        consolidation_host_bytes=consolidation.host_bytes, save_memory_note=consolidation.note,
        parallel_write_pipeline_stage=fmt == "deepspeed" and plan.pp > 1, local=local,
        tier="shared" if local is None else "local",
        local_dir=options.local_dir if local is not None else "", **durable, notes=tuple(notes))


def _interval_steps(given: int | None, optimal_s: float, step_time_s: float, lag_s: float) -> int:
    """Steps between saves: ``given``, else the optimum rounded to steps and never shorter than an asynchronous
    save's background write (a new save waits for the previous one)."""
    if given is not None:
        return given
    return max(1, round(optimal_s / step_time_s), math.ceil(lag_s / step_time_s))
