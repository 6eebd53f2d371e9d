"""NVIDIA's own footnotes on rows of its Megatron-Bridge performance tables (bench/data/nvidia_recipes_blackwell.csv
transcribes the numbers, not the footnote marks): which rows carry one, what it says, and the figures of those rows'
families without them, printed beside the accuracy table's figures, which keep every row (read by
bench/accuracy_nvidia_recipes.py)."""

from __future__ import annotations

import statistics

from accuracy_published import _stats

__all__ = ["FOOTNOTES", "TABLE_FOOTNOTES", "footnoted_summary"]

_ARCHIVE = "NVIDIA-NeMo/Megatron-Bridge@067f987df03b:docs/performance-summary-archive.md"
TABLE_FOOTNOTES = {f"{_ARCHIVE}#L57": "gpt-oss-note", f"{_ARCHIVE}#L58": "gpt-oss-note"}
"""Rows whose cell in NVIDIA's table carries one of NVIDIA's footnotes (the CSV transcribes the numbers, not the
marks): the 26.06.01 GPT-OSS rows' Model TFLOP/s cells read ``661[^gpt-oss-note]`` and ``597[^gpt-oss-note]``."""

FOOTNOTES = {
    "gpt-oss-note": ("NVIDIA's footnote: a known regression of this container, fixed in the next (cudnn-frontend "
                     "#256, the fused grouped MLP's dGeGLU backward kernel); not modelled, kept in every figure"),
}
"""NVIDIA's footnotes on rows (``TABLE_FOOTNOTES``) that say why a row ran slower than its software allows.
gpt-oss-note (performance-summary-archive.md:90 at 067f987) names the 26.06.01 GPT-OSS slowdown a known issue to be
fixed in the next container, pointing at NVIDIA/cudnn-frontend issue #256: ``grouped_gemm_dglu_wrapper_sm100`` (the
MXFP8 grouped GEMM with the dGeGLU backward epilogue) about 10x slower from cudnn-frontend 1.24.0; Transformer
Engine's fused grouped MLP runs it for GPT-OSS's clamped GeGLU (transformer_engine/pytorch/ops/fused/grouped_mlp.py
:106, :982-986 at d0067d0), the path the rows' recipe takes with ``use_transformer_engine_op_fuser``
(bench/data/nvidia_recipe_settings.csv). A kernel regression, not a setting: the estimate stays what the software
allows."""


def footnoted_summary(done: list) -> dict[str, list[float]]:
    """Of the estimated rows ``done`` (the accuracy bench's Cases), those NVIDIA's own footnotes mark as run on a
    regressed container (``TABLE_FOOTNOTES``), and their families' figures without them, printed beside (never
    instead of) the accuracy table's figures, which keep every row."""
    marked = [c for c in done if c.row["source"] in TABLE_FOOTNOTES]
    if not marked:
        return {}
    print(f"rows NVIDIA's footnotes mark as a known software regression of their container (kept in every figure "
          f"above): {len(marked)}; their families without them:")
    out: dict[str, list[float]] = {}
    for family in sorted({c.family for c in marked}):
        errs = [c.error for c in done if c.family == family and c.row["source"] not in TABLE_FOOTNOTES]
        out[family] = errs
        if errs:
            print(f"{'  family ' + family + ' without them':<44}{len(errs):>5}{_stats(errs)}{'':>11}"
                  f"{statistics.median(errs):>+7.1%}")
    return out
