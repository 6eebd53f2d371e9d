"""What the emitters need besides the plan: job settings a user chooses (typed, validated)."""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.emit.megatron_flags import MEGATRON_CORE_RELEASES
from autotune.errors import require_no_problems

__all__ = ["EmitOptions", "CheckpointOptions", "LaunchOptions", "OptimizerOptions", "TORCHTITAN_VERSIONS", "CHECKPOINT_TIERS"]

TORCHTITAN_VERSIONS = ("0.2", "0.3")
"""torchtitan releases the fsdp engine writes files for, oldest first (the last is the default)."""
CHECKPOINT_TIERS = ("shared", "local")
"""Checkpoint storage tiers (``autotune.cost.checkpoint_tiers``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerOptions:
    """Optimizer and schedule written into ds_config / Megatron flags."""

    lr: float = 3e-4
    min_lr: float = 3e-5
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    warmup_steps: int = 2000
    train_steps: int = 100_000
    grad_clip: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointOptions:
    """Checkpoint policy inputs (see autotune/emit/checkpoint.py for how they are used)."""

    save_dir: str = "checkpoints"
    storage_bandwidth_gb_per_s: float = 5.0
    """Aggregate write bandwidth of the checkpoint storage (a parallel file system: 5-50 GB/s)."""
    gpu_mtbf_hours: float = 50_000.0
    """Mean time between failures of one GPU (with its share of node, NIC, switch). The job's MTBF is
    this over the GPU count: 1,024 GPUs fail about every 49 hours, 16,384 every 3 (Llama 3: 419
    interruptions in 54 days on 16,384 GPUs, i.e. one every ~3.1 hours)."""
    relaunch_s: float = 300.0
    """Seconds from a failure to training again, checkpoint read and rendezvous excluded: scheduler requeue, node
    replacement, process start and imports. An assumption of the right order (minutes at scale), not a
    measurement. The rendezvous, which grows with the rank count, is added by the cost model
    (``autotune.cost.checkpoint_tiers.rendezvous_s``)."""
    tier: str = "shared"
    """Where saves go: "shared" (a parallel file system, every save durable) or "local" (node-local storage with a
    replica on a peer node, frequent saves, durable saves to the shared tier less often; Megatron-LM only)."""
    tier_required: bool = True
    """False where the tier came from the cluster file (what the cluster offers): a plan that cannot use the local
    tier then saves to the shared one, saying why, instead of being an error."""
    local_storage_bandwidth_gb_per_s: float = 10.0
    """Write/read bandwidth of one node's local storage (tier "local"). Assumed: a DGX H100 holds 8 x 3.84 TB NVMe
    U.2 data drives in RAID 0 (NVIDIA DGX H100 datasheet); 10 GB/s leaves room for the file system."""
    local_dir: str = "/raid/autotune-local-checkpoints"
    """Node-local folder of the local tier (DGX OS mounts the NVMe RAID at /raid)."""
    keep_last: int = 3
    async_save: bool = True
    interval_steps: int | None = None
    """Override the computed availability-optimal interval (of the local tier's saves when tier is "local")."""
    pretrained_dir: str | None = None
    """The pretrained checkpoint a fine-tuning plan (``ParallelPlan.peft``) starts from (Megatron-Bridge
    ``checkpoint.pretrained_checkpoint``); None: none given."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchOptions:
    """Where and how the job starts."""

    hosts: tuple[str, ...] = ()
    """Host names, one per node; empty: localhost for one node, SLURM's for sbatch."""
    master_addr: str | None = None
    master_port: int = 29500
    script: str | None = None
    """The user's training script; None: the engine's default (the built-in ``python -m autotune.train`` for
    DeepSpeed, FSDP2 and HF; ``pretrain_gpt.py`` for Megatron-LM and Megatron-DeepSpeed)."""
    script_args: tuple[str, ...] = ()
    wrap_class: str | None = None
    """The model's transformer block class for accelerate's FSDP2 auto-wrap (``fsdp_transformer_layer_cls_to_wrap``:
    ``LlamaDecoderLayer``, your own ``MyBlock``; several comma-separated). None: the built-in model's ``Block``,
    or, when the model came from a Hugging Face config.json, the decoder layer transformers names for its
    architecture (``emit --wrap-class`` sets it)."""
    nccl_env: dict[str, str] = field(default_factory=dict)
    """Extra NCCL_* settings (documented options: NCCL_IB_HCA, NCCL_SOCKET_IFNAME, NCCL_IB_GID_INDEX...)."""
    slurm_partition: str | None = None
    slurm_account: str | None = None
    slurm_time: str = "48:00:00"
    job_name: str = "autotune"


@dataclass(frozen=True, slots=True, kw_only=True)
class EmitOptions:
    optimizer: OptimizerOptions = OptimizerOptions()
    checkpoint: CheckpointOptions = CheckpointOptions()
    launch: LaunchOptions = LaunchOptions()
    steps_per_print: int = 10
    wall_clock_breakdown: bool = False
    torchtitan_version: str = "0.3"
    """The torchtitan release the fsdp engine's torchtitan file is for: "0.3" (the newest modelled) writes a
    Python config module (torchtitan_plan.py), "0.2" the v0.2.x TOML job config (torchtitan_job.toml)."""
    megatron_version: str = MEGATRON_CORE_RELEASES[-1]
    """The Megatron-core release megatron_args.sh is for: its flags must be in that release's flag table."""

    def __post_init__(self) -> None:
        problems = []
        o, c, lo = self.optimizer, self.checkpoint, self.launch
        if not o.lr > 0 or not o.min_lr >= 0 or o.min_lr > o.lr:
            problems.append(f"learning rates must satisfy 0 <= min_lr <= lr and lr > 0 (lr {o.lr}, min_lr {o.min_lr})")
        if o.warmup_steps < 0 or o.train_steps < 1 or o.warmup_steps > o.train_steps:
            problems.append(f"need 0 <= warmup_steps <= train_steps and train_steps >= 1 "
                            f"(got {o.warmup_steps}, {o.train_steps})")
        if not c.storage_bandwidth_gb_per_s > 0 or not c.gpu_mtbf_hours > 0 or c.keep_last < 1 or not c.relaunch_s >= 0:
            problems.append("checkpoint storage bandwidth and GPU MTBF must be > 0, relaunch_s >= 0 and keep_last >= 1")
        if c.tier not in CHECKPOINT_TIERS:
            problems.append(f"checkpoint tier {c.tier!r}: expected one of {', '.join(CHECKPOINT_TIERS)} (shared: a "
                            "parallel file system; local: node-local storage with a peer replica)")
        if not c.local_storage_bandwidth_gb_per_s > 0 or c.local_storage_bandwidth_gb_per_s == float("inf"):
            problems.append(f"local_storage_bandwidth_gb_per_s must be a finite number > 0, got "
                            f"{c.local_storage_bandwidth_gb_per_s}")
        if c.interval_steps is not None and c.interval_steps < 1:
            problems.append(f"checkpoint interval must be >= 1 step, got {c.interval_steps}")
        if not 1 <= lo.master_port <= 65535:
            problems.append(f"master_port must be in 1..65535, got {lo.master_port}")
        if lo.wrap_class is not None and not all(part.strip().isidentifier() for part in lo.wrap_class.split(",")):
            problems.append(f"wrap_class {lo.wrap_class!r}: expected a Python class name (LlamaDecoderLayer), or "
                            "several separated by commas")
        if self.torchtitan_version not in TORCHTITAN_VERSIONS:
            problems.append(f"torchtitan_version {self.torchtitan_version!r}: autotune writes for torchtitan "
                            f"{' or '.join(TORCHTITAN_VERSIONS)} (0.3: a Python config module, 0.2: a TOML job config)")
        if self.megatron_version not in MEGATRON_CORE_RELEASES:
            problems.append(f"megatron_version {self.megatron_version!r}: autotune models Megatron-core "
                            f"{', '.join(MEGATRON_CORE_RELEASES)}")
        if self.steps_per_print < 1:
            problems.append(f"steps_per_print must be >= 1, got {self.steps_per_print}")
        require_no_problems(problems, subject="emit options")
