"""Whether a plan's routed experts run Transformer Engine's fused grouped MLP, and what memory-bound work that
kernel pair leaves outside its GEMMs.

When (all of them, as the code checks them):

* Megatron-core builds the experts from TE's op fuser when ``use_transformer_engine_op_fuser`` is set
  (megatron/core/transformer/moe/experts.py:287-291 at d98e8a64: ``_make_fused_ops`` :458, fc1 ``GroupedLinear``,
  the scaled activation, fc2 ``GroupedLinear`` with ``scale_bias=True`` when biased, :518-651). autotune writes it
  on the sync-free MoE path of a whole-iteration graph only (``autotune.emit.megatron_moe_graph``;
  ``autotune.specs.sync_free_moe``), as NVIDIA's full-iteration recipes do (Megatron-Bridge 067f987
  src/megatron/bridge/perf_recipes/gpt_oss/common.py:42, qwen/common.py:54); ``_benchmark_common`` clears it for
  every other recipe (perf_recipes/_common.py:67-68).
* Megatron refuses the fuser with expert tensor parallelism (experts.py:397-398) and for a gated activation
  other than SiLU or quick-GELU (:418-428); a clamped GLU takes ``ScaledClampedQGeGLU`` (:545-602).
* TE then swaps fc1 / activation / fc2 for one fused op only for MXFP8 or NVFP4 recipes (TransformerEngine
  d0067d0 transformer_engine/pytorch/ops/fused/grouped_mlp.py:842-843) on compute capability 10.x (:948-949),
  with ``NVTE_CUTEDSL_FUSED_GROUPED_MLP`` set (:946-947; Megatron's own check experts.py:454-455; the recipes set it,
  perf_recipes/gpt_oss/gb300/gpt_oss.py:251), for ``ScaledSwiGLU`` and ``ScaledClampedQGeGLU`` (:847-851). A
  clamped quick-GEGLU with GPT-OSS's numbers (``alpha`` 1.702, ``glu_linear_offset`` 1.0, ``limit`` 7.0: TE's
  defaults, ops/basic/swiglu.py:749-751, which Megatron's quick-GELU branch keeps, experts.py:574-589; the bridge
  sets clamp 7.0 and offset 1.0, gpt_oss_bridge.py:82-84) matches with any cuDNN frontend (:864-871; other
  values need frontend 1.24). NVIDIA's own footnote on the 26.06.01 GPT-OSS rows confirms the path: their slowdown
  is this fused op's MXFP8 dGeGLU backward GEMM (cudnn-frontend issue #256, ``bench/nvidia_table_footnotes.py``).

What the fused op runs (MXFP8, grouped_mlp.py at d0067d0):

* forward: one cuDNN grouped GEMM for fc1 whose epilogue adds fc1's bias, applies the clamped GLU and the
  routing probabilities and writes fc2's input already quantized (``bias_tensor``, ``prob_tensor``,
  ``act_func="geglu"``, runtime clamp parameters: :1399-1431; the quantized ``d_tensor`` / ``sfd_row_tensor`` /
  ``d_col_tensor`` read back as fc2's input, :1626-1650); then one grouped GEMM for fc2 with its bias, scaled by
  the probabilities (``scale_bias``), in the epilogue (``grouped_gemm_quant`` with ``bias_tensor`` and
  ``prob_tensor``, :1663-1743). No bias add, clamp, concatenation or offset copy runs beside them.
* backward: the output gradient is group-quantized (:1956; the FP8 cast already counted), the fc2 data-gradient
  GEMM's epilogue runs the GLU's backward, the probabilities' gradient and fc1's bias gradient
  (``generate_dbias``, :2066-2081; read back :2291-2300); fc2's scaled bias leaves one Triton kernel that reads
  the output gradient once for the bias's and the probabilities' gradients (``compute_grouped_dbias_dscales``,
  :2266-2280; transformer_engine/pytorch/triton/grouped_dbias_dscales.py:77-128: "a single fused Triton kernel",
  per row ``dy . bias`` and per expert ``sum dy * p``, fp32 atomics).

So on that path the eager bias loop and the clamp kernels (``autotune.cost.moe_time``: ``EXPERT_BIAS_BYTES``,
``CLAMP_BYTES``) and the routed fc1 bias gradient's reduction do not run; what stays is the dbias/dscales kernel's
read of fc2's output gradient (:data:`FUSED_FC2_BIAS_GRAD_BYTES`).

Not modelled here: the GLU itself and the casts of fc2's input and fc1's output gradient, which the same epilogues
take in for every model on that path (they stay charged); NVFP4's variant (its fc2 runs TE's generic grouped GEMM
on a separately quantized input, :1546-1622); the TE basic ops Megatron still runs under the fuser where TE does
not fuse (BF16), charged as the eager path.
"""

from __future__ import annotations

from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.sync_free_moe import sync_free_moe

__all__ = ["FUSED_FC2_BIAS_GRAD_BYTES", "FUSED_GROUPED_MLP_RECIPES", "fused_grouped_mlp"]

FUSED_GROUPED_MLP_RECIPES = frozenset({"te-mxfp8"})
"""FP8 recipes whose experts TE's op fuser fuses (grouped_mlp.py:842-843: MXFP8; NVFP4 not modelled)."""

FUSED_GROUPED_MLP_CC_MAJOR = 10
"""The compute capability major the fused kernels run on (grouped_mlp.py:948-949)."""

FUSED_FC2_BIAS_GRAD_BYTES = 2
"""Backward HBM bytes per element of fc2's output for its probability-scaled bias: the dbias/dscales kernel reads
the 16-bit output gradient once (module docstring)."""


def fused_grouped_mlp(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, fp8_recipe: str | None) -> bool:
    """Whether the plan's routed experts run TE's fused grouped MLP (module docstring)."""
    capability = cluster.gpu.capability
    return (sync_free_moe(model, plan) and model.activation == "swiglu" and plan.expert_tp == 1
            and plan.precision == "fp8" and fp8_recipe in FUSED_GROUPED_MLP_RECIPES
            and (capability is None or capability[0] == FUSED_GROUPED_MLP_CC_MAJOR))
