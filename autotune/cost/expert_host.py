"""Host time of an MoE layer's routed experts as Megatron-core's ``TEGroupedMLP`` issues them: one cuBLASLt GEMM
and (FP8) one quantize kernel per local expert, so the host's work grows with the experts a GPU holds.

What the code runs (Transformer Engine d0067d0, the ``GroupedLinear`` path Megatron takes by default:
``moe_use_grouped_tensor`` False, megatron/core/transformer/transformer_config.py:857 at d98e8a64, and TE's own
default ``NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM`` "0", transformer_engine/pytorch/module/grouped_linear.py
:1656-1667):

* the split sizes are read to the host (grouped_linear.py:814 ``m_splits.tolist()``) and the input is quantized
  split by split (``_split_quantize`` :820; C++ ``split_quantize`` -> ``multi_tensor_quantize_impl``,
  transformer_engine/pytorch/csrc/extensions/cast.cpp:894-942: one fused multi-tensor cast only for delayed-scaling
  Float8 quantizers, otherwise one ``quantize`` kernel per split, :937-939: MXFP8, current scaling, block scaling);
* ``general_grouped_gemm`` (:875) -> ``multi_stream_cublas_gemm`` (transformer_engine/common/gemm/cublaslt_gemm.cu
  :970-1023): a loop of one ``nvte_cublas_gemm_v2`` per expert over 4 compute streams
  (transformer_engine/common/util/multi_stream.cpp:52 ``num_compute_streams = 4``), each call building its
  cuBLASLt descriptors and querying the heuristic (cublaslt_gemm.cu:452-459, :747-775) before it launches;
* backward (:1266-1440): the output gradient quantized split by split (:1315), then a grouped dgrad GEMM (:1382) and
  a grouped wgrad GEMM (:1448-1469 ``grouped_gemm_wgrad``): two cuBLASLt calls per expert.

So per local expert and micro-batch, the two grouped linears (fc1, fc2) issue forward 2 GEMM calls (+ 2 quantize
kernels under FP8 recipes other than delayed scaling) and backward 4 GEMM calls (+ 2 quantize kernels).

One GEMM call's host time, measured: Transformer Engine PR #3134 (SM100, 8 experts x 128 tokens, N = K = 2048,
"PURE" rows, operands pre-swizzled): the multi-stream cuBLASLt path 0.267 ms against 0.069 ms for one
single-launch grouped kernel on the same problem, GPU work of a few microseconds either way: the 7 further GEMM
calls cost (0.267 - 0.069) / 7 = 28 us each (:data:`CUBLASLT_GEMM_CALL_S`). A quantize kernel costs the engine's
plain launch time (``CommSchedule.kernel_launch_s``).

Why it is not hidden behind the GPU's work: every dropless dispatcher reads the token counts to the host before
the experts run, and waits for them: the all-to-all dispatcher (megatron/core/transformer/moe/token_dispatcher.py
at d98e8a64: ``_maybe_dtoh_and_synchronize`` :921-958, sync point "before_ep_alltoall" :594-596 or
"before_finish" :603-605), HybridEP without a static budget (:1111-1112 "HybridEP sizes buffers dynamically (CPU
sync in dispatch)"), DeepEP's dispatch likewise (:1450 ``tokens_per_expert.sum().item()``). The host then holds
no lead when the experts' calls start; it issues them no faster than one per call time, so the experts' GPU work
waits for them. The backward issues them without a new sync; its lead in is what the combine's backward queued,
not modelled (taken as none): an upper bound where large per-expert GEMMs would let the host catch up.

Under Megatron's EP overlap (``ParallelPlan.ep_overlap``) the host issues one micro-batch's experts while the GPU
still runs the other's nodes (megatron/core/models/common/model_chunk_schedule_plan.py at d98e8a64,
``TransformerLayerSchedulePlan.run``: the backward experts :270 are issued before the paired forward's dispatch and
its sync :274, the forward experts :285 after the backward attention :281 is queued): there the experts' host time
only counts where it exceeds the layer's GPU work (``autotune.cost.launch.launch_exposed_s``) or where the forward
dispatch's sync holds the host before it issues the experts' weight gradient and forward
(``autotune.cost.ep_overlap.paired_layers_s``).

Beside the GEMM calls, what Megatron-core runs per local expert or around the activation for biased experts and
a clamped GLU (GPT-OSS: ``add_bias_linear``, ``activation_func_clamp_value``), on the unfused path (every plan
here but a full-iteration graph's, whose op-fuser grouped MLP takes the bias and the clamped GLU into its grouped
kernels and whose launches cost nothing, ``autotune.cost.launch.host_launch_s``), issued between the dispatcher's
sync and the combine like the GEMM calls, so waited for whole (:data:`EXPERT_BIAS_KERNELS`,
:data:`CLAMPED_GLU_KERNELS`):

* fc2's bias, weighted by the routing probabilities (megatron/core/transformer/moe/experts.py:313-330 at
  core_v0.19.0, ``_apply_bias``; fc2 ``skip_bias_add=True``): a Python loop over the local experts' pieces of
  ``torch.split``, each ``t + b * p`` (a broadcast product and an add: 2 kernels), then one ``torch.cat``.
  Backward (autograd): each product's two gradients are a product and a reduction to the operand's shape (the
  bias summed over the expert's rows, the probability over the hidden width): 4 kernels per expert (the add passes
  its gradient through, the cat's gradient is views), and each of the two ``torch.split`` (fc2's output, the
  probabilities) gathers its pieces' gradients with one cat: 2.
* the clamped quick-GEGLU (megatron/core/fusions/fused_bias_geglu.py:411-434 at core_v0.19.0,
  ``weighted_bias_quick_geglu_impl``; the swiglu path takes no clamp there, experts.py:830-843): the two halves
  clamped and concatenated (3 kernels forward; backward the two clamps' masks and the chunk's cat, 3), and the
  linear offset made a device tensor from a Python float every call (``torch.tensor(linear_offset, ...,
  device=input.device)``, :434): PyTorch builds it on the host and moves it with a blocking copy
  (torch/csrc/utils/tensor_new.cpp ``internal_new_from_data``: ``tensor.to(device, ..., non_blocking=false)``;
  aten/src/ATen/native/cuda/Copy.cu ``copy_kernel_cuda``: ``at::cuda::memcpy_and_sync``, a ``cudaMemcpyAsync``
  then ``cudaStreamSynchronize``). So the forward experts sync a second time after fc1: what the host issues
  after it (fc2's calls and the bias loop) starts with the compute stream drained, and under EP overlap it cannot
  hide behind the paired micro-batch's work (:func:`post_sync_forward_host_s`). Selective ``moe_act`` recompute
  reruns the activation with its clamps, cat and copy (experts.py:883-893 at core_v0.19.0: ``bias_act_func``
  under ``CheckpointWithoutOutput``) when fc2's backward needs its input, so the data gradient issues those kernels
  too, and everything of it after that sync (fc2's and fc1's data-gradient calls, the activation's and the clamps'
  gradients) starts with the stream drained (:func:`post_sync_backward_host_s`).

Not counted: the grouped-tensor path (one grouped kernel; ``moe_use_grouped_tensor``), and engines whose experts
run one grouped kernel (torchtitan's ``torch._grouped_mm``): the caller gates on the engine's launch time.
"""

