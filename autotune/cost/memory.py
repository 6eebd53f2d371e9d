"""The per-GPU memory ledger of one training step, for the most loaded pipeline stage.

Model states and engine buffers come from the plan's engine (``autotune/engines``, formulas in
``autotune.engines.states``); activations from ``autotune.cost.activations``. Three peaks, as the
tools that report memory see them:

* ``allocated``: bytes of live tensors at the peak (``torch.cuda.max_memory_allocated``): model states,
  buffers and the larger of the backward peak (activations) and the optimizer-step peak (the fp32 gradient
  copies some optimizers make while activations are freed; its own ``optimizer_step`` row, the bytes it
  adds beyond the activations);
* ``reserved``: what the caching allocator holds (``max_memory_reserved``, what torchtitan logs): allocated
  plus fragmentation and segment rounding (``fragmentation_fraction``);
* ``total``: the device total ``nvidia-smi`` shows, which ``fits`` is judged on: reserved plus the CUDA
  context and NCCL's communicator buffers, outside the allocator. ``overhead`` is total minus allocated. With
  expandable segments (``MemorySettings.expandable_segments``) the allocator returns its free pages when memory
  runs out instead of failing, so the total needed leaves the reserve out (``reserved`` keeps it).

Host memory is reported per node.
"""

from __future__ import annotations

import dataclasses
import operator

from autotune.cost.activation_offload import offloaded_activation_bytes
from autotune.cost.activations import STAGE_ACTIVATION_FIELDS, stage_activation_bytes
from autotune.cost.cp_ring import cp_kind
from autotune.cost.memory_estimate import MemoryEstimate
from autotune.cost.launch import cuda_graph_static_bytes
from autotune.cost.sync_free_moe_memory import sync_free_moe_bytes
from autotune.engines import Engine, engine_for
from autotune.engines.facts import ActivationFacts
from autotune.engines.states import ModelStateBytes
from autotune.specs.frozen import builder
from autotune.specs.hardware import GIB, ClusterSpec
from autotune.specs.layout import split_vpp_key, stage_param_groups
from autotune.specs.nvfp4 import is_quantized
from autotune.specs.model import ModelSpec, ParamGroups
from autotune.specs.plan import ParallelPlan
from autotune.specs.quantized_gemms import quantized_gemm_groups
from autotune.specs.settings import MemorySettings
from autotune.specs.stage_mix import model_representative_stages

__all__ = ["MemoryEstimate", "estimate_memory", "model_state_bytes", "states_floor", "expandable_segments"]


def model_state_bytes(plan: ParallelPlan, dense_params: float, expert_params: float, *,
                      model: ModelSpec | None = None, stage: int = 0) -> ModelStateBytes:
    """Weights, gradients and optimizer states of one GPU, as the plan's engine holds them.

    ``dense_params`` are partitioned over dp*cp ranks, ``expert_params`` over dp*cp/ep ranks. With
    ``model`` the engine may use the exact tensor layout of ``stage`` (DeepSpeed ZeRO-1/2 slices)."""
    return engine_for(plan).model_states(model, plan, stage, dense_params, expert_params)


_memory_estimate = builder(MemoryEstimate)


def _common_buffer_bytes(engine: Engine, model: ModelSpec, plan: ParallelPlan, stage: int, groups: ParamGroups,
                         settings: MemorySettings, fp8_any_layout: bool = False) -> dict[str, float]:
    """Buffers whatever the engine: the FP8 or FP4 weight cache (as the engine keeps one; ``fp8_any_layout``: the GPU's
    ``GPUSpec.fp8_gemm_any_layout``), NVMe staging, the static buffers of CUDA graphs (``autotune.cost.launch``),
    the paged stash and rank budget of MoE under a full-iteration graph (``autotune.cost.sync_free_moe_memory``)."""
    out: dict[str, float] = {}
    scheme = engine.layer_split_of(plan, model.num_layers)
    if (graphs := cuda_graph_static_bytes(model, plan, stage, scheme)) > 0:
        out["cuda_graphs"] = graphs
    if (stash := sync_free_moe_bytes(model, plan, stage, scheme)) > 0:
        out["moe_paged_stash"] = stash
    if is_quantized(plan.precision) and (cache := engine.fp8_weight_cache_bytes(
            plan, quantized_gemm_groups(model, plan, stage, groups), fp8_any_layout)) > 0:
        out[f"{plan.precision}_weight_cache"] = cache  # the quantized copies: fp8_weight_cache, fp4_weight_cache
    if "nvme" in (plan.offload_optimizer, plan.offload_param):
        out["nvme_staging"] = float(settings.offload_buffer_bytes)
    return out


