"""Megatron-core's own refusals of the run settings a plan asks of it, where they depend on the model (the rules
every engine shares are ``support_rules``'). Sources: megatron-core 0.19.2 ``megatron/core/transformer/
transformer_config.py`` (TransformerConfig.__post_init__), ``megatron/core/models/gpt/gpt_layer_specs.py`` and
``megatron/core/transformer/transformer_layer.py``, ``megatron/training/arguments.py``; line numbers are that
release's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.engines.facts import Rule
from autotune.specs.context_parallel import hierarchical_cp_sizes
from autotune.specs.plan import FULL_ITERATION_GRAPH
from autotune.specs.sync_free_moe import SYNC_FREE_DISPATCHER

if TYPE_CHECKING:
    from autotune.specs.hardware import ClusterSpec, GPUSpec
    from autotune.specs.model import ModelSpec
    from autotune.specs.plan import ParallelPlan

__all__ = ["activation_offload_rules", "cp_comm_type_rules", "cuda_graph_rules", "ep_overlap_rules",
           "expert_bias_rules", "fp8_attention_rules", "module_set_rules", "moe_dispatcher_rules", "mtp_rules",
           "recompute_module_rules", "token_drop_rules"]

_SRC = "megatron-core 0.19.2 megatron/core/transformer/transformer_config.py"


def recompute_module_rules(model: ModelSpec, plan: ParallelPlan, fp8_recipe: str) -> list[Rule]:
    """What Megatron refuses of ``plan.recompute_modules`` for this model, and the modules that would recompute
    nothing in it (refused too: the estimate would not move, and the user asked for a saving)."""
    return module_set_rules(model, plan.recompute_modules or (), plan.precision, fp8_recipe)


def module_set_rules(model: ModelSpec, modules: tuple[str, ...], precision: str, fp8_recipe: str) -> list[Rule]:
    """``recompute_module_rules`` of a plan of ``model`` at ``precision`` / ``fp8_recipe`` that names ``modules``
    (the rules read nothing else of the plan)."""
    out: list[Rule] = []

    def bad(message: str, source: str = _SRC) -> None:
        out.append(Rule(id="megatron:recompute_modules", message=f"Megatron-LM: {message}", source=source))

    moe = model.moe
    has_dense = any(not model.is_moe_layer(i) for i in range(model.num_layers))
    for name in ("moe", "moe_act", "shared_experts"):
        if name in modules and moe is None:
            bad(f"{name} in --recompute-modules recomputes part of an MoE layer, and {model.name} has none: drop it",
                "megatron/core/transformer/moe/moe_layer.py:248-253, moe/experts.py:270")
    if "shared_experts" in modules and moe is not None and not moe.num_shared_experts:
        bad(f"shared_experts in --recompute-modules: {model.name} has no shared experts: drop it",
            "megatron/core/transformer/moe/shared_experts.py:153")
    if "mla_up_proj" in modules and model.mla is None:
        bad("mla_up_proj in recompute_modules is only supported with multi_latent_attention: drop it",
            f"{_SRC}:1789")
    if "mlp" in modules and not has_dense:
        bad(f"mlp in --recompute-modules recomputes dense MLPs, and every layer of {model.name} is an MoE layer: "
            f"use moe or moe_act", "megatron/core/transformer/transformer_layer.py:514")
    if "layernorm" in modules and model.mla is None and moe is None:
        # The Transformer Engine layer spec fuses the input norm into linear_qkv and has no pre-MLP norm in dense
        # layers (gpt_layer_specs.py:313-336): transformer_layer.py:452-507 finds only IdentityOp to recompute.
        bad(f"layernorm in --recompute-modules recomputes nothing in {model.name}: Transformer Engine fuses the "
            f"input norm into the QKV linear and dense layers have no separate pre-MLP norm: drop it",
            "megatron/core/models/gpt/gpt_layer_specs.py:313-336")
    if precision == "fp8" and fp8_recipe == "te-delayed" and {"moe_act", "layernorm"} & set(modules):
        bad("Delayed scaling does not support moe_act and layernorm recompute for fp8: use --fp8-recipe te-current "
            "or drop them", f"{_SRC}:1820-1826")
    return out


def cuda_graph_rules(model: ModelSpec, plan: ParallelPlan) -> list[Rule]:
    """What Megatron-core refuses of CUDA graphs (``plan.cuda_graph``, ``plan.cuda_graph_scope``). A full-iteration
    graph captures whole layers (``full_cudagraph`` of transformer_config.py:2538-2543 at core_v0.19.0), so the
    dropout rules of graphed recompute hold for it as for whole-layer graphs; it alone allows full recompute
    (:2521-2525 there); its empty scope is ``ParallelPlan``'s check."""
    if plan.cuda_graph in (None, "none"):
        return []
    scope = plan.cuda_graph_scope  # None: the whole layer
    out: list[Rule] = []

    def bad(message: str, line: str) -> None:
        out.append(Rule(id="megatron:cuda_graph", message=f"Megatron-LM: {message}", source=f"{_SRC}:{line}"))

    if plan.recompute == "full" and plan.cuda_graph != FULL_ITERATION_GRAPH:
        bad("full recompute is only supported with full iteration CUDA graph: use --recompute selective or none, "
            "--cuda-graph full-iteration, or drop --cuda-graph", "2520-2524")
    if scope and {"moe_router", "moe_preprocess"} & set(scope) and model.moe is None:
        bad(f"moe cuda graph is only supported for MoE ({model.name} has no MoE layer): drop moe_router and "
            "moe_preprocess from --cuda-graph-scope", "2492-2496")
    if scope and "moe_preprocess" in scope and "moe_router" not in scope and plan.cuda_graph == "transformer_engine":
        bad("moe_preprocess cuda graph is only supported with moe_router cuda graph: add moe_router to "
            "--cuda-graph-scope", "2488-2491")  # Megatron's own graphs (local) add it themselves (:2473-2482)
    if (scope and "moe_preprocess" in scope and (plan.moe_dispatcher or "alltoall") == "alltoall"
            and plan.moe_capacity_factor is not None and not plan.moe_pad_to_capacity):
        bad("moe_preprocess cuda graph is not supported when there are DtoH copies and synchronizations in the "
            "preprocess step (the all-to-all dispatcher with a capacity factor, unpadded): pad to the capacity "
            "(--moe-pad-to-capacity), or drop moe_preprocess from --cuda-graph-scope", "2512-2520")
    if scope and "mlp" in scope and not any(not model.is_moe_layer(i) for i in range(model.num_layers)):
        bad(f"mlp cuda graph is only supported for dense layers, and every layer of {model.name} is an MoE layer: "
            "use moe_router", "2497-2503")
    modules = (plan.recompute_modules or ("core_attn",)) if plan.recompute == "selective" else ()
    graphs_attention = scope is None or "attn" in scope
    if model.dropout > 0 and "core_attn" in modules and graphs_attention:
        bad("attention dropout is not supported with graphed attention recomputation: leave attention out of "
            "--cuda-graph-scope, or recompute no core_attn", "2541-2547")
    if model.dropout > 0 and "mlp" in modules and (scope is None or "mlp" in scope):
        bad("hidden dropout is not supported with graphed MLP recomputation", "2548-2563")
    if plan.cuda_graph == "transformer_engine" and "moe" in modules and scope and "moe_router" in scope:
        bad("moe recompute is not supported with moe_router CUDA graph with --cuda-graph-impl transformer_engine",
            "2527-2535")
    if (plan.cuda_graph == FULL_ITERATION_GRAPH and model.moe is not None
            and plan.moe_dispatcher != SYNC_FREE_DISPATCHER):
        # autotune.specs.sync_free_moe: every other dispatcher copies its token counts to the host each step
        out.append(Rule(id="megatron:full_iteration_moe", source="megatron-core core_v0.19.0 megatron/core/"
                        "transformer/moe/token_dispatcher.py:317, :540-610, :1441, :1103-1104; moe/README.md:514",
                        message=f"Megatron-LM: a full-iteration CUDA graph cannot capture {model.name}'s MoE layers "
                                f"with the {plan.moe_dispatcher or 'default (alltoall)'} dispatcher: dropless "
                                "dispatchers copy their token counts to the host every step. Use --moe-dispatcher "
                                "flex-hybridep (autotune then writes its static rank budget and paged stash), or "
                                "--cuda-graph transformer_engine"))
    return out