from __future__ import annotations

from autotune.cost.run_settings import recompute_modules
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["CLAMPED_GLU_KERNELS", "CUBLASLT_GEMM_CALL_S", "EXPERT_BIAS_KERNELS", "EXPERT_CALLS",
           "grouped_mlp_host_parts_s", "grouped_mlp_host_s", "local_experts", "post_sync_backward_host_s",
           "post_sync_forward_host_s"]

CUBLASLT_GEMM_CALL_S = (0.267e-3 - 0.069e-3) / 7
"""Host seconds of one cuBLASLt GEMM call on Transformer Engine's multi-stream path (TE PR #3134, SM100: module
docstring)."""

EXPERT_CALLS = {"fwd": (2, 2), "dgrad": (2, 2), "wgrad": (2, 0)}
"""Per local expert and pass: (cuBLASLt GEMM calls, quantize kernels under a per-split FP8 recipe), fc1 and fc2
together (module docstring); the backward is its data gradient (the output gradient quantized split by split,
grouped_linear.py:1315, and the dgrad GEMMs :1382) and its weight gradient (the wgrad GEMMs :1448-1469), which
Megatron's ``--delay-wgrad-compute`` issues apart (``autotune.cost.ep_overlap``)."""

EXPERT_BIAS_KERNELS = {"fwd": (2, 1), "dgrad": (4, 2), "wgrad": (0, 0)}
"""Per pass: (kernels per local expert, kernels per layer) of fc2's probability-weighted bias on the eager path,
experts with biases (module docstring: experts.py:313-330 at core_v0.19.0)."""

