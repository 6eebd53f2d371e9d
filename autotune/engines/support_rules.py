"""The rules that follow from an engine's :class:`EngineSupport`: one per plan dimension it cannot run.

Rule ids are ``<engine>:<dimension>`` (``deepspeed:sequence_parallel``), so the planner's rejection
counts say which engine refused what. Each message carries the engine's source (its ``sources``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from autotune.engines.facts import EngineSupport, Rule
from autotune.specs.layout import layer_counts, split_scheme, virtual_layout

if TYPE_CHECKING:
    from autotune.specs.model import ModelSpec
    from autotune.specs.plan import ParallelPlan

__all__ = ["support_problems", "LAYOUT_DIMS", "VARIANT_DIMS"]

# support_problems' rules in its order: first those that read only the layout (tp, cp, pp, vpp, ep, etp, sequence
# parallelism and the layer split), then those that read only the ZeRO stage (and pp > 1), the offloads, whether
# dp_replicate > 1, the precision and the gradient dtype, then the run settings. The planner relies on this order
# to answer a variant's first broken rule without building its plan (autotune.search.planner._probe_rule): a new
# rule goes into the group whose fields it reads, or after them.
LAYOUT_DIMS = ("tp", "sequence_parallel", "pp", "tp_pp", "vpp", "layer_split", "loss_slots", "cp", "ulysses_heads",
               "ep", "etp")
VARIANT_DIMS = ("zero_stage", "zero_pp", "offload_optimizer", "offload_param", "hybrid_shard", "precision",
                "grad_dtype")


class DeclaresSupport(Protocol):
    """What the rules read of an engine (``autotune.engines.base.Engine`` has it all)."""

    name: str
    title: str
    version: str
    support: EngineSupport


def support_problems(engine: DeclaresSupport, model: ModelSpec, plan: ParallelPlan) -> list[Rule]:
    s, src = engine.support, getattr(engine, "sources", {})
    out: list[Rule] = []

    def bad(dim: str, message: str) -> None:
        out.append(Rule(id=f"{engine.name}:{dim}", message=f"{engine.title}: {message}",
                        source=src.get(dim, engine.version)))

    if plan.tp > 1 and s.tp is None:
        bad("tp", f"no tensor parallelism (tp={plan.tp}): set tp=1")
    if plan.sequence_parallel and not s.sequence_parallel:
        bad("sequence_parallel", "no Megatron-style sequence parallelism: disable it"
            + (" (DeepSpeed's own sequence parallelism is Ulysses: use cp)" if s.cp == "ulysses" else ""))
    if plan.pp > 1 and s.pp is None:
        bad("pp", f"no pipeline parallelism (pp={plan.pp}): set pp=1")
    if plan.pp > 1 and plan.tp > 1 and s.pp is not None and s.tp is not None and not s.tp_with_pp:
        bad("tp_pp", f"its tensor parallelism ({s.tp}) does not compose with its pipeline engine ({s.pp}): "
                     f"use tp=1 or pp=1")
    if plan.vpp > 1 and not s.vpp:
        bad("vpp", "no interleaved (virtual) pipeline schedule: set vpp=1")
    if plan.pp > 1 and s.pp is not None and layer_counts(model.num_layers, plan.pp, s.layer_split) is None:
        bad("layer_split", f"cannot split {model.num_layers} layers over pp={plan.pp} stages ({s.layer_split} split)")
    if plan.loss_slots:
        _loss_slot_rules(s, model, plan, bad)
    if plan.cp > 1 and s.cp is None:
        bad("cp", f"no context/sequence parallelism (cp={plan.cp}): set cp=1")
    if plan.cp > 1 and s.cp == "ulysses" and model.num_attention_heads % (plan.cp * plan.tp):
        bad("ulysses_heads", f"Ulysses scatters attention heads: num_attention_heads ({model.num_attention_heads}) "
                             f"must be divisible by tp x cp ({plan.tp * plan.cp})")
    if plan.ep > 1 and not s.ep:
        bad("ep", f"no expert parallelism (ep={plan.ep}): set ep=1")
    if plan.etp is not None and plan.etp != plan.tp and not s.etp:
        bad("etp", f"no expert tensor parallelism of its own (etp={plan.etp}, parallel folding is Megatron-core's): "
                   f"leave etp unset")
    if plan.zero_stage not in s.zero_stages:
        bad("zero_stage", f"no ZeRO stage {plan.zero_stage} equivalent: use one of "
                          f"{', '.join(map(str, s.zero_stages))}")
    elif plan.pp > 1 and s.pp is not None and plan.zero_stage not in s.zero_stages_with_pp:  # no pp: rule pp
        bad("zero_pp", f"ZeRO stage {plan.zero_stage} does not run with pipeline parallelism (pp={plan.pp}): use "
                       f"stage {' or '.join(map(str, s.zero_stages_with_pp))}, or pp=1")
    if plan.offload_optimizer not in s.offload_optimizer:
        bad("offload_optimizer", f"no optimizer offload to {plan.offload_optimizer}: use "
                                 f"{' or '.join(s.offload_optimizer)}")
    if plan.offload_param not in s.offload_param:
        bad("offload_param", f"no parameter offload to {plan.offload_param}: use {' or '.join(s.offload_param)}")
    if plan.dp_replicate > 1 and not s.hybrid_shard:
        bad("hybrid_shard", f"no hybrid (replicate x shard) data parallelism (dp_replicate={plan.dp_replicate}): "
                            f"set dp_replicate=1")
    if plan.precision not in s.precisions:
        # NVFP4 (autotune.specs.nvfp4) is Transformer Engine's NVFP4BlockScaling, which Megatron-LM runs
        # (--fp4-format); torchtitan, DeepSpeed and accelerate have no FP4 training recipe to write.
        elsewhere = " (NVFP4 training runs on Megatron-LM: --engine megatron)" if plan.precision == "fp4" else ""
        bad("precision", f"no {plan.precision} training: use {' or '.join(s.precisions)}{elsewhere}")
    if not s.runs("grad_dtype", plan.grad_dtype):
        bad("grad_dtype", f"{plan.grad_dtype} gradients are not modelled for this engine: leave the gradient dtype "
                          f"to the engine (drop --grad-dtype)")
    elif plan.grad_dtype == "bf16" and plan.precision == "fp16":
        bad("grad_dtype", "bf16 gradients with fp16 training: fp16 runs reduce fp16 gradients; use --precision "
                          "bf16 or fp8, or drop --grad-dtype")
    _run_setting_rules(s, plan, bad)
    return out


def _loss_slot_rules(s: EngineSupport, model: ModelSpec, plan: ParallelPlan, bad) -> None:
    """A plan's ``loss_slots`` (``layout.split_scheme``): the engine's files must write the split, there must be a
    pipeline (the plan's own check, ``plan_values.loss_slots_problems``), and the split must exist: Megatron's
    leave no virtual stage without a layer but the embedding's and the loss's, torchtitan's pass its own checks."""
    k, pp, vpp = plan.loss_slots, plan.pp, plan.vpp
    if not s.loss_slots:
        bad("loss_slots", f"its files cannot give the output layer and loss {k} layer slots of the pipeline split "
                          f"(Megatron-core's --pipeline-model-parallel-layout, torchtitan's "
                          f"pipeline_parallel_last_stage_less_layers): use --engine megatron or fsdp, or drop "
                          f"--loss-slots")
    elif pp > 1 and virtual_layout(model.num_layers, pp, vpp, _scheme(s, model, plan, k)) is None:
        ok = [j for j in range(k - 1, 0, -1) if virtual_layout(model.num_layers, pp, vpp, _scheme(s, model, plan, j))]
        fix = "use " + (f"--loss-slots {ok[0]} or less, or " if ok else "") + "fewer virtual stages (--vpp), or drop " \
                                                                              "--loss-slots"
        if s.layer_split == "any":
            bad("loss_slots", f"--loss-slots {k}: {_torchtitan_refusal(model.num_layers, pp * vpp, k)}: {fix}")
            return
        bad("loss_slots", f"--loss-slots {k}: {model.num_layers} layers + the embedding's slot + {k} loss slots"
                          + (f" + {2 * plan.mtp_layers} MTP slots" if plan.mtp_layers else "")
                          + f" over pp x vpp = {pp} x {vpp} virtual stages leave one with no layer, neither the "
                          f"embedding nor the loss: {fix}")


def _torchtitan_refusal(num_layers: int, stages: int, k: int) -> str:
    """What torchtitan's split raises for the output as k layers (pipeline_parallel_last_stage_less_layers = k) over
    ``stages`` virtual stages: ``generate_llm_fqn_per_model_part``, pytorch/torchtitan@73a0e69 (v0.2.2)
    torchtitan/distributed/pipeline_parallel.py:266-296 (``_generate_llm_fqn_per_model_part``, b5bcd76 :389-419)."""
    effective = num_layers + 1 + k
    told = (f"torchtitan counts the embedding as 1 layer and the output layer and loss as {k} "
            f"(pipeline_parallel_last_stage_less_layers), {num_layers} + 1 + {k} = {effective} effective layers over "
            f"{stages} virtual stages")
    if stages > effective:
        return (f"{told}, and raises \"Number of stages ({stages}) cannot be greater than effective layers "
                f"({effective})\"")
    return (f"{told}, {effective // stages} a stage, and raises \"output_weight ({k}) exceeds minimum layers per stage "
            f"({effective // stages})\"")


def _scheme(s: EngineSupport, model: ModelSpec, plan: ParallelPlan, k: int) -> str:
    return split_scheme(s.layer_split, plan.mtp_layers, model.num_layers, plan.pp, plan.vpp, k)


def _run_setting_rules(s: EngineSupport, plan: ParallelPlan, bad) -> None:
    """The FP8 recipe, TP overlap, torch.compile, loss chunks, CUDA graphs, EP overlap and recompute modules a plan
    asks for (None: the engine's default, always runs; ``EngineSupport.runs`` says which values the engine runs)."""
    if not s.runs("fp8_recipe", plan.fp8_recipe):
        bad("fp8_recipe", f"no {plan.fp8_recipe} FP8 recipe: "
            + (f"use {' or '.join(s.fp8_recipes)}, or " if s.fp8_recipes else "")
            + "leave the recipe to the engine (drop --fp8-recipe)")
    overlap = plan.tp_overlap
    if not s.runs("tp_overlap", overlap):
        bad("tp_overlap", f"no {overlap} TP communication overlap: use {' or '.join(s.tp_overlaps)} (--tp-overlap)")
    elif overlap not in (None, "none") and plan.tp == 1:
        bad("tp_overlap", f"{overlap} overlaps tensor-parallel collectives, and tp=1 has none: drop --tp-overlap")
    elif overlap == "userbuffers" and not plan.sequence_parallel:
        bad("tp_overlap", "--tp-comm-overlap needs sequence parallelism (Megatron-LM arguments.py; Megatron-Bridge "
                          "comm_overlap.py turns it off without): add --sequence-parallel or drop --tp-overlap")
    elif overlap == "async-tp" and plan.torch_compile is False:
        bad("tp_overlap", "async TP needs torch.compile (torchtitan distributed/tensor_parallel.py: \"Async TP "
                          "requires 'model' in --compile.components and --compile.enable\"): drop --no-compile")
    if not s.runs("torch_compile", plan.torch_compile):
        bad("torch_compile", "its files cannot turn torch.compile on: drop --compile")
    if not s.runs("loss_chunks", plan.loss_chunks):
        bad("loss_chunks", "its files compute the loss over the whole sequence at once: drop --loss-chunks")
    if not s.runs("cuda_graph", plan.cuda_graph):
        bad("cuda_graph", f"its files cannot capture {plan.cuda_graph} CUDA graphs: "
            + (f"use {' or '.join(s.cuda_graphs)}, or " if len(s.cuda_graphs) > 1 else "") + "drop --cuda-graph")
    if not s.runs("ep_overlap", plan.ep_overlap):
        bad("ep_overlap", f"its files cannot overlap the expert-parallel all-to-alls ({plan.ep_overlap}): "
            + (f"use {' or '.join(s.ep_overlaps)}, or " if len(s.ep_overlaps) > 1 else "") + "drop --ep-overlap")
    if plan.moe_dispatcher is not None and plan.moe_dispatcher not in s.moe_dispatchers:
        bad("moe_dispatcher", f"its expert parallelism has no {plan.moe_dispatcher} token dispatcher: use "
            f"{' or '.join(s.moe_dispatchers)}, or drop --moe-dispatcher")
    if not s.runs("cp_comm_type", plan.cp_comm_type):
        bad("cp_comm_type", f"its context parallelism has no {plan.cp_comm_type} exchange: "
            + (f"use {' or '.join(s.cp_comm_types)}, or " if s.cp_comm_types else "") + "drop --cp-comm-type")
    if plan.peft is not None and plan.peft not in s.peft:
        bad("peft", f"its files cannot freeze the base weights and train {plan.peft} adapters: use --engine "
                    "megatron (Megatron-Bridge's LoRA), or drop --peft")
    if not s.runs("activation_offload_layers", plan.activation_offload_layers):
        bad("activation_offload_layers", "its files cannot offload activations to host memory (Megatron-core's "
            "--cpu-offloading-num-layers): use --engine megatron, or drop --activation-offload-layers")
    if not s.runs("mtp_layers", plan.mtp_layers):
        bad("mtp_layers", "its files cannot train multi-token-prediction modules (Megatron-core's --mtp-num-layers): "
            "use --engine megatron, or drop --mtp-layers")
    if not (s.runs("moe_capacity_factor", plan.moe_capacity_factor)
            and s.runs("moe_pad_to_capacity", plan.moe_pad_to_capacity)):
        bad("moe_capacity_factor", "its MoE layers are dropless (no expert capacity): use --engine megatron "
            "(--moe-expert-capacity-factor), or drop --moe-capacity-factor and --moe-pad-to-capacity")
    if not s.runs("fp8_attention", plan.fp8_attention):
        bad("fp8_attention", "its attention runs in 16 bits (no FP8 attention kernel): use --engine megatron "
            "(Megatron-core's fp8_dot_product_attention), or drop --fp8-attention")
    if not s.runs("fp8_output_proj", plan.fp8_output_proj):
        bad("fp8_output_proj", "its output layer runs in 16 bits (no FP8 LM head): use --engine megatron "
            "(Megatron-core's fp8_output_proj, core 0.18+), or drop --fp8-output-proj")
    other = [m for m in plan.recompute_modules or () if m not in s.recompute_modules]
    if other:
        bad("recompute_modules", f"its selective recompute cannot be told to rerun {' '.join(other)} (Megatron-core's "
            f"--recompute-modules): leave it to the engine (drop --recompute-modules)")
