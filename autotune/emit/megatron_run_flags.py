"""Megatron-LM arguments of a plan's run settings: recompute, CUDA graphs, the EP all-to-all overlap and the MoE
token dispatcher, as the Megatron-core release in use spells them (its flag table, ``megatron_flags_core_v0.NN.json``).
Used by :func:`autotune.emit.megatron.megatron_args`."""

from __future__ import annotations

from autotune.emit.megatron_flags import megatron_flag_table
from autotune.specs.model import ModelSpec
from autotune.specs.plan import FULL_ITERATION_GRAPH, ParallelPlan

__all__ = ["recompute_flags", "cuda_graph_flags", "ep_overlap_flags", "dispatcher_flags", "token_drop_flags"]


def recompute_flags(plan: ParallelPlan) -> list[str]:
    if plan.recompute == "selective":  # --recompute-modules: nargs "+", unset = ["core_attn"] (TransformerConfig)
        modules = ["--recompute-modules", *plan.recompute_modules] if plan.recompute_modules else []
        return ["--recompute-granularity", "selective", *modules]
    if plan.recompute == "full":
        if plan.recompute_num_layers is None:  # every layer: uniform chunks of one layer
            return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
        return ["--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", str(plan.recompute_num_layers)]
    return []


def _flag_choices(release: str, flag: str) -> tuple[str, ...]:
    """The choices ``flag`` takes in the release's flag table (none listed: any value)."""
    spec = megatron_flag_table(release).get(flag)
    return spec.choices or () if spec is not None else ()


def cuda_graph_flags(plan: ParallelPlan, release: str) -> list[str]:
    """--cuda-graph-impl, and the captured parts: --cuda-graph-modules from core 0.18 (its --cuda-graph-scope is then
    a hidden, deprecated alias, arguments.py:1966 of 0.19.2), --cuda-graph-scope before; unset: the whole layer."""
    if plan.cuda_graph in (None, "none"):
        return []
    if plan.cuda_graph == FULL_ITERATION_GRAPH:
        # Core 0.18 on: an implementation of its own (--cuda-graph-impl choices, megatron_flags_core_v0.18.json);
        # before: local graphs of the full_iteration scope (arguments.py:1006-1008 of core_v0.17.1, :725-728 of
        # core_v0.16.1). Each release asserts the NaN check off with it (:1195-1197 of core_v0.19.0): the check's
        # host sync cannot run inside the captured graph.
        full = "full_iteration" in _flag_choices(release, "--cuda-graph-impl")
        return (["--cuda-graph-impl", "full_iteration"] if full else
                ["--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration"]) + [
            "--no-check-for-nan-in-loss-and-grad"]
    args = ["--cuda-graph-impl", plan.cuda_graph]
    if plan.cuda_graph_scope:
        modules = "--cuda-graph-modules" in megatron_flag_table(release)
        flag = "--cuda-graph-modules" if modules else "--cuda-graph-scope"
        args += [flag, *plan.cuda_graph_scope]
    return args


def ep_overlap_flags(plan: ParallelPlan) -> list[str]:
    """The EP all-to-all overlap (core_v0.16 .. 0.19 arguments.py, store_true each: emit/megatron_flags_core_v0.*.json);
    --delay-wgrad-compute needs --overlap-moe-expert-parallel-comm (transformer_config.py:2749-2752 of 0.19.2)."""
    if not plan.ep_overlapped:
        return []
    return ["--overlap-moe-expert-parallel-comm"] + (["--delay-wgrad-compute"] if plan.ep_overlap == "a2a-delay-wgrad"
                                                     else [])


def dispatcher_flags(model: ModelSpec, plan: ParallelPlan, release: str | None, problems: list[str]) -> list[str]:
    """The MoE token dispatcher where experts are split (ep > 1) or a plan names one: alltoall unless the plan says
    otherwise (Megatron's own default is allgather, transformer_config.py:862 of 0.19.2); flex with its backend
    (--moe-flex-dispatcher-backend), as the release's flag table has them (core_v0.16 .. 0.19 all do)."""
    if model.moe is None or (plan.ep <= 1 and plan.moe_dispatcher is None):
        return []
    kind, _, backend = (plan.moe_dispatcher or "alltoall").partition("-")
    args = ["--moe-token-dispatcher-type", kind] + (["--moe-flex-dispatcher-backend", backend] if backend else [])
    table = megatron_flag_table(release)
    for flag, value in zip(args[::2], args[1::2], strict=True):
        spec = table.get(flag)
        if spec is None or (spec.choices is not None and value not in spec.choices):
            problems.append(f"{flag} {value}: not in Megatron-core {release or 'newest'}'s arguments (its "
                            "dispatchers: " + (", ".join(spec.choices or ()) if spec else "none") + ")")
    return args


def token_drop_flags(plan: ParallelPlan) -> list[str]:
    """Token dropping (``plan.moe_capacity_factor``): --moe-expert-capacity-factor C (a float) and, padded,
    --moe-pad-expert-input-to-capacity (store_true), in core_v0.16 .. 0.19's arguments (megatron_flags_core_v0.*.json);
    the router keeps Megatron's default aux_loss balancing, which capacity needs (transformer_config.py:1660-1684)."""
    if plan.moe_capacity_factor is None:
        return []
    return (["--moe-expert-capacity-factor", f"{plan.moe_capacity_factor:g}"]
            + (["--moe-pad-expert-input-to-capacity"] if plan.moe_pad_to_capacity else []))
