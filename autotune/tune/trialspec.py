"""What a profiling trial is (:class:`TrialSpec`, :class:`Workload`) and what it gave (:class:`TrialResult`).

Shared by the trial's three parts: :mod:`autotune.tune.launch` (starting and ending its processes),
:mod:`autotune.tune.logs` (reading its log) and :mod:`autotune.tune.judge` (its verdict), which
:mod:`autotune.tune.trial` runs together.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from autotune.emit.options import EmitOptions
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["Workload", "TrialSpec", "TrialResult", "Status", "LOG_NAME", "DS_CONFIG_NAME", "METRICS_NAME",
           "RESULT_NAME", "LAUNCH_NAME", "TRAIN_PLAN_NAME", "COMMAND_PLACEHOLDERS", "placeholder_list",
           "trial_model_of"]

LOG_NAME = "trial.log"
DS_CONFIG_NAME = "ds_config.json"
METRICS_NAME = "metrics.json"
RESULT_NAME = "result.json"
TRAIN_PLAN_NAME = "plan.json"
"""builtin trials: the estimate document ``python -m autotune.train --plan`` reads (the trial's model and plan)."""
LAUNCH_NAME = "launch.json"
"""The launched process group (host, pid, pgid, start time): ``--resume`` ends it if a killed tuner left it."""

Status = Literal["completed", "pruned", "oom", "crashed", "hung"]

COMMAND_PLACEHOLDERS = {
    "nproc": "the trial's rank count (the plan's world size)",
    "ds_config": "the path of the trial's DeepSpeed config",
    "workdir": "the trial's folder",
    "steps": "the steps the trial runs: --warmup-steps + --steps (the command is ended once that many metric "
             "lines are in)",
    "megatron_args": "the plan's Megatron-LM arguments",
    "accelerate_config": "the path of accelerate's config for the plan (engine hf: DeepSpeed, fsdp: FSDP2)",
    "torchtitan_config": "the path of torchtitan 0.2's TOML for the plan (engine fsdp)",
    "micro_batch": "the plan's micro-batch per GPU",
    "grad_accum": "the plan's micro-batches per optimizer step (micro_batch x grad_accum x dp = the global batch)",
}
"""A ``--command`` template's placeholders (:func:`autotune.tune.launch.command_line` fills them) and what each is."""


def placeholder_list() -> str:
    """The placeholders as a user writes them: ``{nproc}, {ds_config}, ...``."""
    return ", ".join("{" + name + "}" for name in COMMAND_PLACEHOLDERS)


def trial_model_of(model: ModelSpec, workload_kind: str, num_layers: int | None) -> ModelSpec:
    """The model a trial runs: builtin trials cut to ``num_layers``; a script or command builds its own model,
    which the tuner takes to be ``model`` (``tune --num-layers`` is refused for them)."""
    if num_layers is not None and workload_kind == "builtin" and num_layers != model.num_layers:
        return dataclasses.replace(model, num_layers=num_layers)
    return model


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """What a trial runs: ``builtin``, the plan's engine's built-in trainer (``python -m autotune.train``,
    :mod:`autotune.train`, on the model :mod:`autotune.workloads` builds); ``script``, the user's DeepSpeed
    script; ``command``, a shell command template."""

    kind: Literal["builtin", "script", "command"]
    script: str | None = None
    """script: the user's unchanged DeepSpeed script (it gets ``--deepspeed_config PATH``)."""
    script_args: tuple[str, ...] = ()
    command: str | None = None
    """command: a template, e.g. ``torchrun --nproc_per_node {nproc} pretrain_gpt.py {megatron_args} --train-iters
    {steps}``; its placeholders: :data:`COMMAND_PLACEHOLDERS`."""
    metric_pattern: str | None = None
    """command: regex with a named group ``step_time_s`` (or ``tokens_per_s``) matched on each log line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialSpec:
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    workload: Workload
    workdir: Path
    """This trial's folder: ds_config.json, trial.log, result.json."""
    steps: int = 6
    """Measured optimizer steps (after the warm-up)."""
    warmup_steps: int = 2
    timeout_s: float = 300.0
    host_memory_limit_bytes: int | None = None
    """The trial is stopped (status "oom") when its process tree's resident memory exceeds this."""
    num_layers: int | None = None
    """builtin: run this many layers instead of the model's, to keep trials short."""
    launcher: str = "torchrun"
    """How the ranks are started: torchrun (this machine), deepspeed or slurm (:mod:`autotune.tune.launchers`)."""
    hostfile: str | None = None
    """deepspeed launcher: an MPI-style hostfile (``host slots=N``); None: this machine."""
    include: str = ""
    """deepspeed launcher: ``--include`` (DeepSpeed's ``NAME[:SLOT,...][@...]``)."""
    exclude: str = ""
    """deepspeed launcher: ``--exclude``."""
    emit_options: EmitOptions | None = None
    """The engine releases' file formats (``EmitOptions.megatron_version`` / ``torchtitan_version``): a command
    workload's ``{megatron_args}`` follow that release's flag table, plan.json records it; None: the newest."""

    @property
    def trial_model(self) -> ModelSpec:
        """The model the trial really runs (the layer count cut to ``num_layers`` for builtin runs)."""
        return trial_model_of(self.model, self.workload.kind, self.num_layers)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialResult:
    status: Status
    reason: str
    """A sentence: why (e.g. "exit code 1 (rank 1): AssertionError: ... (log: PATH)")."""
    log_path: Path
    step_time_s: float | None = None
    """Median over the measured steps (after warm-up)."""
    tokens_per_s: float | None = None
    tflops_per_gpu: float | None = None
    """Model FLOPs (recompute excluded) per step / step time / world size, in TFLOP/s."""
    peak_memory_bytes: int | None = None
    """CPU: peak RSS of the busiest rank; GPU: torch.cuda.max_memory_allocated of the busiest rank."""
    step_times_s: tuple[float, ...] = ()
    """Measured step times (warm-up excluded)."""
    returncode: int | None = None

    def to_attrs(self) -> dict:
        """A JSON-safe dict (Optuna user attributes)."""
        def num(x):
            return x if x is None or math.isfinite(x) else None
        return {
            "status": self.status,
            "reason": self.reason,
            "log_path": str(self.log_path),
            "step_time_s": num(self.step_time_s),
            "tokens_per_s": num(self.tokens_per_s),
            "tflops_per_gpu": num(self.tflops_per_gpu),
            "peak_memory_bytes": self.peak_memory_bytes,
            "step_times_s": [num(t) for t in self.step_times_s],
            "returncode": self.returncode,
        }
