"""Megatron-core's own refusals of the run settings a plan asks of it, where they depend on the model (the rules
every engine shares are ``support_rules``'). Sources: megatron-core 0.19.2 ``megatron/core/transformer/
transformer_config.py`` (TransformerConfig.__post_init__), ``megatron/core/models/gpt/gpt_layer_specs.py`` and
``megatron/core/transformer/transformer_layer.py``; line numbers are that release's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.engines.facts import Rule

if TYPE_CHECKING:
    from autotune.specs.model import ModelSpec
    from autotune.specs.plan import ParallelPlan

__all__ = ["recompute_module_rules", "cuda_graph_rules"]

_SRC = "megatron-core 0.19.2 megatron/core/transformer/transformer_config.py"


def recompute_module_rules(model: ModelSpec, plan: ParallelPlan, fp8_recipe: str) -> list[Rule]:
    """What Megatron refuses of ``plan.recompute_modules`` for this model, and the modules that would recompute
    nothing in it (refused too: the estimate would not move, and the user asked for a saving)."""
    modules = plan.recompute_modules or ()
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
    if plan.precision == "fp8" and fp8_recipe == "te-delayed" and {"moe_act", "layernorm"} & set(modules):
        bad("Delayed scaling does not support moe_act and layernorm recompute for fp8: use --fp8-recipe te-current "
            "or drop them", f"{_SRC}:1820-1826")
    return out


def cuda_graph_rules(model: ModelSpec, plan: ParallelPlan) -> list[Rule]:
    """What Megatron-core refuses of per-layer CUDA graphs (``plan.cuda_graph``, ``plan.cuda_graph_scope``)."""
    if plan.cuda_graph in (None, "none"):
        return []
    scope = plan.cuda_graph_scope  # None: the whole layer
    out: list[Rule] = []

    def bad(message: str, line: str) -> None:
        out.append(Rule(id="megatron:cuda_graph", message=f"Megatron-LM: {message}", source=f"{_SRC}:{line}"))

    if plan.recompute == "full":
        bad("full recompute is only supported with full iteration CUDA graph: use --recompute selective or none, or "
            "drop --cuda-graph", "2520-2524")
    if scope and "moe_router" in scope and model.moe is None:
        bad(f"moe cuda graph is only supported for MoE ({model.name} has no MoE layer): drop moe_router from "
            "--cuda-graph-scope", "2492-2496")
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
    return out
