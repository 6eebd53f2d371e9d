"""The planner: enumerate every plan, reject invalid and non-fitting ones (counted by reason),
rank the rest by predicted throughput (ties: memory headroom).

Pruning keeps the search exact: for fixed other settings, activation memory grows with the
micro-batch, so once a micro-batch does not fit, the larger ones are counted as not fitting
without being estimated. Every plan that is ranked went through the same
``estimate_memory`` / ``estimate_step_time`` as ``autotune estimate``.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace

from autotune.cost.estimate import Estimate
from autotune.cost.memory import estimate_memory, states_floor
from autotune.cost.step_time import TimeSettings, estimate_step_time
from autotune.engines import engine_for
from autotune.engines.support_rules import LAYOUT_DIMS, VARIANT_DIMS
from autotune.rules import (GENERIC_PREFIX_RULES, LAYOUT_RULES, VPP_RULES, inner_plan_problems, plan_problems,
                            vpp_problems)
from autotune.search.loss_slots import search_loss_slots
from autotune.search.result import SearchResult, explain_winner
from autotune.search.space import (SearchConstraints, dimension_values, release_feasible, replica_counts,
                                   with_release_cost)
from autotune.search.ties import rank_with_ties
from autotune.specs.frozen import builder
from autotune.specs.hardware import GIB, ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.settings import MemorySettings

__all__ = ["SearchResult", "search_plans", "explain_winner"]

# Rules that depend on the micro-batch or recompute setting (the rest are checked once per layout).
_INNER_RULES = frozenset({"batch_triple", "interleave_microbatches", "recompute_layers"})
# Generic rules over the layout alone (engine, tp, cp, pp, vpp, ep), the first plan_problems checks: when a layout
# breaks one, each of its ZeRO / replica / offload / precision variants breaks it first too, so they are counted
# against it without being built. Only the VPP_RULES among them read vpp: a layout's first one follows from a
# layout that differs in vpp alone (its first other layout rule) and the vpp rules (_search_plans).
_LAYOUT_RULES = frozenset(LAYOUT_RULES)
_NOT_VPP_RULES = _LAYOUT_RULES - frozenset(VPP_RULES)
_BEFORE_VPP_RULES = frozenset(LAYOUT_RULES[:LAYOUT_RULES.index(VPP_RULES[0])])
# Rules a variant's probe may break before the engine's variant rules, reading only the layout, the precision and the
# run settings (the engine's LAYOUT_DIMS rules join them by name: _probe_rule).
_PREFIX_RULES = GENERIC_PREFIX_RULES | _LAYOUT_RULES

_estimate = builder(Estimate)  # ~10^4 per search: without the keyword constructor (autotune.specs.frozen)
_UNCHECKED = object()  # a cache miss (None: checked, no rule broken)
# A ledger is skipped where its variant's floor (``states_floor``) exceeds the GPU by more than rounding can.
_FLOOR_MARGIN = 1 + 1e-9
_VERIFY_SHORTCUTS = False  # tests: check each answer of a rule shortcut against plan_problems on the plan itself


def _rank_key(est: Estimate) -> tuple[float, float]:
    return (est.time.tokens_per_s, est.memory.headroom)


def search_plans(model: ModelSpec, cluster: ClusterSpec, *, seq_len: int, global_batch_size: int,
                 constraints: SearchConstraints | None = None, top_k: int = 10,
                 memory_settings: MemorySettings | None = None,
                 time_settings: TimeSettings | None = None, ties: bool = True) -> SearchResult:
    """Search the whole plan space; raises nothing for infeasibility (see ``num_feasible``). ``ties``: plans within
    each other's error are ties, ranked simplest first (autotune.search.ties); False: by predicted speed alone."""
    with _no_cycle_collection():
        result = _search_plans(model, cluster, seq_len, global_batch_size, constraints, top_k, memory_settings,
                               time_settings)
    if not ties or not result.ranked:
        return result
    tie = rank_with_ties(result.ranked)
    candidates = tie.ranked[:top_k]
    why = tie.explanation()
    if tie.ranked[0] is tie.fastest:
        why = "; ".join(part for part in (explain_winner(candidates), why) if part)
    return replace(result, candidates=candidates, decided=tie.ranked, explanation=why, tied=tie.leading_group,
                   uncertainty=tie.uncertainty)


