"""``CheckpointPolicy``: what the checkpoint policy decided for a plan (``autotune.cost.checkpoint.checkpoint_policy``)
with the figures that follow from it (wall-time fractions, storage), the settings the engine's files carry, and its
words for plan.md; re-exported by :mod:`autotune.cost.checkpoint`."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from autotune.cost.availability import wall_time_fractions
from autotune.cost.checkpoint_sizes import CheckpointBytes
from autotune.cost.checkpoint_tiers import LocalTier
from autotune.emit.checkpoint import CheckpointSettings
from autotune.specs.hardware import GIB

__all__ = ["CheckpointPolicy", "fmt_bytes", "fmt_s"]


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
        content = (f"{fmt_bytes(s.weight_bytes_total)} of 16-bit weights + {fmt_bytes(s.optimizer_bytes_total)} of "
                   f"{opt}" if s.weight_bytes_total else f"{opt} only: ZeRO-3 rebuilds the 16-bit weights on load")
        if self.async_save:
            stall = (f"asynchronous save blocks training only for the {fmt_s(self.blocking_s)} device-to-host copy of "
                     f"the largest rank's {fmt_bytes(s.per_rank)} at {self.pcie_bandwidth_gb_per_s:g} GB/s, into "
                     f"{fmt_bytes(self.staging_host_bytes_per_node)} of pinned host memory per node")
        else:
            stall = f"the save blocks training for all of it (largest rank: {fmt_bytes(s.per_rank)})"
        if s.consolidated_bytes:
            stall += (f"; the Hugging Face Trainer also writes the whole {fmt_bytes(s.consolidated_bytes)} 16-bit "
                      f"model from rank 0 at each save ({fmt_s(self.consolidation_s)} of the stall, "
                      f"{fmt_bytes(self.consolidation_host_bytes)} of node 0's host memory)")
        interval = (f"every {self.interval_steps:,} steps ({self.interval_s / 60:,.1f} min"
                    + (", set by hand" if self.interval_overridden
                       else f"; availability optimum {self.optimal_interval_s / 60:,.1f} min") + ")")
        text = (f"Checkpoints: {fmt_bytes(s.total)} per save ({content}). Writing takes {fmt_s(self.write_time_s)} "
                f"at {self.storage_bandwidth_gb_per_s:g} GB/s aggregate; {stall}. {self.num_gpus:,} GPUs at "
                f"{self.gpu_mtbf_hours:,.0f} h MTBF each fail every {self.job_mtbf_s / 3600:,.1f} h, so save "
                f"{interval} and keep the last {self.keep_last} ({fmt_bytes(self.storage_bytes)} of storage). "
                f"Expected time lost to saving, rework and restarts (planned ones too, every "
                f"{self.planned_interval_s / 3600:,.0f} h): {100 * self.expected_loss_fraction:.2f}%. A restart "
                f"takes {fmt_s(self.restart_s)}: detection {fmt_s(self.detection_s)}, relaunch "
                f"{fmt_s(self.relaunch_s)}, rendezvous of {self.num_gpus:,} ranks {fmt_s(self.rendezvous_s)}, "
                f"checkpoint read {fmt_s(self.load_time_s)}.")
        if self.local is not None:
            lt = self.local
            text += (f" Tier local: each node writes its {fmt_bytes(lt.node_bytes)} to {self.local_dir} in "
                     f"{fmt_s(lt.write_s)} and sends a replica to the node {lt.replication_jump} ranks on in "
                     f"{fmt_s(lt.replicate_s)} (Megatron-LM --non-persistent-ckpt-type local --replication; needs "
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


def fmt_bytes(b: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", GIB), ("MiB", 2**20)):
        if b >= size:
            return f"{b / size:,.1f} {unit}"
    return f"{b / 2**10:,.1f} KiB"


def fmt_s(seconds: float) -> str:
    return f"{seconds:,.0f} s" if seconds >= 10 else f"{seconds:.2g} s"