def ep_overlap_rules(model: ModelSpec, plan: ParallelPlan) -> list[Rule]:
    """What Megatron-core refuses of the expert-parallel all-to-all overlap (``plan.ep_overlap``:
    --overlap-moe-expert-parallel-comm, with --delay-wgrad-compute). Always met by what autotune writes, so not
    rules: bf16 or fp16 (FP8 plans train on --bf16,
    :2701-2704), no --moe-shared-expert-overlap (never written, :2706-2708), torch >= 2.6 (:2671)."""
    if not plan.ep_overlapped:
        return []
    out: list[Rule] = []

    def bad(message: str, source: str) -> None:
        out.append(Rule(id="megatron:ep_overlap", message=f"Megatron-LM: {message}", source=source))

    if plan.ep <= 1 or model.moe is None:
        bad("overlap_moe_expert_parallel_comm is only supported with expert model parallelism: use --ep > 1 on an "
            "MoE model, or drop --ep-overlap", f"{_SRC}:2680-2682")
    if plan.moe_dispatcher == "allgather":
        bad("overlap_moe_expert_parallel_comm is supported with alltoall/flex token dispatcher: use --moe-dispatcher "
            "alltoall, flex-deepep or flex-hybridep, or drop --ep-overlap", f"{_SRC}:2683-2686")
    if plan.pp > 1 and not plan.interleaved:
        bad("if enabling EP A2A overlap, virtual_pipeline_model_parallel_size must be specified when "
            "pipeline_model_parallel_size > 1: add --vpp 2 or more, or drop --ep-overlap", f"{_SRC}:2674-2678")
    if plan.recompute == "full":
        bad("disable full recomputation when enabling overlap_moe_expert_parallel_comm (nor a recompute method or "
            "layer count): use --recompute selective or none", f"{_SRC}:2688-2696")
    if plan.recompute == "selective" and "moe" in (plan.recompute_modules or ()):
        bad("disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm: recompute moe_act "
            "instead", f"{_SRC}:2697-2699")
    if (plan.mtp_layers or 0) > 1:  # the plan's --mtp-num-layers (the checkpoint's own MTP modules train only so)
        bad(f"MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm (asked: "
            f"{plan.mtp_layers}): use --mtp-layers 1, or drop --ep-overlap", f"{_SRC}:2709-2713")
    scope = plan.cuda_graph_scope
    if plan.cuda_graph == "transformer_engine" and scope is None:
        bad("EP overlap must be disabled when CUDA graph captures the whole MLP/MoE part: name the parts "
            "(--cuda-graph-scope attn moe_router)", "megatron-core 0.19.2 megatron/core/transformer/"
            "transformer_layer.py:1255-1264")
    elif plan.cuda_graph == "transformer_engine" and "mlp" in scope:
        bad("CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm: drop mlp from "
            "--cuda-graph-scope", f"{_SRC}:2738-2746")
    if plan.cuda_graph == "local":
        # The overlap schedule calls each layer's parts itself and replays only Transformer Engine graphs (the
        # layer's cuda_graphs list, models/gpt/fine_grained_callables.py:73-80); local graphs live in the layer's
        # CudaGraphManager (transformer/module.py:173-179), which that path never calls: they would not run.
        bad("the EP overlap schedule replays Transformer Engine layer graphs only: use --cuda-graph "
            "transformer_engine, or drop one", "megatron-core 0.19.2 megatron/core/models/gpt/"
            "fine_grained_callables.py:73-80")
    attn_bias = model.linear_bias or model.qkv_bias or model.attention_output_bias
    if (plan.ep_overlap == "a2a-delay-wgrad" and plan.overlap_comm and plan.cuda_graph == "transformer_engine"
            and scope and "attn" in scope and attn_bias):
        bad(f"CUDA graph with delay_wgrad_compute doesn't support attn bias for now ({model.name} has attention "
            "biases): drop attn from --cuda-graph-scope, or use --ep-overlap a2a",
            "megatron-core 0.19.2 megatron/training/arguments.py:1822-1846")
    return out


