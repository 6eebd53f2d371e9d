"""What the opt-in run settings a search left at the engine's defaults would gain.

The search ranks plans with each engine's own run settings unless the request fixes them
(``SearchConstraints``): no CUDA graphs, the all-to-all MoE dispatcher, no EP or TP communication overlap, the p2p
context-parallel ring, no ``torch.compile`` where the engine does not compile by default. They are opt-in on purpose:
each changes how the job runs and needs what the engine's rules say (EP overlap: interleaving with pp > 1 and no full
recompute; TP overlap: sequence parallelism; a flex dispatcher: DeepEP / HybridEP installed; a graph: static
buffers and shapes). Yet they are where NVIDIA's tuned recipes find much of their speed: Megatron-Bridge's
Blackwell MoE recipes run a full-iteration CUDA graph, the HybridEP dispatcher and the EP overlap with delayed
weight gradients together (e.g. Megatron-Bridge 067f987 src/megatron/bridge/perf_recipes/qwen/gb200/qwen3_moe.py
``qwen3_235b_a22b_pretrain_256gpu_gb200_fp8mx_config``: ``moe_flex_dispatcher_backend = "hybridep"``,
``_enable_hybridep_full_iteration_mxfp8``), and their dense ones TP communication overlap with userbuffers
(perf_recipes/llama/gb200/llama3.py ``comm_overlap.tp_comm_overlap_cfg``). So `autotune plan` says what they
would gain, by the same cost model:

* for a mixture of experts, whose layouts the settings reshape (the EP overlap refuses full recompute; a
  full-iteration graph needs a dispatcher without host syncs), a second search over every plan of one engine (the
  first plan's where it runs the EP overlap, else the first searched engine that does) with that bundle
  (:data:`MOE_BUNDLES`; the second only where the first finds no plan that gains; each setting where the engine
  runs it and the request left it open), its fastest plan against this search's fastest;
* otherwise each combination of the opt-in settings (:data:`OPT_IN_SETTINGS`) on the first plan itself (a dozen
  estimates), the fastest that passes every rule and fits.

`autotune estimate` says it of the one plan it estimates (:func:`plan_setting_gains`): each combination of the
settings the command line and the job's files left open on that plan itself, for a mixture of experts with the
bundles' dispatcher and EP overlap among them (so each bundle is one combination), no search.

Only speed settings are tried; the ones that change what trains (gradient dtype, FP8 recipe, token dropping,
multi-token prediction) or only move memory (activation offload, the chunked loss) stay the user's to choose.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from dataclasses import dataclass, replace

from autotune.cost.estimate import Estimate, estimate
from autotune.cost.time_settings import TimeSettings
from autotune.engines import engine_for
from autotune.report import plan_summary
from autotune.rules import plan_problems
from autotune.search.planner import search_plans
from autotune.search.result import SearchResult
from autotune.search.space import SearchConstraints
from autotune.specs.plan import CP_COMM_TYPES, CUDA_GRAPHS, TP_OVERLAPS
from autotune.specs.settings import MemorySettings

__all__ = ["OPT_IN_SETTINGS", "MOE_BUNDLES", "MIN_GAIN", "SettingGains", "setting_gains", "plan_setting_gains",
           "with_setting_gains"]

OPT_IN_SETTINGS: dict[str, tuple[str, tuple[object, ...]]] = {
    "cuda_graph": ("--cuda-graph", tuple(v for v in CUDA_GRAPHS if v != "none")),
    "tp_overlap": ("--tp-overlap", tuple(v for v in TP_OVERLAPS if v != "none")),
    "cp_comm_type": ("--cp-comm-type", CP_COMM_TYPES),
    "torch_compile": ("--compile", (True,)),
}
"""{plan field: (flag, values tried)}: the speed-only run settings tried on the first plan, each value but the
engines' default."""

FLAGS = {name: flag for name, (flag, _) in OPT_IN_SETTINGS.items()} | {"moe_dispatcher": "--moe-dispatcher",
                                                                        "ep_overlap": "--ep-overlap"}
