"""Megatron-FSDP: Megatron-core's own fully sharded data parallelism (``--use-megatron-fsdp``), the Megatron engine's
ZeRO-2 and ZeRO-3. What it holds, what it gathers, what it refuses (the flags that ask for it:
``autotune.emit.megatron_fsdp``).

Sources: NVIDIA/Megatron-LM at d98e8a64 (the mirrored commit): ``megatron/training/arguments.py`` (validate_args and
the flag definitions, line numbers below), ``megatron/core/distributed/fsdp/mcore_fsdp_adapter.py`` and
``megatron/core/distributed/fsdp/src/megatron_fsdp/`` (``megatron_fsdp.py``, ``param_and_grad_buffer.py``,
``distributed_data_parallel_config.py``); Megatron-Bridge at 067f987d (its Llama-3 FSDP perf recipes,
``src/megatron/bridge/perf_recipes/llama/gb300/llama3.py:218-228``).

* ``--data-parallel-sharding-strategy`` (arguments.py:3190): ``optim_grads_params`` (ZeRO-3, the default) shards the
  16-bit weights, the gradients and the optimizer; ``optim_grads`` (ZeRO-2) keeps the weights whole. Both
  reduce-scatter every micro-batch's gradients (megatron_fsdp.py:757-786, ``grad_reduce_every_bprop``).
* The FSDP unit is a transformer layer (mcore_fsdp_adapter.py:167-171: ``TransformerLayer``, ``MoETransformerLayer``,
  ``MambaLayer``); embedding, final norm and output layer sit outside every unit.
* Weights: the sharded 16-bit model weights (FP8 with ``--fp8-param-gather``, arguments.py:1096), fp32 main weights
  (``--megatron-fsdp-main-params-dtype`` fp32, arguments.py:3687), main gradients in the model's dtype
  (``--megatron-fsdp-main-grads-dtype`` auto: "main gradients will match the dtype of the model compute
  parameters", distributed_data_parallel_config.py:132-136), reduced in that dtype (grad comm dtype None: the main
  gradients' dtype, :138-150), Adam's two fp32 moments; all over the dp x cp ranks (experts over the expert-dp ranks,
  mcore_fsdp_adapter.py:356-372).
* ``--fsdp-double-buffer`` (arguments.py:3202, what NVIDIA's Llama-3 FSDP recipes set): two persistent buffers of one
  unit each, for the unsharded weights and for the unsharded gradients; a prefetch never takes a third unit
  (param_and_grad_buffer.py:4420-4485): the next layer is gathered while one runs.
* Recompute: a layer's forward rerun inside the backward keeps the weights the backward gathered
  (megatron_fsdp.py:794-812 and 936-967: PRE_BACKWARD skips the forward prefetch and the reshard): one gather
  per layer and backward, as FSDP2.
* LoRA (Megatron-Bridge's peft, applied to the model before it is wrapped: Bridge training/setup.py:369 and 641, no
  check of its ``ConfigContainer.validate`` refuses it with ``use_megatron_fsdp``): the buckets are split by
  ``requires_grad`` (param_and_grad_buffer.py:1838), and by default (``only_create_grad_buffer_and_main_weight_buffer_
  for_param_requires_grad=True``, :2017) a frozen bucket gets its model-weight buffer alone, no main weights and no
  gradient buffer (:2646-2649, 2689-2692, 2709); that buffer is sharded with optim_grads_params like any other
  (:2340-2344, 2651-2653). So the frozen base weights are held as in full training, gathered per unit as in full
  training, and only the adapters get gradients, main weights and optimizer states.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.emit.megatron_fsdp import sharding_strategy
from autotune.engines.facts import Rule
from autotune.engines.states import ModelStateBytes
from autotune.specs.layout import largest_layer
from autotune.specs.plan import OPTIMIZER_STATE_BYTES

if TYPE_CHECKING:
    from autotune.specs.model import ModelSpec
    from autotune.specs.plan import ParallelPlan

__all__ = ["megatron_fsdp_rules", "megatron_fsdp_states", "megatron_fsdp_buffers", "MEGATRON_FSDP_GRAD_BYTES",
           "UNIT_BUFFERS", "recompute_row_gathers", "lora_fsdp_base_weights"]

MEGATRON_FSDP_GRAD_BYTES = 2.0
"""Main gradients (and their reduce-scatter) in the model's 16-bit dtype: ``--megatron-fsdp-main-grads-dtype``
default ``auto`` (arguments.py:3691), ``--megatron-fsdp-grad-comm-dtype`` default ``auto`` (arguments.py:3695)."""

UNIT_BUFFERS = 2
"""``--fsdp-double-buffer``: the FixedPoolAllocator's two unit buffers (param_and_grad_buffer.py:4426-4430: "double
buffers can support no more than 2 FSDP units")."""

_ARGS = "megatron/training/arguments.py"
_ADAPTER = "megatron/core/distributed/fsdp/mcore_fsdp_adapter.py"