@contextmanager
def _no_cycle_collection():
    """The search allocates ~10^5 objects, none in reference cycles, and keeps every feasible plan's estimate: the
    cyclic garbage collector's passes over that growing heap took 0.4-0.5 s of a 3 s 405B search (gc.callbacks).
    It is off while the search runs and back on (as it was) after. Turned back on, the collector's first pass would
    walk every object the search made (all in its youngest generation: 0.12 s of a 405B search), so they are moved
    to its oldest generation first (``gc.freeze`` then ``gc.unfreeze``, where nothing else froze objects): still
    collected by a full pass, as long-lived objects are."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _search_plans(model, cluster, seq_len, global_batch_size, constraints, top_k, memory_settings,
                  time_settings) -> SearchResult:
    started = time.perf_counter()
    c = constraints or SearchConstraints()
    dims = dimension_values(model, cluster, seq_len, global_batch_size, c)
    memory_settings = memory_settings or MemorySettings()
    time_settings = time_settings or TimeSettings()
    min_headroom = c.min_headroom_gib * GIB
    n = cluster.num_gpus
    rejections: Counter[str] = Counter()
    feasible: list[Estimate] = []
    enumerated = 0
    variant_rules: dict[tuple, str | None] = {}  # _probe_rule's, over every layout

    cost_settings = {engine: with_release_cost(memory_settings, time_settings, cost)
                     for engine, cost in dims.cost_settings.items()}
    for engine in dims.engines:
        scheme = engine_for(engine).support.layer_split
        release = c.engine_versions.get(engine)
        engine_memory, engine_time = cost_settings.get(engine, (memory_settings, time_settings))
        other_rule: dict[tuple, str | None] = {}  # (tp, cp, pp, ep) -> its first layout rule not on vpp (None: none)
        for tp in dims.tp:
            for cp in dims.cp:
                for pp in dims.pp:
                    if n % (tp * cp * pp):
                        continue  # not a layout of this cluster: never generated
                    dp = n // (tp * cp * pp)
                    sp = tp > 1 and engine_for(engine).support.sequence_parallel
                    per_variant = len(dims.micro_batch_sizes) * len(dims.offload_optimizer) * len(dims.offload_param) \
                        * sum(len(dims.recompute_modes[engine, p]) for p in dims.precisions)
                    variants = [(z, r) for z in dims.zero_stages for r in replica_counts(dims, engine, z, dp, tp, cp)]
                    for vpp in dims.vpp:
                        for ep in dims.ep:
                            enumerated += len(variants) * per_variant
                            shape = (engine, tp, cp, pp, dp, vpp, ep, seq_len, global_batch_size, sp)
                            checked = (tp, cp, pp, ep) in other_rule and not _VERIFY_SHORTCUTS
                            layout = None if checked else _layout_plan(*shape)
                            first = _layout_rule(model, cluster, layout, (tp, cp, pp, ep), vpp, scheme, dims,
                                                 other_rule)
                            if first is None and release is not None:  # the named release's own rules
                                layout = layout or _layout_plan(*shape)
                                broken = engine_for(engine).release_problems(release, model, layout)
                                first = broken[0].id if broken else None
                            if first is not None:
                                rejections[first] += len(variants) * per_variant
                                continue
                            layout = layout or _layout_plan(*shape)
                            rest = (variants, dims, engine_memory, engine_time, min_headroom, rejections, feasible,
                                    variant_rules)
                            _search_variants(model, cluster, layout, *rest)
                            if dims.loss_slots and pp > 1 and engine_for(engine).support.loss_slots:
                                enumerated += search_loss_slots(model, layout, dims, len(variants) * per_variant,
                                                                rejections, lambda p: _search_variants(model, cluster,
                                                                                                       p, *rest))
    feasible = release_feasible(model, feasible, c.engine_versions, rejections)
    feasible.sort(key=_rank_key, reverse=True)
    candidates = tuple(feasible[:top_k])
    elapsed = time.perf_counter() - started
    return SearchResult(model=model, cluster=cluster, candidates=candidates, num_enumerated=enumerated,
                        num_feasible=len(feasible), rejections=dict(rejections.most_common()),
                        search_time_s=elapsed, explanation=explain_winner(candidates), ranked=tuple(feasible),
                        engine_versions={e: r for e, r in c.engine_versions.items() if e in c.engines},
                        release_defaults={engine: {"release": c.engine_versions[engine], "settings": dict(taken)}
                                          for engine, taken in dims.release_defaults.items()},
                        release_cost_settings={engine: {"release": c.engine_versions[engine], "settings": dict(cost)}
                                               for engine, cost in dims.cost_settings.items()})


def _layout_plan(engine, tp, cp, pp, dp, vpp, ep, seq_len, global_batch_size, sp) -> ParallelPlan:
    """The plan a layout's rules are checked on: ZeRO stage 0, no offload, micro-batch 1 (the rules read none)."""
    return ParallelPlan(engine=engine, tp=tp, cp=cp, pp=pp, dp=dp, vpp=vpp, ep=ep, seq_len=seq_len,
                        global_batch_size=global_batch_size, sequence_parallel=sp, micro_batch_size=1,
                        grad_accum_steps=max(1, global_batch_size // dp))


def _layout_rule(model, cluster, layout, group, vpp, scheme, dims, other_rule) -> str | None:
    """The first layout rule (``LAYOUT_RULES``) a layout breaks, None: none. Its first rule that does not read vpp is
    the same for every vpp of the layout (``other_rule``, by (tp, cp, pp, ep): ``plan_problems`` lists every rule a
    plan breaks, so one check of one of them tells); those before the vpp rules come first, then the vpp rules
    (``vpp_problems``, checked alone), then the rest. ``layout``: the plan, where it is to be checked in full."""
    other = other_rule.get(group, _UNCHECKED)
    told = _UNCHECKED
    if other is not _UNCHECKED:
        on_vpp = () if other in _BEFORE_VPP_RULES else vpp_problems(model.num_layers, group[2], vpp, scheme,
                                                                    dims.uneven_layouts)
        told = on_vpp[0][0] if on_vpp else other
        if not _VERIFY_SHORTCUTS:
            return told
    broken = [r for r, _ in plan_problems(model, cluster, layout, uneven_layouts=dims.uneven_layouts)]
    first = broken[0] if broken and broken[0] in _LAYOUT_RULES else None
    assert told is _UNCHECKED or told == first, f"layout shortcut said {told}, the rules {first}: {layout}"
    other_rule[group] = next((r for r in broken if r in _NOT_VPP_RULES), None)
    return first


def _search_variants(model, cluster, layout, variants, dims, memory_settings, time_settings, min_headroom,
                     rejections, feasible, variant_rules) -> None:
    """Every ZeRO stage / replica count / offload / precision variant of one layout that passed the layout rules.

    Two shortcuts, both exact. The rules other than the inner ones read the replica count only as
    ``dp_replicate > 1`` (``support_problems``' hybrid_shard, fsdp's hybrid_no_shard), so a variant's first rule
    is looked up by that, and so is the first inner rule of each recompute mode (with its modules) and micro-batch.
    And a plan's memory grows with its replica count, all else equal (smaller shard groups
    hold more of the model states; activations, buffers and the allocator's outside bytes do not read it:
    tests/search/test_replica_monotonicity), so where a replica count did not fit in GPU memory at a recompute
    mode and micro-batch, the larger counts of the same variant are counted as not fitting there without being
    estimated (replica counts ascend, ``replica_counts``)."""
    global_batch_size, dp = layout.global_batch_size, layout.dp
    inner = {p: len(dims.recompute_modes[layout.engine, p]) * len(dims.micro_batch_sizes) for p in dims.precisions}
    outer_rule: dict[tuple, str | None] = {}
    inner_rule: dict[tuple, str | None] = {}  # the same, with the recompute mode and micro-batch
    gpu_full_at: dict[tuple, tuple[int, int]] = {}  # (zero, offloads, precision, mode) -> (mb index, replicas)
    settings = dims.run_settings[layout.engine]  # the engine's own: its release's defaults under the asked
    base_fields = dict(engine=layout.engine, tp=layout.tp, cp=layout.cp, pp=layout.pp, dp=dp, vpp=layout.vpp,
                       ep=layout.ep, seq_len=layout.seq_len, global_batch_size=global_batch_size,
                       sequence_parallel=layout.sequence_parallel, grad_dtype=settings["grad_dtype"],
                       torch_compile=settings["torch_compile"], loss_chunks=settings["loss_chunks"],
                       recompute_modules=settings["recompute_modules"],  # with it, dims.recompute is ("selective",)
                       cuda_graph=settings["cuda_graph"], cuda_graph_scope=settings["cuda_graph_scope"],
                       ep_overlap=settings["ep_overlap"] if layout.ep > 1 else None,  # ep=1 has no all-to-alls
                       moe_dispatcher=settings["moe_dispatcher"] if layout.ep > 1 else None,  # nor dispatches
                       cp_comm_type=settings["cp_comm_type"] if layout.cp > 1 else None,  # cp=1: no exchange
                       moe_capacity_factor=settings["moe_capacity_factor"],
                       moe_pad_to_capacity=settings["moe_pad_to_capacity"],
                       fp8_attention=settings["fp8_attention"],  # with it, fp8 alone is searched (dimension_values)
                       fp8_output_proj=settings["fp8_output_proj"],  # with it, fp8 under te-mxfp8 alone (the same)
                       # Megatron-core offloads activations without a pipeline only (megatron_rules)
                       activation_offload_layers=settings["activation_offload_layers"] if layout.pp == 1 else None,
                       mtp_layers=settings["mtp_layers"],  # on the last stage, with or without a pipeline
                       loss_slots=layout.loss_slots,  # the layout's (_search_loss_slots)
                       tp_overlap=settings["tp_overlap"] if layout.tp > 1 else None,  # tp=1 has no TP collectives
                       **dims.peft_settings)
    fp8_recipe = settings["fp8_recipe"]
    # The first rule a variant's probe breaks, where it follows from the rules already seen (``_probe_rule``):
    # {precision: this layout's prefix rule (None: none breaks)}.
    prefix: dict[str, str | None] = {}
    first_probe: list[ParallelPlan] = []  # the layout's first probe, the others' source
    shortcut = "nvme" not in (*dims.offload_optimizer, *dims.offload_param)  # NVMe rules come before the prefix
    for zero, rep in variants:
        for off_opt in dims.offload_optimizer:
            for off_param in dims.offload_param:
                for precision in dims.precisions:
                    key = (zero, rep > 1, off_opt, off_param, precision)
                    rule = outer_rule.get(key, _UNCHECKED)
                    probe = None
                    if rule is _UNCHECKED:
                        base = dict(base_fields, zero_stage=zero, dp_replicate=rep, offload_optimizer=off_opt,
                                    offload_param=off_param, precision=precision,
                                    fp8_recipe=fp8_recipe if precision == "fp8" else None)
                        rule, probe = _probe_rule(model, cluster, dims, base, settings, prefix, variant_rules,
                                                  shortcut, first_probe)
                        outer_rule[key] = rule
                    if rule is not None:
                        rejections[rule] += inner[precision]
                        continue
                    if probe is None:  # the rules passed on another variant's probe: the layout's first, recast
                        probe = first_probe[0].with_sharding(zero, rep, off_opt, off_param, precision,
                                                             fp8_recipe if precision == "fp8" else None)
                    _search_inner(model, cluster, probe, dims, dp, global_batch_size, memory_settings,
                                  time_settings, min_headroom, rejections, feasible,
                                  gpu_full_at, (zero, off_opt, off_param, precision), inner_rule, key)


def _probe_rule(model, cluster, dims, base, settings, prefix, variant_rules, shortcut, first_probe) \
        -> tuple[str | None, ParallelPlan | None]:
    """The first rule, other than the inner ones, that a variant of a layout breaks (None: none), as ``plan_problems``
    finds it on a representative plan (the probe) of the variant's inner loops; and the probe, where one was built
    (from the layout's first, ``first_probe``, where there is one).

    Two shortcuts, exact by ``plan_problems``' order (see there): the layout rules never break here (the layout passed
    them), so a probe's first rule is its prefix rule if one breaks (``GENERIC_PREFIX_RULES`` and the engine's
    ``LAYOUT_DIMS``: they read the layout, the precision and the engine's run settings, so every variant of the
    layout at that precision breaks the same one first), else its first ``VARIANT_DIMS`` rule if one breaks (they
    read the engine, the ZeRO stage, pp > 1, the offloads, dp_replicate > 1, the precision and the gradient dtype,
    so every layout with the same breaks the same one), else whatever the rest of the rules say. A probe is built
    and checked only where the rules seen so far do not tell."""
    engine, precision = base["engine"], base["precision"]
    known = prefix.get(precision, _UNCHECKED) if shortcut else _UNCHECKED
    vkey = (engine, base["zero_stage"], base["pp"] > 1, base["offload_optimizer"], base["offload_param"],
            base["dp_replicate"] > 1, precision, base["grad_dtype"])
    told = known if known is not _UNCHECKED and known is not None else (
        variant_rules.get(vkey) if known is None else None)  # no prefix rule: a variant rule seen elsewhere
    if told is not None and not _VERIFY_SHORTCUTS:
        return told, None
    if first_probe:  # the layout's probes differ in these fields alone
        probe = first_probe[0].with_sharding(base["zero_stage"], base["dp_replicate"], base["offload_optimizer"],
                                             base["offload_param"], precision, base["fp8_recipe"])
    else:
        probe = ParallelPlan(micro_batch_size=1, grad_accum_steps=max(1, base["global_batch_size"] // base["dp"]),
                             recompute=dims.recompute[0] if settings["recompute_modules"] else "none", **base)
        first_probe.append(probe)
    if known is None:
        # No generic rule but the inner ones breaks (the layout's, NVMe's and the prefix's do not): the engine's
        # rules (its layout ones do not break either) are plan_problems' rest, in its order.
        outer = [r.id for r in engine_for(engine).plan_problems(model, cluster, probe) if r.id not in _INNER_RULES]
        told = told if told is not None else outer[0] if outer else None
    if known is not None or _VERIFY_SHORTCUTS:
        outer = [r for r, _ in plan_problems(model, cluster, probe, uneven_layouts=dims.uneven_layouts)
                 if r not in _INNER_RULES]
        assert known is _UNCHECKED or (outer[0] if outer else None) == told, \
            f"probe shortcut said {told}, the rules {outer[:1]}: {probe}"
    first = outer[0] if outer else None
    if shortcut:
        engine_dim = first[len(engine) + 1:] if first and first.startswith(engine + ":") else None
        is_prefix = first in _PREFIX_RULES or engine_dim in LAYOUT_DIMS
        prefix[precision] = first if is_prefix else None
        if not is_prefix:
            variant_rules[vkey] = first if engine_dim in VARIANT_DIMS else None
    return first, probe


def _search_inner(model, cluster, probe, dims, dp, global_batch_size, memory_settings, time_settings, min_headroom,
                  rejections, feasible, gpu_full_at, variant, inner_rule, rules_key) -> None:
    """The recompute modes (``DimensionValues.recompute_modes``) and micro-batches of one variant. ``probe``: the plan
    its rules were checked on (``_probe_rule``), or one that differs from it only in those and the accumulation; where
    it is one of these plans, it is that plan, and the others are made from it (``ParallelPlan.with_microbatch``).
    The engine's module sets (the modes after ``dims.recompute``, narrowest first) only save memory: one is tried at
    a micro-batch only where neither no recompute nor a narrower set fits (``Engine.searched_recompute_modules``)."""
    rep = probe.dp_replicate
    fit_before: set[int] = set()  # the micro-batches a plan without recompute, or with a searched set, fits at
    capacity = float(cluster.gpu.memory_bytes)  # MemoryEstimate.capacity
    floor = 0.0  # a lower bound on the total of every ledger of this variant (``states_floor``), once one is built
    for k, mode in enumerate(dims.recompute_modes[probe.engine, probe.precision]):  # (recompute, modules)
        mbs = dims.micro_batch_sizes
        known = gpu_full_at.get((*variant, mode))
        full_from = known[0] if known is not None and known[1] < rep else len(mbs)
        for i, mb in enumerate(mbs):
            if global_batch_size % (mb * dp):
                rejections["batch_triple"] += 1
                continue
            if k >= len(dims.recompute) and mb in fit_before:
                rejections["recompute_unneeded"] += 1
                continue
            if i >= full_from:
                # A smaller replica count reached the memory estimate here (its rules passed, as they do here)
                # and did not fit in GPU memory: this one holds more.
                rejections["gpu_memory"] += len(mbs) - i
                break
            rule_key = (rules_key, mode, mb)
            rule = inner_rule.get(rule_key, _UNCHECKED)
            if rule is not None and rule is not _UNCHECKED:
                rejections[rule] += 1
                continue
            accumulation = global_batch_size // (mb * dp)
            if (probe.micro_batch_size, probe.grad_accum_steps, probe.recompute, probe.recompute_modules) \
                    == (mb, accumulation, *mode):
                plan = probe
            else:
                plan = probe.with_microbatch(mb, accumulation, *mode)
            if rule is _UNCHECKED:
                problems = inner_plan_problems(model, cluster, plan)  # the probe passed every other rule
                inner_rule[rule_key] = problems[0][0] if problems else None
                if problems:
                    rejections[problems[0][0]] += 1
                    continue
            if floor > capacity * _FLOOR_MARGIN:
                # The model states alone do not fit (an earlier ledger of this variant said: ``states_floor``):
                # neither does this micro-batch and recompute mode, so its ledger is not built; counted as it counts.
                assert not _VERIFY_SHORTCUTS or not estimate_memory(model, cluster, plan, memory_settings).fits_gpu
                if known is None or i < known[0]:
                    gpu_full_at[(*variant, mode)] = (i, rep)
                rejections["gpu_memory"] += len(mbs) - i
                break
            memory = estimate_memory(model, cluster, plan, memory_settings)
            total = memory.total  # MemoryEstimate's fits_gpu, fits_host and headroom, read once
            fits_gpu = total <= memory.capacity
            if not (fits_gpu and memory.host_per_node <= memory.host_capacity_per_node) \
                    or memory.capacity - total < min_headroom:
                reason = "host_memory" if fits_gpu and not memory.fits_host else "gpu_memory" if not fits_gpu \
                    else "headroom"
                if not fits_gpu:
                    floor = max(floor, states_floor(memory, memory_settings))
                if not fits_gpu and (known is None or i < known[0]):
                    gpu_full_at[(*variant, mode)] = (i, rep)
                # Larger micro-batches only hold more activations: they do not fit either.
                rest = len(mbs) - i
                rejections[reason] += rest
                break
            step = estimate_step_time(model, cluster, plan, time_settings)
            feasible.append(_estimate(model, cluster, plan, memory, step))  # Estimate(model, cluster, plan, ...)
            if mode[0] == "none" or k >= len(dims.recompute):
                fit_before.add(mb)
