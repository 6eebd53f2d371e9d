"""The values a ParallelPlan's fields may take: engines, precisions, recompute, offload, optimizers and the run
settings' vocabularies (TP / EP overlaps, CUDA graphs, MoE dispatchers, CP exchanges), each with its source.

autotune.specs.plan re-exports them; the plan checks its fields against them.
"""

from __future__ import annotations

from typing import Literal

# The engines of autotune/engines/ (each module there registers one; tests check the two lists agree).
ENGINE_NAMES = ("deepspeed", "megatron", "megatron-deepspeed", "fsdp", "hf")
EngineName = Literal["deepspeed", "megatron", "megatron-deepspeed", "fsdp", "hf"]
Recompute = Literal["none", "selective", "full"]
Offload = Literal["none", "cpu", "nvme"]
Optimizer = Literal["adamw", "sgd", "adafactor", "adamw8bit"]
PlanPrecision = Literal["bf16", "fp16", "fp8", "fp4"]  # fp4: NVFP4 (autotune.specs.nvfp4)
GradDtype = Literal["bf16"]
# FP8 scaling recipes (the cost of each: autotune.cost.kernels.FP8_CAST_BYTES). te-delayed: Transformer Engine
# DelayedScaling (Megatron --fp8-recipe delayed); te-current: TE Float8CurrentScaling (Megatron --fp8-recipe
# tensorwise); te-blockwise: TE Float8BlockScaling (Megatron --fp8-recipe blockwise; Megatron-core fp8_utils.py
# get_fp8_recipe); te-mxfp8: TE MXFP8BlockScaling (Megatron --fp8-recipe mxfp8); torchao-tensorwise /
# torchao-rowwise: torchao.float8 (torchtitan quantize.linear.float8); torchao-mxfp8: torchao's MX linear (torchtitan
# 0.2 quantize.linear.mx, 0.3 MXFP8LinearConverter).
FP8_RECIPES = ("te-delayed", "te-current", "torchao-tensorwise", "torchao-rowwise", "te-blockwise", "te-mxfp8",
               "torchao-mxfp8")
Fp8Recipe = Literal["te-delayed", "te-current", "torchao-tensorwise", "torchao-rowwise", "te-blockwise", "te-mxfp8",
                    "torchao-mxfp8"]
# Block-scaled recipes: bytes of scale per FP8 element, (activations and gradients, weights). TransformerEngine
# @d0067d0 common/recipe/__init__.py: MXFP8BlockScaling scales "each group of 32 consecutive values" by an E8M0
# (1-byte) factor, weights too unless enable_2d_quantization (default False): 1/32 B each; Float8BlockScaling keeps
# "float32 containers" (4 B) over 1-D blocks of 128 for inputs and gradients (x_block_scaling_dim /
# grad_block_scaling_dim = 1, block_len = 128 in pytorch/tensor/float8_blockwise_tensor.py) and 2-D 128 x 128
# blocks for weights (w_block_scaling_dim = 2): 4/128 and 4/16384 B. Both recipes quantise every tensor along
# both axes from the 16-bit source ("both versions are computed from the high precision input", the same
# docstrings): a row-wise and a column-wise FP8 copy, each with its own scales. torchao's MX linear: blocks of 32
# (block_size = 32) with an E8M0 scale each for inputs, weights and gradients alike (torchao v0.16.0
# prototype/mx_formats/config.py MXLinearConfig; v0.18.0 prototype/moe_training/mxfp8_linear.py
# _to_mxfp8_then_scaled_mm, the class torchtitan 0.3 converts to): 1/32 B each.
FP8_BLOCK_SCALE_BYTES: dict[str, tuple[float, float]] = {"te-blockwise": (4 / 128, 4 / (128 * 128)),
                                                        "te-mxfp8": (1 / 32, 1 / 32), "torchao-mxfp8": (1 / 32, 1 / 32)}
# The least CUDA compute capability each Transformer Engine block-scaled recipe runs on, and the first it no longer
# runs on (TransformerEngine @d0067d0 pytorch/quantization.py _compute_mxfp8_support: 10.0 or higher, "not supported
# on 12.0+ architectures yet"; _compute_fp8_block_scaling_support: 9.0 or higher, with CUDA >= 12.9); torchtitan's
# MX converters ask for 10.0 or higher and name no upper bound (torchtitan v0.2.2 components/quantization/mx.py:42-44
# ``has_cuda_capability(10, 0)``, its ROCm gfx950 alternative not modelled; 0.3.0 mx.py:70-71).
FP8_RECIPE_CAPABILITY: dict[str, tuple[tuple[int, int], tuple[int, int] | None]] = {
    "te-mxfp8": ((10, 0), (12, 0)), "te-blockwise": ((9, 0), None), "torchao-mxfp8": ((10, 0), None)}
