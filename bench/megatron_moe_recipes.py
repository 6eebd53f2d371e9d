"""Megatron-core's own MoE recipes (bench/data/megatron_moe_recipes.csv): predicted vs measured throughput.

    python bench/megatron_moe_recipes.py

NVIDIA's Megatron-core MoE team publishes recipes with their measured median model TFLOP/s per GPU
(NVIDIA/Megatron-LM branch ``dev`` at d48bd6be0a85, ``examples/moe_recipes/README.md`` "Recipe Index", one YAML per
row under ``examples/moe_recipes/``); the Qwen3 rows are here (Qwen3-235B-A22B and Qwen3-30B-A3B; the DeepSeek ones use
MLA, which :func:`megatron_flops_per_token` does not count). For Qwen3-235B they include plans without pipelining
(tp1 pp1 ep64 on 128 GB200 / GB300, tp2 pp1 ep16 on B300): measured points for the pp1 / wide-EP plans the planner
ranks first on NVIDIA's Megatron-Bridge rows (bench/accuracy_nvidia_recipes.py), whose own table has none.

Each row goes through `autotune estimate` (its argument parser and ``estimate_from_flags``) with the recipe's plan
and the settings the tool has flags for, each read from the row's YAML: CUDA graphs and their scope (``local``
``full_iteration`` is the tool's ``full-iteration``; ``moe_preprocess`` the dispatcher's preprocess with the router), ``overlap_moe_expert_parallel_comm`` with ``delay_wgrad_compute`` (``a2a-delay-wgrad``), the flex dispatcher's
backend, selective recompute modules, MXFP8 / FP8 blockwise (``FP8_RECIPES``; the tool gathers FP8 weights with the
distributed optimizer, which two Qwen3-30B GB200 MXFP8 recipes leave off). ``main_grads_dtype: fp32``: the tool's
default gradient dtype. Racks of 72 GPUs holding 128 of a job
are read as NVLink domains of 64, as bench/accuracy_nvidia_recipes.py reads 256.

The README states model TFLOP/s, counted by Megatron-LM's ``num_floating_point_operations``
(megatron/training/training.py at d98e8a64, ``transformer_flops``); :func:`megatron_flops_per_token` is that count
for a standard-attention model, so measured tokens/s = TFLOP/s / FLOPs per token. (Check: Megatron-Bridge PR #5722
reports 1,083.66 TFLOP/s with 7,320.27 tokens/s per GPU for Qwen3-235B on GB200, 1.4804e11 FLOPs a token, which the
function gives.)
"""

from __future__ import annotations

import csv
import shlex
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.cli import build_parser  # noqa: E402
from autotune.commands.estimate import estimate_from_flags  # noqa: E402
from autotune.errors import InputError  # noqa: E402
from autotune.specs.loading import load_model  # noqa: E402
from autotune.specs.model import ModelSpec  # noqa: E402

DATA = ROOT / "bench" / "data" / "megatron_moe_recipes.csv"
FP8_RECIPES = {"mxfp8": "te-mxfp8", "fp8-blockwise": "te-blockwise"}
"""The recipes' ``fp8_recipe`` (Megatron ``--fp8-recipe mxfp8 | blockwise``) as the tool's ``--fp8-recipe``."""


def megatron_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """FLOPs per token of Megatron-LM's throughput count (training.py ``transformer_flops``, standard attention,
    no MTP): 3 (forward + backward) x 2 (FMA) x (the linear layers' weights a token meets: attention projections,
    the dense layers' and the routed and shared experts' MLPs, the logits) + the causal attention core,
    3 x 2 x q width / 2 x 2 per token per key position."""
    moe = model.moe
    h, layers = model.hidden_size, model.num_layers
    glu = 3 if model.activation == "swiglu" else 2
    moe_layers = model.num_moe_layers if moe is not None else 0
    mlp = model.ffn_hidden_size * glu * (layers - moe_layers)
    if moe is not None:
        shared = moe.num_shared_experts * moe.shared_width
        mlp += (moe.expert_ffn_hidden_size * moe.top_k + shared) * glu * moe_layers
    attention = h * (model.q_width + 2 * model.kv_width) + model.q_width * h
    linear = h * mlp + attention * layers + h * model.vocab_size
    core = seq_len * model.q_width * layers
    return 6 * linear + 6 * core