"""{plan field: the flag that sets it} of every setting tried."""
MOE_BUNDLES: tuple[dict[str, object], ...] = (
    {"cuda_graph": "full-iteration", "moe_dispatcher": "flex-hybridep", "ep_overlap": "a2a-delay-wgrad",
     "tp_overlap": "userbuffers"},
    {"cuda_graph": "transformer_engine", "moe_dispatcher": "flex-hybridep", "ep_overlap": "a2a-delay-wgrad",
     "tp_overlap": "userbuffers"},
)
"""The settings NVIDIA's Blackwell MoE recipes run together (module docstring), then the same with per-layer
(Transformer Engine) graphs where no plan runs a whole-iteration one."""

MIN_GAIN = 0.01
"""Gains under 1% are not reported (the model's error is several percent)."""


@dataclass(frozen=True, slots=True)
class SettingGains:
    """The opt-in settings that gain most, the plan they were estimated on and its gain."""

    settings: dict[str, object]
    """{plan field: value}."""
    flags: tuple[str, ...]
    """The command-line flags that set them."""
    best: Estimate
    gain: float
    """Predicted tokens/s of ``best`` over the compared plan's, minus 1."""
    scope: str
    """"search": ``best`` is the fastest plan of a search with the settings, compared with this search's fastest;
    "first plan": the search's first plan with them, compared with itself; "this plan": the plan `autotune estimate`
    estimated, with them, compared with itself."""

    @property
    def searched(self) -> bool:
        return self.scope == "search"

    def to_dict(self) -> dict:
        return {"settings": dict(self.settings), "flags": list(self.flags), "gain": self.gain,
                "scope": self.scope, "plan": self.best.plan.to_dict(),
                "summary": plan_summary(self.best.plan), "tokens_per_s": self.best.time.tokens_per_s}

    def text(self) -> str:
        flags = " ".join(self.flags)
        if self.searched:
            return (f"opt-in run settings (not searched: each changes how the job runs): with {flags} the fastest "
                    f"plan is {plan_summary(self.best.plan)} at {self.best.time.tokens_per_s:,.0f} tokens/s, "
                    f"{self.gain:+.1%} over this search's fastest (add the flags to rank every plan with them)")
        if self.scope == "this plan":
            return (f"opt-in run settings (not searched: each changes how the job runs): this plan with {flags}: "
                    f"{self.best.time.tokens_per_s:,.0f} tokens/s, {self.gain:+.1%}")
        return (f"opt-in run settings (not searched: each changes how the job runs): #1 with {flags} "
                f"{self.gain:+.1%} (add the flags to rank every plan with them)")


