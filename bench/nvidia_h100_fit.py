"""NVIDIA's H100 recipes ran on 80 GB GPUs: does the memory ledger say they fit?

    python bench/nvidia_h100_fit.py                  # does each fit?
    python bench/nvidia_h100_fit.py --plan-quality   # and NVIDIA's plan's place in `autotune plan` (a minute or two)

Each Megatron-Bridge H100 performance recipe of bench/data/nvidia_h100_recipes.csv (written by
bench/nvidia_h100_recipes_build.py from NVIDIA-NeMo/Megatron-Bridge@067f987df03b, every setting with its file and
line) goes through `autotune estimate` (its argument parser and ``estimate_from_flags``) on ``h100-sxm-80gb`` with the
recipe's plan, batch, sequence and precision and the run settings the tool has flags for (bench/nvidia_recipe_settings.py
``flags_for``: recompute, CUDA graphs, TP / EP overlap, dispatcher), its gradient dtype and loss kernel
(``_benchmark_common``: 16-bit gradient reduction, Transformer Engine's cross entropy) and the allocator of its
launcher environment (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``). NVIDIA measured throughput with these
recipes, so each ran in 80 GB: the check is that the ledger says it fits, and by how much. The measured throughputs
are not in the repository (kept aside); only the configurations are.

``--plan-quality``: for each recipe that fits, its plan's place in `autotune plan --engine megatron` on the same
model, GPUs, batch, sequence, precision and run settings (bench/nvidia_plan_quality.py ``planner_rank``: the first
place of its tie group, the intervals without its own family's NVIDIA records), and the predicted gain of the
planner's first plan over it: measured figures are not needed for that, so the H100 recipes check the planner where
the Blackwell table cannot.

One recipe of the issue that named these checks is NeMo 2.0's, not Megatron-Bridge's: Nemotron-4 340B on 256 H100
(``NEMOTRON4_340B``), the plan of NVIDIA's DGX Cloud benchmarking recipe and the performance mode of NeMo's own recipe,
which reduces gradients in 16 bits.
"""

from __future__ import annotations

import csv
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from autotune.cli import build_parser  # noqa: E402
from autotune.commands.estimate import estimate_from_flags  # noqa: E402
from autotune.emit.megatron_layout import megatron_split, rank_loads_loss_slots  # noqa: E402
from autotune.errors import InputError  # noqa: E402
from autotune.specs.presets import load_model_preset  # noqa: E402
from nvidia_plan_quality import like_for_like_search, planner_rank, uncertainty_family  # noqa: E402
from nvidia_recipe_settings import RecipeSettings, flags_for  # noqa: E402
from nvidia_recipe_settings_build import MODEL_PREFIX  # noqa: E402

DATA = ROOT / "bench" / "data" / "nvidia_h100_recipes.csv"
GPU = "h100-sxm-80gb"
GIB = 2**30
MODELS = {"llama3_8b": "llama3-8b", "llama3_70b": "llama3-70b", "llama31_405b": "llama3-405b",
          "deepseek_v3": "deepseek-v3", "kimi_k2": "kimi-k2", "qwen3_30b_a3b": "qwen3-30b-a3b",
          "qwen3_235b_a22b": "qwen3-235b-a22b", "gpt_oss_120b": "gpt-oss-120b"}
"""Recipe name prefix -> model preset."""
PRECISION = {"bf16": ["--precision", "bf16"], "fp8_cs": ["--precision", "fp8", "--fp8-recipe", "te-current"],
             "fp8_ds": ["--precision", "fp8", "--fp8-recipe", "te-delayed"]}
"""``_perf_precision``'s argument (perf_recipes/_common.py) as estimate flags; an FP8 recipe given ``fp8_recipe =
"blockwise"`` runs ``--fp8-recipe te-blockwise`` (DeepSeek-V3's 1x128 / 128x128 scaling)."""
NAME = re.compile(r"^(?P<model>[a-z0-9_]+?)_pretrain_(?P<gpus>\d+)gpu_h100_")
NEMOTRON4_340B = ("nemotron4_340b_pretrain_256gpu_h100 (NeMo 2.0)", [
    # NVIDIA/dgxc-benchmarking nemotron4-340b/README.md (H100 table: 256 GPUs, seq 4096, 96 layers, TP 8, PP 8, CP 1,
    # DP 4, VP 12, MBS 1, GBS 64); NVIDIA/NeMo@01d03c17 nemo/collections/llm/recipes/nemotron4_340b.py
    # ``pretrain_performance_optimizations``: ``recipe.trainer.plugins.grad_reduce_in_fp32 = False``.
    "estimate", "--model", "nemotron-4-340b", "--gpu", GPU, "--num-gpus", "256", "--engine", "megatron",
    "--seq-len", "4096", "--global-batch", "64", "--micro-batch", "1", "--tp", "8", "--pp", "8", "--vpp", "12",
    "--precision", "bf16", "--grad-dtype", "bf16"])


