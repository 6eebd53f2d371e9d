"""Rules a ParallelPlan must satisfy for a model and a cluster.

Each generic rule is the one DeepSpeed 0.19.8 or Megatron-LM enforces (line numbers are Megatron-LM's
``megatron/training/arguments.py`` and DeepSpeed's files, as cited at each rule); the plan's engine adds its
own (``autotune.engines``: what it supports, and its ``extra_problems``). :func:`plan_problems` returns every
violation with the way out; it never raises, so the planner can count rejections by rule.
:func:`engines_that_run` says which engines would take a plan as it is.
"""

from __future__ import annotations

from autotune.engines import ENGINES, engine_for
from autotune.specs.hardware import ClusterSpec
from autotune.specs.layout import pipeline_split, virtual_layout
from autotune.specs.model import ModelSpec
from autotune.specs.nvfp4 import FP4_PRECISION, NVFP4_CAPABILITY
from autotune.specs.plan import FP8_RECIPE_CAPABILITY, PRECISIONS, ParallelPlan

__all__ = ["inner_plan_problems", "plan_problems", "engines_that_run", "sequence_problems", "vpp_problems",
           "LAYOUT_RULES", "VPP_RULES", "GENERIC_PREFIX_RULES"]

# The rules over the layout alone (engine, tp, cp, pp, vpp, ep and the dp they leave), the first plan_problems checks,
# in its order; VPP_RULES are the only ones of them that read vpp (the planner checks them alone on the layouts that
# differ from one it checked in vpp only: autotune.search.planner).
LAYOUT_RULES = ("world_size", "heads_tp", "kv_heads_tp", "layers_pp", "layers_vpp", "vpp_needs_pp", "seq_cp", "seq_sp",
                "ep_dense", "experts_ep", "ep_dp")