def moe_dispatcher_rules(model: ModelSpec, plan: ParallelPlan, gpu: GPUSpec | None = None) -> list[Rule]:
    """What Megatron-core refuses of the token dispatcher a plan asks for (``plan.moe_dispatcher``:
    --moe-token-dispatcher-type, --moe-flex-dispatcher-backend); the EP overlap's own is in ``ep_overlap_rules``.
    Not rules, as autotune never writes them: allgather with --moe-router-padding-for-quantization (:2322-2326) or variable sequence lengths (:2644-2649).
    The GPUs each flex backend runs on are Megatron-Bridge's check (0.6.2 training/flex_dispatcher_backend.py:102-119
    ``validate_flex_dispatcher_backend``: DeepEP on Ampere, Hopper, B200 and B300; HybridEP on compute capability
    8, 9 or 10), which the Bridge file autotune writes beside the arguments meets at setup."""
    if plan.moe_dispatcher is None:
        return []
    out: list[Rule] = []
    src = "megatron-core 0.19.2 megatron/core/transformer/moe/"
    if model.moe is None:  # only an MoE layer builds a token dispatcher (moe_layer.py:299-320)
        out.append(Rule(id="megatron:moe_dispatcher", message=f"Megatron-LM: {model.name} has no MoE layers: there "
                        "are no tokens to dispatch; drop --moe-dispatcher", source=f"{src}moe_layer.py:299-320"))
    elif plan.moe_dispatcher == "flex-deepep" and plan.tp * plan.ep == 1:
        out.append(Rule(id="megatron:moe_dispatcher", message="Megatron-LM: DeepEP dispatcher requires TPxEP > 1: use "
                        "--ep 2 or more, or another --moe-dispatcher", source=f"{src}token_dispatcher.py:1769-1770"))
    cap = gpu.capability if gpu is not None else None
    bridge = "megatron-bridge 0.6.2 megatron/bridge/training/flex_dispatcher_backend.py"
    if cap is not None and plan.moe_dispatcher == "flex-deepep" and not (
            cap[0] in (8, 9) or gpu.name.lower().startswith(("b200", "b300"))):
        out.append(Rule(id="megatron:moe_dispatcher", message=f"Megatron-Bridge: DeepEP is supported for Ampere, "
                        f"Hopper, and Blackwell (B200/B300) GPUs, not {gpu.name}: use --moe-dispatcher "
                        "flex-hybridep (NVL72 racks) or alltoall", source=f"{bridge}:104-113"))
    if cap is not None and plan.moe_dispatcher == "flex-hybridep" and cap[0] not in (8, 9, 10):
        out.append(Rule(id="megatron:moe_dispatcher", message=f"Megatron-Bridge: HybridEP is supported for GB200, "
                        f"GB300 with NVL72 and for Ampere, Hopper, B200 and B300 GPUs, not {gpu.name}: use "
                        "--moe-dispatcher alltoall", source=f"{bridge}:115-119"))
    return out


