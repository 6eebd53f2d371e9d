"""The nearest plan that passes every rule, for a plan that breaks some: what an invalid ``estimate`` / ``emit``
names beside the rules it broke (issue 17: "the rule's text and source line, and the nearest plan that passes").

Only the layout changes: tp, pp, cp, ep, etp and vpp (dp follows as num_gpus / (tp x pp x cp), the accumulation as
global batch / (micro-batch x dp)); the engine, batch, precision and run settings stay the user's. Nearest means the
fewest dimensions changed, then the smallest change in powers of two, summed over the dimensions (ep 64 -> 32 is one
step, tp 2 -> 8 two; a tensor-parallel group moved past the node, which puts each layer's collectives on the
network, three steps for each doubling past it: ``tp 8 -> 16`` on nodes of 8 weighs more than ``vpp 4 -> 1``), then
the smallest change of dp (the batch per replica and the memory it sets). One or two dimensions are tried at every value the cluster and the model allow, three only at
half or twice the user's values: beyond that the user is better served by ``autotune plan``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from autotune.errors import InputError
from autotune.rules import plan_problems
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["NearestPlan", "nearest_valid_plan", "nearest_on_other_engine"]

DIMS = ("tp", "pp", "cp", "ep", "etp", "vpp")
"""The layout dimensions the search changes, in the order a suggestion names them."""


@dataclass(frozen=True)
class NearestPlan:
    plan: ParallelPlan
    changes: tuple[tuple[str, int, int], ...]
    """(dimension, the user's value, the suggested one) for each dimension changed."""
    distance: float
    """The changes' size (:func:`_distance`, module docstring)."""

    def flags(self) -> str:
        """The suggestion as the command line's flags (``--tp 2 --ep 32``)."""
        return " ".join(f"--{dim} {new}" for dim, _, new in self.changes)

    def describe(self) -> str:
        changed = ", ".join(f"{dim} {old} -> {new}" for dim, old, new in self.changes)
        return f"the nearest plan that passes every rule: {self.flags()} ({changed}; dp {self.plan.dp})"

    def describe_on_engine(self) -> str:
        """The suggestion for another engine than the user's (:func:`nearest_on_other_engine`)."""
        changed = ", ".join(f"{dim} {old} -> {new}" for dim, old, new in self.changes)
        return (f"nearer, on another engine: --engine {self.plan.engine} {self.flags()} ({changed}; dp "
                f"{self.plan.dp})")


def _value(plan: ParallelPlan, dim: str) -> int:
    return plan.expert_tp if dim == "etp" else getattr(plan, dim)


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(int(math.log2(max(1, limit))) + 1)]