def _held_reserve(reserve: float, expandable_segments: bool) -> float:
    """The part of the allocator's reserve the device total counts: all of it, or none with expandable segments,
    whose free pages the allocator unmaps and maps where the next allocation needs them before it reports out of
    memory (``MemorySettings.expandable_segments``)."""
    return 0.0 if expandable_segments else reserve


def expandable_segments(engine: Engine, settings: MemorySettings) -> bool:
    """Whether the run's allocator uses expandable segments: the settings' word, else what the engine's own launcher
    sets (``Engine.expandable_segments``)."""
    return engine.expandable_segments if settings.expandable_segments is None else settings.expandable_segments


_cluster_cache: dict[tuple, tuple[ClusterSpec, MemorySettings, tuple[float, float, bool, float, float]]] = {}


def _cluster_facts(cluster: ClusterSpec, settings: MemorySettings) -> tuple[float, float, bool, float, float]:
    """(CUDA context bytes, NCCL bytes per communicator, the GPU's FP8 GEMM layout fact, GPU capacity, host capacity
    per node): what every ledger reads of the cluster and the settings, derived once per pair (cached by their ids:
    the specs hash slowly; each entry keeps its own, so a reused id cannot match)."""
    key = (id(cluster), id(settings))
    hit = _cluster_cache.get(key)
    if hit is None or hit[0] is not cluster or hit[1] is not settings:
        gpu = cluster.gpu.name != "cpu"
        context = settings.cuda_context_bytes
        if context is None:
            context = 0.75 * GIB if gpu else 0
        nccl = settings.nccl_bytes_per_communicator
        if nccl is None:
            nccl = 256 * 2**20 if gpu else 0
        if len(_cluster_cache) > 256:
            _cluster_cache.clear()
        hit = _cluster_cache[key] = (cluster, settings, (context, nccl, cluster.gpu.fp8_gemm_any_layout,
                                                         float(cluster.gpu.memory_bytes),
                                                         float(cluster.host_memory_bytes_per_node)))
    return hit[2]


def _outside_allocator_bytes(cluster: ClusterSpec, plan: ParallelPlan, settings: MemorySettings) -> float:
    """CUDA context and NCCL buffers: device memory the caching allocator does not see."""
    context, nccl = _cluster_facts(cluster, settings)[:2]
    return _outside_bytes(context, nccl, plan)


def _outside_bytes(context: float, nccl: float, plan: ParallelPlan) -> float:
    """:func:`_outside_allocator_bytes` of the cluster facts already looked up (the ledger has them)."""
    groups = (plan.tp > 1) + (plan.pp > 1) + (plan.cp > 1) + (plan.dp > 1) + (plan.ep > 1)
    return context + nccl * groups


# Every plan field but the ones the micro-batch loop varies, which no engine's model states read (the planner asks
# for the states of each micro-batch size and recompute mode of a layout), and vpp: the states are those of a
# stage's parameters (``stage_param_groups``: pp and the split alone) however its layers form chunks (no engine's
# ``model_states`` reads vpp: tests/cost/test_memory_caches.py). They include everything the stages and their
# parameters per GPU follow from (engine, pp, tp, ep, etp).
_STATE_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(ParallelPlan) if f.name not in (
    "micro_batch_size", "grad_accum_steps", "recompute", "recompute_num_layers", "vpp")))
_states_cache: dict[tuple, tuple[ModelSpec, tuple[ModelStateBytes, ...]]] = {}


