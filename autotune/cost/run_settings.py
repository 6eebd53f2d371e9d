"""The run settings a step time is computed with: the cost model's own override (``TimeSettings``, set by the
published-runs bench), else the plan's (``ParallelPlan.fp8_recipe`` / ``tp_overlap`` / ``torch_compile``, set from
the command line or read back from a job's files), else the engine's default (``Engine.comm``, ``Engine.compiles``).

One place, so the estimate, the "assumed run settings" lines under it and the files emitted for the plan agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from autotune.engines import Engine
    from autotune.specs.plan import ParallelPlan


class TimeSettings(Protocol):
    """What these functions read of ``autotune.cost.step_time.TimeSettings`` (which imports this module)."""

    fp8_recipe: str | None
    tp_overlap: str | None
    torch_compile: bool

__all__ = ["fp8_recipe", "tp_overlap", "compiled", "recompute_modules", "DEFAULT_RECOMPUTE_MODULES"]

# What Megatron-core's selective recompute reruns unless told (transformer_config.py:1763 of megatron-core 0.19.2), as
# Korthikanti et al. 2022 Sec. 4.2 recompute the attention core: the cost model's "attention-core" policy.
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)


def fp8_recipe(plan: ParallelPlan, settings: TimeSettings | None, engine: Engine) -> str:
    """The FP8 scaling recipe (``autotune.cost.kernels.FP8_RECIPES``) an FP8 plan runs."""
    return (settings and settings.fp8_recipe) or plan.fp8_recipe or engine.comm.fp8_recipe


def tp_overlap(plan: ParallelPlan, settings: TimeSettings | None, engine: Engine) -> str:
    """How the plan's TP collectives overlap the GEMMs: "none", "userbuffers" or "async-tp"."""
    return (settings and settings.tp_overlap) or plan.tp_overlap or engine.comm.tp_overlap


def compiled(plan: ParallelPlan, settings: TimeSettings | None, engine: Engine) -> bool:
    """Whether the plan runs under torch.compile (its elementwise chains fused)."""
    return bool(settings and settings.torch_compile) or engine.compiles(plan)


def recompute_modules(plan: ParallelPlan) -> tuple[str, ...]:
    """What the plan's selective recompute reruns (the attention-core policy's modules)."""
    return plan.recompute_modules or DEFAULT_RECOMPUTE_MODULES


def without_defaults(plan: ParallelPlan) -> ParallelPlan:
    """``plan`` with each FP8 recipe / TP overlap / compile setting that is what its engine does anyway left unset:
    a job's files state some of them always (Megatron ``--fp8-recipe delayed``, torchtitan ``compile.enable``), and
    the plan read back from them is then the plan they were written for."""
    from autotune.engines import engine_for

    engine, none = engine_for(plan), None
    if plan.loss_chunks == 1:  # unchunked, as every engine's default
        plan = plan.with_(loss_chunks=None)
    if plan.recompute_modules == DEFAULT_RECOMPUTE_MODULES:
        plan = plan.with_(recompute_modules=None)
    if plan.cuda_graph == "none":  # no engine graphs by default
        plan = plan.with_(cuda_graph=None)
    if plan.ep_overlap == "none":  # no engine overlaps the all-to-alls by default
        plan = plan.with_(ep_overlap=None)
    if plan.moe_dispatcher == "alltoall":  # every engine's expert parallelism dispatches by all-to-all
        plan = plan.with_(moe_dispatcher=None)
    for name, effective in (("fp8_recipe", fp8_recipe), ("tp_overlap", tp_overlap), ("torch_compile", compiled)):
        if getattr(plan, name) is not None and not (name == "fp8_recipe" and plan.fp8_output_proj):  # MXFP8's
            unset = plan.with_(**{name: None})
            if effective(unset, none, engine) == effective(plan, none, engine):
                plan = unset
    return plan