def _choices(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> dict[str, list[int]]:
    """Every value each dimension may take on this cluster and model."""
    n = cluster.num_gpus
    moe = model.moe
    experts = moe.num_experts if moe is not None else 1
    return {
        "tp": [v for v in _powers_of_two(min(n, model.num_attention_heads)) if n % v == 0],
        "pp": [v for v in range(1, min(n, model.num_layers) + 1) if n % v == 0],
        "cp": [v for v in _powers_of_two(n) if n % v == 0],
        "ep": [v for v in _powers_of_two(n) if experts % v == 0] if moe is not None else [1],
        "etp": _powers_of_two(min(n, model.num_attention_heads)) if moe is not None else [plan.expert_tp],
        # up to the layers + 2 chunks torchtitan's split allows (the embedding and the output a chunk's layer each,
        # specs.layout.torchtitan_split); the rules drop what an engine's own split refuses
        "vpp": [v for v in range(1, max(1, (model.num_layers + 2) // max(1, plan.pp)) + 1)],
    }


def _neighbours(value: int, allowed: list[int]) -> list[int]:
    return [v for v in (value // 2, value * 2) if v in allowed and v != value]


def _build(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, values: dict[str, int],
           accept: Callable[[ParallelPlan], bool] | None = None) -> ParallelPlan | None:
    """The plan with ``values`` changed, dp and accumulation derived; None when it breaks a rule (or ``accept``
    refuses it)."""
    fields = {k: v for k, v in values.items() if k != "etp"}
    tp, pp, cp = (values.get(k, getattr(plan, k)) for k in ("tp", "pp", "cp"))
    if cluster.num_gpus % (tp * pp * cp):
        return None
    dp = cluster.num_gpus // (tp * pp * cp)
    per_step = plan.micro_batch_size * dp
    if per_step > plan.global_batch_size or plan.global_batch_size % per_step:
        return None
    etp = values.get("etp", plan.etp)
    if etp is not None and etp == tp and plan.etp is None:
        etp = None  # the default (etp = tp) stays implicit, as the user wrote it
    try:
        candidate = replace(plan, **fields, dp=dp, grad_accum_steps=plan.global_batch_size // per_step, etp=etp,
                            sequence_parallel=plan.sequence_parallel and tp > 1)
    except (InputError, ValueError):
        return None
    if plan_problems(model, cluster, candidate) or (accept is not None and not accept(candidate)):
        return None
    return candidate


_PAST_NODE_STEPS = 3.0
"""Steps a tensor-parallel doubling past the node weighs (module docstring): its per-layer collectives leave NVLink."""


def _distance(plan: ParallelPlan, values: dict[str, int], per_node: int) -> float:
    """Powers of two summed over the dimensions changed, a tp / etp group grown past the node weighing more."""
    steps = 0.0
    for dim, v in values.items():
        old = _value(plan, dim)
        steps += abs(math.log2(v / old))
        if dim in ("tp", "etp") and v > max(old, per_node):
            steps += (_PAST_NODE_STEPS - 1) * math.log2(v / max(old, per_node))
    return steps


def nearest_valid_plan(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                       accept: Callable[[ParallelPlan], bool] | None = None) -> NearestPlan | None:
    """The plan nearest to ``plan`` (module docstring) that breaks no rule and that ``accept`` (when given: the
    engine release's own rules, ``Engine.release_problems``) takes; None when none is within three dimensions."""
    choices = _choices(model, cluster, plan)
    for count in (1, 2, 3):
        found: list[tuple[float, float, tuple, ParallelPlan, dict[str, int]]] = []
        for dims in itertools.combinations(DIMS, count):
            pools = [[v for v in (choices[d] if count < 3 else _neighbours(_value(plan, d), choices[d]))
                      if v != _value(plan, d)] for d in dims]
            for combo in itertools.product(*pools):
                values = dict(zip(dims, combo))
                candidate = _build(model, cluster, plan, values, accept)
                if candidate is not None:
                    moved_dp = abs(math.log2(candidate.dp / max(1, plan.dp)))
                    found.append((_distance(plan, values, cluster.gpus_per_node), moved_dp, tuple(DIMS.index(d) for d in dims), candidate,
                                  values))
        if found:
            distance, *_, best, values = min(found, key=lambda f: f[:3])
            changes = tuple((d, _value(plan, d), values[d]) for d in DIMS if d in values)
            return NearestPlan(best, changes, distance)
    return None


def nearest_on_other_engine(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, engines: list[str],
                            nearest: NearestPlan | None) -> NearestPlan | None:
    """The nearest plan on one of ``engines`` (other than the plan's) that changes less than ``nearest`` (the one on
    the plan's own engine; None: it found none), or None: for a plan whose own engine cannot run what the user asked
    for (expert parallelism on plain DeepSpeed), the layout another engine runs with a smaller change. Ties go to
    the first of ``engines``."""
    best = None
    for name in engines:
        if name == plan.engine:
            continue
        try:
            other = replace(plan, engine=name)
        except (InputError, ValueError):
            continue
        if not plan_problems(model, cluster, other):
            continue  # it runs the plan as it is: make_plan's "engines that can run this plan" names it
        found = nearest_valid_plan(model, cluster, other)
        if found is not None and (best is None or found.distance < best.distance):
            best = found
    if best is None or (nearest is not None and best.distance >= nearest.distance):
        return None
    return best