def _model_states(engine: Engine, model: ModelSpec, plan: ParallelPlan, parts: tuple) -> tuple[ModelStateBytes, ...]:
    """``engine.model_states`` of each stage of ``parts`` (``_stages_parts``), cached over ``_STATE_FIELDS``."""
    key = (id(model), _STATE_FIELDS(plan), split_vpp_key(plan))  # ModelSpec hashes slowly: its id
    hit = _states_cache.get(key)
    if hit is None or hit[0] is not model:
        if len(_states_cache) > 65536:
            _states_cache.clear()
        hit = _states_cache[key] = (model, tuple(engine.model_states(model, plan, stage, dense, expert)
                                                 for stage, dense, expert, *_ in parts))
    return hit[1]


def states_floor(memory: MemoryEstimate, settings: MemorySettings | None = None) -> float:
    """A lower bound on the total of every plan that differs from ``memory``'s only in the micro-batch size, the
    accumulation steps or the recompute setting (the planner asks it after a ledger that does not fit, for the
    variant's other micro-batches and recompute modes). Their model states are the same per stage (no engine's read
    these fields: ``_STATE_FIELDS``); at any stage the tensors are weights + gradients + optimizer states + max(the
    activations, the optimizer step's transient) + buffers, activations and buffers >= 0, so at least the states
    and the transient of this ledger's stage; the most loaded stage's are no fewer; the reserve is
    ``fragmentation_fraction`` of them (none with expandable segments), and the bytes outside the allocator read
    none of these fields. 0.0 (no bound) for a negative fragmentation fraction."""
    settings = settings or MemorySettings()
    states = memory.offloaded
    if settings.fragmentation_fraction < 0 or states is None:
        return 0.0
    tensors = states.weights + states.gradients + states.optimizer_states + states.step_transient
    held = 0.0 if memory.expandable_segments else settings.fragmentation_fraction
    return (1 + held) * tensors + (memory.overhead - _held_reserve(memory.reserve, memory.expandable_segments))


# The plan fields a stage's activations (``activations._STAGE_ACTIVATION_FIELDS``) and its parameters per GPU read:
# every ZeRO stage, replica count and offload of a layout shares them.
_ACTIVATION_FIELDS = operator.attrgetter(*STAGE_ACTIVATION_FIELDS, "ep", "etp")
_activations_cache: dict[tuple, tuple[ModelSpec, tuple, ActivationFacts]] = {}


def _stages_activations(model: ModelSpec, plan: ParallelPlan, facts: ActivationFacts, scheme: str) -> tuple:
    """For each stage that can be the most loaded: (stage, its parameter groups, dense and expert parameters per
    GPU, activation parts, their sum), cached over ``_ACTIVATION_FIELDS``."""
    key = (id(model), id(facts), scheme, _ACTIVATION_FIELDS(plan))  # the facts: one object each (_run_facts)
    hit = _activations_cache.get(key)
    if hit is None or hit[0] is not model or hit[2] is not facts:
        if len(_activations_cache) > 65536:
            _activations_cache.clear()
        out = []
        for stage in model_representative_stages(model, plan.pp, scheme, plan.vpp):
            groups = stage_param_groups(model, plan, stage, scheme)
            activation_parts = stage_activation_bytes(model, plan, stage, facts, scheme)
            out.append((stage, groups, groups.tp_sharded / plan.tp + groups.replicated,
                        groups.expert / (plan.ep * plan.expert_tp), activation_parts, sum(activation_parts.values())))
        hit = _activations_cache[key] = (model, tuple(out), facts)
    return hit[1]


# Every plan field but the replica count: hybrid sharding changes only which ranks hold the model states (the
# engine reads it through ``zero_partitions``); a stage's parameters, activations and buffers are the same for
# every replica count (tests/search/test_replica_monotonicity), so the planner's replica counts of a plan share them.
_PARTS_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(ParallelPlan) if f.name != "dp_replicate"))
_parts_cache: dict[tuple, tuple[ModelSpec, MemorySettings, tuple]] = {}
# The same less the recompute settings, which no engine's buffers read (nor ``_common_buffer_bytes``:
# tests/cost/test_memory_caches.py): the planner's recompute modes of a plan share its buffers.
_BUFFER_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(ParallelPlan) if f.name not in (
    "dp_replicate", "recompute", "recompute_num_layers", "recompute_modules")))