VPP_RULES = ("layers_vpp", "vpp_needs_pp")
# The generic rules after the NVMe ones and before the engine's that read nothing but the layout, the precision and
# the run settings (see plan_problems).
GENERIC_PREFIX_RULES = frozenset({"sp_tp", "seq_positions", "precision_gpu", "fp8_recipe_gpu"})


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def plan_problems(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, *,
                  uneven_layouts: bool = True) -> list[tuple[str, str]]:
    """Every rule the plan breaks, as (rule id, message naming the fix). ``uneven_layouts=False``: the planner's
    default search space, which keeps to the classic Megatron splits (``layout.classic_megatron_split``) and
    refuses the rest by the rules that refused them before Megatron-core's uneven layouts were modelled.

    The order is the planner's to rely on (``autotune.search.planner._probe_rule``): the layout rules, the NVMe
    ones, then rules that read the layout, the precision and the run settings only (``GENERIC_PREFIX_RULES``), the
    inner ones (micro-batch, accumulation, recompute), then the engine's (``support_rules.LAYOUT_DIMS`` first)."""
    out: list[tuple[str, str]] = []

    def bad(rule: str, message: str) -> None:
        out.append((rule, message))

    tp, pp, cp, dp, vpp, ep = plan.tp, plan.pp, plan.cp, plan.dp, plan.vpp, plan.ep
    engine = engine_for(plan)
    # Megatron arguments.py:433 "world size is not divisible by total_model_size".
    if plan.world_size != cluster.num_gpus:
        bad("world_size", f"tp*pp*dp*cp = {tp}*{pp}*{dp}*{cp} = {plan.world_size} but the cluster has "
                          f"{cluster.num_gpus} GPUs: derive dp = num_gpus / (tp*pp*cp)")
    # TransformerConfig: heads must be a multiple of TP; query groups a multiple or divisor of TP.
    if model.num_attention_heads % tp:
        bad("heads_tp", f"num_attention_heads ({model.num_attention_heads}) must be a multiple of tp ({tp}): "
                        f"use tp in {{{_divisors(model.num_attention_heads)}}}")
    if model.mla is None and model.kv_heads % tp and tp % model.kv_heads:
        bad("kv_heads_tp", f"num_kv_heads ({model.kv_heads}) must be a multiple or a divisor of tp ({tp})")
    # arguments.py:969/973/998: layers divisible by pp (or an uneven split with
    # --decoder-first/last-pipeline-num-layers, see specs/layout.py), and by the virtual stages.
    if pp > model.num_layers:
        bad("layers_pp", f"num_layers ({model.num_layers}) cannot be split over pp={pp} stages: use pp <= "
                         f"{model.num_layers}")
    scheme = engine.support.layer_split
    # a plan's loss_slots: its own split, judged by the engine's loss_slots rule (support_rules)
    judged = None if plan.loss_slots and engine.support.loss_slots else scheme
    out += vpp_problems(model.num_layers, pp, vpp, judged, uneven_layouts)
    # arguments.py:1337 "seq-length should be a multiple of 2 * context-parallel-size".
    if cp > 1 and plan.seq_len % (2 * cp):
        bad("seq_cp", f"seq_len ({plan.seq_len}) must be a multiple of 2*cp ({2 * cp}) for context parallelism")
    if plan.seq_len % (tp if plan.sequence_parallel else 1):
        bad("seq_sp", f"seq_len ({plan.seq_len}) must be divisible by tp ({tp}) with sequence parallelism")
    # Expert parallelism (arguments.py:1656): experts divisible by ep. The expert grid is tp_e x ep x dp_e x pp over
    # the same ranks (parallel folding): world size divisible by etp x ep x pp, megatron/core/parallel_state.py:881,
    # i.e. etp x ep divides tp x dp x cp (with etp = tp, the default: ep divides dp x cp).
    if ep > 1 or plan.etp is not None:
        if model.moe is None:
            bad("ep_dense", f"ep={ep} needs a mixture-of-experts model; {model.name} is dense: set ep=1"
                + (" and leave etp unset" if plan.etp is not None else ""))
        elif model.moe.num_experts % ep:
            bad("experts_ep", f"num_experts ({model.moe.num_experts}) must be divisible by ep ({ep})")
        etp, folded = plan.expert_tp, tp * dp * cp
        if folded % (etp * ep):
            fits = [e for e in range(1, tp + 1) if tp % e == 0 and folded % (e * ep) == 0]
            bad("ep_dp", f"etp x ep ({etp} x {ep}) must divide tp x dp x cp ({folded}): the expert groups are carved "
                         f"out of the tp x dp x cp ranks (megatron/core/parallel_state.py:881)"
                + (f"; use etp={fits[-1]} (parallel folding, --etp)" if fits and plan.etp is None else ""))
    if "nvme" in (plan.offload_optimizer, plan.offload_param):
        if not plan.nvme_path:
            bad("nvme_path", "NVMe offload needs nvme_path (a local NVMe folder), DeepSpeed partition_parameters.py:1225")
        if cluster.nvme_bandwidth_gb_per_s <= 0:
            bad("nvme_cluster", "NVMe offload needs a cluster with NVMe (nvme_bandwidth_gb_per_s > 0)")
    # Sequence parallelism: Megatron silently disables it at tp=1 (arguments.py:1436); we refuse instead.
    if plan.sequence_parallel and tp == 1:
        bad("sp_tp", "sequence parallelism needs tp > 1: disable it or raise tp")
    for rule, message in sequence_problems(model, plan.seq_len):
        bad(rule, message)
    # Precision. The cpu preset runs bf16/fp16 trials on gloo (autocast on the CPU); it has no fp8 kernels.
    cpu_autocast = cluster.gpu.name == "cpu" and plan.precision in ("bf16", "fp16")
    if not cpu_autocast and not cluster.gpu.supports(plan.precision):
        have = ", ".join(sorted(p for p in cluster.gpu.peak_tflops if p in PRECISIONS)) or "none"
        bad("precision_gpu", f"{cluster.gpu.name} has no {plan.precision} tensor cores (training precisions it "
                             f"has: {have}): pick one of those (--precision)")
    elif plan.precision == FP4_PRECISION and cluster.gpu.name != "cpu":
        _fp4_gpu(cluster, bad)
    _fp8_recipe_gpu(cluster, plan, bad)
    _inner_core_problems(model, plan, bad)
    # The engine's own rules (autotune/engines): what it can run, in its words, with its source.
    engine_rules = [(r.id, r.render()) for r in engine.plan_problems(model, cluster, plan)]
    layer_split = f"{engine.name}:layer_split"
    if (not uneven_layouts and scheme == "megatron" and engine.support.pp is not None and pp > 1
            and pipeline_split(model.num_layers, pp) is None and all(r != layer_split for r, _ in engine_rules)):
        why = f"{model.num_layers} layers over pp={pp} stages: not a split the planner searches by default (opt-in)"
        engine_rules.insert(0, (layer_split, why))
    return out + engine_rules


def vpp_problems(num_layers: int, pp: int, vpp: int, scheme: str | None,
                 uneven_layouts: bool) -> list[tuple[str, str]]:
    """The rules on the virtual pipeline stages (``VPP_RULES``): whether the engine's split (``scheme``; None: a split
    the engine's own rules judge, a plan's loss_slots) fills the pp x vpp virtual stages, and whether there is a
    pipeline to interleave."""
    out = []
    if vpp > 1 and scheme is not None:
        judged = scheme if uneven_layouts or scheme == "any" else "classic"
        out += _interleave_problems(num_layers, pp, vpp, judged)
    # arguments.py:1003: the interleaved schedule needs more than one stage.
    if vpp > 1 and pp < 2:
        out.append(("vpp_needs_pp", f"vpp={vpp} (interleaved schedule) needs pp > 1: set vpp=1 or pp >= 2"))
    return out