def expert_bias_rules(model: ModelSpec, plan: ParallelPlan) -> list[Rule]:
    """Biased experts split across tensor-parallel ranks: an MoE model without ``--disable-bias-linear`` (GPT-OSS)
    has biased experts, and TransformerConfig.__post_init__ asserts "Bias in Moe is only supported when ETP==1"
    (:2279-2282); ``--expert-tensor-parallel-size`` defaults to tp (megatron/training/arguments.py:569-570), so a
    plan with tp > 1 must keep its experts whole (etp 1)."""
    if model.moe is None or not model.linear_bias or plan.expert_tp == 1:
        return []
    return [Rule(id="megatron:expert_bias", source=f"{_SRC}:2279-2282",
                 message=f"Megatron-LM: Bias in Moe is only supported when ETP==1: {model.name}'s experts have biases "
                         f"and this plan splits each expert {plan.expert_tp} ways (etp "
                         f"{plan.etp if plan.etp is not None else f'= tp = {plan.tp}'}): add --etp 1 (Megatron-LM's "
                         "--expert-tensor-parallel-size 1: each expert whole on its rank, tp for attention only), or "
                         "use --tp 1")]


def token_drop_rules(model: ModelSpec, plan: ParallelPlan) -> list[Rule]:
    """What Megatron-core refuses of token dropping (``plan.moe_capacity_factor``, ``plan.moe_pad_to_capacity``:
    --moe-expert-capacity-factor, --moe-pad-expert-input-to-capacity). Always met by what autotune writes, so not a
    rule: the router's aux_loss balancing (--moe-router-load-balancing-type, :1660-1684)."""
    factor, pad = plan.moe_capacity_factor, bool(plan.moe_pad_to_capacity)
    if factor is None and not pad:
        return []
    out: list[Rule] = []

    def bad(message: str, lines: str) -> None:
        out.append(Rule(id="megatron:moe_capacity_factor", message=f"Megatron-LM: {message}", source=f"{_SRC}:{lines}"))

    if model.moe is None:
        bad(f"{model.name} has no MoE layers: there are no experts to cap; drop --moe-capacity-factor and "
            "--moe-pad-to-capacity", "888-896")
    if pad and factor is None:
        bad("moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity: add "
            "--moe-capacity-factor (e.g. 1.0), or drop --moe-pad-to-capacity", "1686-1690")
    if pad and plan.moe_dispatcher == "flex-deepep":
        bad("Flex token dispatcher with deepep backend does not support moe_pad_expert_input_to_capacity: use "
            "--moe-dispatcher alltoall or flex-hybridep, or drop --moe-pad-to-capacity", "1600-1608")
    return out


