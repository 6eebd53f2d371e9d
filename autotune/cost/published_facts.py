"""What the published-runs files leave to the reader, as data: each run's family and engine, the architecture
facts a source names but does not restate, readings of free text the field parsers cannot take, and the GPU
presets the free-text GPU names map to. Each with its source; nothing here is fitted.
(``autotune.cost.published_runs`` turns the entries and these into plans.)
"""

from __future__ import annotations

import os
from pathlib import Path

from autotune.errors import InputError

__all__ = ["reference_dir", "FAMILIES", "ARCH", "MTNLG", "MTNLG_PARALLEL", "READINGS", "UNFUSED_ATTENTION", "SAME_CONFIG_AS",
           "GPU_PATTERNS"]

# (id prefix, family, engine) in match order. Engines: the software each source ran (issue 8 point 5).
FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("narayanan21-t1", "Megatron-LM 2021 (Narayanan Table 1)", "megatron"),
    ("narayanan21-t2-ptd", "Megatron-LM 2021 (Narayanan Table 2, PTD-P)", "megatron"),
    ("narayanan21-t2-zero3", "DeepSpeed ZeRO-3 (Narayanan Table 2)", "deepspeed"),
    ("korthikanti22", "Megatron-LM 2022 (Korthikanti, SP + selective)", "megatron"),
    ("megatron-core-h100", "Megatron-core H100 (README scaling)", "megatron"),
    ("llama3", "Llama 3 405B (Meta, FSDP + TP + PP)", "fsdp"),
    ("bloom", "Megatron-DeepSpeed (BLOOM tr11)", "megatron-deepspeed"),
    ("mtnlg", "Megatron-DeepSpeed (MT-NLG)", "megatron-deepspeed"),
    ("palm-mfu-mtnlg", "Megatron-DeepSpeed (MT-NLG)", "megatron-deepspeed"),
    ("palm-mfu-gopher", "Gopher (TPU, PaLM Table 3)", "none"),
    # Turing-NLG: Megatron-LM's model code (tensor slicing) under DeepSpeed's ZeRO engine, the pairing the
    # Megatron-DeepSpeed engine runs today (DeepSpeedExamples' Megatron-LM of 2020 was its predecessor).
    ("zero-paper-turing-nlg", "Turing-NLG 17B (ZeRO paper, V100)", "megatron-deepspeed"),
    ("zero-paper", "DeepSpeed ZeRO paper (V100)", "deepspeed"),
    ("fsdp-paper", "PyTorch FSDP paper", "fsdp"),
    ("torchtitan-a100", "torchtitan A100 (FSDP2)", "fsdp"),
    ("torchtitan-h100", "torchtitan H100 (FSDP2 / TP / PP / CP, Float8)", "fsdp"),
    ("mpt", "MosaicML MPT (FSDP)", "fsdp"),
    ("nemo", "NeMo / Megatron-Bridge FP8 (H100)", "megatron"),
    ("bridge", "NeMo / Megatron-Bridge FP8 (H100)", "megatron"),
)

# Architecture facts the run's entry does not restate, from the public configuration it names.
ARCH: dict[str, dict] = {
    # GPT-3 175B (Brown et al. 2020, Table 2.1): 96 layers, d_model 12288, 96 heads; GPT-2 BPE vocabulary
    # 50257 padded to 51200 (Megatron's --make-vocab-size-divisible-by 128 x tp 8).
    "GPT3-175B (NeMo recipe)": {"layers": 96, "hidden": 12288, "heads": 96, "vocab": 51200},
    # Megatron-LM README strong scaling: "GPT-3 175B architecture with 131,072 vocab".
    "GPT-3 175B architecture with 131,072 vocab ('slightly more than 175B parameters')":
        {"layers": 96, "hidden": 12288, "heads": 96},
    # Llama 3 70B config.json (meta-llama/Meta-Llama-3-70B): vocab 128256.
    "LLAMA3-70B": {"vocab": 128256},
}
# MT-NLG 530B (Smith et al. 2022, Table 1 / Sec. 2.4): the run entries give layers/hidden/heads; vocabulary the
# GPT-2 BPE padded to 51200, as Megatron pads it; the PaLM MFU row is the same training (2240 GPUs, batch 1920).
MTNLG = {"layers": 105, "hidden": 20480, "heads": 128, "vocab": 51200, "seq_len": 2048}
# Smith et al. 2022 Sec. 2.4 (the mtnlg entry). Recompute: the section's 126 / 121 / 113 TFLOP/s for its 60.1 /
# 50.2 / 44.4 s iterations on 2240 / 2800 / 3360 GPUs are Narayanan's Eq. 3 count, 96 B s l h^2 (1 + s/6h +
# V/16lh), which includes the recomputed forward (1.70e22 FLOP / (2800 x 50.2 s) = 121 TFLOP/s): the run
# checkpointed every layer's activations, as Megatron-DeepSpeed's --checkpoint-activations does.
MTNLG_PARALLEL = {"tp": 8, "pp": 35, "global_batch": 1920, "recompute": "full"}

