"""DeepSpeed 0.19.8 configs for a plan: plain JSON, the Hugging Face Trainer variant, accelerate's YAML.

Every key written exists in DeepSpeed 0.19.8 (its pydantic config models under ``deepspeed/runtime``, the
keys ``schemas/deepspeed_config.schema.json`` lists) and none of the keys 0.19.8 rejects is written. Integers are written as ints (pydantic accepts ``5e8`` for an
int field but rejects ``5.5``). The ZeRO bucket sizes are the :class:`MemorySettings` the memory
ledger assumed, so the job runs with the buffers the estimate counted. Every config written here
passes :func:`autotune.emit.validate.validate_deepspeed_config` (schema, DeepSpeed's own parser,
cross-field rules) for the plan's world size; the tests check that for hundreds of planner plans.

What DeepSpeed has no key for is said by :func:`deepspeed_config_notes`, for the caller to warn:
FP8 (Transformer Engine's ``fp8_autocast`` in the model code; the config says bf16), and the
optimizers DeepSpeed does not build (Adafactor, 8-bit AdamW: the config names AdamW).
"""

from __future__ import annotations

import copy

from autotune.emit.options import EmitOptions
from autotune.errors import InputError
from autotune.specs.hardware import ClusterSpec
from autotune.specs.layout import pipeline_split
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.settings import MemorySettings

__all__ = ["DEEPSPEED_VERSION", "HF_AUTO_PATHS", "PARAM_NVME_BUFFER_COUNT", "deepspeed_config",
           "deepspeed_config_notes", "hf_deepspeed_config"]

DEEPSPEED_VERSION = "0.19.8"
"""The DeepSpeed release whose keys and rules the configs follow."""

# Where the Hugging Face integration replaces "auto" (transformers integrations/deepspeed.py,
# HfTrainerDeepSpeedConfig.trainer_config_process / trainer_config_finalize). Everywhere else "auto"
# reaches DeepSpeed: a top-level value raises TypeError, one inside a pydantic block is dropped to
# DeepSpeed's default (config_utils.py:56).
HF_AUTO_PATHS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps", "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps", "fp16.enabled", "bf16.enabled",
    "zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
})

# DeepSpeed defaults the ledger does not model (zero/config.py:228, 251).
_PARAM_PERSISTENCE_THRESHOLD = 100_000
_MAX_REUSE_DISTANCE = 1_000_000_000
# Optimizer NVMe swapping: one buffer per fp32 state tensor of Adam (master, exp_avg, exp_avg_sq, grad).
_OPTIMIZER_NVME_BUFFER_COUNT = 4
PARAM_NVME_BUFFER_COUNT = 5
# Dynamic fp16 loss scaling, DeepSpeed's documented defaults (precision_config.py:115-155).
_FP16_LOSS_SCALING = {"loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
                      "min_loss_scale": 1}
_CHECKPOINT_BLOCK = {"tag_validation": "Warn", "load_universal": False, "use_node_local_storage": False}
# Optimizers DeepSpeed cannot build from the config; they are written as AdamW (see deepspeed_config_notes).
_NO_DEEPSPEED_OPTIMIZER = {"adafactor": "Adafactor", "adamw8bit": "8-bit AdamW (bitsandbytes)"}