_buffers_cache: dict[tuple, tuple[ModelSpec, MemorySettings, tuple]] = {}


def _stages_buffers(engine: Engine, model: ModelSpec, plan: ParallelPlan, settings: MemorySettings,
                    stages: tuple, fp8_any_layout: bool = False) -> tuple:
    """(buffer parts, their sum) of each stage of ``stages`` (``_stages_activations``), cached over
    ``_BUFFER_FIELDS`` and the GPU's FP8 layout fact."""
    key = (id(model), id(settings), fp8_any_layout, _BUFFER_FIELDS(plan))  # the specs hash slowly: their ids
    hit = _buffers_cache.get(key)
    if hit is None or hit[0] is not model or hit[1] is not settings:
        if len(_buffers_cache) > 65536:
            _buffers_cache.clear()
        out = []
        for stage, groups, *_ in stages:
            buffer_parts = engine.buffers(model, plan, groups, settings, fp8_any_layout, stage) | _common_buffer_bytes(
                engine, model, plan, stage, groups, settings, fp8_any_layout)
            out.append((buffer_parts, sum(buffer_parts.values())))
        hit = _buffers_cache[key] = (model, settings, tuple(out))
    return hit[2]


_facts_cache: dict[tuple, tuple[ActivationFacts, ActivationFacts]] = {}


def _run_facts(engine: Engine, plan: ParallelPlan, settings: MemorySettings, node: int) -> ActivationFacts:
    """The engine's activation facts for the plan with the run's selective policy, what its column-parallel linears
    save (``MemorySettings.linear_inputs_gathered``), what its loss keeps (``te_cross_entropy``) and, under context
    parallelism, the CP kind (``activations.py``; ``node``: :func:`_split_node`): one object for each (cached), so
    the caches above key on its id."""
    facts = engine.activation_facts(plan)
    kind = cp_kind(plan, engine.comm.cp_kind) if plan.cp > 1 else None  # context parallelism's attention buffers
    repeat = (engine.comm.cp_repeat_kv if settings.cp_repeat_kv is None else settings.cp_repeat_kv) if kind \
        else None
    key = (id(facts), settings.selective_policy, settings.linear_inputs_gathered, settings.te_cross_entropy, kind,
           repeat, node)
    hit = _facts_cache.get(key)
    if hit is None or hit[0] is not facts:
        run = facts
        if settings.selective_policy is not None:
            run = dataclasses.replace(run, selective=settings.selective_policy)
        if settings.linear_inputs_gathered is not None:
            run = dataclasses.replace(run, gathered_linear_inputs=settings.linear_inputs_gathered)
        if settings.te_cross_entropy:  # TE's loss: 16-bit logits with the gradient in them, no backward copy
            run = dataclasses.replace(run, loss_logit_bytes=2.0, loss_backward_bytes_per_logit=0.0)
        elif settings.te_cross_entropy is not None:  # an fp32 softmax, the engine's backward
            run = dataclasses.replace(run, loss_logit_bytes=4.0)
        if kind:
            node_field = {"cp_node_gpus": node} if node else {}
            run = dataclasses.replace(run, cp_kind=kind, cp_repeat_kv=repeat, **node_field)
        if len(_facts_cache) > 256:
            _facts_cache.clear()
        hit = _facts_cache[key] = (facts, run)
    return hit[1]


def _split_node(plan: ParallelPlan, cluster: ClusterSpec) -> int:
    """GPUs per node where they split the plan's context-parallel exchange (a2a+p2p:
    ``autotune.specs.context_parallel``); 0 where no ledger term reads the node's size."""
    return cluster.gpus_per_node if plan.cp > 1 and plan.cp_comm_type == "a2a+p2p" else 0