@dataclass
class Recipe:
    name: str
    argv: list[str] = field(default_factory=list)
    unexpressed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    reason: str = ""
    total_gib: float | None = None
    capacity_gib: float | None = None
    fits: bool | None = None
    result: object = None
    rank: int | None = None
    gain: float | None = None
    first_plan: str = ""


def load_recipes(path: Path = DATA) -> dict[str, dict[str, str]]:
    """Recipe -> {setting (dotted): value}, in file order."""
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if not ln.startswith("#")]
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for r in csv.DictReader(lines):
        out[r["recipe"]][r["setting"]] = r["value"]
    return dict(out)


def _short(values: dict[str, str]) -> dict[str, str]:
    return {key.rsplit(".", 1)[-1]: value for key, value in values.items()}


def _int(values: dict[str, str], name: str) -> int:
    v = values.get(name, "None")
    return 1 if v in ("None", "") else int(v)


def express(name: str, values: dict[str, str]) -> Recipe:
    """The recipe as `autotune estimate` arguments, or the reason it cannot be."""
    recipe, short, m = Recipe(name), _short(values), NAME.match(name)
    model = MODELS.get(m["model"]) if m else None
    if model is None:
        recipe.reason = "no model preset for this recipe"
        return recipe
    if short.get("precision") not in PRECISION:
        recipe.reason = f"precision {short.get('precision')!r} not read"
        return recipe
    tp, pp, vp, ep = (_int(short, f"{k}_model_parallel_size") for k in ("tensor", "pipeline", "virtual_pipeline",
                                                                        "expert"))
    cp = _int(short, "context_parallel_size")
    mtp = _int(short, "mtp_num_layers") if short.get("mtp_num_layers") not in (None, "None", "0") else 0
    precision = list(PRECISION[short["precision"]])
    if short.get("fp8_recipe") == "blockwise":
        precision[-1] = "te-blockwise"
    recipe.argv = ["estimate", "--model", model, "--gpu", GPU, "--num-gpus", m["gpus"], "--engine", "megatron",
                   "--zero", "1", "--seq-len", short["seq_length"], "--global-batch", short["global_batch_size"],
                   "--micro-batch", short["micro_batch_size"], "--tp", str(tp), "--pp", str(pp), "--cp", str(cp),
                   "--vpp", str(vp), "--ep", str(ep), *precision]
    if values.get("ddp.grad_reduce_in_fp32") == "False":  # the DDP buffers' dtype; else the tool's default, fp32
        recipe.argv += ["--grad-dtype", "bf16"]
    if tp > 1 and short.get("sequence_parallel") in ("True", "False"):
        recipe.argv.append("--sequence-parallel" if short["sequence_parallel"] == "True" else "--no-sequence-parallel")
    if ep > 1:
        recipe.argv += ["--etp", "1"]  # NVIDIA's MoE recipes: expert_tensor_parallel_size 1
    if mtp:
        recipe.argv += ["--mtp-layers", str(mtp)]
    if short.get("cross_entropy_fusion_impl") == "te":
        recipe.argv += ["--cross-entropy", "te"]
    if "expandable_segments:True" in short.get("env_vars", ""):
        recipe.argv.append("--expandable-segments")
    layers = load_model_preset(model).num_layers
    split = megatron_split(layers, pp, vp, mtp or None) if pp > 1 else None
    flags = _flags(name, short, tp, ep, split)
    layout = short.get("pipeline_model_parallel_layout")
    slots = rank_loads_loss_slots(layout, layers, pp, vp, mtp or None) \
        if any(u.startswith("pipeline_model_parallel_layout") for u in flags.unexpressed) else None
    if slots is not None:  # the recipe's own layout, as the tool's lighter last stage with the same rank loads
        recipe.argv += ["--loss-slots", str(slots)]
        split = megatron_split(layers, pp, vp, mtp or None, slots)
        recipe.notes.append(f"its layout as --loss-slots {slots}: as many layers on each pipeline rank (the first and "
                            f"last exactly; which middle rank holds an extra layer may differ)")
        flags = _flags(name, {**short, "pipeline_model_parallel_layout": "None"}, tp, ep, split)
    recipe.argv += flags.argv
    recipe.unexpressed = flags.unexpressed
    return recipe


