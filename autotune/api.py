"""The library API the CLI (and users' pipelines) call: build a plan, estimate it."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.cost.memory import MemoryEstimate, MemorySettings, estimate_memory
from autotune.cost.step_time import StepTimeEstimate, TimeSettings, estimate_step_time
from autotune.errors import InputError
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.rules import plan_problems

__all__ = ["Estimate", "make_plan", "estimate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """One plan's prediction (the contract's ``estimate --json``)."""

    @property
    def fits(self) -> bool:
        return self.memory.fits

    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    memory: MemoryEstimate
    time: StepTimeEstimate

    def to_dict(self) -> dict:
        return {
            "model": {"name": self.model.name, "num_params": self.model.num_params,
                      "num_active_params": self.model.num_active_params},
            "cluster": {"gpu": self.cluster.gpu.name, "num_gpus": self.cluster.num_gpus,
                        "gpus_per_node": self.cluster.gpus_per_node},
            "plan": self.plan.to_dict(),
            "memory": self.memory.to_dict(),
            "time": self.time.to_dict(),
        }


def make_plan(model: ModelSpec, cluster: ClusterSpec, *, global_batch_size: int | None = None, tp: int = 1,
              pp: int = 1, cp: int = 1, micro_batch_size: int = 1, sequence_parallel: bool | None = None,
              **rest) -> ParallelPlan:
    """A plan for ``cluster`` with dp and gradient accumulation derived; InputError lists every problem.

    ``global_batch_size`` None means one micro-batch per data-parallel replica. ``sequence_parallel``
    None means on whenever tp > 1 (Megatron's recommended setting).
    """
    problems: list[str] = []
    mp = tp * pp * cp
    if mp >= 1 and cluster.num_gpus % mp == 0:
        dp = cluster.num_gpus // mp
    else:
        problems.append(f"num_gpus ({cluster.num_gpus}) is not divisible by tp*pp*cp ({tp}*{pp}*{cp}={mp}): "
                        f"choose tp, pp and cp whose product divides {cluster.num_gpus}")
        dp = 1
    if global_batch_size is None:
        global_batch_size = micro_batch_size * dp
    per_step = micro_batch_size * dp
    accum = max(1, global_batch_size // per_step) if per_step > 0 else 1
    if sequence_parallel is None:
        sequence_parallel = tp > 1
    try:
        plan = ParallelPlan(tp=tp, pp=pp, cp=cp, dp=dp, micro_batch_size=micro_batch_size,
                            global_batch_size=global_batch_size, grad_accum_steps=accum,
                            sequence_parallel=sequence_parallel, **rest)
    except InputError as err:
        raise InputError(problems + list(err.problems), subject="plan") from None
    problems += [msg for rule, msg in plan_problems(model, cluster, plan) if not (problems and rule == "world_size")]
    if problems:
        raise InputError(problems, subject="plan")
    return plan


def estimate(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, settings: MemorySettings | None = None,
             time_settings: TimeSettings | None = None) -> Estimate:
    """The memory ledger and step time of one (valid) plan."""
    return Estimate(model=model, cluster=cluster, plan=plan, memory=estimate_memory(model, cluster, plan, settings),
                    time=estimate_step_time(model, cluster, plan, time_settings))