def _stages_parts(engine: Engine, model: ModelSpec, plan: ParallelPlan, settings: MemorySettings,
                  node: int, fp8_any_layout: bool = False) -> tuple:
    """For each stage that can be the most loaded: (stage, dense and expert parameters per GPU, activation parts,
    their sum, buffer parts, their sum), cached over ``_PARTS_FIELDS``, the GPU's FP8 layout fact and ``node``
    (:func:`_split_node`)."""
    key = (id(model), id(settings), fp8_any_layout, _PARTS_FIELDS(plan), node)  # the specs hash slowly: their ids
    hit = _parts_cache.get(key)
    if hit is None or hit[0] is not model or hit[1] is not settings:
        if len(_parts_cache) > 65536:
            _parts_cache.clear()
        facts = _run_facts(engine, plan, settings, node)
        stages = _stages_activations(model, plan, facts, engine.layer_split_of(plan, model.num_layers))
        hit = _parts_cache[key] = (model, settings, tuple(
            (stage, dense, expert, activation_parts, activations, buffer_parts, buffers)
            for (stage, _, dense, expert, activation_parts, activations), (buffer_parts, buffers)
            in zip(stages, _stages_buffers(engine, model, plan, settings, stages, fp8_any_layout))))
    return hit[2]


def estimate_memory(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                    settings: MemorySettings | None = None) -> MemoryEstimate:
    """The per-GPU ledger of the most loaded pipeline stage (the first or the last).

    The plan is assumed valid (see ``autotune.rules``); every term is finite and >= 0. The plan's engine is
    looked up once here and asked for its model states, buffers and activation facts.
    """
    settings = settings or MemorySettings()
    engine = engine_for(plan)
    context, nccl, fp8_any_layout, capacity, host_capacity = _cluster_facts(cluster, settings)
    parts = _stages_parts(engine, model, plan, settings, _split_node(plan, cluster), fp8_any_layout)
    best = None
    for part, states in zip(parts, _model_states(engine, model, plan, parts)):
        activations, buffers = part[4], part[6]
        # The optimizer step can be the peak instead of backward: activations are gone, fp32 grads are not.
        step_extra = max(0.0, states.step_transient - activations)
        tensors = states.weights + states.gradients + states.optimizer_states + activations + step_extra + buffers
        if best is None or tensors > best[0]:  # the first of the largest, as max() picks
            best = (tensors, part, states, step_extra)
    assert best is not None
    tensors, (stage, _, _, activation_parts, activations, buffer_parts, buffers), states, step_extra = best
    reserve = settings.fragmentation_fraction * tensors
    expandable = expandable_segments(engine, settings)

    # Host memory per node: every GPU of a node offloads its own partition (worst stage assumed for all).
    host_per_gpu = states.host_weights + states.host_gradients + states.host_optimizer_states + states.host_buffers
    if "nvme" in (plan.offload_optimizer, plan.offload_param):
        host_per_gpu += settings.offload_buffer_bytes
    if plan.activation_offload_layers:  # the offloaded layers' saved activations (autotune.cost.activation_offload)
        host_per_gpu += offloaded_activation_bytes(model, plan, _run_facts(engine, plan, settings, _split_node(
            plan, cluster)), engine.layer_split_of(plan, model.num_layers))
    return _memory_estimate(  # MemoryEstimate's fields in their order (a builder: ~10^4 ledgers per search)
        states.weights,  # weights
        states.gradients,  # gradients
        states.optimizer_states,  # optimizer_states
        activations,  # activations
        buffers,  # buffers
        _held_reserve(reserve, expandable) + _outside_bytes(context, nccl, plan),  # overhead
        capacity,  # capacity
        stage,  # stage
        host_per_gpu * cluster.gpus_per_node,  # host_per_node
        states.nvme * cluster.gpus_per_node,  # nvme_per_node
        host_capacity,  # host_capacity_per_node
        dict(activation_parts),  # activation_parts
        dict(buffer_parts),  # buffer_parts
        states,  # offloaded
        step_extra,  # optimizer_step
        reserve,  # reserve
        expandable,  # expandable_segments
    )
