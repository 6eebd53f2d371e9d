"""How a pipeline splits the transformer layers over its stages.

Two schemes, as the engines do it:

- ``megatron``: evenly when pp divides the layers; else Megatron-LM's
  ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``: every middle
  stage gets ceil(L/pp) layers and the first and last stages the remainder, halved (the two
  stages that also hold the embedding and the output layer get fewer transformer layers).
  Llama 3 405B: 126 layers on pp = 16 is 7 + 14 x 8 + 7 (Llama 3 paper, Sec. 3.3.2).
  Where neither exists, Megatron-core's slot split: the embedding and the loss each take a layer's
  slot, L + 2 slots over pp stages, the first stages one slot more (DeepSeek-V3: 61 layers on pp = 16
  is 3 + 14 x 4 + 2, as NVIDIA's ``--pipeline-model-parallel-layout``). With interleaving
  (:func:`virtual_layout`) each stage's slots go to its vpp chunks as evenly as possible.
- ``uniform``: DeepSpeed's ``PipelineModule(partition_method="uniform"|"type:<layer>")`` through
  ``deepspeed.runtime.utils.partition_uniform``: chunk = L // pp, and the first L % pp stages get
  one layer more. BLOOM-176B: 70 layers on pp = 12 is 10 x 6 + 2 x 5.
- ``any``: ``megatron`` where it exists, else ``uniform`` (torchtitan splits by module names, so
  it can express either); where there are fewer layers than stages (pp x vpp virtual stages, up to
  layers + 2), torchtitan's own split (:func:`torchtitan_split`): the embedding and the output count as a
  layer each, so the first chunk may hold the embedding alone and the last the norm + output alone
  (Llama 3 405B: 126 layers on 16 x 8 virtual stages, Llama 3 paper Sec. 3.3.2). A plan's ``loss_slots`` K
  (``any+lossK``): torchtitan's own split over the pp x vpp virtual stages with the output as K layers
  (``torchtitan_split(L, pp x vpp, 1, K)``, ``pipeline_parallel_last_stage_less_layers = K``).
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.specs.model import ModelSpec, ParamGroups
    from autotune.specs.plan import ParallelPlan

__all__ = ["SPLIT_SCHEMES", "split_scheme", "scheme_parts", "layer_counts", "torchtitan_split", "virtual_layout",
           "classic_megatron_split", "pipeline_split", "stage_layers",
           "stage_param_groups", "largest_layer", "microbatches_in_flight", "interleaved_forwards_at_peak",
           "interleaved_chunk_loads"]

SPLIT_SCHEMES = ("megatron", "uniform", "any")


@functools.lru_cache(maxsize=4096)
def pipeline_split(num_layers: int, pp: int) -> tuple[int, int, int] | None:
    """Megatron's (first, middle, last) stage layer counts, or None when no even or uneven split exists."""
    if pp == 1:
        return (num_layers, num_layers, num_layers)
    if num_layers % pp == 0:
        per = num_layers // pp
        return (per, per, per)
    if pp < 3:
        return None
    middle = -(-num_layers // pp)
    ends = num_layers - (pp - 2) * middle
    if ends < 2 or ends % 2:
        return None
    return (ends // 2, middle, ends // 2)


def _slot_split(num_layers: int, pp: int, extra: int = 0, empty_ends: bool = False) -> tuple[int, ...] | None:
    # Megatron-core's --account-for-embedding/loss-in-pipeline-split idea (transformer_block.py:148-159, 188-201):
    # the embedding and the loss are a layer's slot each; the first (L + 2) % pp stages get one slot more.
    # ``extra``: the last stage's slots beyond the loss's one (split_scheme: each multi-token-prediction module's
    # two, a plan's loss_slots beyond the first). ``empty_ends``: the first / last stage may keep the embedding / the
    # loss alone (a layout's stage "E" or "L"; a plan's loss_slots).
    base, rest = divmod(num_layers + 2 + extra, pp)
    slots = [base + (1 if i < rest else 0) for i in range(pp)]
    slots[0] -= 1
    slots[-1] -= 1 + extra
    ends = 0 if empty_ends else 1
    return tuple(slots) if min(slots[1:-1] or [1]) >= 1 and min(slots[0], slots[-1]) >= ends else None


MTP_SCHEME = "+mtp"
LOSS_SCHEME = "+loss"
VPP_SCHEME = "+vpp"
_SCHEME = re.compile(r"([a-z]+)(?:\+mtp(\d+))?(?:\+loss(\d+))?(?:\+vpp(\d+))?")


def split_scheme(scheme: str, mtp_layers: int | None, num_layers: int = 0, pp: int = 1, vpp: int = 1,
                 loss_slots: int | None = None) -> str:
    """The split scheme of a plan: its engine's, or for Megatron's with multi-token-prediction modules
    ``megatron+mtpN``: where the slot split places the layers (no even or first/last split), each MTP module takes
    two slots of the last stage (its layer, and its output layer and loss). That is NVIDIA's DeepSeek-V3 placement:
    every layout of Megatron-Bridge's ``_get_deepseek_v3_pipeline_layout`` (recipes/deepseek/h100/deepseek_v3.py:
    50-68 at 067f987: "E + 16 | 16 | 16 | 13 + mtp + L" on pp 4, "E + 4 | 14 x 4 | 1 + mtp + L" on 16 virtual
    stages, ...) is this split of 61 layers (tests/specs/test_mtp_split.py). Where that split leaves no layout of
    ``num_layers`` over pp x ``vpp`` virtual stages (given), the engine's own: the modules then follow the last
    stage's layers, as ``emit.megatron_layout.megatron_split`` writes them.

    A plan's ``loss_slots`` k (Megatron only, pp > 1): always the slot split, the output layer and loss taking k
    slots of the last stage (``megatron+lossK``, with MTP modules ``megatron+mtpN+lossK``: their two slots each
    too): L + 1 + k (+ 2N) slots over the pp x vpp virtual stages, the earlier ones one slot more. k = 1 is
    Megatron-core's --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split where L + 2
    divides evenly (transformer_block.py:148-201); no fallback: a k that empties a virtual stage has no layout
    (``virtual_layout`` None; the megatron engine refuses it, ``support_rules``).

    torchtitan's (``any``) with loss_slots k, pp > 1: ``any+lossK`` (``any+lossK+vppV`` with V > 1 virtual stages a
    rank, whose chunks give each rank its layers): ``torchtitan_split(L, pp x vpp, 1, k)``, as torchtitan splits
    with ``pipeline_parallel_last_stage_less_layers = k`` (None where it raises; the fsdp engine refuses it)."""
    if scheme == "any" and loss_slots and pp > 1:
        return f"{scheme}{LOSS_SCHEME}{loss_slots}" + (f"{VPP_SCHEME}{vpp}" if vpp > 1 else "")
    if scheme != "megatron" or not (mtp_layers or (loss_slots and pp > 1)):
        return scheme
    if loss_slots and pp > 1:
        return f"{scheme}{MTP_SCHEME}{mtp_layers}{LOSS_SCHEME}{loss_slots}" if mtp_layers else \
            f"{scheme}{LOSS_SCHEME}{loss_slots}"
    counted = f"{scheme}{MTP_SCHEME}{mtp_layers}"
    if vpp > 1 and virtual_layout(num_layers, pp, vpp, counted) is None:
        return scheme
    return counted


def scheme_parts(scheme: str) -> tuple[str, int]:
    """(the engine's scheme, the MTP modules :func:`split_scheme` added)."""
    return _scheme_parts(scheme)[:2]


@functools.lru_cache(maxsize=256)
def _scheme_parts(scheme: str) -> tuple[str, int, int, int]:
    """(the engine's scheme, the MTP modules, the loss slots :func:`split_scheme` added, 0 where none; the virtual
    stages a rank, 1 where not given)."""
    m = _SCHEME.fullmatch(scheme)
    if m is None:
        raise ValueError(f"unknown split scheme {scheme!r}")
    return m.group(1), int(m.group(2) or 0), int(m.group(3) or 0), int(m.group(4) or 1)


@functools.lru_cache(maxsize=4096)
def _counts(num_layers: int, pp: int, scheme: str) -> tuple[tuple[int, ...] | None, int]:
    """(layer_counts, the slots its last stage gave up beyond the loss's one: the MTP modules' where counted, the
    loss slots beyond the first; 0 where none)."""
    base, mtp, loss, vpp = _scheme_parts(scheme)
    if base not in SPLIT_SCHEMES:
        raise ValueError(f"unknown split scheme {scheme!r}")
    if loss and base == "any":  # torchtitan's split with the loss as k layers: each rank its chunks' layers
        chunks = torchtitan_split(num_layers, pp * vpp, 1, loss)
        return (None if chunks is None else tuple(sum(chunks[s::pp]) for s in range(pp))), 0
    if loss and base == "megatron":  # a plan's loss_slots: the slot split always (split_scheme)
        if pp == 1:
            return (num_layers,), 0
        extra = 2 * mtp + loss - 1
        return (_slot_split(num_layers, pp, extra, empty_ends=True) if pp <= num_layers + 1 + loss + 2 * mtp
                else None), extra
    if base in ("megatron", "any"):
        split = pipeline_split(num_layers, pp)
        if split is not None:
            first, middle, last = split
            return ((num_layers,) if pp == 1 else (first, *([middle] * (pp - 2)), last)), 0
        if base == "megatron":
            if not 1 < pp <= num_layers:
                return None, 0
            counted = _slot_split(num_layers, pp, 2 * mtp) if mtp else None
            return (counted, 2 * mtp) if counted is not None else (_slot_split(num_layers, pp), 0)
        if num_layers < pp:  # torchtitan: up to layers + 2 stages, the embedding / the output alone at the ends
            return torchtitan_split(num_layers, pp), 0
    return _uniform(num_layers, pp), 0


def classic_megatron_split(num_layers: int, pp: int, vpp: int = 1) -> bool:
    """The splits the planner searches by default: even, or uneven first/last halved without interleaving; with
    interleaving, layers divisible by pp x vpp (Megatron's --num-layers-per-virtual-pipeline-stage alone)."""
    if vpp > 1:
        return num_layers % (pp * vpp) == 0
    return pipeline_split(num_layers, pp) is not None


@functools.lru_cache(maxsize=4096)
def virtual_layout(num_layers: int, pp: int, vpp: int, scheme: str = "megatron") -> tuple[int, ...] | None:
    """Transformer layers of each of the pp x vpp virtual stages in model order (index chunk * pp + stage, as
    Megatron-core's PipelineParallelLayerLayout orders them, pipeline_parallel_layer_layout.py:48-54, and
    torchtitan's loop placement, virtual stage s on pp rank s % pp), or None when a chunk would hold nothing (no
    layer, no embedding, no loss). Layers divisible by pp x vpp: the same count on every chunk; else stage s's
    slots (its ``layer_counts(L, pp, scheme)`` layers, plus the embedding on stage 0 and the loss on the last) go to
    its chunks evenly, the earlier chunks one more, so every stage keeps the layers the cost model gives it.
    ``any`` (torchtitan's module names) where that leaves a chunk empty: ``layer_counts(L, pp x vpp, "any")``."""
    base, mtp, loss, _ = _scheme_parts(scheme)
    if loss and base == "any":  # torchtitan's own split, the loss as k layers (split_scheme)
        return torchtitan_split(num_layers, pp * vpp, 1, loss)
    if num_layers % (pp * vpp) == 0 and not loss:  # even: --num-layers-per-virtual-pipeline-stage alone
        return (num_layers // (pp * vpp),) * (pp * vpp)
    counts, extra = _counts(num_layers, pp, scheme)
    if counts is None or scheme == "uniform":
        return None
    out = [0] * (pp * vpp)
    for s, n in enumerate(counts):
        slots = n + (s == 0) + (s == pp - 1) * (1 + extra)
        if slots < vpp:
            return layer_counts(num_layers, pp * vpp, "any") if scheme == "any" else None
        base, rest = divmod(slots, vpp)
        for c in range(vpp):
            out[c * pp + s] = base + (1 if c < rest else 0)
    out[0] -= 1  # the embedding's slot
    out[-1] -= 1 + extra  # the loss's slots and the MTP modules'
    # MTP slots beyond the last chunk's share come off the last stage's earlier chunks (each keeps a layer); the
    # loss slots do not (a k beyond the last chunk's share empties it: no layout)
    movable = 2 * mtp if loss else extra
    for c in range(vpp - 2, -1, -1):
        if out[-1] >= 0:
            break
        give = min(-out[-1], out[c * pp + pp - 1] - 1, movable)
        movable -= give
        out[c * pp + pp - 1] -= give
        out[-1] += give
    return tuple(out) if out[-1] >= 0 else None


@functools.lru_cache(maxsize=4096)
def torchtitan_split(num_layers: int, stages: int, input_weight: int = 1, output_weight: int = 1
                     ) -> tuple[int, ...] | None:
    """Transformer layers of each of ``stages`` (virtual) stages as torchtitan's own split places them, or None where
    it raises. torchtitan ``_generate_llm_fqn_per_model_part`` (distributed/pipeline_parallel.py:357-467 at
    b5bcd76; ``generate_llm_fqn_per_model_part``, :236-344 at v0.2.2): the embedding counts as ``input_weight``
    layers and the norm + output as ``output_weight`` (``pipeline_parallel_first/last_stage_less_layers``, 1 by
    default, config/configs.py:197-208); the L + in + out effective layers go ``(L + in + out) // stages`` to a
    stage, the first ``(L + in + out) % stages`` stages one more; stage 0 holds the embedding and that many layers
    fewer, the last stage the norm + output and that many fewer (0 layers where its share is the weight alone).
    It raises where ``stages > L + in + out`` (an empty stage) or a weight exceeds ``(L + in + out) // stages``."""
    if stages == 1:
        return (num_layers,)
    effective = num_layers + input_weight + output_weight
    if stages < 1 or stages > effective:
        return None
    base, extra = divmod(effective, stages)
    if input_weight > base or output_weight > base:
        return None
    out = [base + (1 if i < extra else 0) for i in range(stages)]
    out[0] -= input_weight
    out[-1] -= output_weight
    return tuple(out)


def _uniform(num_layers: int, pp: int) -> tuple[int, ...] | None:
    # deepspeed/runtime/utils.py partition_uniform: the first `residual` parts get chunk + 1 items.
    if num_layers < pp:
        return None  # a stage with no transformer layer: DeepSpeed allows it, nobody trains that way
    chunk, residual = divmod(num_layers, pp)
    return tuple(chunk + 1 if i < residual else chunk for i in range(pp))


@functools.lru_cache(maxsize=4096)
def layer_counts(num_layers: int, pp: int, scheme: str = "megatron") -> tuple[int, ...] | None:
    """Transformer layers of every stage, first to last, or None when the scheme cannot split them."""
    return _counts(num_layers, pp, scheme)[0]


def stage_layers(num_layers: int, pp: int, stage: int, scheme: str = "megatron") -> tuple[int, int]:
    """(first layer index, layer count) of pipeline stage ``stage``."""
    counts = layer_counts(num_layers, pp, scheme)
    assert counts is not None, f"no {scheme} pipeline split of {num_layers} layers over {pp} stages"
    return sum(counts[:stage]), counts[stage]


# Keyed by the model's id (a ModelSpec hashes all its fields, slowly, and the planner asks for every plan); each
# entry keeps its model, so a reused id cannot match.
_groups_cache: dict[tuple, tuple[ModelSpec, ParamGroups]] = {}
_largest_cache: dict[int, tuple[ModelSpec, ParamGroups]] = {}


def stage_param_groups(model: ModelSpec, plan: ParallelPlan, stage: int, scheme: str = "megatron") -> ParamGroups:
    """Parameters of pipeline stage ``stage``: its layers as ``scheme`` splits them (the engine's
    ``support.layer_split``), the embedding on the first stage, the output layer (and any multi-token-prediction
    modules, ``plan.mtp_layers``) on the last."""
    mtp = plan.mtp_layers or 0
    key = (id(model), plan.pp, stage, scheme, mtp)
    hit = _groups_cache.get(key)
    if hit is None or hit[0] is not model:
        if len(_groups_cache) > 4096:
            _groups_cache.clear()
        groups = _stage_param_groups(model, plan.pp, stage, scheme)
        if mtp and stage == plan.pp - 1:  # the MTP modules sit on the last stage (autotune.cost.mtp)
            groups = groups + model.mtp_module_params().scaled(mtp)
            if stage > 0 and not model.tied_embeddings:  # and an embedding for their shifted tokens (Megatron-LM
                # @d98e8a6 megatron/core/models/gpt/gpt_model.py:173-181: built where pre_process or mtp_process;
                # a tied model's last stage holds that table already, as its output layer)
                groups = groups + model.embedding_params()
        hit = _groups_cache[key] = (model, groups)
    return hit[1]


def _stage_param_groups(model: ModelSpec, pp: int, stage: int, scheme: str = "megatron") -> ParamGroups:
    first, count = stage_layers(model.num_layers, pp, stage, scheme)
    return model.stage_params(first, count, has_embedding=stage == 0, has_output=stage == pp - 1)


def largest_layer(model: ModelSpec) -> ParamGroups:
    """The transformer layer with the most parameters (what ZeRO-3 / FSDP gather at once)."""
    hit = _largest_cache.get(id(model))
    if hit is None or hit[0] is not model:
        if len(_largest_cache) > 256:
            _largest_cache.clear()
        hit = _largest_cache[id(model)] = (
            model, max((model.layer_params(i) for i in range(model.num_layers)), key=lambda g: g.total))
    return hit[1]


def torchtitan_scheme(plan: ParallelPlan, num_layers: int) -> str:
    """torchtitan's split of ``plan`` (``engines.fsdp``; the 0.3 module's stage lists): a plan's ``loss_slots``, else
    for a 1F1B pipeline torchtitan's own split, which counts the embedding and the output as a layer each
    (pipeline_parallel_first/last_stage_less_layers, 1 by default: torchtitan v0.2.2 pipeline_parallel.py:110-121,
    configs.py:197-208 at b5bcd76), as the emitted TOML leaves a 1F1B pipeline to it (emit/torchtitan.py writes a
    split with interleaving only): loss slots 1, ``torchtitan_split(L, pp)``, Llama-3 8B on pp 4: 8, 9, 8, 7."""
    own = 1 if plan.pp > 1 and plan.vpp == 1 else None
    return split_scheme("any", plan.mtp_layers, num_layers, plan.pp, plan.vpp, plan.loss_slots or own)


def split_vpp_key(plan: ParallelPlan) -> int | bool:
    """What of ``plan.vpp`` its pipeline stages' layers can depend on, for the caches keyed without vpp: all of it
    with multi-token-prediction modules or loss slots (``split_scheme`` places them over the pp x vpp virtual
    stages), else whether it interleaves (torchtitan's own 1F1B split: ``engines.fsdp.FSDPEngine.layer_split_of``)."""
    return plan.vpp if plan.mtp_layers or plan.loss_slots else plan.vpp == 1


def microbatches_in_flight(plan: ParallelPlan, stage: int) -> float:
    """Micro-batches' worth of a pipeline stage's layers whose activations the stage holds at its peak.

    The peak is the first steady-state forward: the warm-up forwards plus one. 1F1B: stage i warms up with
    min(pp - i - 1, m) micro-batches, so holds min(pp - i, m) (Narayanan et al. 2021, Sec. 2.2.1; Megatron-LM
    schedules.py ``forward_backward_pipelining_without_interleaving``). Interleaved (vpp chunks of 1/vpp of the
    stage's layers each): Megatron-LM ``forward_backward_pipelining_with_interleaving`` warms up with
    ``(pp - i - 1) * 2 + (vpp - 1) * pp`` chunk-micro-batches, capped at all ``m * vpp`` of them
    (``get_pp_rank_microbatches``, megatron/core/pipeline_parallel/schedules.py:949-977 at d98e8a6; the
    micro-batch group is ``microbatch_group_size_per_vp_stage``, pp by default); torch.distributed.pipelining
    ``ScheduleInterleaved1F1B`` (``get_rank_warmup_ops``) has the same count. On the first stage that is
    pp * (1 + (pp-1)/(pp*vpp)) micro-batches, Korthikanti et al. 2022 Sec. 4.2.3. Without pipelining one
    micro-batch at a time. Where a stage's chunks hold unequal layers (Megatron's embedding and loss slots), the
    activations weigh each chunk's micro-batches instead (:func:`interleaved_chunk_loads`).
    """
    if plan.pp == 1:
        return 1.0
    m = plan.num_microbatches
    if not plan.interleaved:
        return float(min(plan.pp - stage, m))
    return interleaved_forwards_at_peak(plan, stage) / plan.vpp


def interleaved_forwards_at_peak(plan: ParallelPlan, stage: int) -> int:
    """Chunk-micro-batch forwards stage ``stage`` has run, none backward yet, at its interleaved peak."""
    chunks = plan.num_microbatches * plan.vpp
    # One forward more with the EP all-to-all overlap (megatron-core 0.19.2 pipeline_parallel/schedules.py:939-943)
    # No "all micro-batches in warm-up when m == pp" case: Megatron-LM dropped it with the tunable schedule
    # (4295be1a6c, "tunable schedule with overlapping", 2024-11); only the cap at m * vpp remains (schedules.py:976).
    warmup = min((plan.pp - stage - 1) * 2 + (plan.vpp - 1) * plan.pp + plan.ep_overlapped, chunks)
    return min(warmup + 1, chunks)


@functools.lru_cache(maxsize=4096)
def interleaved_chunk_loads(pp: int, vpp: int, num_microbatches: int, stage: int,
                            extra_warmup: int = 0) -> tuple[tuple[int, ...], ...]:
    """The micro-batches each of stage ``stage``'s vpp chunks holds after every forward of its steady state
    (and after its last warm-up forward), distinct vectors: where the chunks hold different layers, the stage's
    peak is the vector whose layers weigh most, not necessarily the first steady-state one.

    Megatron-LM's interleaved schedule (megatron/core/pipeline_parallel/schedules.py at d98e8a6):
    ``get_schedule_table`` (:989-1016) orders the forwards group by group (``microbatch_group_size_per_vp_stage``,
    pp by default), within a group chunk by chunk; ``get_model_chunk_id`` runs forward k on ``table[k]``'s chunk and
    backward k on chunk ``vpp - 1 -`` that; warm-up as :func:`interleaved_forwards_at_peak`, then one forward and one
    backward per step, forward first (1F1B)."""
    table: list[int] = []
    for first in range(0, num_microbatches, pp):
        size = num_microbatches - first if first + pp >= num_microbatches else pp
        for chunk in range(vpp):
            table += [chunk] * size
        if first + pp >= num_microbatches:
            break
    total = len(table)
    warmup = min((pp - stage - 1) * 2 + (vpp - 1) * pp + extra_warmup, total)
    held = [0] * vpp
    for k in range(warmup):
        held[table[k]] += 1
    seen = {tuple(held)}
    for k in range(total - warmup):
        held[table[warmup + k]] += 1
        seen.add(tuple(held))
        held[vpp - 1 - table[k]] -= 1
    return tuple(sorted(seen))