# Readings of an entry's free text that the field parsers cannot take, each with its reason (merged into the entry).
READINGS: dict[str, dict] = {
    # PyTorch FSDP paper (Zhao et al. 2023) Sec. 5.4 / Fig. 7(b): "minGPT" 175B is the GPT-3 175B shape (Brown et
    # al. 2020 Table 2.1: 96 layers, d_model 12288, 96 heads); plain FSDP FULL_SHARD (no TP/PP); the largest
    # cluster of the "128-512" range, where memory pressure no longer slows batch 2 (the entry's note); "more
    # than 186" TFLOP/s taken as 186. Its kind: with activation checkpointing, 186 TFLOP/s of model FLOPs would
    # be 248 TFLOP/s executed, 92% of the A100's best measured GEMM rate (271, gpus.yaml), above any end-to-end
    # A100 figure (FlashAttention-2 paper: 225 TFLOP/s without recompute); only the executed-FLOP reading is
    # physical. minGPT's CausalSelfAttention is unfused (softmax over q @ k^T, mingpt/model.py).
    "fsdp-paper-gpt175b-bs2": {"model": {"layers": 96, "hidden": 12288, "heads": 96},
                               "hardware": {"total_gpus": 512}, "parallel": {"tp": 1, "pp": 1},
                               "measured": {"tflops_per_gpu": 186, "tflops_per_gpu_kind": "hardware"}},
    # Turing-NLG 17B (ZeRO paper Sec. 10.6; its 41.4 TFLOP/s per GPU): the Microsoft Research blog "Turing-NLG: A
    # 17-billion-parameter language model by Microsoft" (2020-02-10) gives 78 Transformer layers, hidden 4256, 28
    # heads, tensor slicing across 4 V100s with Megatron-LM, NVIDIA DGX-2 nodes (16 GPUs), 256 GPUs and a batch
    # of 512 (12 l h^2 + V h = 17.2B with V = 50257, as DeepSpeed's docs/_tutorials/large-models-w-deepspeed.md
    # counts it). Precision: the ZeRO paper's mixed-precision fp16 Adam (Sec. 3.1). Recompute: ZeRO-R's
    # (partitioned) activation checkpointing, every layer as Megatron-LM's --checkpoint-activations. Not in any
    # source here: the sequence length, taken as 1024, the GPT-2 / Megatron-LM 8.3B context the blog compares
    # with (a 4% effect on the FLOPs per token at h = 4256); the vocabulary, GPT-2's BPE padded by Megatron to a
    # multiple of 128 x tp (50688); the micro-batch, every divisor of the 8 sequences per data-parallel rank.
    # Its 41.4 TFLOP/s is read as model FLOPs (the files' convention). DeepSpeed's later Megatron example counts
    # 8 x parameters per token, the recomputed forward included (DeepSpeedExamples Megatron-LM-v1.1.5-ZeRO3
    # megatron/utils.py flops_calculator); that reading gives 291 tokens/s per GPU, 41% under the model, where
    # the same V100 facts time NVIDIA's own V100 runs 6-16% slow (tests/cost/test_v100_facts.py): not taken.
    "zero-paper-turing-nlg-17b": {"model": {"layers": 78, "hidden": 4256, "heads": 28, "vocab": 50688,
                                            "seq_len": 1024},
                                  "hardware": {"total_gpus": 256, "gpus_per_node": 16},
                                  "parallel": {"tp": 4, "pp": 1, "global_batch": 512, "zero_stage": 2,
                                               "recompute": "activation checkpointing"},
                                  "precision": "fp16 mixed precision"},
}
UNFUSED_ATTENTION = ("narayanan21", "korthikanti22", "bloom", "mtnlg", "palm-mfu-mtnlg", "fsdp-paper", "zero-paper")

# Runs whose entry says their unstated settings are another run's ("config assumed identical to the dp8
# selective run (2240 A100, 530B)", source.note of the first): the missing parallel fields are taken from it.
SAME_CONFIG_AS = {"korthikanti22-530b-dp8-full-recompute": "korthikanti22-530b-dp8-selective-sp"}

GPU_PATTERNS = (  # (regex over the free-text GPU, preset)
    (r"HBM2e|94-95GB|500W", "h100-sxm-96gb-500w"),  # torchtitan's Grand Teton H100s (power-limited HBM2e part)
    (r"^H100", "h100-sxm-80gb"),
    (r"^A100.*40GB", "a100-40gb"),
    (r"^A100", "a100-80gb"),
    (r"^V100", "v100-32gb"),
)


def reference_dir() -> Path:
    """The published-runs folder: $AUTOTUNE_REFERENCE_DIR, else the copy shipped in autotune/data/published_runs."""
    env = os.environ.get("AUTOTUNE_REFERENCE_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[1] / "data" / "published_runs"
    if not (path / "published_runs_dev.yaml").is_file():
        raise InputError([f"published runs not found in {path}: set AUTOTUNE_REFERENCE_DIR to the folder holding "
                          "published_runs_dev.yaml"], subject="reference data")
    return path