def _fp4_gpu(cluster: ClusterSpec, bad) -> None:
    """NVFP4 on a GPU Transformer Engine runs it on (``NVFP4_CAPABILITY``)."""
    words = ("NVFP4 needs compute capability 10.0 or later (Blackwell B200 / GB200 / B300 / GB300; "
             "TransformerEngine pytorch/quantization.py _compute_nvfp4_support)")
    cc = cluster.gpu.capability
    if cc is None:
        bad("precision_gpu", f"{words}, and {cluster.gpu.name} states none: give the GPU's compute_capability in "
                             "the cluster file, or --precision fp8 / bf16")
    elif cc < NVFP4_CAPABILITY:
        bad("precision_gpu", f"{words}; {cluster.gpu.name} is {cluster.gpu.compute_capability}: use --precision "
                             "fp8 or bf16")


def _fp8_recipe_gpu(cluster: ClusterSpec, plan: ParallelPlan, bad) -> None:
    """A block-scaled Transformer Engine recipe on a GPU generation TE runs it on (``FP8_RECIPE_CAPABILITY``)."""
    need = FP8_RECIPE_CAPABILITY.get(plan.fp8_recipe or "") if plan.precision == "fp8" else None
    if need is None or cluster.gpu.name == "cpu":
        return
    (least, below), cc = need, cluster.gpu.capability
    words, source = {
        "te-mxfp8": ("MXFP8 needs compute capability 10.x (Blackwell B200 / GB200 / B300 / GB300)",
                     "TransformerEngine pytorch/quantization.py _compute_mxfp8_support"),
        "te-blockwise": ("blockwise FP8 needs compute capability 9.0 or later (Hopper, Blackwell) and CUDA 12.9",
                         "TransformerEngine pytorch/quantization.py _compute_fp8_block_scaling_support"),
        "torchao-mxfp8": ("MXFP8 needs compute capability 10.0 or later (Blackwell B200 / GB200 / B300 / GB300)",
                          "torchtitan components/quantization/mx.py: \"MXFP8 is only supported on SM100 or later\"")}[
        plan.fp8_recipe]
    other = "torchao-rowwise or torchao-tensorwise" if plan.fp8_recipe.startswith("torchao") else "te-current or te-delayed"
    if cc is None:
        bad("fp8_recipe_gpu", f"{words} ({source}), and {cluster.gpu.name} states none: give the GPU's "
                              "compute_capability in the cluster file, or another --fp8-recipe")
    elif cc < least or (below is not None and cc >= below):
        bad("fp8_recipe_gpu", f"{words} ({source}); {cluster.gpu.name} is "
                              f"{cluster.gpu.compute_capability}: use --fp8-recipe {other}")