def _layers_per_stage(model: ModelSpec, plan: ParallelPlan) -> int:
    split = pipeline_split(model.num_layers, plan.pp)
    return max(split) if split is not None else -(-model.num_layers // plan.pp)


def _zero_block(plan: ParallelPlan, settings: MemorySettings, *, gather_16bit: bool = True) -> dict:
    zero: dict = {
        "stage": plan.zero_stage,
        "contiguous_gradients": True,
        "overlap_comm": plan.overlap_comm,
        "reduce_bucket_size": int(settings.reduce_bucket_size),
        "allgather_bucket_size": int(settings.allgather_bucket_size),
    }
    if plan.zero_stage == 3:
        zero.update({
            "stage3_prefetch_bucket_size": int(settings.stage3_prefetch_bucket_size),
            "stage3_param_persistence_threshold": _PARAM_PERSISTENCE_THRESHOLD,
            "stage3_max_live_parameters": int(settings.stage3_max_live_parameters),
            "stage3_max_reuse_distance": _MAX_REUSE_DISTANCE,
            "stage3_gather_16bit_weights_on_model_save": gather_16bit,
        })
    # The ledger's NVMe staging buffers are buffer_count x buffer_size x 2 bytes (memory.py).
    param_buffer_size = max(1, int(settings.offload_buffer_bytes) // (PARAM_NVME_BUFFER_COUNT * 2))
    for name, device in (("offload_optimizer", plan.offload_optimizer), ("offload_param", plan.offload_param)):
        if device == "none":
            continue
        if device == "nvme" and not plan.nvme_path:
            raise InputError([f"{name}=nvme needs nvme_path (a local NVMe folder)"], subject="plan")
        block: dict = {"device": device, "pin_memory": True}
        if device == "nvme":
            block["nvme_path"] = plan.nvme_path
            if name == "offload_param":
                block.update(buffer_count=PARAM_NVME_BUFFER_COUNT, buffer_size=param_buffer_size)
            else:
                block["buffer_count"] = _OPTIMIZER_NVME_BUFFER_COUNT
        zero[name] = block
    return zero


def _optimizer_block(plan: ParallelPlan, options: EmitOptions, *, auto: bool) -> dict:
    o = options.optimizer
    # HF fills lr/betas/eps/weight_decay from TrainingArguments and refuses concrete values that differ.
    fill = (lambda v: "auto") if auto else (lambda v: v)
    if plan.optimizer == "sgd":
        # torch.optim.SGD (engine.py:2545); momentum: the first beta, as for Adam's first moment.
        return {"type": "SGD",
                "params": {"lr": fill(o.lr), "momentum": o.betas[0], "weight_decay": fill(o.weight_decay)}}
    params = {"lr": o.lr, "betas": list(o.betas), "eps": o.eps, "weight_decay": o.weight_decay}
    return {"type": "AdamW", "params": {k: fill(v) for k, v in params.items()}}


def _scheduler_block(options: EmitOptions, *, auto: bool) -> dict:
    o = options.optimizer
    # WarmupCosineLR (lr_schedules.py:865): the peak is the optimizer lr; cos_min_ratio = min_lr / lr.
    params: dict = {
        "total_num_steps": int(o.train_steps),
        "warmup_num_steps": max(1, int(o.warmup_steps)),  # must be a positive int (lr_schedules.py:874)
        "warmup_min_ratio": 0.0,
        "cos_min_ratio": o.min_lr / o.lr,
        "warmup_type": "linear",
    }
    if auto:
        params.update(total_num_steps="auto", warmup_num_steps="auto")
    return {"type": "WarmupCosineLR", "params": params}


def _precision_blocks(plan: ParallelPlan, *, auto: bool) -> dict:
    if auto:  # the Trainer's --bf16 / --fp16 decide; the loss scaling is ours
        return {"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto", **_FP16_LOSS_SCALING}}
    if plan.precision == "fp16":
        return {"fp16": {"enabled": True, **_FP16_LOSS_SCALING}}
    # bf16, and fp8: DeepSpeed has no fp8 key; the model runs bf16 outside Transformer Engine's fp8_autocast.
    return {"bf16": {"enabled": True}}


def deepspeed_config(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, options: EmitOptions | None = None,
                     memory_settings: MemorySettings | None = None, *, checkpoint_block: dict | None = None,
                     autotp: bool = True, ulysses: bool = True) -> dict:
    """The DeepSpeed 0.19.8 config (a JSON-ready dict) that runs ``plan``.

    ``train_batch_size`` = global batch = micro-batch x accumulation x dp, where dp is world / (tp x pp x cp);
    AutoTP configs write it x tp (DeepSpeed 0.19.8 counts TP ranks in it, see below) and Ulysses ones say
    ``sequence_parallel_size``. ``checkpoint_block`` entries extend or override the ``checkpoint`` block.
    ``autotp``: tp > 1 is DeepSpeed's AutoTP (``tensor_parallel.autotp_size``), not TP done outside DeepSpeed
    (Megatron-DeepSpeed's); ``ulysses``: cp > 1 is DeepSpeed-Ulysses (``sequence_parallel_size``). The caller's
    engine says which (``autotune.engines.common.engine_deepspeed_config``).
    On the ``cpu`` cluster AdamW runs as ``torch.optim.AdamW`` (``torch_adam``), not DeepSpeed's CPU FusedAdam,
    which a user's script would otherwise JIT-build for minutes on its first step.
    """
    cfg = _build(model, plan, options or EmitOptions(), memory_settings or MemorySettings(), checkpoint_block,
                 auto=False, autotp=autotp, ulysses=ulysses)
    return _torch_adam_on_cpu(cfg, cluster, plan)


def _torch_adam_on_cpu(cfg: dict, cluster: ClusterSpec, plan: ParallelPlan) -> dict:
    if cluster.gpu.name == "cpu" and cfg["optimizer"]["type"] == "AdamW" and plan.offload_optimizer == "none":
        # DeepSpeed's CPU FusedAdam is a JIT build of minutes on first use (tune/ops.py); torch.optim.AdamW computes
        # the same update (DeepSpeed 0.19.8 ops/adam: torch_adam selects it).
        cfg["optimizer"]["params"]["torch_adam"] = True
    return cfg


def _build(model: ModelSpec, plan: ParallelPlan, options: EmitOptions, settings: MemorySettings,
           checkpoint_block: dict | None, *, auto: bool, autotp: bool = True, ulysses: bool = True,
           gather_16bit: bool = True) -> dict:
    full = plan.recompute == "full"
    cfg: dict = {
        "train_batch_size": plan.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.grad_accum_steps,
        "gradient_clipping": options.optimizer.grad_clip,
        "steps_per_print": options.steps_per_print,
        "wall_clock_breakdown": options.wall_clock_breakdown,
        "zero_optimization": _zero_block(plan, settings, gather_16bit=gather_16bit),
        **_precision_blocks(plan, auto=auto),
        "optimizer": _optimizer_block(plan, options, auto=auto),
        "scheduler": _scheduler_block(options, auto=auto),
        "activation_checkpointing": {
            # Partitioning splits each checkpoint over the TP ranks (Megatron-style mpu); no gain at tp=1.
            "partition_activations": plan.tp > 1 and plan.recompute != "none",
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        },
        "checkpoint": {**_CHECKPOINT_BLOCK, **copy.deepcopy(checkpoint_block or {})},
    }
    if full:  # checkpoints per forward pass of a stage (sizes the contiguous buffers)
        per_stage = plan.recompute_num_layers or _layers_per_stage(model, plan)
        cfg["activation_checkpointing"]["number_checkpoints"] = per_stage
    if plan.optimizer == "sgd" and plan.zero_stage > 0:
        # torch.optim.SGD is not in ZERO_SUPPORTED_OPTIMIZERS (zero/utils.py:45): engine.py:2298 asserts without this.
        cfg["zero_allow_untested_optimizer"] = True
    if plan.pp > 1:
        cfg["pipeline"] = {"activation_checkpoint_interval": 1 if full else 0}
    if plan.tp > 1 and autotp:
        cfg["tensor_parallel"] = {"autotp_size": plan.tp}  # AutoTP training (tensor_parallel/config.py:45)
        # DeepSpeed 0.19.8 reads the batch sizes before AutoTP makes its groups, with no mpu, so it checks
        # train_batch_size == micro x accumulation x the whole world, TP ranks included (runtime/config.py:466-471,
        # 602), although TP ranks share their batch: train_batch_size is written as DeepSpeed counts it, global
        # batch x tp (what engine.train_batch_size() reports); the sequences per step stay the plan's.
        cfg["train_batch_size"] = plan.global_batch_size * plan.tp
    if plan.cp > 1 and ulysses:
        # Read when no mpu is passed (the HF zero.init case): DeepSpeed's dp world = world / sequence_parallel_size
        # (runtime/config.py:468), so the batch check counts dp, not the Ulysses ranks.
        cfg["sequence_parallel_size"] = plan.cp
    if auto:
        for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                    "gradient_clipping"):
            cfg[key] = "auto"
        zero = cfg["zero_optimization"]
        for key in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"):
            if key in zero:
                zero[key] = "auto"
    return cfg


