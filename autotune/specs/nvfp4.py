"""NVFP4 training (``--precision fp4``): the facts of Transformer Engine's one FP4 training recipe.

A plan of precision ``fp4`` runs Transformer Engine's ``NVFP4BlockScaling`` recipe, as Megatron-core builds it for
``--fp4-format e2m1 --fp4-recipe nvfp4`` (Megatron-LM d98e8a64 megatron/core/fp4_utils.py:219-245
``get_fp4_recipe``; the only other ``--fp4-recipe`` choice, "custom", takes a user's quantizer factory and is not
modelled). What the recipe does (TransformerEngine d0067d0 transformer_engine/common/recipe/__init__.py:489-609):

* every linear layer's GEMMs (forward, data gradient, weight gradient) take E2M1 operands (4 bits: half a byte per
  element) in blocks of 16 consecutive values, each block with an E4M3 scale (1 byte), and one FP32 scale per tensor
  ("2-level block scaling");
* weights are scaled per 2-D block of 16 x 16 (``fp4_quant_fwd_weight.fp4_2d_quantization``), activations and
  gradients per 1-D block of 16;
* inputs and gradients go through a 16 x 16 random Hadamard transform for their column-wise (weight-gradient) copy
  (``random_hadamard_transform``), gradients are rounded stochastically;
* attention (``fp8_dpa = False``), norms, the output layer and the router stay 16-bit (NVFP4 applies to the Transformer
  Engine linear layers inside the fp8_autocast Megatron opens per layer, fp4_utils.py:247-292).

Every transformer layer's linear layers run NVFP4, as Megatron-Bridge's ``bf16_with_nvfp4_mixed`` (the Llama-3
NVFP4 performance recipes' precision) leaves ``first_last_layers_bf16`` False (Megatron-Bridge 067f987
training/mixed_precision.py:404-418). Megatron's ``--first-last-layers-bf16`` with ``--num-layers-at-start-in-bf16`` /
``--num-layers-at-end-in-bf16`` (layers kept in BF16: fp4_utils.py get_fp4_context; Bridge sets 14 at the end for
Nemotron 3 Super only, ``nemotron_3_super_bf16_with_nvfp4_mixed``) is not modelled.

Each tensor is quantised along both axes from the 16-bit source (the docstring: "both versions are computed from the
high precision input"); how many bytes that moves: :data:`NVFP4_CAST_BYTES`.
"""

from __future__ import annotations

__all__ = ["FP4_PRECISION", "FP4_ELEMENT_BYTES", "NVFP4_BLOCK", "NVFP4_SCALE_BYTES", "NVFP4_WEIGHT_BYTES",
           "NVFP4_INPUT_BYTES", "NVFP4_CAST_BYTES", "NVFP4_CAPABILITY", "QUANTIZED_PRECISIONS", "is_quantized"]

FP4_PRECISION = "fp4"
"""The plan's precision value of NVFP4 training (the tensor-core rate key of autotune/presets/gpus.yaml too)."""

FP4_ELEMENT_BYTES = 0.5
"""E2M1: 4 bits per element (recipe/__init__.py ``fp4_format = Format.E2M1``)."""

NVFP4_BLOCK = 16
"""Values per scaling block ("each group of 16 consecutive values is scaled together", recipe/__init__.py:493-494;
csrc/quantizer.cpp ``NVFP4_BLOCK_SIZE`` in ``NVFP4Quantizer::get_scale_shape``)."""

NVFP4_SCALE_BYTES: tuple[float, float] = (1 / NVFP4_BLOCK, 1 / (NVFP4_BLOCK * NVFP4_BLOCK))
"""Bytes of E4M3 scale per element: (activations and gradients, 1-D blocks of 16; weights, 2-D blocks of 16 x 16).
The per-tensor FP32 scale (4 bytes a tensor) is left out."""

NVFP4_WEIGHT_BYTES = FP4_ELEMENT_BYTES + NVFP4_SCALE_BYTES[1]
"""Bytes per element of one NVFP4 copy of a weight (its data and 2-D block scales)."""

NVFP4_INPUT_BYTES = FP4_ELEMENT_BYTES + NVFP4_SCALE_BYTES[0]
"""Bytes per element a linear layer saves of its input for the weight gradient: the column-wise NVFP4 copy and its
scales (Transformer Engine keeps the quantised input, as for the FP8 recipes, module/linear.py)."""

NVFP4_CAST_BYTES = 2.0 + 2.0 + 2 * NVFP4_INPUT_BYTES
"""HBM bytes per element quantised to NVFP4 (activations and gradients; csrc/quantizer.cpp
``NVFP4Quantizer::quantize_impl`` at d0067d0): one pass reads the 16-bit tensor for its amaxes
(``nvte_hadamard_transform_amax``: the row-wise amax and that of the Hadamard-transformed transpose; without the
transform ``nvte_compute_amax_with_config``), 2 bytes; a second, fused kernel reads it again
(``nvte_quantize_with_hadamard_transform``: "Rowwise quantization" and "RHT followed by columnwise quantization &
transpose"), 2 bytes, and writes the row-wise and the column-wise FP4 copies with their 1-D scales,
2 x (0.5 + 1/16). The 16 x 16 Hadamard transform runs on the tensor cores (32 FLOP an element), far under the
kernel's memory time."""

NVFP4_CAPABILITY = (10, 0)
"""The least CUDA compute capability NVFP4 runs on (TransformerEngine d0067d0 pytorch/quantization.py:171-175
``_compute_nvfp4_support``: "Device compute capability 10.0 or higher required for NVFP4 execution")."""

QUANTIZED_PRECISIONS = ("fp8", FP4_PRECISION)
"""Precisions whose linear layers run quantised GEMMs (a cast kernel before each, quantised weight copies)."""


def is_quantized(precision: str) -> bool:
    """Whether a plan of ``precision`` runs its linear layers' GEMMs on quantised (FP8 / NVFP4) operands."""
    return precision in QUANTIZED_PRECISIONS
