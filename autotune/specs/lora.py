"""The LoRA a plan runs (``ParallelPlan.peft``), with Megatron-Bridge's defaults, and the adapter parameters it
trains per GPU: facts of the plan and the model that the engines' ledgers and the cost model read
(``autotune.cost.lora`` has the costs and the sources of how Bridge runs LoRA).

Bridge's ``ParallelLinearAdapter`` (NVIDIA-NeMo/Megatron-Bridge @067f987 peft/utils.py:1033-1072) gives a base layer
of input width k and output width n a ``linear_in`` k -> rank and a ``linear_out`` rank -> n, each sharded over
the tensor-parallel ranks: rank x (k + n) / tp parameters per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.specs.layout import stage_layers
from autotune.specs.model import ModelSpec
from autotune.specs.peft import LORA_DEFAULT_ALPHA, LORA_DEFAULT_RANK, LORA_TARGETS
from autotune.specs.plan import ParallelPlan
from autotune.specs.stage_mix import model_representative_stages

__all__ = ["LoraRun", "lora_run", "lora_model_problems", "target_widths", "adapter_params_per_layer",
           "trainable_stage_params"]


@dataclass(frozen=True, slots=True)
class LoraRun:
    """The LoRA a plan runs, its unset fields at Bridge's defaults."""

    rank: int
    alpha: float
    targets: tuple[str, ...]


def lora_run(plan: ParallelPlan) -> LoraRun | None:
    """The plan's LoRA with Bridge's defaults filled in (peft/lora.py:143-147); None for full training. The one
    place estimate and emit read it."""
    if plan.peft != "lora":
        return None
    return LoraRun(rank=plan.lora_rank or LORA_DEFAULT_RANK,
                   alpha=LORA_DEFAULT_ALPHA if plan.lora_alpha is None else float(plan.lora_alpha),
                   targets=plan.lora_targets or LORA_TARGETS)


def lora_model_problems(model: ModelSpec) -> list[str]:
    """What of ``model`` the LoRA cost model does not cover: MoE experts (Bridge's grouped-expert adapters,
    peft/utils.py ``GroupedExpertLinearAdapter``) and MLA's split projections are not modelled."""
    out = []
    if model.is_moe:
        out.append(f"LoRA on an MoE model ({model.name}): expert adapters are not modelled: use a dense model or "
                   "drop --peft")
    if model.mla is not None:
        out.append(f"LoRA on multi-latent attention ({model.name}): its projections' adapters are not modelled: "
                   "drop --peft")
    return out


def target_widths(model: ModelSpec, targets: tuple[str, ...]) -> list[tuple[int, int]]:
    """(input width k, output width n) of each targeted linear layer of one dense layer (Megatron-core names:
    linear_qkv the fused Q, K, V projection; linear_proj the attention output; linear_fc1 the MLP's gated up
    projection, two widths with SwiGLU; linear_fc2 the down projection)."""
    h, f = model.hidden_size, model.ffn_hidden_size
    n_in = 2 if model.gated_mlp else 1
    widths = {"linear_qkv": (h, model.q_width + 2 * model.kv_width), "linear_proj": (model.attention_output_width, h),
              "linear_fc1": (h, n_in * f), "linear_fc2": (f, h)}
    return [widths[t] for t in targets]


def adapter_params_per_layer(model: ModelSpec, plan: ParallelPlan) -> float:
    """Trainable adapter parameters of one layer on one GPU: rank x (k + n) / tp per target (module docstring)."""
    run = lora_run(plan)
    if run is None:
        return 0.0
    return sum(run.rank * (k + n) for k, n in target_widths(model, run.targets)) / plan.tp


def trainable_stage_params(model: ModelSpec, plan: ParallelPlan, scheme: str, stage: int | None = None) -> float:
    """Adapter parameters one GPU trains: its stage's layers' adapters (``stage``; None: the stage with the most
    layers). The embedding and output layer are frozen and get none."""
    stages = model_representative_stages(model, plan.pp, scheme, plan.vpp) if stage is None else (stage,)
    layers = max(stage_layers(model.num_layers, plan.pp, s, scheme)[1] for s in stages)
    return layers * adapter_params_per_layer(model, plan)