def cp_comm_type_rules(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec) -> list[Rule]:
    """What Transformer Engine's context-parallel attention refuses of the exchange a plan runs (``plan.cp_comm_type``,
    Megatron ``--cp-comm-type``, default p2p); TransformerEngine d0067d0
    ``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``."""
    te = "TransformerEngine d0067d0 transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py"
    if plan.cp <= 1:
        return [] if plan.cp_comm_type is None else [Rule(
            id="megatron:cp_comm_type", source="megatron/training/arguments.py:3221",
            message=f"--cp-comm-type {plan.cp_comm_type} says how context-parallel ranks exchange attention inputs, "
                    "and this plan has cp=1: drop --cp-comm-type or set --cp")]
    kind = plan.cp_comm_type or "p2p"
    out: list[Rule] = []
    if model.sliding_window is not None and not model.chunked_attention and kind in ("p2p", "a2a+p2p"):
        out.append(Rule(id="megatron:cp_comm_type", source=f"{te}:5057-5060",
                        message=f"Transformer Engine: context parallelism does not support sliding window attention "
                                f"({model.name}) with cp_comm_type {kind}: use --cp-comm-type a2a or allgather"))
    if model.attention_sinks and kind != "a2a":
        out.append(Rule(id="megatron:cp_comm_type", source=f"{te}:5065-5067",
                        message=f"Transformer Engine: context parallelism runs attention sinks ({model.name}) only "
                                f"with cp_comm_type a2a, not {kind}: use --cp-comm-type a2a"))
    a2a = plan.cp if kind == "a2a" else hierarchical_cp_sizes(plan.cp, plan.tp, cluster.gpus_per_node)[0] \
        if kind == "a2a+p2p" else 1
    q_local = model.num_attention_heads // plan.tp
    kv_local = max(1, model.kv_heads // plan.tp)
    if a2a > 1 and (q_local % a2a or kv_local % a2a):
        out.append(Rule(id="megatron:cp_comm_type", source=f"{te}:4246-4250",
                        message=f"Transformer Engine: cp_comm_type a2a needs the heads on each tensor-parallel rank "
                                f"(query {q_local}, key/value {kv_local}) divisible by its all-to-all size ({a2a}): "
                                f"use --cp-comm-type p2p or allgather, or a smaller cp"))
    return out


_OFFLOAD_SRC = "Megatron-LM @d98e8a6 megatron/core/transformer/transformer_config.py"


def activation_offload_rules(model: ModelSpec, plan: ParallelPlan) -> list[Rule]:
    """What Megatron-core refuses of activation CPU offload (``plan.activation_offload_layers``,
    ``--cpu-offloading-num-layers``, which turns ``cpu_offloading`` on: megatron/training/arguments.py:1950-1951 at
    d98e8a6); TransformerConfig.__post_init__'s checks, line numbers at that commit."""
    n = plan.activation_offload_layers
    if not n:
        return []
    out: list[Rule] = []

    def bad(message: str, line: str) -> None:
        out.append(Rule(id="megatron:activation_offload", message=f"Megatron-LM: {message}",
                        source=f"{_OFFLOAD_SRC}:{line}"))

    if n >= model.num_layers:
        bad(f"CPU offloading can be done only for layers less than {model.num_layers} (asked: {n}): lower "
            "--activation-offload-layers", "1884-1889")
    if plan.pp > 1:
        bad("there is no support for pipeline parallelism with CPU offloading: use --pp 1 or drop "
            "--activation-offload-layers", "1891-1894")
    if plan.recompute != "none":
        bad(f"CPU offloading does not work when activation recomputation is enabled (recompute {plan.recompute}): "
            "use --recompute none or drop --activation-offload-layers", "1896-1899")
    if plan.cuda_graph not in (None, "none", FULL_ITERATION_GRAPH):
        bad(f"CUDA graphs not supported with CPU offloading ({plan.cuda_graph}; a full-iteration graph is): use "
            "--cuda-graph full-iteration or none, or drop --activation-offload-layers", "2800-2801")
    return out


_MTP_SRC = "Megatron-LM @d98e8a6 megatron/training/arguments.py"


def megatron_position_type(model: ModelSpec) -> str:
    """The --position-embedding-type autotune writes for ``model`` (``autotune.emit.megatron_attention``: yarn where
    RoPE is YaRN-scaled, rope, learned_absolute for a learned table); ALiBi has none in Megatron's GPT model. MLA's
    YaRN is --rope-type (MLATransformerConfig.rope_type), its position type rope."""
    if model.position_embedding == "rope":
        return "yarn" if model.rope_scaling == "yarn" and model.mla is None else "rope"
    return "learned_absolute" if model.position_embedding == "learned" else model.position_embedding


def mtp_rules(model: ModelSpec, plan: ParallelPlan) -> list[Rule]:
    """What Megatron-LM refuses of multi-token prediction (``plan.mtp_layers``, ``--mtp-num-layers``) for this model;
    the EP overlap's own limit (one MTP layer) is in ``ep_overlap_rules``. validate_args checks the position
    embedding twice at d98e8a6: rope or none (arguments.py:881-886), then learned_absolute, rope, mrope or none
    (:1942-1948, "types that use position_ids"); the first runs first, so only rope and none pass both."""
    if not plan.mtp_layers:
        return []
    kind = megatron_position_type(model)
    if kind in ("rope", "none"):
        return []
    return [Rule(id="megatron:mtp", source=f"{_MTP_SRC}:881-886, 1942-1948",
                 message=f"Megatron-LM: Multi-Token Prediction (MTP) is not supported with {kind} position embedding "
                         f"type ({model.name}); the supported position embedding types are rope and none: drop "
                         "--mtp-layers")]


def fp8_attention_rules(plan: ParallelPlan, fp8_recipe: str) -> list[Rule]:
    """FP8 attention under a recipe that drops it: Megatron-core hands ``fp8_dot_product_attention`` to Transformer
    Engine as the recipe's ``fp8_dpa`` for delayed scaling (extensions/transformer_engine.py:3350 TEDelayedScaling),
    current scaling and MXFP8 (fp8_utils.py:777-788 get_fp8_recipe), not for Float8BlockScaling (:781-784), so a
    blockwise plan would run its attention in 16 bits (Megatron-LM d98e8a6)."""
    if not plan.fp8_attention or fp8_recipe != "te-blockwise":
        return []
    return [Rule(id="megatron:fp8_attention", source="Megatron-LM @d98e8a6 megatron/core/fp8_utils.py:781-784",
                 message="Megatron-core's blockwise FP8 recipe (Float8BlockScaling) takes no fp8_dpa: its attention "
                         "stays 16-bit; use --fp8-recipe te-delayed, te-current or te-mxfp8, or drop --fp8-attention")]