# How TP collectives overlap the GEMMs: none; userbuffers (Megatron --tp-comm-overlap, Transformer Engine
# userbuffers); async-tp (torch micro-pipelined TP, torchtitan parallelism.enable_async_tensor_parallel).
TP_OVERLAPS = ("none", "userbuffers", "async-tp")
TpOverlap = Literal["none", "userbuffers", "async-tp"]
# What Megatron-core's selective recompute can rerun (``--recompute-modules``; megatron-core 0.19.2
# transformer_config.py:546-563 names them, :1766-1782 checks them; "gdn_norm_out", the Gated DeltaNet output norm,
# is not modelled). Kept in this order in a plan, so that the same set reads back equal.
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
# CUDA graphs of Megatron-core's training layers (--cuda-graph-impl; arguments.py of core_v0.16.1 .. 0.19.2): "local"
# (Megatron's CudaGraphManager) or "transformer_engine" (TE make_graphed_callables), per layer, over the scope's parts
# (--cuda-graph-scope in 0.16 / 0.17, --cuda-graph-modules from 0.18; enums.py CudaGraphScope / CudaGraphModule):
# "attn", "mlp" (dense layers), "moe_router" (the MoE block up to its router), "moe_preprocess" (with moe_router: the
# dispatcher's preprocess, MoELayer.preprocess; transformer_config.py:1056-1057 of 0.19.2); None: the whole layer.
# "moe" (drop-and-pad MoE only) is not modelled. "full-iteration": one graph of the whole forward-backward of
# every micro-batch (megatron/core/full_cuda_graph.py FullCudaGraphWrapper, wrapping forward_backward_func at
# megatron/training/training.py:3617-3622 of core_v0.19.0; the optimizer step stays outside), spelled
# --cuda-graph-impl full_iteration from core 0.18 and --cuda-graph-impl local --cuda-graph-scope full_iteration
# before (autotune/emit/megatron_flags_core_v0.*.json); it captures no parts, so takes no scope.
CUDA_GRAPHS = ("none", "local", "transformer_engine", "full-iteration")
FULL_ITERATION_GRAPH = "full-iteration"
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe_router", "moe_preprocess")
# Expert-parallel all-to-all overlap (Megatron-core's 1F1B batch-level overlap: one micro-batch's forward runs layer by
# layer beside another's backward, each one's dispatch / combine all-to-alls behind the other's compute): "a2a" =
# --overlap-moe-expert-parallel-comm; "a2a-delay-wgrad" adds --delay-wgrad-compute (the weight-gradient GEMMs run
# apart, after the data gradients, so the backward all-to-alls start sooner). Both flags in core_v0.16 .. 0.19's
# arguments.py (autotune/emit/megatron_flags_core_v0.*.json); model_parallel_config.py:343-349 of 0.19.2.
EP_OVERLAPS = ("none", "a2a", "a2a-delay-wgrad")
# MoE token dispatcher (Megatron --moe-token-dispatcher-type {alltoall,allgather,flex}, with flex
# --moe-flex-dispatcher-backend {deepep,hybridep}; transformer_config.py:862-872 of megatron-core 0.19.2; the flags in
# core_v0.16 .. 0.19's arguments.py, autotune/emit/megatron_flags_core_v0.*.json). What each moves:
# autotune.cost.moe_time. None: the engine's own (alltoall: what autotune writes and every engine's EP runs).
MOE_DISPATCHERS = ("alltoall", "allgather", "flex-deepep", "flex-hybridep")
# Token dropping (Megatron --moe-expert-capacity-factor C [--moe-pad-expert-input-to-capacity]; transformer_config.py
# :888-896 of core_v0.19.0): each expert takes at most ceil(C x tokens x top_k / experts) of a rank's routed tokens
# (moe_utils.py get_capacity; router.py:788-795 drops the rest), and with padding exactly that many, so every shape
# is static (token_dispatcher.py:505-531). None: dropless, the engines' default. What it costs: autotune.cost.moe_time.


def capacity_problems(factor: object, pad: object) -> list[str]:
    """What is wrong with a plan's token-dropping settings (``moe_capacity_factor``, ``moe_pad_to_capacity``)."""
    out = []
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                               or not 0 < factor < float("inf")):
        out.append(f"moe_capacity_factor must be a positive number or absent (dropless), got {factor!r}: e.g. "
                   "--moe-capacity-factor 1.0")
    if pad is not None and not isinstance(pad, bool):
        out.append(f"moe_pad_to_capacity must be true, false or absent, got {pad!r}")
    return out


# FP8 attention (Megatron-core TransformerConfig.fp8_dot_product_attention, transformer_config.py:640 at d98e8a6;
# Megatron-Bridge mixed_precision / model ``fp8_dot_product_attention``): Transformer Engine's fused attention takes
# FP8 Q, K, V (its recipe's ``fp8_dpa``). FP8 plans only. What it costs: autotune.cost.fp8_attention.