def _flags(name: str, short: dict[str, str], tp: int, ep: int, split):
    settings = RecipeSettings(recipe=name, read_at="067f987df03b", values={k: (v, "") for k, v in short.items()})
    return flags_for(settings, tp, ep, split_accounts=split is not None and split.kind == "account",
                     split_layout=split.layout if split is not None else None)


def estimate(recipe: Recipe) -> None:
    """Fill in the ledger's verdict (or the tool's own refusal as the reason)."""
    try:
        est = estimate_from_flags(build_parser().parse_args(recipe.argv))
    except InputError as err:  # the tool's own refusal, its problems on one line
        recipe.reason = " ".join(line.strip().removeprefix("- ") for line in str(err).splitlines())
        return
    mem = est.memory
    recipe.result = est
    recipe.total_gib, recipe.capacity_gib, recipe.fits = mem.total / GIB, mem.capacity / GIB, mem.fits


def all_recipes() -> list[Recipe]:
    out = [express(name, values) for name, values in load_recipes().items()]
    out.append(Recipe(NEMOTRON4_340B[0], argv=list(NEMOTRON4_340B[1])))
    for r in out:
        if not r.reason:
            estimate(r)
    return out


def family_of(name: str) -> str:
    """The Blackwell table's family name of a recipe (its NVIDIA records in the uncertainty intervals)."""
    m = NAME.match(name)
    return next((family for family, prefix in MODEL_PREFIX.items() if m and prefix == m["model"]), "")


def rank(recipe: Recipe, searches: dict) -> None:
    """NVIDIA's plan's place in `autotune plan` with its run settings, and the planner's first plan's gain."""
    from autotune.report import plan_summary

    est = recipe.result
    found = like_for_like_search(est, recipe.argv, searches)
    recipe.rank, _ = planner_rank(found, est, frozenset({uncertainty_family(family_of(recipe.name))}))
    if found.in_order:
        first = found.in_order[0]
        recipe.gain = first.time.tokens_per_s / est.time.tokens_per_s - 1
        recipe.first_plan = plan_summary(first.plan)


def main(argv: list[str] | None = None) -> int:
    quality = "--plan-quality" in (sys.argv[1:] if argv is None else argv)
    recipes = all_recipes()
    print(f"NVIDIA's H100 recipes on {GPU}: the ledger's per-GPU total against the GPU's memory")
    print(f"{'recipe':<66}{'GiB':>8}{'of':>8}  fits  settings the tool cannot express")
    for r in recipes:
        if r.reason:
            print(f"{r.name:<66}{'':>8}{'':>8}  --    not estimated: {r.reason}")
            continue
        print(f"{r.name:<66}{r.total_gib:>8.1f}{r.capacity_gib:>8.1f}  {'yes ' if r.fits else 'NO  '}  "
              f"{'; '.join(r.unexpressed + r.notes) or '-'}")
    done = [r for r in recipes if not r.reason]
    if quality:
        searches: dict = {}
        ranked = [r for r in done if r.fits]
        print(f"\nPLAN QUALITY: NVIDIA's plan's place in `autotune plan --engine megatron` (same model / GPUs / batch / "
              f"seq / precision / run settings)\n{'recipe':<66}{'rank':>6}{'gain':>8}  the planner's first plan")
        for r in ranked:
            rank(r, searches)
            gain = "" if r.gain is None else f"{r.gain:+.1%}"
            print(f"{r.name:<66}{r.rank:>6}{gain:>8}  {r.first_plan}")
        top10 = sum(r.rank <= 10 for r in ranked)
        gains = sorted(r.gain for r in ranked if r.gain is not None)
        print(f"NVIDIA's plan in the planner's top 10: {top10} of {len(ranked)}; median predicted gain of the first "
              f"plan over NVIDIA's {statistics.median(gains):+.1%}" if gains else "")
    print(f"{sum(bool(r.fits) for r in done)} of {len(done)} estimated recipes fit ({len(recipes) - len(done)} not "
          f"estimated); largest share of memory: "
          f"{max(r.total_gib / r.capacity_gib for r in done):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
