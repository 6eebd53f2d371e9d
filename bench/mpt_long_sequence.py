"""MPT's long-sequence rows held out of the published-run set: the attention kernel against data it was not fitted on.

    PYTHONPATH=. python bench/mpt_long_sequence.py

llm-foundry's MPT benchmark tables (mosaicml/llm-foundry scripts/train/benchmarking/README.md at 495218376, the
"H100 80GB BF16" and "A100 80GB with 1600 Gbps node-node interconnect (RoCE)" tables; added at b2a43a147, whose
submit_benchmarks.py:144 defaults ``--attn_impl`` to ``triton``) time MPT 1B-30B on 8 GPUs (FSDP FULL_SHARD,
activation checkpointing, amp_bf16) at sequences of 8k-64k. The published-run set holds two of these rows
(``mpt-a100_80gb-7b-seq65536-8gpu-ac``, ``mpt-h100_80gb-13b-seq32768-8gpu-ac``); this bench estimates the rest
from the same entries (their hardware and settings), once with the attention kernel the runs used (Triton
FlashAttention, ``autotune.cost.kernels.TRITON_FLASH``) and once as FlashAttention-2. Model shapes: the
llm-foundry pretrain yamls (n_layers, d_model, n_heads; expansion_ratio 4; 30B's heads as the set's MPT-30B entry,
d_model / 128). Nothing here is fitted: the shared parameters are the shipped ones.
"""

from __future__ import annotations

import copy
import statistics
import sys
from dataclasses import replace

import yaml

from autotune.cost.published_facts import reference_dir
from autotune.cost.published_runs import predict_run, run_from_entry

A100 = "mpt-a100_80gb-7b-seq65536-8gpu-ac"
H100 = "mpt-h100_80gb-13b-seq32768-8gpu-ac"
SHAPES = {"1b": (24, 2048, 16), "3b": (32, 2560, 20), "7b": (32, 4096, 32), "13b": (40, 5120, 40),
          "30b": (48, 7168, 56)}
"""(n_layers, d_model, n_heads) of scripts/train/yamls/pretrain/mpt-{1b,3b,7b,13b,30b}.yaml."""
ROWS = (  # (table's template entry, model, SeqLen, MicroBatchSize, GradAccum, Throughput (T/s/GPU)), README rows
    (A100, "13b", 32768, 1, 3, 1016), (A100, "7b", 32768, 2, 2, 1672), (A100, "3b", 65536, 1, 2, 1767),
    (A100, "3b", 32768, 3, 6, 3029), (A100, "1b", 65536, 1, 2, 3044), (A100, "30b", 8192, 1, 21, 574),
    (H100, "7b", 65536, 1, 2, 1956), (H100, "7b", 32768, 2, 2, 3318), (H100, "13b", 16384, 3, 3, 2985),
    (H100, "3b", 65536, 1, 2, 3262), (H100, "30b", 8192, 1, 21, 1384), (H100, "7b", 8192, 8, 2, 6935),
)


def held_out_entry(template: dict, name: str, seq: int, micro: int, accum: int, tokens_per_s: int) -> dict:
    entry = copy.deepcopy(template)
    layers, hidden, heads = SHAPES[name]
    entry["id"] = f"mpt-{template['id'].split('-')[1]}-{name}-seq{seq}"  # the family is read from the id
    entry["model"].update(name=f"MPT-{name}", layers=layers, hidden=hidden, heads=heads, ffn_hidden=4 * hidden,
                          seq_len=seq)
    entry["model"].pop("params", None)
    gpus = template["hardware"]["total_gpus"]
    entry["parallel"].update(micro_batch=micro, grad_accum=accum, global_batch=micro * accum * gpus,
                             global_batch_tokens=micro * accum * gpus * seq)
    entry["measured"] = {"tokens_per_s_per_gpu": tokens_per_s}
    return entry


def held_out_errors() -> list[tuple[str, float, float, float]]:
    """(run id, measured tokens/s per GPU, error with Triton FlashAttention, error as FlashAttention-2) per row."""
    data = yaml.safe_load((reference_dir() / "published_runs_more.yaml").read_text(encoding="utf-8"))
    templates = {e["id"]: e for e in data["runs"] if e["id"] in (A100, H100)}
    out = []
    for template, *row in ROWS:
        run = run_from_entry(held_out_entry(templates[template], *row))
        as_fa2 = replace(run, time_overrides={k: v for k, v in run.time_overrides.items() if k != "attention_kernel"})
        measured = run.tokens_per_s_per_gpu
        out.append((run.run_id, measured, predict_run(run)[0] / measured - 1, predict_run(as_fa2)[0] / measured - 1))
    return out


def main() -> int:
    rows = held_out_errors()
    print(f"{'row':<34}{'measured':>9}{'Triton FA':>11}{'as FA2':>9}   (tokens/s per GPU, error of the estimate)")
    for run_id, measured, triton, fa2 in rows:
        print(f"{run_id:<34}{measured:>9.0f}{triton:>+11.1%}{fa2:>+9.1%}")
    med = [statistics.median(abs(r[i]) for r in rows) for i in (2, 3)]
    print(f"{'median |error|':<43}{med[0]:>11.1%}{med[1]:>9.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