def fp8_attention_problems(value: object, precision: str) -> list[str]:
    """What is wrong with a plan's ``fp8_attention`` (FP8 attention kernels) for its precision."""
    if value is not None and not isinstance(value, bool):
        return [f"fp8_attention must be true, false or absent (the engine's default: 16-bit attention), got {value!r}"]
    if value and precision != "fp8":
        return [f"fp8_attention runs attention in FP8 (Megatron fp8_dot_product_attention), and this plan trains in "
                f"{precision}: use --precision fp8, or drop --fp8-attention"]
    return []


# FP8 LM head (Megatron-core TransformerConfig.fp8_output_proj, NVIDIA/Megatron-LM 3f6a2ed844 "Add opt-in MXFP8
# LM-head output projection (#4825)", first in core_v0.18.0; Megatron-LM --fp8-output-proj): the output layer built
# as Transformer Engine's TELMHeadColumnParallelLinear under the MXFP8 autocast (models/gpt/gpt_model.py:273-277)
# instead of the 16-bit ColumnParallelLinear. transformer_config.py:1569-1575 raises unless fp8 and fp8_recipe ==
# 'mxfp8' (line numbers at d98e8a6). What it costs: autotune.cost.fp8_head.


def fp8_output_proj_problems(value: object, precision: str, fp8_recipe: str | None) -> list[str]:
    """What is wrong with a plan's ``fp8_output_proj`` (the output layer in MXFP8) for its precision and recipe."""
    if value is not None and not isinstance(value, bool):
        return [f"fp8_output_proj must be true, false or absent (the engine's default: a 16-bit output layer), "
                f"got {value!r}"]
    if value and (precision != "fp8" or fp8_recipe != "te-mxfp8"):
        now = (f"trains in {precision}" if precision != "fp8"
               else f"runs the FP8 recipe {fp8_recipe or '(the engine default)'}")
        return [f"fp8_output_proj runs the output layer in MXFP8, which Megatron-core allows with fp8 and the "
                f"mxfp8 recipe alone (transformer_config.py:1569-1575, NVIDIA/Megatron-LM 3f6a2ed844), and this plan "
                f"{now}: use --precision fp8 --fp8-recipe te-mxfp8, or drop --fp8-output-proj"]
    return []


def loss_slots_problems(value: object, pp: object) -> list[str]:
    """What is wrong with a plan's ``loss_slots`` (the layer slots its split gives the output layer and loss,
    ``autotune.specs.layout.split_scheme``) for its pipeline; the engine's rules judge its split."""
    if value is None:
        return []
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return [f"loss_slots must be a positive integer or absent (the engine's own split), got {value!r}"]
    if pp == 1:
        return [f"loss_slots ({value}) gives the output layer and loss layer slots on the last pipeline stage, and "
                f"this plan has no pipeline (pp=1): use --pp 2 or more, or drop --loss-slots"]
    return []


# Context parallelism's attention exchange (Megatron --cp-comm-type, megatron/training/arguments.py:3221 at d98e8a6;
# Transformer Engine context_parallel.py ``attn_forward_func_with_cp`` :5096-5140 at d0067d0): p2p (the K/V ring),
# a2a (Ulysses all-to-all of Q, K, V and the output), allgather (TE's ``all_gather``: K/V gathered, exposed) and
# a2a+p2p (all-to-all inside the node, ring across, --hierarchical-context-parallel-sizes). What each moves:
# autotune.cost.cp_ring. None: the engine's own (Megatron p2p).
CP_COMM_TYPES = ("p2p", "a2a", "allgather", "a2a+p2p")
# The run settings a plan may fix (None: the engine's default, left out of to_dict); the engines say which they
# run (EngineSupport), the cost model reads them, the emitters write them and autotune.job_files reads them back.
RUN_SETTINGS = ("grad_dtype", "fp8_recipe", "tp_overlap", "torch_compile", "loss_chunks", "recompute_modules",
                "cuda_graph", "cuda_graph_scope", "ep_overlap", "moe_dispatcher", "cp_comm_type",
                "activation_offload_layers", "moe_capacity_factor", "moe_pad_to_capacity", "mtp_layers",
                "fp8_attention", "fp8_output_proj")

# Optimizer-state bytes per parameter, fp32 master weights included (the ZeRO paper's K).
#   adamw:     fp32 master 4 + exp_avg 4 + exp_avg_sq 4                    = 12 (ZeRO paper, Sec. 3.1)
#   sgd:       fp32 master 4 + momentum 4                                  = 8
#   adafactor: fp32 master 4 + factored second moment (rows+cols, ~0/param) = 4
#   adamw8bit: fp32 master 4 + 8-bit exp_avg 1 + 8-bit exp_avg_sq 1        = 6
#              (Dettmers et al. 2022; block-wise quantisation statistics, 2 fp32 per 2048-block, ignored)
OPTIMIZER_STATE_BYTES: dict[str, float] = {"adamw": 12.0, "sgd": 8.0, "adafactor": 4.0, "adamw8bit": 6.0}