def recompute_row_gathers(plan: ParallelPlan, fp8_recipe: str, fp8_param_gather: bool) -> int:
    """Gathers per layer and micro-batch that optim_grads_params issues inside the backward, besides the one the
    backward prefetches, and that nothing prefetches (so the compute waits for each).

    With MXFP8 parameters a unit has two weight buffers: the row-wise data gathered for the forward and the
    column-wise (transpose) data gathered for the backward (mixed_precision.py:183-185 ``fp8_need_transpose_data``:
    MXFP8 tensors; param_and_grad_buffer.py:2637-2672 the transpose buffer; :4327-4332 the backward's bucket key is
    the transpose buffer's). The forward releases the row-wise buffer after each unit (megatron_fsdp.py:977-993:
    resharded unless in PRE_BACKWARD) and the backward's prefetch fetches the next unit's column-wise data
    (megatron_fsdp.py:918-932, ``bwd=True``). Full recompute reruns each layer's forward inside the backward: its
    pre-forward hook gathers the row-wise data again, with the forward prefetch cancelled in PRE_BACKWARD
    (megatron_fsdp.py:794-800): one more gather per layer, waited for. 16-bit and per-tensor FP8 units have one
    buffer whose backward key is the forward's, so the backward's prefetch serves the recompute too (0 here).
    Only full recompute is counted: a selective recompute of modules with weights (mla_up_proj, mlp, moe) regathers
    their buckets the same way, at a granularity (bucket per unit, dtype and expert-ness,
    param_and_grad_buffer.py:1731-1830) not modelled."""
    if plan.zero_stage != 3 or plan.recompute != "full" or not fp8_param_gather:
        return 0
    return 1 if plan.precision == "fp8" and fp8_recipe == "te-mxfp8" else 0


def megatron_fsdp_rules(model: ModelSpec, plan: ParallelPlan) -> list[Rule]:
    """What Megatron-FSDP refuses of a ZeRO-2/3 plan, with the nearest plan it runs (offload: the engine's support
    rules)."""
    if sharding_strategy(plan) is None:
        return []
    del model
    out: list[Rule] = []

    def bad(message: str, source: str) -> None:
        out.append(Rule(id="megatron:fsdp", message=f"Megatron-FSDP: {message}", source=source))

    if plan.optimizer not in ("adamw", "sgd"):
        bad(f"Megatron-FSDP does not support the {plan.optimizer} optimizer yet: use --optimizer adamw or sgd, or "
            f"--zero 1 (the distributed optimizer)", f"{_ARGS}:1150-1151")
    if plan.ep_overlapped and plan.cuda_graph not in (None, "none"):
        bad(f"1F1B overlap with FSDP does not support per-layer CUDA graphs (--cuda-graph {plan.cuda_graph}): drop "
            "--cuda-graph or --ep-overlap", f"{_ADAPTER}:182-187")
    return out


def megatron_fsdp_states(plan: ParallelPlan, dense: float, expert: float) -> ModelStateBytes:
    """Model states one GPU holds under Megatron-FSDP (module docstring): the 16-bit weights sharded with
    optim_grads_params or whole with optim_grads (the engine takes off what FP8 parameters save); gradients and the
    optimizer (fp32 main weights and Adam's moments: ``OPTIMIZER_STATE_BYTES``) sharded. At the step the optimizer's
    ``.grad`` is the main gradient shard cast to the fp32 main weights' dtype (``megatron_fsdp_use_decoupled_grad`` False,
    distributed_data_parallel_config.py:152-156): a 4-byte copy of the shard."""
    owned = dense / plan.zero_partitions + expert / plan.expert_zero_partitions
    weights = 2.0 * (owned if plan.zero_stage == 3 else dense + expert)
    return ModelStateBytes(weights=weights, gradients=MEGATRON_FSDP_GRAD_BYTES * owned,
                           optimizer_states=OPTIMIZER_STATE_BYTES[plan.optimizer] * owned, step_transient=4 * owned)


def lora_fsdp_base_weights(plan: ParallelPlan, dense: float, expert: float) -> float:
    """Bytes of a LoRA plan's frozen 16-bit base weights on one GPU (module docstring): sharded like full training's
    weights with optim_grads_params, whole with optim_grads; they have no gradients or optimizer states."""
    if plan.zero_stage == 3:
        return 2.0 * (dense / plan.zero_partitions + expert / plan.expert_zero_partitions)
    return 2.0 * (dense + expert)


def megatron_fsdp_buffers(model: ModelSpec, plan: ParallelPlan, gather_bytes: float,
                          trainable_per_layer: float | None = None) -> dict[str, float]:
    """The double buffers (``UNIT_BUFFERS`` units of the largest layer, this GPU's tp / ep share): the unsharded
    weights (``gather_bytes`` per element, optim_grads_params only) and the unsharded gradients before their
    reduce-scatter; the embedding and output layer, outside every unit, are gathered whole while they run.
    ``trainable_per_layer``: the parameters of a layer that train, where not all do (LoRA's adapters, this GPU's
    share): a unit's gradient buffer holds theirs alone (frozen buckets have none, module docstring)."""
    layer = largest_layer(model).per_gpu(plan.tp, plan.ep)
    grads = layer if trainable_per_layer is None else trainable_per_layer
    out = {"fsdp_unsharded_grads": UNIT_BUFFERS * MEGATRON_FSDP_GRAD_BYTES * grads}
    if plan.zero_stage == 3:
        root = max(model.embedding_params().per_gpu(plan.tp, plan.ep), model.output_params().per_gpu(plan.tp, plan.ep))
        out["fsdp_unsharded_params"] = UNIT_BUFFERS * gather_bytes * layer + 2 * root
    return out