def _flags(settings: dict[str, object], flag_of: dict[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    for name, value in settings.items():
        out += [flag_of[name]] if value is True else [flag_of[name], str(value)]
    return tuple(out)


def _moe_engine(first: Estimate, constraints: SearchConstraints) -> str | None:
    """The engine the MoE bundle is searched on: the first plan's where it runs the EP overlap, else the first
    searched engine that does (None: none does)."""
    for engine in (first.plan.engine, *constraints.engines):
        if engine_for(engine).support.runs("ep_overlap", "a2a-delay-wgrad"):
            return engine
    return None


def _moe_search(fastest: Estimate, first: Estimate, engine: str, constraints: SearchConstraints,
                memory_settings: MemorySettings | None, time_settings: TimeSettings | None) -> SettingGains | None:
    support = engine_for(engine).support
    best: SettingGains | None = None
    for bundle in MOE_BUNDLES:
        if best is not None and best.gain >= MIN_GAIN:
            break  # the next bundle only where this one found no plan, or none that gains
        asked = {name: value for name, value in bundle.items()
                 if getattr(constraints, name) is None and support.runs(name, value)}
        if not asked:
            continue
        found = search_plans(first.model, first.cluster, seq_len=first.plan.seq_len,
                             global_batch_size=first.plan.global_batch_size,
                             constraints=replace(constraints, engines=(engine,), **asked), top_k=1,
                             memory_settings=memory_settings, time_settings=time_settings, ties=False)
        if found.ranked:
            top = found.ranked[0]
            # the settings its plan uses (an EP overlap says nothing to an ep=1 plan, a TP overlap to tp=1)
            used = {name: value for name, value in asked.items() if getattr(top.plan, name) == value}
            gains = SettingGains(used, _flags(used, FLAGS), top,
                                 top.time.tokens_per_s / fastest.time.tokens_per_s - 1, "search")
            if best is None or gains.gain > best.gain:
                best = gains
    return best


def _options(first: Estimate, fixed: Collection[str]) -> list[tuple[str, tuple[object, ...]]]:
    """[(plan field, (None, each value tried))]: the opt-in settings the plan leaves at the engine's default, ``fixed``
    does not name and its engine runs; for a mixture of experts also the MoE bundles' dispatcher and EP overlap, so
    that each bundle is one of the combinations."""
    plan = first.plan
    support = engine_for(plan).support
    tried = {name: values for name, (_, values) in OPT_IN_SETTINGS.items()}
    if first.model.is_moe:
        for bundle in MOE_BUNDLES:
            for name, value in bundle.items():
                if value not in tried.setdefault(name, ()):
                    tried[name] += (value,)
    options: list[tuple[str, tuple[object, ...]]] = []
    for name, values in tried.items():
        if name not in fixed and getattr(plan, name) in (None, False, "none"):
            runs = tuple(v for v in values if support.runs(name, v))
            if runs:
                options.append((name, (None, *runs)))
    return options


def plan_setting_gains(first: Estimate, fixed: Collection[str] = (), memory_settings: MemorySettings | None = None,
                       time_settings: TimeSettings | None = None, *, scope: str = "this plan") -> SettingGains | None:
    """The best combination of the opt-in settings (:func:`_options`) on ``first``'s plan itself, the fastest that
    passes every rule (the checks `autotune estimate` makes of a plan) and fits, against that plan; ``fixed``, the
    plan fields the user set (kept); None where no combination gains ``MIN_GAIN``."""
    plan = first.plan
    options = _options(first, fixed)
    # the plan again with the settings the variants get (the search may have estimated it with its engine
    # release's cost settings: SearchResult.release_cost_settings), so that the gain compares like with like
    base = estimate(first.model, first.cluster, plan, memory_settings, time_settings)
    best: tuple[float, dict, Estimate] | None = None
    for values in itertools.product(*(v for _, v in options)):
        asked = {name: value for (name, _), value in zip(options, values) if value is not None}
        if not asked:
            continue
        try:
            variant = plan.with_(**asked)
        except ValueError:  # a combination the plan itself refuses
            continue
        if plan_problems(first.model, first.cluster, variant):
            continue
        other = estimate(first.model, first.cluster, variant, memory_settings, time_settings)
        gain = other.time.tokens_per_s / base.time.tokens_per_s - 1
        if other.memory.fits and (best is None or gain > best[0]):
            best = (gain, asked, other)
    if best is None or best[0] < MIN_GAIN:
        return None
    return SettingGains(best[1], _flags(best[1], FLAGS), best[2], best[0], scope)


def setting_gains(first: Estimate, fastest: Estimate, constraints: SearchConstraints,
                  memory_settings: MemorySettings | None = None,
                  time_settings: TimeSettings | None = None) -> SettingGains | None:
    """What the opt-in settings the request left open would gain (module docstring): ``first``, the search's
    first plan; ``fastest``, its fastest by prediction; None where nothing gains ``MIN_GAIN``."""
    engine = _moe_engine(first, constraints) if first.model.is_moe else None
    if engine is not None:
        found = _moe_search(fastest, first, engine, constraints, memory_settings, time_settings)
    else:
        fixed = [name for name in FLAGS if getattr(constraints, name) is not None]
        found = plan_setting_gains(first, fixed, memory_settings, time_settings, scope="first plan")
    return found if found is not None and found.gain >= MIN_GAIN else None


def with_setting_gains(result: SearchResult, constraints: SearchConstraints,
                       memory_settings: MemorySettings | None = None,
                       time_settings: TimeSettings | None = None) -> SearchResult:
    """``result`` (a search with ``constraints``) with what the opt-in settings would gain on its first plan
    (:func:`setting_gains`, ``SearchResult.setting_gains``); as it is where it found no plan."""
    if not result.ranked:
        return result
    return replace(result, setting_gains=setting_gains(result.candidates[0], result.ranked[0], constraints,
                                                       memory_settings, time_settings))