CLAMPED_GLU_KERNELS = {"fwd": 4, "dgrad": 3, "wgrad": 0}
"""Per pass, one MoE layer: the clamped quick-GEGLU's kernels beside the fused activation (module docstring:
fused_bias_geglu.py:424-434 at core_v0.19.0): forward two clamps, their cat and the offset's host-to-device copy;
backward the clamps' masks and the chunk's cat."""

FUSED_MULTI_CAST_RECIPES = frozenset({"te-delayed"})
"""FP8 recipes whose split inputs are cast by one fused multi-tensor kernel (cast.cpp:908-936), not one per split."""


def local_experts(model: ModelSpec, plan: ParallelPlan) -> int:
    """Routed experts one GPU holds."""
    moe = model.moe
    assert moe is not None
    return max(1, moe.num_experts // max(1, plan.ep))


def grouped_mlp_host_parts_s(model: ModelSpec, plan: ParallelPlan, fp8_recipe: str | None,
                             launch_s: float) -> tuple[float, float, float]:
    """(forward, data gradient, weight gradient) host seconds one MoE layer's routed experts take to issue, one
    micro-batch."""
    if launch_s <= 0 or model.moe is None:
        return 0.0, 0.0, 0.0
    per_split_cast = plan.precision == "fp8" and fp8_recipe not in FUSED_MULTI_CAST_RECIPES
    experts = local_experts(model, plan)
    biased, clamped = model.linear_bias, _clamped_glu(model)

    def part(name: str) -> float:
        gemms, casts = EXPERT_CALLS[name]
        per_expert, per_layer = EXPERT_BIAS_KERNELS[name] if biased else (0, 0)
        kernels = per_layer + (CLAMPED_GLU_KERNELS[name] if clamped else 0)
        if name == "dgrad" and clamped and _recomputes_moe_act(plan):  # the activation's rerun, its copy included
            kernels += CLAMPED_GLU_KERNELS["fwd"]
        return experts * (gemms * CUBLASLT_GEMM_CALL_S + ((casts if per_split_cast else 0) + per_expert) * launch_s) \
            + kernels * launch_s

    return part("fwd"), part("dgrad"), part("wgrad")


def post_sync_forward_host_s(model: ModelSpec, plan: ParallelPlan, fp8_recipe: str | None, launch_s: float) -> float:
    """Host seconds of one micro-batch's forward experts issued after the clamped GLU's stream synchronisation
    (module docstring): fc2's GEMM call (and per-split quantize) per local expert and fc2's bias loop; 0 for a model
    without that activation."""
    if launch_s <= 0 or model.moe is None or not _clamped_glu(model):
        return 0.0
    per_split_cast = plan.precision == "fp8" and fp8_recipe not in FUSED_MULTI_CAST_RECIPES
    per_expert, per_layer = EXPERT_BIAS_KERNELS["fwd"] if model.linear_bias else (0, 0)
    fc2 = CUBLASLT_GEMM_CALL_S + (launch_s if per_split_cast else 0.0)  # one of the pass's two GEMMs (and casts)
    return local_experts(model, plan) * (fc2 + per_expert * launch_s) + per_layer * launch_s


def post_sync_backward_host_s(model: ModelSpec, plan: ParallelPlan, fp8_recipe: str | None, launch_s: float) -> float:
    """Host seconds of one micro-batch's experts' data gradient issued after the synchronisation of the clamped GLU's
    ``moe_act`` rerun (module docstring): all of it; 0 without that rerun."""
    if launch_s <= 0 or model.moe is None or not (_clamped_glu(model) and _recomputes_moe_act(plan)):
        return 0.0
    return grouped_mlp_host_parts_s(model, plan, fp8_recipe, launch_s)[1]


def _recomputes_moe_act(plan: ParallelPlan) -> bool:
    return plan.recompute == "selective" and "moe_act" in recompute_modules(plan)


def _clamped_glu(model: ModelSpec) -> bool:
    """Whether the experts run Megatron's clamped quick-GEGLU (a gated activation with a clamp)."""
    return model.activation_clamp is not None and model.activation == "swiglu"


def grouped_mlp_host_s(model: ModelSpec, plan: ParallelPlan, fp8_recipe: str | None,
                       launch_s: float) -> tuple[float, float]:
    """(forward, backward) host seconds one MoE layer's routed experts take to issue, one micro-batch."""
    fwd, dgrad, wgrad = grouped_mlp_host_parts_s(model, plan, fp8_recipe, launch_s)
    return fwd, dgrad + wgrad
