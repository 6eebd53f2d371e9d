"""FP8 attention (``ParallelPlan.fp8_attention``; Megatron-core ``fp8_dot_product_attention``, Transformer Engine's
``fp8_dpa``): the fused attention kernel's speed over its BF16 self, as NVIDIA timed cuDNN's.

Source: bench/data/cudnn_sdpa_training.csv, NVIDIA's cuDNN SDPA training timings (NVIDIA/cudnn-frontend@3929da2ef4c1
benchmark/sdpa_benchmark_training/results/*/*.csv, cuDNN 9.22), each configuration timed in bf16, ``fp8`` (E4M3
inputs with per-tensor scales: Transformer Engine's delayed and current scaling) and ``mxfp8`` (E4M3 in 32-value
blocks: MXFP8BlockScaling). Derivation: per pass, the median over the GB200 and GB300 causal ("top_left") rows of
at most 8K tokens without a window of bf16 time / FP8 time of the same configuration, by the width of the query-key
heads (the speedup depends on it):

=========  =====  ==========================================  =====  =====
recipe     width  rows (each at 2K, 4K, 8K on GB200, GB300)   fwd    bwd
=========  =====  ==========================================  =====  =====
fp8        128    Llama 3.1                                   1.365  1.059
fp8        192    DeepSeek-V3, Kimi-K2.6 (MLA, 128-wide V)    1.623  1.635
mxfp8      128    Llama 3.1                                   1.240  0.917
mxfp8      192    DeepSeek-V3, Kimi-K2.6                      1.482  1.283
=========  =====  ==========================================  =====  =====

MXFP8's backward at width 128 is slower than BF16's. Other widths take the nearer measured width's figures (GPT-OSS's
64 and Qwen3's 128: width 128). Nothing here is fitted to a run: bench/attention_vs_cudnn_sdpa.py checks the model
with them against every FP8 row, tests/cost/test_attention_vs_cudnn.py re-derives them from the CSV.

Sliding windows: cuDNN's FP8 forward skips the tiles outside the window as BF16's does (GPT-OSS, window 128: the
FP8 forward 0.10 / 0.20 / 0.39 / 0.77 / 1.53 ms at 2K-32K on GB200, linear in the sequence like BF16's 0.11-2.63 ms),
but its backward does not: 0.54 / 1.73 / 6.18 / 23.2 / 90.3 ms (fp8) and 0.64 / 2.08 / 7.43 / 27.9 / 108 ms (mxfp8),
four times longer per doubling, against 0.24-3.69 ms BF16 (the gpt_oss rows of the CSV, results/gpt_oss/gb200/
gpt_oss_20260424_100011.csv). It takes what a causal backward of that shape takes at the FP8 rate (the model's causal
FP8 backward 0.87-1.00 of every GB200 / GB300 GPT-OSS row at <= 8K): a sliding-window layer's FP8 backward runs every
causal tile (``autotune.cost.attention_tiles.fp8_backward_share``).
"""

from __future__ import annotations

__all__ = ["FP8_ATTENTION_SPEEDUP", "recipe_rows", "speedup", "backward_scale", "saved_bytes"]

FP8_ATTENTION_SPEEDUP: dict[tuple[str, int], tuple[float, float]] = {
    ("fp8", 128): (1.365, 1.059), ("fp8", 192): (1.623, 1.635),
    ("mxfp8", 128): (1.240, 0.917), ("mxfp8", 192): (1.482, 1.283),
}
"""(cuDNN's timed rows, query-key head width) -> (forward, backward) BF16 time over FP8 time (module docstring)."""


def recipe_rows(fp8_recipe: str | None) -> str:
    """The timed rows a plan's FP8 recipe runs as: MXFP8 blocks ("mxfp8") or per-tensor scales ("fp8": Transformer
    Engine's delayed scaling, the Megatron default, and current scaling)."""
    return "mxfp8" if fp8_recipe in ("te-mxfp8", "torchao-mxfp8") else "fp8"


def speedup(fp8_recipe: str | None, head_dim_qk: float) -> tuple[float, float]:
    """(forward, backward) speed of the FP8 attention kernel over BF16's for the recipe and query-key head width."""
    width = 192 if head_dim_qk > 160 else 128
    return FP8_ATTENTION_SPEEDUP[(recipe_rows(fp8_recipe), width)]


def backward_scale(fwd_speedup: float, bwd_speedup: float, fwd_share: float, bwd_share: float) -> float:
    """The FP8 backward over what the BF16 backward-to-forward ratio makes of the FP8 forward: the two passes'
    speedups differ, and where sliding-window layers' backward runs more tiles than their forward, the backward's
    executed share of a causal layer (``bwd_share``) is larger than the forward's (``fwd_share``)."""
    return fwd_speedup / bwd_speedup * bwd_share / fwd_share


MXFP8_BLOCK = 32
"""Values per E8M0 scale byte of an MXFP8 tensor (one scale per 32-value block)."""


def saved_bytes(fp8_recipe: str) -> tuple[float, float]:
    """(bytes per element of Q, K and V, bytes per element of the output) the FP8 fused attention saves for its
    backward, by recipe, as Transformer Engine's ``FusedAttnFunc.forward`` keeps them (TransformerEngine d0067d0
    transformer_engine/pytorch/attention/dot_product_attention/backends.py:1580-1591, with the quantizer usages of
    utils.py:2687-2726 ``get_attention_quantizers``):

    * delayed scaling: Q, K, V and the output in FP8, row-wise only (1 byte each; the output's ``bwd_requires_o_fp8``);
    * current scaling: Q, K, V in FP8 (1 byte), the output in 16 bits (``NVTE_DPA_FP8CS_O_in_F16`` defaults to 1,
      backends.py:210);
    * MXFP8: Q, K, V with both their row-wise and column-wise data (``QKV_quantizer.columnwise_usage = True`` for
      MXFP8, utils.py:2720-2722), each 1 byte plus a scale byte per 32 values, so 2 x (1 + 1/32); the output in
      16 bits.

    A 16-bit attention saves 2 bytes of each. The output projection's own FP8 cast of its input is the linear's
    (``autotune.cost.activations``), under either."""
    if recipe_rows(fp8_recipe) == "mxfp8":
        return 2 * (1 + 1 / MXFP8_BLOCK), 2.0
    if fp8_recipe == "te-current":
        return 1.0, 2.0
    return 1.0, 1.0
