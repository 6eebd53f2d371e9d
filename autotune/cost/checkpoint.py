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
from dataclasses import asdict, dataclass, replace

from autotune.cost.availability import (
    PLANNED_GPU_HOURS,
    availability_optimal_interval_s,
    expected_detection_s,
    wall_time_fractions,
)
from autotune.cost.checkpoint_sizes import CheckpointBytes, checkpoint_bytes
from autotune.cost.checkpoint_tiers import LocalTier, local_tier_for, rendezvous_s
from autotune.cost.consolidated_save import consolidated_save
from autotune.emit.checkpoint import CheckpointSettings
from autotune.emit.options import CheckpointOptions
from autotune.engines import engine_for
from autotune.errors import require_no_problems
from autotune.specs.hardware import GB, GIB

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


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointPolicy:
    """When and how to save, and what it costs. Seconds, bytes (SI inside; GiB only in ``to_text``)."""

    engine: str
    format: str
    """How the engine saves: "deepspeed" (save_checkpoint tags), "torch_dist" (Megatron), "dcp" (torch DCP)."""
    save_dir: str
    zero_stage: int
    pp: int
    num_gpus: int
    sizes: CheckpointBytes
    storage_bandwidth_gb_per_s: float
    pcie_bandwidth_gb_per_s: float
    gpu_mtbf_hours: float
    write_time_s: float
    """Total bytes over the storage's aggregate write bandwidth."""
    blocking_s: float
    """Training stall per save (Daly's delta): the device-to-host copy with async save, else the write."""
    load_time_s: float
    """Reading the checkpoint back at the same aggregate bandwidth."""
    restart_s: float
    """Detection, relaunch and load, per failure."""
    job_mtbf_s: float
    planned_interval_s: float
    """Mean time between planned interruptions of the job (each costs a restart, no rework)."""
    relaunch_s: float
    """Requeue, node replacement, process start per restart (detection, rendezvous and load excluded)."""
    rendezvous_s: float
    """Every rank joining the job's TCPStore, growing with the rank count (autotune.cost.checkpoint_tiers)."""
    detection_s: float
    """Mean time from a failure to the job knowing it (autotune.cost.availability.expected_detection_s)."""
    optimal_interval_s: float
    """Availability optimum (autotune.cost.availability) before rounding to steps."""
    step_time_s: float
    interval_steps: int
    interval_overridden: bool
    keep_last: int
    async_save: bool
    """Effective: True only where the engine saves asynchronously (Megatron torch_dist, torch DCP) and the staging
    fits in host memory; see ``notes``."""
    staging_host_bytes_per_node: float
    """Pinned host memory an asynchronous save stages per node (every local rank's shard); 0 when saves block."""
    gather_16bit_weights_on_model_save: bool
    """ZeRO-3: let ``engine.save_16bit_model()`` write a consolidated 16-bit model (for inference); the Hugging Face
    Trainer calls it at every save (off when node 0's host memory cannot hold the model: see ``notes``)."""
    parallel_write_pipeline_stage: bool
    """DeepSpeed pipeline engine: spread each stage's layer files over its data-parallel ranks."""
    tag_validation: str = "Fail"
    """Abort a save whose tag differs across ranks (a mixed checkpoint cannot be resumed)."""
    tier: str = "shared"
    local: LocalTier | None = None
    """Tier "local": its save and load figures; ``interval_steps``, ``blocking_s`` and ``load_time_s`` are then
    the node-local saves', and the durable saves to the shared tier come every ``durable_interval_steps``."""
    local_dir: str = ""
    durable_interval_steps: int | None = None
    durable_blocking_s: float = 0.0
    consolidation_s: float = 0.0
    """Part of ``blocking_s``: gathering the whole 16-bit model to rank 0 and rank 0 writing it (engine ``hf``)."""
    consolidation_host_bytes: float = 0.0
    """Host memory node 0 holds while rank 0 writes the consolidated model (engine ``hf``); 0 when it writes none."""
    save_memory_note: str = ""
    """What a save's host memory changed or risks (also in ``notes``); ``estimate`` prints it."""
    notes: tuple[str, ...] = ()

    # ---- derived ---------------------------------------------------------------------------
    @property
    def interval_s(self) -> float:
        return self.interval_steps * self.step_time_s

    @property
    def host_at_save(self) -> tuple[float, str]:
        """The most host memory a save adds on one node, and what it is (a row of the memory ledger)."""
        if self.consolidation_host_bytes > self.staging_host_bytes_per_node:
            return self.consolidation_host_bytes, "on node 0: the 16-bit model rank 0 writes, Hugging Face Trainer"
        if self.staging_host_bytes_per_node:
            return self.staging_host_bytes_per_node, "pinned checkpoint staging, async save"
        return 0.0, ""

    @property
    def lag_s(self) -> float:
        """How long after a save it becomes the one a restart resumes from (the background write)."""
        if not self.async_save:
            return 0.0
        return self.local.persist_s if self.local is not None else self.write_time_s

    @property
    def wall_fractions(self) -> dict[str, float]:
        """Fractions of wall time: train, checkpoint, rework, restart, planned (autotune.cost.availability); with
        the local tier, the durable saves' stall is added to checkpoint."""
        out = wall_time_fractions(interval_s=self.interval_s, delta_s=self.blocking_s, mtbf_s=self.job_mtbf_s,
                                  restart_s=self.restart_s, lag_s=self.lag_s, planned_s=self.planned_interval_s,
                                  planned_restart_s=self.relaunch_s + self.rendezvous_s + self.load_time_s)
        if self.durable_interval_steps is None:
            return out
        extra = out["train"] * self.durable_blocking_s / (self.durable_interval_steps * self.step_time_s)
        out = {k: v / (1 + extra) for k, v in out.items()}
        out["checkpoint"] += extra / (1 + extra)
        return out

    @property
    def loss_parts(self) -> dict[str, float]:
        """Fractions of wall time not training, by cause."""
        return {k: v for k, v in self.wall_fractions.items() if k != "train"}

    @property
    def expected_loss_fraction(self) -> float:
        return 1.0 - self.wall_fractions["train"]

    @property
    def storage_bytes(self) -> float:
        """Disk the kept checkpoints take (with the consolidated model rank 0 writes beside each)."""
        return self.keep_last * (self.sizes.total + self.sizes.consolidated_bytes)

    # ---- what the writers are told -----------------------------------------------------------
    def files(self, *, load_universal: bool = False) -> CheckpointSettings:
        """The settings the engine's files carry (the DeepSpeed ``checkpoint`` block, Megatron's flags);
        ``load_universal``: a DeepSpeed job that resumes another layout's checkpoint after ``ds_to_universal``."""
        local = self.local is not None
        return CheckpointSettings(save_dir=self.save_dir, load_universal=load_universal,
                                  interval_steps=self.durable_interval_steps if local else self.interval_steps,
                                  local_interval_steps=self.interval_steps if local else None,
                                  local_dir=self.local_dir, local_replication_jump=self.local.replication_jump if local
                                  else 0,
                                  async_save=self.async_save, tag_validation=self.tag_validation,
                                  parallel_write_pipeline_stage=self.parallel_write_pipeline_stage,
                                  gather_16bit_weights_on_model_save=self.gather_16bit_weights_on_model_save)

    def resume_command_note(self) -> str:
        d = self.save_dir
        if self.format == "dcp":
            return (f"Resume: torch.distributed.checkpoint.load(state_dict, checkpoint_id='{d}/step-<N>') with the "
                    f"model and optimizer state dicts from torch.distributed.checkpoint.state_dict."
                    f"get_state_dict(model, optimizer); DCP reshards on load, so another mesh resumes from the same "
                    f"folder (torchtitan: [checkpoint] enable=true, folder='{d}'). Keep the newest {self.keep_last} "
                    f"step-* folders.")
        if self.format == "torch_dist":
            return (f"Resume: relaunch with the same flags; `--load {d}` reads latest_checkpointed_iteration.txt "
                    f"and restores weights, optimizer, scheduler and iteration. torch_dist checkpoints reshard on "
                    f"load, so a different TP/PP/DP layout resumes from the same folder. Megatron keeps every "
                    f"save: delete all but the newest {self.keep_last} iter_* folders "
                    f"(autotune.emit.checkpoint.prune_old_tags).")
        return (f"Resume: build the engine as before, then `load_path, client_state = engine.load_checkpoint('{d}')` "
                f"(no tag: the one named in {d}/latest) and continue from client_state['step'] (pass it to "
                f"save_checkpoint(..., client_state={{'step': step}})). After each save, rank 0 keeps the newest "
                f"{self.keep_last} tags (autotune.emit.checkpoint.prune_old_tags). To resume on a different parallel "
                f"layout: `python -m deepspeed.checkpoint.ds_to_universal --input_folder {d}/<tag> "
                f"--output_folder {d}/<tag>_universal` (writes {d}/latest_universal), then set "
                f"checkpoint.load_universal: true. zero_to_fp32.py in {d} rebuilds fp32 weights offline.")

    def to_text(self) -> str:
        """A short paragraph for plan.md."""
        s = self.sizes
        opt = "fp32 master weights and optimizer states"
        content = (f"{_fmt_bytes(s.weight_bytes_total)} of 16-bit weights + {_fmt_bytes(s.optimizer_bytes_total)} of "
                   f"{opt}" if s.weight_bytes_total else f"{opt} only: ZeRO-3 rebuilds the 16-bit weights on load")
        if self.async_save:
            stall = (f"asynchronous save blocks training only for the {_fmt_s(self.blocking_s)} device-to-host copy of "
                     f"the largest rank's {_fmt_bytes(s.per_rank)} at {self.pcie_bandwidth_gb_per_s:g} GB/s, into "
                     f"{_fmt_bytes(self.staging_host_bytes_per_node)} of pinned host memory per node")
        else:
            stall = f"the save blocks training for all of it (largest rank: {_fmt_bytes(s.per_rank)})"
        if s.consolidated_bytes:
            stall += (f"; the Hugging Face Trainer also writes the whole {_fmt_bytes(s.consolidated_bytes)} 16-bit "
                      f"model from rank 0 at each save ({_fmt_s(self.consolidation_s)} of the stall, "
                      f"{_fmt_bytes(self.consolidation_host_bytes)} of node 0's host memory)")
        interval = (f"every {self.interval_steps:,} steps ({self.interval_s / 60:,.1f} min"
                    + (", set by hand" if self.interval_overridden
                       else f"; availability optimum {self.optimal_interval_s / 60:,.1f} min") + ")")
        text = (f"Checkpoints: {_fmt_bytes(s.total)} per save ({content}). Writing takes {_fmt_s(self.write_time_s)} "
                f"at {self.storage_bandwidth_gb_per_s:g} GB/s aggregate; {stall}. {self.num_gpus:,} GPUs at "
                f"{self.gpu_mtbf_hours:,.0f} h MTBF each fail every {self.job_mtbf_s / 3600:,.1f} h, so save "
                f"{interval} and keep the last {self.keep_last} ({_fmt_bytes(self.storage_bytes)} of storage). "
                f"Expected time lost to saving, rework and restarts (planned ones too, every "
                f"{self.planned_interval_s / 3600:,.0f} h): {100 * self.expected_loss_fraction:.2f}%. A restart "
                f"takes {_fmt_s(self.restart_s)}: detection {_fmt_s(self.detection_s)}, relaunch "
                f"{_fmt_s(self.relaunch_s)}, rendezvous of {self.num_gpus:,} ranks {_fmt_s(self.rendezvous_s)}, "
                f"checkpoint read {_fmt_s(self.load_time_s)}.")
        if self.local is not None:
            lt = self.local
            text += (f" Tier local: each node writes its {_fmt_bytes(lt.node_bytes)} to {self.local_dir} in "
                     f"{_fmt_s(lt.write_s)} and sends a replica to the node {lt.replication_jump} ranks on in "
                     f"{_fmt_s(lt.replicate_s)} (Megatron-LM --non-persistent-ckpt-type local --replication; needs "
                     f"nvidia-resiliency-ext >= 0.6.0 installed); the interval above is the local saves', durable saves to "
                     f"{self.save_dir} come every {self.durable_interval_steps:,} steps, and a restart reads "
                     f"locally.")
        return " ".join([text, *self.notes])

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "notes"}
        out.update(sizes={**asdict(self.sizes), "per_rank": self.sizes.per_rank, "total": self.sizes.total},
                   interval_s=self.interval_s, expected_loss_fraction=self.expected_loss_fraction,
                   loss_parts=self.loss_parts, wall_fractions=self.wall_fractions, storage_bytes=self.storage_bytes,
                   notes=list(self.notes))
        return out


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
                     f"{_fmt_bytes(staging)} per node and {_fmt_bytes(max(host_free, 0.0))} is free beside the "
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


def _fmt_bytes(b: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", GIB), ("MiB", 2**20)):
        if b >= size:
            return f"{b / size:,.1f} {unit}"
    return f"{b / 2**10:,.1f} KiB"


def _fmt_s(seconds: float) -> str:
    return f"{seconds:,.0f} s" if seconds >= 10 else f"{seconds:.2g} s"