def deepspeed_config_notes(plan: ParallelPlan) -> list[str]:
    """What the config cannot say, for the caller to warn about (empty when it says everything)."""
    notes = []
    if plan.optimizer in _NO_DEEPSPEED_OPTIMIZER:
        notes.append(f"DeepSpeed has no {_NO_DEEPSPEED_OPTIMIZER[plan.optimizer]} optimizer: the config names AdamW; "
                     f"to train with {plan.optimizer}, pass the optimizer to deepspeed.initialize(optimizer=...) and "
                     f"delete the config's optimizer block (the memory estimate assumed {plan.optimizer}'s states)")
    if plan.precision == "fp8":
        notes.append("DeepSpeed has no fp8 key: the config enables bf16; FP8 GEMMs come from Transformer Engine "
                     "modules run under te.fp8_autocast in the model code (see the emitted TE recipe)")
    return notes


def hf_deepspeed_config(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, options: EmitOptions | None = None,
                        memory_settings: MemorySettings | None = None, *, checkpoint_block: dict | None = None,
                        gather_16bit: bool = True) -> dict:
    """The Hugging Face Trainer / accelerate variant: ``"auto"`` exactly where the integration fills it.

    The batch sizes, clipping, optimizer hyper-parameters, scheduler steps and bf16/fp16 switches
    come from ``TrainingArguments`` (accelerate's ``mixed_precision`` picks bf16 or fp16); the rest
    is the plan's (on the ``cpu`` cluster AdamW as ``torch_adam``, as :func:`deepspeed_config`). The integration
    sizes the auto buckets from the model: reduce hidden^2 (under the
    ledger's 5e8 while hidden < 22,360), ZeRO-3 prefetch 0.9 hidden^2 (over the ledger's 5e7 once
    hidden > 7,450: for hidden 16,384 about 0.4 GB more per GPU than estimated). ``gather_16bit``: ZeRO-3's
    ``stage3_gather_16bit_weights_on_model_save``, which makes the Trainer gather the whole model to rank 0 at
    every save (``CheckpointPolicy.gather_16bit_weights_on_model_save`` says whether node 0 can hold it).
    """
    cfg = _build(model, plan, options or EmitOptions(), memory_settings or MemorySettings(), checkpoint_block,
                 auto=True, gather_16bit=gather_16bit)
    return _torch_adam_on_cpu(cfg, cluster, plan)