@dataclass
class Row:
    recipe: str
    argv: list[str]
    measured: float  # tokens/s per GPU
    gpu: str
    graphs: str
    predicted: float | None = None
    fits: bool | None = None
    reason: str = ""
    without_overlap: float | None = None
    """The prediction with ``--ep-overlap none`` where the recipe overlaps its all-to-alls."""

    @property
    def error(self) -> float | None:
        return None if self.predicted is None else self.predicted / self.measured - 1


def read_row(raw: dict) -> Row:
    """The row's `autotune estimate` arguments and its measured tokens/s per GPU."""
    fp8 = FP8_RECIPES.get(raw["precision"])
    argv = ["estimate", "--model", raw["model"], "--gpu", raw["gpu"], "--num-gpus", raw["gpus"],
            "--gpus-per-node", raw["gpus_per_node"], "--engine", "megatron", "--zero", "1",
            "--seq-len", raw["seq"], "--global-batch", raw["gbs"], "--micro-batch", raw["mbs"],
            "--tp", raw["tp"], "--pp", raw["pp"], "--vpp", raw["vpp"], "--ep", raw["ep"], "--etp", "1",
            "--precision", "fp8" if fp8 else raw["precision"], "--moe-dispatcher", raw["dispatcher"],
            "--cuda-graph", raw["cuda_graph"], "--ep-overlap", raw["ep_overlap"], "--recompute", raw["recompute"],
            "--expandable-segments"]  # every recipe's PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    if fp8:
        argv += ["--fp8-recipe", fp8]
    if int(raw["tp"]) > 1:
        argv.append("--sequence-parallel")
    if raw["cuda_graph_scope"]:
        argv += ["--cuda-graph-scope", *raw["cuda_graph_scope"].split()]
    if raw["recompute_modules"]:
        argv += ["--recompute-modules", *raw["recompute_modules"].split()]
    per_token = megatron_flops_per_token(load_model(raw["model"]), int(raw["seq"]))
    graphs = "full CG" if raw["cuda_graph"] == "full-iteration" else (
        "partial CG" if raw["cuda_graph"] != "none" else "no CG")
    return Row(raw["recipe"], argv, float(raw["median_tflops"]) * 1e12 / per_token, raw["gpu"], graphs)


def estimate(row: Row) -> None:
    try:
        result = estimate_from_flags(build_parser().parse_args(row.argv))
    except InputError as err:
        row.reason = err.render().replace("\n  - ", " | ")
        return
    row.predicted = result.time.tokens_per_s / result.cluster.num_gpus
    row.fits = result.memory.fits
    at = row.argv.index("--ep-overlap") + 1
    if row.argv[at] != "none":
        plain = estimate_from_flags(build_parser().parse_args([*row.argv[:at], "none", *row.argv[at + 1:]]))
        row.without_overlap = plain.time.tokens_per_s / plain.cluster.num_gpus


def main() -> int:
    with DATA.open() as f:
        rows = [read_row(raw) for raw in csv.DictReader(f)]
    print(f"{'recipe':<74}{'measured':>9}{'predicted':>10}{'error':>8}  fits  (without the EP overlap it runs)")
    for row in rows:
        estimate(row)
        if row.predicted is None:
            print(f"{row.recipe:<74}{row.measured:>9.0f}  not estimated: {row.reason[:120]}")
            continue
        plain = "" if row.without_overlap is None else (
            f"  ({row.without_overlap:.0f}, {row.without_overlap / row.measured - 1:+.1%})")
        print(f"{row.recipe:<74}{row.measured:>9.0f}{row.predicted:>10.0f}{row.error:>+8.1%}  "
              f"{'yes' if row.fits else 'NO '}{plain}")
    done = [r for r in rows if r.error is not None]
    if done:
        print(f"\nmedian |error| {statistics.median(abs(r.error) for r in done):.1%} over {len(done)} rows; by CUDA "
              "graphs: " + ", ".join(f"{g} {statistics.median(r.error for r in done if r.graphs == g):+.1%}"
                                     for g in ("full CG", "partial CG", "no CG") if any(r.graphs == g for r in done)))
    for r in rows:  # the commands, to rerun one row
        print("  " + shlex.join(["autotune", *r.argv]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
