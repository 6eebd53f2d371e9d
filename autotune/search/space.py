"""The search space: which values each plan dimension may take for a model and a cluster.

Dimensions: engine x tp x cp x pp x vpp x ep x ZeRO stage x hybrid-shard replicas x optimizer
offload x parameter offload x precision x recompute x micro-batch. Values that can never divide (tp not a power of
two, pp not dividing the layers, tp*cp*pp not dividing the GPU count) are not generated;
everything generated is judged by the plan rules, so rejections are counted by rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from autotune.specs.hardware import ClusterSpec
from autotune.engines import engine_for
from autotune.specs.layout import layer_counts, pipeline_split
from autotune.specs.model import ModelSpec
from autotune.specs.peft import PEFT_SETTINGS
from autotune.specs.plan import RUN_SETTINGS

__all__ = ["SearchConstraints", "dimension_values", "recompute_modes", "release_cost_settings", "release_defaults_taken",
           "replica_counts", "UNEVEN_LOSS_SLOTS", "with_release_cost", "release_feasible"]

# The output layer and loss's layer slots (``ParallelPlan.loss_slots``) --uneven-layouts searches on Megatron and fsdp
# (torchtitan) plans with a pipeline: the 16-bit output layer and the cross entropy cost about 2-5 layers' time on the last stage
# (``StepTimeEstimate.stage_times_s``); 1 is the engine's own split or near it.
UNEVEN_LOSS_SLOTS = (2, 3, 4, 5, 6)


def _powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchConstraints:
    """What the user allows. None means 'search it'."""

    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    ep: int | None = None
    vpp: int | None = None
    micro_batch_size: int | None = None
    max_tp: int | None = None
    """Largest TP to try; default: GPUs per node (TP across nodes is rarely worth it)."""
    max_pp: int | None = None
    max_cp: int = 16
    max_micro_batch_size: int = 16
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    dp_replicate: int | None = None
    """Hybrid sharding (HSDP) replica groups; None: search 1 and every split whose shard group spans whole
    nodes, for engines that shard hybrid (``EngineSupport.hybrid_shard``) at ZeRO stage 2/3."""
    precisions: tuple[str, ...] | None = None
    """None: bf16 (fp16 on GPUs without bf16). FP8 changes numerics, so it is opt-in."""
    recompute: tuple[str, ...] = ("none", "selective", "full")
    engines: tuple[str, ...] = ("megatron", "deepspeed")
    """Engines to rank plans across (``autotune.engines``)."""
    uneven_layouts: bool = False
    """Also search the pipeline splits only Megatron-core's uneven layouts run (``--account-for-embedding/loss-
    in-pipeline-split``, asymmetric first/last stages, ``--pipeline-model-parallel-layout``; specs/layout.py).
    Off by default: the default space keeps to even splits, the halved first/last split, and layers divisible
    by pp x vpp under interleaving."""
    allow_offload: bool = True
    grad_dtype: str | None = None
    """Every plan's ``grad_dtype`` (None: each engine's default); engines that do not model it reject the plans."""
    fp8_recipe: str | None = None
    """Every FP8 plan's ``fp8_recipe`` (None: each engine's default)."""
    tp_overlap: str | None = None
    """Every plan's ``tp_overlap`` where tp > 1 (None: each engine's default)."""
    torch_compile: bool | None = None
    """Every plan's ``torch_compile`` (None: each engine's default)."""
    loss_chunks: int | None = None
    """Every plan's ``loss_chunks`` (None: each engine's default)."""
    recompute_modules: tuple[str, ...] | None = None
    """What every plan's selective recompute reruns; given, only selective recompute is searched. None: each engine's
    default set, and beside it the sets the engine searches for the model (``Engine.searched_recompute_modules``:
    Megatron-core's ``SEARCHED_MODULE_SETS`` on MoE / MLA models, each where no lighter mode fits)."""
    cuda_graph: str | None = None
    """Every plan's CUDA graphs (None: each engine's default)."""
    cuda_graph_scope: tuple[str, ...] | None = None
    """What every plan's CUDA graphs capture (None: the whole layer)."""
    engine_versions: Mapping[str, str] = field(default_factory=dict)
    """{engine: the release of its package modelled} (``Engine.versions``, ``--engine-version``). An engine named here
    runs its release's own defaults (``Engine.release_defaults``: torchtitan 0.3's 8-chunk loss and rowwise Float8)
    in its plans only, for every run setting above left None; an engine not named, the modelled defaults."""
    ep_overlap: str | None = None
    """Every plan's expert-parallel all-to-all overlap where ep > 1 (None: each engine's default)."""
    moe_dispatcher: str | None = None
    """Every plan's MoE token dispatcher where ep > 1 (None: each engine's default)."""
    cp_comm_type: str | None = None
    """Every plan's context-parallel exchange where cp > 1 (None: each engine's default)."""
    moe_capacity_factor: float | None = None
    """Every plan's expert capacity factor, tokens over it dropped (None: dropless); never searched: dropping tokens
    changes what trains."""
    moe_pad_to_capacity: bool | None = None
    """With a capacity factor: every plan pads each expert's input to its capacity (None: not padded)."""
    fp8_attention: bool | None = None
    """Every plan's FP8 attention (Megatron fp8_dot_product_attention); with it, FP8 is the only precision searched
    (None: each engine's default, 16-bit attention)."""
    fp8_output_proj: bool | None = None
    """Every plan's output layer in MXFP8 (Megatron-core fp8_output_proj); with it, FP8 under the MXFP8 recipe is the
    only precision searched (None: each engine's default, a 16-bit output layer)."""
    activation_offload_layers: int | None = None
    """Every plan's activation CPU offload (the first N layers' saved activations in host memory) where pp = 1
    (Megatron-core refuses it with a pipeline; its plans with recompute are refused too); None: none."""
    mtp_layers: int | None = None
    """Every plan's multi-token-prediction modules after the last layer (Megatron ``--mtp-num-layers``), at every
    layout (the modules sit on the last pipeline stage); never searched: MTP changes what trains. Engines that cannot
    run it: narrowed away where the engines are left to the default (``commands.plan.run_setting_engines``), else
    their plans are refused with the rule's reason, as every run setting's; None: none trained."""
    min_headroom_gib: float = 0.0
    """Plans whose per-GPU memory comes closer than this to capacity are rejected."""
    peft: str | None = None
    """Every plan's parameter-efficient fine-tuning (``autotune.specs.peft``; None: full training); engines that
    cannot run it reject the plans."""
    lora_rank: int | None = None
    lora_alpha: float | None = None
    lora_targets: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class DimensionValues:
    engines: tuple[str, ...]
    tp: tuple[int, ...]
    cp: tuple[int, ...]
    pp: tuple[int, ...]
    vpp: tuple[int, ...]
    ep: tuple[int, ...]
    zero_stages: tuple[int, ...]
    offload_optimizer: tuple[str, ...]
    offload_param: tuple[str, ...]
    precisions: tuple[str, ...]
    recompute: tuple[str, ...]
    micro_batch_sizes: tuple[int, ...]
    dp_replicate: int | None = None
    gpus_per_node: int = 1
    uneven_layouts: bool = False
    grad_dtype: str | None = None
    fp8_recipe: str | None = None
    tp_overlap: str | None = None
    loss_slots: tuple[int, ...] = ()
    """The output layer and loss's layer slots (``ParallelPlan.loss_slots``) searched beside each Megatron / fsdp
    layout with pp > 1 (with ``uneven_layouts`` only: ``UNEVEN_LOSS_SLOTS``); none: the engine's own split alone."""
    run_settings: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    """{engine: its plans' run settings (``RUN_SETTINGS``)}: the constraints' values, else its release's defaults."""
    release_defaults: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    """{engine: the run settings its release's defaults gave its plans} (engines that took none left out)."""
    peft_settings: Mapping[str, object] = field(default_factory=dict)
    """Every plan's PEFT fields (``autotune.specs.peft.PEFT_SETTINGS``) as the constraints give them."""
    cost_settings: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    """{engine: what its release's code does that no plan field says} (``release_cost_settings``; engines whose
    release has none left out): the search estimates that engine's plans with them, as ``estimate`` does."""
    recompute_modes: Mapping[tuple[str, str], tuple[tuple[str, tuple[str, ...] | None], ...]] = \
        field(default_factory=dict)
    """{(engine, precision): the (recompute, recompute_modules) pairs its plans are searched at} (``recompute_modes``)."""


def recompute_modes(c: SearchConstraints, model: ModelSpec, precisions: tuple[str, ...], recompute: tuple[str, ...],
                    run_settings: Mapping[str, Mapping[str, object]]) -> dict:
    """{(engine, precision): the recompute modes searched}: each of ``recompute`` with the engine's modules (the ones
    asked, None: its default set) and, where selective recompute is searched and no modules were asked, a selective
    mode for each module set the engine searches for this model (``Engine.searched_recompute_modules``)."""
    out = {}
    for engine in c.engines:
        asked = run_settings[engine]["recompute_modules"]
        for precision in precisions:
            recipe = run_settings[engine]["fp8_recipe"] if precision == "fp8" else None
            more = engine_for(engine).searched_recompute_modules(model, precision, recipe) \
                if asked is None and "selective" in recompute else ()
            out[(engine, precision)] = (*((r, asked) for r in recompute), *(("selective", m) for m in more))
    return out


def release_defaults_taken(c: SearchConstraints, precisions: tuple[str, ...], model=None) -> dict[str, dict[str, object]]:
    """{engine: its release's defaults the search gives its plans}: those the constraints leave None, ``fp8_recipe``
    only where FP8 is searched (``Engine.release_defaults``). Engines without a release, or whose release has no
    defaults of its own, are left out."""
    out = {}
    for engine in c.engines:
        release = c.engine_versions.get(engine)
        taken = {} if release is None else {
            name: value for name, value in engine_for(engine).release_defaults(release, model).items()
            if getattr(c, name) is None and (name != "fp8_recipe" or "fp8" in precisions)}
        if taken:
            out[engine] = taken
    return out


def release_cost_settings(c: SearchConstraints) -> dict[str, dict[str, object]]:
    """{engine: its release's cost-model settings} (``Engine.release_cost_settings``: torchtitan 0.3's op-SAC save
    set ``selective_policy="op-sac-0.3"``), for the engines searched whose release ``c.engine_versions`` names and
    has some; the others are left out (estimated with the settings the search was given)."""
    out = {}
    for engine in c.engines:
        release = c.engine_versions.get(engine)
        if release is not None and (cost := engine_for(engine).release_cost_settings(release)):
            out[engine] = dict(cost)
    return out


def with_release_cost(memory_settings, time_settings, cost: dict) -> tuple:
    """The search's ``MemorySettings`` and ``TimeSettings`` with a release's cost settings (``DimensionValues.
    cost_settings``) in each field the caller left None (one it set wins, as a run setting the constraints fix wins
    over the release's default): made once per engine and search, so the cost model's caches, keyed by the settings'
    ids, stay warm."""
    def filled(settings):
        unset = {k: v for k, v in cost.items() if getattr(settings, k) is None}
        return replace(settings, **unset) if unset else settings

    return filled(memory_settings), filled(time_settings)


def replica_counts(dims: DimensionValues, engine: str, zero_stage: int, dp: int, tp: int, cp: int) -> tuple[int, ...]:
    """The ``dp_replicate`` values to try for one layout: 1 (shard over every dp rank) and, where the engine
    shards hybrid (FSDP2 HSDP: ``fully_shard`` on a 2-D ('dp_replicate', 'dp_shard') mesh) at stage 2/3, the
    power-of-two replica counts whose shard group (dp / replicas x tp x cp ranks) still fills whole nodes:
    the layout HSDP exists for (gathers on NVLink inside a node, one gradient all-reduce across nodes)."""
    if dims.dp_replicate is not None:
        # fixed: layouts it leaves no shard group of 2+ ranks in (dp not a multiple of 2 x replicas) are not generated
        r = dims.dp_replicate
        return (r,) if r == 1 or (dp % r == 0 and dp > r) else ()
    if zero_stage < 2 or not engine_for(engine).support.hybrid_shard:
        return (1,)
    out, r = [1], 2
    while r < dp:
        if dp % r == 0 and (dp // r) * tp * cp >= dims.gpus_per_node:
            out.append(r)
        r *= 2
    return tuple(out)


def _splits(num_layers: int, pp: int, scheme: str, c: SearchConstraints) -> bool:
    if scheme == "megatron" and not c.uneven_layouts:
        return pipeline_split(num_layers, pp) is not None
    return layer_counts(num_layers, pp, scheme) is not None


def dimension_values(model: ModelSpec, cluster: ClusterSpec, seq_len: int, global_batch: int,
                     c: SearchConstraints) -> DimensionValues:
    n = cluster.num_gpus
    max_tp = c.max_tp or cluster.gpus_per_node
    tps = (c.tp,) if c.tp else tuple(v for v in _powers_of_two(min(max_tp, n)) if model.num_attention_heads % v == 0)
    max_cp = min(c.max_cp, seq_len // 2)
    cps = (c.cp,) if c.cp else tuple(v for v in _powers_of_two(max_cp) if seq_len % (2 * v) == 0 or v == 1)
    max_pp = c.max_pp or model.num_layers
    schemes = {engine_for(e).support.layer_split for e in c.engines}
    pps = (c.pp,) if c.pp else tuple(v for v in range(1, min(max_pp, model.num_layers, n) + 1)
                                     if n % v == 0 and any(_splits(model.num_layers, v, s, c) for s in schemes))
    vpps = (c.vpp,) if c.vpp else (1, 2, 3, 4, 6, 8)
    if c.ep:
        eps = (c.ep,)
    elif model.moe is not None:
        eps = tuple(v for v in _powers_of_two(min(model.moe.num_experts, n)) if model.moe.num_experts % v == 0)
    else:
        eps = (1,)
    offload = ("none", "cpu") if c.allow_offload else ("none",)
    mbs = (c.micro_batch_size,) if c.micro_batch_size else tuple(
        v for v in _powers_of_two(min(c.max_micro_batch_size, global_batch)))
    precisions = c.precisions or (("bf16",) if cluster.gpu.supports("bf16") or cluster.gpu.name == "cpu"
                                  else ("fp16",))
    if c.fp8_attention and tuple(precisions) != ("fp8",):
        from autotune.errors import InputError

        raise InputError([f"--fp8-attention runs attention in FP8, which FP8 plans alone do, and the search's "
                          f"precisions are {', '.join(precisions)}: search --precision fp8, or drop --fp8-attention"],
                         subject="plan request")
    if c.fp8_output_proj and (tuple(precisions) != ("fp8",) or c.fp8_recipe != "te-mxfp8"):
        from autotune.errors import InputError

        raise InputError(["--fp8-output-proj runs the output layer in MXFP8, which Megatron-core allows with fp8 and "
                          "the mxfp8 recipe alone (transformer_config.py:1569-1575), and the search's precisions are "
                          f"{', '.join(precisions)} (FP8 recipe: {c.fp8_recipe or 'the engine default'}): search "
                          "--precision fp8 --fp8-recipe te-mxfp8, or drop --fp8-output-proj"], subject="plan request")
    asked = {name: getattr(c, name) for name in RUN_SETTINGS}
    taken = release_defaults_taken(c, precisions, model)
    run_settings = {e: asked | taken.get(e, {}) for e in c.engines}
    recompute = ("selective",) if c.recompute_modules else c.recompute
    return DimensionValues(engines=c.engines, tp=tps, cp=cps, pp=pps, vpp=vpps, ep=eps,
                           zero_stages=c.zero_stages, offload_optimizer=offload, offload_param=offload,
                           precisions=precisions, micro_batch_sizes=mbs,
                           recompute=recompute,
                           dp_replicate=c.dp_replicate, gpus_per_node=cluster.gpus_per_node,
                           uneven_layouts=c.uneven_layouts, loss_slots=UNEVEN_LOSS_SLOTS if c.uneven_layouts else (),
                           run_settings=run_settings, release_defaults=taken,
                           recompute_modes=recompute_modes(c, model, precisions, recompute, run_settings),
                           peft_settings={name: getattr(c, name) for name in PEFT_SETTINGS},
                           cost_settings=release_cost_settings(c))


def release_feasible(model, feasible: list, releases: Mapping[str, str], rejections: Counter) -> list:
    """The plans whose engine's named release runs them (``Engine.release_problems``), the rest counted under its
    first rule: the layout's rules were asked before its variants were estimated, these are the ones a variant's run
    settings break (torchtitan 0.2 never compiles GPT-OSS, which FP8 turns on)."""
    kept = []
    for est in feasible:
        release = releases.get(est.plan.engine)
        broken = engine_for(est.plan.engine).release_problems(release, model, est.plan) if release else []
        if broken:
            rejections[broken[0].id] += 1
        else:
            kept.append(est)
    return kept