def inner_plan_problems(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> list[tuple[str, str]]:
    """:func:`plan_problems` for a plan whose other fields already passed: only the rules that read the
    micro-batch, gradient accumulation or recompute (the generic ones, and the engine's ``extra_problems``; its
    support rules read none of them). The planner's inner loop, where most plans are checked."""
    out: list[tuple[str, str]] = []

    def bad(rule: str, message: str) -> None:
        out.append((rule, message))

    _inner_core_problems(model, plan, bad)
    out += [(r.id, r.render()) for r in engine_for(plan).extra_problems(model, cluster, plan)]
    return out


def _inner_core_problems(model: ModelSpec, plan: ParallelPlan, bad) -> None:
    """The generic rules over the fields the planner's inner loop varies (micro-batch, accumulation, recompute)."""
    pp, dp = plan.pp, plan.dp
    # Batch triple (DeepSpeed config.py:596-605; Megatron num_microbatches_calculator.py:381).
    if plan.global_batch_size != plan.micro_batch_size * plan.grad_accum_steps * dp:
        bad("batch_triple", f"global batch {plan.global_batch_size} != micro-batch {plan.micro_batch_size} x "
                            f"grad accumulation {plan.grad_accum_steps} x dp {dp}: choose a global batch that is a "
                            f"multiple of micro-batch x dp ({plan.micro_batch_size * dp})")
    # Pipeline with 1F1B wants at least as many micro-batches as stages to fill the pipe; fewer is legal but wasteful,
    # so it is a cost, not a rule. Interleaving needs num_microbatches % pp == 0 in Megatron.
    if plan.interleaved and plan.num_microbatches % pp:
        bad("interleave_microbatches", f"interleaved schedule needs micro-batches ({plan.num_microbatches}) divisible "
                                       f"by pp ({pp}): change the global batch or micro-batch")
    # Recompute (arguments.py:1427; TransformerConfig): layer count only with full recompute.
    if plan.recompute_num_layers is not None:
        if plan.recompute != "full":
            bad("recompute_layers", "recompute_num_layers applies to full recompute only")
        elif plan.recompute_num_layers > -(-model.num_layers // pp):
            bad("recompute_layers", f"recompute_num_layers ({plan.recompute_num_layers}) exceeds the layers per stage "
                                    f"({-(-model.num_layers // pp)} at most)")


def _interleave_problems(num_layers: int, pp: int, vpp: int, scheme: str) -> list[tuple[str, str]]:
    """Whether the pp x vpp virtual stages can hold the layers, as the engine's split scheme places them."""
    stages = pp * vpp
    if scheme == "any":  # torch.distributed.pipelining builds its pp x vpp stages from module names, uneven too
        # torchtitan counts the embedding and the norm + output as a layer each (layout.torchtitan_split): a chunk
        # may hold the embedding or the output alone, so pp x vpp <= layers + 2; beyond, it raises "Number of
        # stages (S) cannot be greater than effective layers (E)" (distributed/pipeline_parallel.py:392-396 at
        # b5bcd76, :269-272 at v0.2.2).
        if virtual_layout(num_layers, pp, vpp, "any") is None:
            ok = [v for v in range(vpp - 1, 0, -1) if pp * v <= num_layers + 2]
            return [("layers_vpp", f"number of stages ({pp} x {vpp} = {stages}) cannot be greater than effective "
                                   f"layers ({num_layers} layers + the embedding + the output = {num_layers + 2}; "
                                   f"torchtitan distributed/pipeline_parallel.py _generate_llm_fqn_per_model_part): "
                                   + (f"use vpp={ok[0]}" if ok else "lower pp"))]
        return []
    if scheme == "megatron":
        # Megatron-core: any split whose chunks are not empty, through --pipeline-model-parallel-layout where
        # the even, --account-for-embedding/loss-in-pipeline-split or first/last flags do not give it
        # (transformer_config.py:2241-2290; layout.virtual_layout).
        if virtual_layout(num_layers, pp, vpp) is not None:
            return []
        ok = [v for v in range(vpp - 1, 0, -1) if virtual_layout(num_layers, pp, v) is not None]
        return [("layers_vpp", f"the interleaved schedule needs a layer (or the embedding / loss) in each of the pp x "
                               f"vpp = {pp} x {vpp} = {stages} virtual stages, and {num_layers} layers leave some empty "
                               f"(megatron/core/transformer/transformer_block.py:191-201): "
                               + (f"use vpp={ok[0]}" if ok else "set vpp=1"))]
    if scheme == "classic":  # the planner's default space: the rule as it was (layers, then layers per stage)
        if num_layers % pp:
            return [("layers_vpp", f"the interleaved schedule needs layers ({num_layers}) divisible by pp ({pp})")]
        if (num_layers // pp) % vpp:
            return [("layers_vpp", f"layers per stage ({num_layers // pp}) must be divisible by vpp ({vpp})")]
        return []
    if num_layers % stages:
        divisors = [v for v in range(vpp - 1, 0, -1) if num_layers % (pp * v) == 0]
        return [("layers_vpp", f"the interleaved schedule needs layers ({num_layers}) divisible by pp x vpp "
                               f"({pp} x {vpp} = {stages}): " + (f"use vpp={divisors[0]}" if divisors else "set vpp=1"))]
    return []


def sequence_problems(model: ModelSpec, seq_len: int) -> list[tuple[str, str]]:
    """The rules no layout can satisfy for ``seq_len``: a learned position table has one row per position, so a
    longer sequence indexes past it (an index error in the embedding lookup). RoPE and ALiBi compute positions,
    so they are left to the user. The planner's caller checks these once, before searching any layout."""
    if model.position_embedding == "learned" and seq_len > model.max_position_embeddings:
        return [("seq_positions", f"seq_len ({seq_len}) exceeds {model.name}'s learned position table "
                                  f"(max_position_embeddings {model.max_position_embeddings}): use seq_len <= "
                                  f"{model.max_position_embeddings} (--seq-len), or a model with a larger "
                                  f"max_position_embeddings or RoPE positions")]
    return []


def engines_that_run(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> list[str]:
    """Names of the engines whose rules accept ``plan`` as it is (for 'which engines can run it')."""
    return [name for name in ENGINES if not plan_problems(model, cluster, plan.with_(engine=name))]
