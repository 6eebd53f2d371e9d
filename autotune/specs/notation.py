"""The one-line plan notation of tables, logs and file headers: ``tp8 pp4x2 dp16 cp2 ep8 mcore-distopt sp
mb1x32 rc-selective bf16``.

Pure: the engine's sharding tag (``mcore-distopt``, ``ds-zero3``, ``fsdp-full``) is passed in by whoever
knows the engine (``autotune.report.plan_summary`` asks the plan's engine for it).
"""

from __future__ import annotations

from autotune.specs.plan import ParallelPlan

__all__ = ["plan_notation", "TP_OVERLAP_WORDS"]

TP_OVERLAP_WORDS = {"none": "tp-no-overlap", "userbuffers": "tp-userbuffers", "async-tp": "async-tp"}


def plan_notation(plan: ParallelPlan, sharding_tag: str | None = None) -> str:
    """One line: the parallel layout and the settings that change memory or time (no tag: no sharding word)."""
    parts = [f"tp{plan.tp}", f"pp{plan.pp}" + (f"x{plan.vpp}" if plan.vpp > 1 else ""), f"dp{plan.dp}"]
    if plan.loss_slots is not None:  # the pipeline split: the output layer and loss as N layer slots
        parts.insert(2, f"loss-slots{plan.loss_slots}")
    if plan.cp > 1:
        parts.append(f"cp{plan.cp}")
    if plan.ep > 1:
        parts.append(f"ep{plan.ep}")
    if plan.etp is not None:
        parts.append(f"etp{plan.etp}")
    if sharding_tag:
        parts.append(sharding_tag)
    if plan.sequence_parallel:
        parts.append("sp")
    if plan.offload_optimizer != "none":
        parts.append(f"opt->{plan.offload_optimizer}")
    if plan.offload_param != "none":
        parts.append(f"param->{plan.offload_param}")
    parts.append(f"mb{plan.micro_batch_size}x{plan.grad_accum_steps}")
    if plan.recompute != "none":
        parts.append(f"rc-{plan.recompute}")
    if plan.recompute_modules is not None:
        parts.append("rc:" + "+".join(plan.recompute_modules))
    if plan.activation_offload_layers is not None:
        parts.append(f"act-offload{plan.activation_offload_layers}")
    if plan.mtp_layers is not None:
        parts.append(f"mtp{plan.mtp_layers}")
    parts.append(plan.precision)
    if plan.grad_dtype is not None:
        parts.append(f"grads-{plan.grad_dtype}")
    if plan.fp8_recipe is not None:
        parts.append(plan.fp8_recipe)
    if plan.tp_overlap is not None:
        parts.append(TP_OVERLAP_WORDS[plan.tp_overlap])
    if plan.torch_compile is not None:
        parts.append("compiled" if plan.torch_compile else "eager")
    if plan.loss_chunks is not None:
        parts.append(f"loss-chunks{plan.loss_chunks}")
    if plan.cuda_graph is not None:
        parts.append({"none": "no-cuda-graphs", "local": "cg-local", "transformer_engine": "cg-te",
                      "full-iteration": "cg-full"}[plan.cuda_graph]
                     + (":" + "+".join(plan.cuda_graph_scope) if plan.cuda_graph_scope else ""))
    if plan.ep_overlap is not None:
        parts.append({"none": "no-ep-overlap", "a2a": "ep-overlap", "a2a-delay-wgrad": "ep-overlap+dw"}[plan.ep_overlap])
    if plan.moe_dispatcher is not None:
        parts.append(f"disp-{plan.moe_dispatcher}")
    if plan.moe_capacity_factor is not None:  # token dropping at this capacity, padded to it or not
        parts.append(f"cap{plan.moe_capacity_factor:g}" + ("-pad" if plan.moe_pad_to_capacity else ""))
    if plan.cp_comm_type is not None:
        parts.append(f"cp-{plan.cp_comm_type}")
    if plan.fp8_attention:
        parts.append("fp8-attn")
    if plan.fp8_output_proj:
        parts.append("fp8-head")
    if plan.peft is not None:  # LoRA: its rank and targets where set (Bridge's defaults otherwise)
        parts.append(plan.peft + (f"-r{plan.lora_rank}" if plan.lora_rank else "")
                     + (":" + "+".join(t.removeprefix("linear_") for t in plan.lora_targets) if plan.lora_targets else ""))
    return " ".join(parts)
