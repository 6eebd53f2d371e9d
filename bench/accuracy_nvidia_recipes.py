"""NVIDIA's own Blackwell recipes (bench/data/nvidia_recipes_blackwell.csv, Megatron-Bridge performance summary):
how far off the cost model is on them, and where NVIDIA's plan ranks in the planner's search.

    python bench/accuracy_nvidia_recipes.py              # both tables, every row
    python bench/accuracy_nvidia_recipes.py --limit 5    # the first 5 rows of the file only
    python bench/accuracy_nvidia_recipes.py --model LLAMA3 --rows   # Llama 3 rows only, each row of both tables

Accuracy: each row NVIDIA's plan (their tp/pp/cp/vp/ep/mbs/gbs/seq/precision, Megatron engine, distributed optimizer)
goes through `autotune estimate` itself (its argument parser and ``estimate_from_flags``, the command's own code;
nothing fitted here), with the run settings of NVIDIA's recipe for that row that the tool has flags for (recompute,
CUDA graphs, TP / EP overlap, FP8 attention, MXFP8 output layer: bench/nvidia_recipe_settings.py reads them, each with
its recipe file and line, from bench/data/nvidia_recipe_settings.csv); the settings it cannot express are counted in a
table. Where no recipe at the cited commit runs the row's plan (older containers), the tool's default settings are
taken and each recompute mode is estimated, the fastest that fits kept (as bench/accuracy_published.py takes the
fastest candidate where a source leaves a setting out: NVIDIA tuned theirs). Predicted vs measured tokens/s per GPU, the error, and
whether the ledger says the plan fits. FP8-CS rows run as ``--precision fp8 --fp8-recipe te-current`` (Transformer
Engine current scaling, Megatron ``--fp8-recipe tensorwise``); MXFP8 / FP8-MX rows as ``--fp8-recipe te-mxfp8``
(Transformer Engine MXFP8BlockScaling, Megatron ``--fp8-recipe mxfp8``: its casts, block scales and FP8 parameters);
FP8 rows, whose granularity the table leaves unsaid, with the engine's default recipe; NVFP4 rows as
``--precision fp4`` (Transformer Engine NVFP4BlockScaling, Megatron ``--fp4-format e2m1 --fp4-recipe nvfp4``); every
row with ``--grad-dtype bf16`` (GRAD_DTYPE); with ``--expandable-segments`` where NVIDIA's launcher set
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` for the row (bench/nvidia_allocator_env.py: each release's
launcher rules), and with ``--cross-entropy te`` where it made the loss Transformer Engine's cross entropy
(bench/nvidia_loss_kernel.py), for NVIDIA's plan and the planner's search alike. Rows the tool cannot express are listed with the
reason (the tool's own error message where it gives one) and counted.

Plan quality: for each estimated row, `autotune plan --engine megatron --precision P` on the same model, GPUs, global
batch and sequence length, with the run settings NVIDIA's plan was estimated with (``--cuda-graph``,
``--cuda-graph-scope``, ``--tp-overlap``, ``--ep-overlap``, ``--moe-dispatcher``: like for like, every searched plan
runs them where it can) (``search_plans``, the command's code path and default search space otherwise). NVIDIA's
plan's rank: the first place of its tie group in the planner's order (``planner_rank``: plans within each other's
interval are ties, autotune.search.ties; the intervals without the row's own family's records, which
bench/uncertainty_table.py ships from these rows); beside it, 1 + the feasible searched plans predicted faster. The
predicted gain of the planner's first plan (what `autotune plan` lists first) over NVIDIA's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from autotune.cli import build_parser
from autotune.commands.estimate import estimate_from_flags
from autotune.errors import InputError
from autotune.emit.megatron_layout import megatron_split
from autotune.specs.presets import load_model_preset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy_published import (  # median / p90 of |error|, the published-runs bench's columns
    _stats,
    p90_abs,
)
from nvidia_allocator_env import expandable_segments_source
from nvidia_ep_overlap import ep_overlap_table
from nvidia_loss_kernel import te_cross_entropy_source
from nvidia_gpu_pairs import gpu_pairs_table
from nvidia_plan_changes import plan_changes_table
from nvidia_plan_quality import plan_quality_table
from nvidia_table_footnotes import FOOTNOTES, TABLE_FOOTNOTES, footnoted_summary
from nvidia_lora_recipes import lora_flags
from nvidia_recipe_settings import Flags, flags_for, load_settings, settings_table, without_graphs
from nvidia_variants import VARIANT_FLAGS, VARIANT_NOTES, mtp_layers
from nvidia_rows import (  # the table's rows and columns, re-exported (other benches and the tests read them here)
    DATA,
    MODEL_PRESETS,
    NOT_MODELLED,
    SYSTEM_PRESETS,
    count,
    family_of,
    load_rows,
    model_preset,
    precision_of,
    precision_tag,
)

__all__ = ["DATA", "MODEL_PRESETS", "NOT_MODELLED", "SYSTEM_PRESETS", "Case", "count", "estimate_case", "express",
           "family_of", "label", "load_rows", "model_preset", "precision_of", "precision_tag", "main"]

GRAD_DTYPE = "bf16"
"""The recipes reduce gradients in bf16: Megatron-Bridge perf_recipes/_common.py ``_benchmark_common`` sets
``ddp.grad_reduce_in_fp32 = False`` (and ``_perf_precision`` the precision config's), as
scripts/performance/utils/precision.py ``get_precision_config`` did for the earlier containers."""

RECOMPUTE = ("none", "selective", "full")
"""Activation recompute modes tried for NVIDIA's plan where its recipe is not matched (the table does not say)."""

SETTINGS = load_settings()
"""Per row source, its Megatron-Bridge recipe's run settings (bench/nvidia_recipe_settings.py)."""

@dataclass
class Case:
    row: dict
    family: str
    gpu: str
    argv: list[str] = field(default_factory=list)
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    measured: float = 0.0
    predicted: float | None = None
    fits: bool | None = None
    result: object = None
    flags: Flags = field(default_factory=Flags)

    @property
    def error(self) -> float | None:
        return None if self.predicted is None else self.predicted / self.measured - 1


def estimate_argv(row: dict, preset: str, gpu: str, precision: str, zero: int = 1) -> tuple[list[str], list[str]]:
    """`autotune estimate` arguments of NVIDIA's plan, and notes on how the row was read."""
    gpus, notes = count(row["gpus"]), []
    argv = ["estimate", "--model", preset, "--gpu", gpu, "--num-gpus", str(gpus), "--engine", "megatron",
            "--zero", str(zero), "--seq-len", row["seq"], "--global-batch", row["gbs"], "--micro-batch", row["mbs"],
            "--tp", str(count(row["tp"])), "--pp", str(count(row["pp"])), "--cp", str(count(row["cp"])),
            "--vpp", str(count(row["vp"])), "--ep", str(count(row["ep"])), "--precision", precision,
            "--grad-dtype", GRAD_DTYPE]
    if count(row["ep"]) > 1:
        # NVIDIA's MoE performance configs set expert_tensor_parallel_size=1 (Megatron's default would be tp):
        # Megatron-Bridge v0.2.0 scripts/performance/configs/qwen3/workload_base_configs.py:23,29,
        # .../deepseek/workload_base_configs.py:23, .../gpt_oss/workload_base_configs.py:25
        argv += ["--etp", "1"]
    # The recipe functions the precision column names (the settings build's reading): FP8 current scaling for
    # "FP8-CS" and the 26.x tables' plain "FP8" (e.g. the settings file matches LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V2,
    # whose precision is Bridge's bf16_with_fp8_current_scaling_mixed); MX block scaling for MXFP8 / FP8-MX.
    recipe = precision_tag(row["precision"]) if precision == "fp8" else ()
    if recipe == ("fp8cs",):
        argv += ["--fp8-recipe", "te-current"]
        notes.append("FP8 current scaling")
    elif recipe == ("fp8mx",):  # MX block scaling (Blackwell)
        argv += ["--fp8-recipe", "te-mxfp8"]
        notes.append("MXFP8")
    if gpu in ("gb200", "gb300") and gpus > 72 and gpus % 72:
        # NVL72 racks: a job of 128 / 256 GPUs is read as NVLink domains of 64 GPUs (of each rack's 72).
        argv += ["--gpus-per-node", "64"]
        notes.append("NVLink domains of 64")
    return argv, notes


def run_estimate(argv: list[str]):
    """The command's own parsing and estimate; InputError as the tool reports it."""
    args = build_parser().parse_args(argv)
    return estimate_from_flags(args)


def express(row: dict) -> Case:
    """The row as a Case: its estimate arguments, or the reason it cannot be expressed."""
    family, variant = family_of(row["model"])
    case = Case(row=row, family=family, gpu=SYSTEM_PRESETS.get(row["system"], ""),
                measured=float(row["tokens_per_s_per_gpu"]))
    if variant in VARIANT_NOTES:
        case.notes.append(VARIANT_NOTES[variant])
    if row["source"] in TABLE_FOOTNOTES:
        case.notes.append(FOOTNOTES[TABLE_FOOTNOTES[row["source"]]])
    if not case.gpu:
        case.reason = f"system {row['system']!r} has no GPU preset"
        return case
    lora = lora_flags(family) if row["task"].startswith("LoRA") else None
    if row["task"].startswith("LoRA") and lora is None:
        case.reason = f"LoRA fine-tuning of {family}: its recipe's LoRA settings are not read (bench/nvidia_lora_recipes.py)"
        return case
    preset, why = model_preset(family)
    precision, why_p = precision_of(row["precision"])
    if preset is None or precision is None:
        case.reason = why or why_p
        return case
    # Megatron-FSDP (fsdp > 0): NVIDIA's recipes set data_parallel_sharding_strategy optim_grads_params
    # (Megatron-Bridge perf_recipes/llama/gb300/llama3.py:218-219): the Megatron engine's --zero 3.
    fsdp = count(row["fsdp"], 0) > 0
    case.argv, notes = estimate_argv(row, preset, case.gpu, precision, zero=3 if fsdp else 1)
    case.argv += VARIANT_FLAGS.get(variant, [])
    mtp = mtp_layers(family, variant)
    if mtp:  # the recipe's MTP module (nvidia_variants.MTP_LAYERS)
        case.argv += ["--mtp-layers", str(mtp)]
        case.notes.append(f"MTP {mtp}")
    case.notes += notes + ([f"Megatron-FSDP optim_grads_params (fsdp={row['fsdp']})"] if fsdp else [])
    layers = load_model_preset(preset).num_layers
    split = megatron_split(layers, count(row["pp"]), count(row["vp"]), mtp) if count(row["pp"]) > 1 else None
    case.flags = flags_for(SETTINGS.get(row["source"]), count(row["tp"]), count(row["ep"]),
                           split_accounts=split is not None and split.kind == "account",
                           split_layout=split.layout if split is not None else None)
    read = SETTINGS.get(row["source"])
    if expandable_segments_source(family, row["system"], row["precision"], read.read_at if read else "",
                                  read.recipe if read else ""):
        case.argv.append("--expandable-segments")  # the launcher's PYTORCH_CUDA_ALLOC_CONF (nvidia_allocator_env.py)
        case.notes.append("expandable segments")
    impl, impl_at = read.values.get("cross_entropy_fusion_impl", (None, "")) if read else (None, "")
    if te_cross_entropy_source(row["task"], read.read_at if read else "", impl, impl_at):
        # the launcher's or the recipe's cross_entropy_fusion_impl (nvidia_loss_kernel.py)
        case.argv += ["--cross-entropy", "te"]
        case.notes.append("TE cross entropy")
    if lora is not None:  # the fine-tuning recipe's own settings (the settings table matched pre-training ones)
        case.argv += lora[0]
        case.flags = lora[1]
    return case


def one_line(err: InputError) -> str:
    return err.render().replace("\n  - ", " | ")


def estimate_case(case: Case) -> None:
    """NVIDIA's plan with its recipe's run settings (bench/data/nvidia_recipe_settings.csv). Where the recompute is
    not read (no recipe matched, or a release whose base recipe is not read), each mode is estimated and the fastest
    that fits is taken, as the published-runs bench takes the fastest candidate where a source leaves a setting out
    (NVIDIA tuned theirs)."""
    found, refused = [], ""
    modes = [[]] if case.flags.recompute_set else [["--recompute", mode] for mode in RECOMPUTE]
    for flags in (case.flags, without_graphs(case.flags)) if case.flags.argv else ():
        try:  # the recipe's settings; where the tool refuses its CUDA graphs with the rest, without them
            found = [run_estimate([*case.argv, *flags.argv, *mode]) for mode in modes]
            case.flags = flags
            case.notes.append("recipe settings: " + ", ".join(flags.applied))
            break
        except InputError as err:  # the tool refuses a setting: the row falls back to the default settings
            refused = one_line(err)
    if case.flags.argv and not found:
        case.notes.append(f"recipe settings refused ({refused[:80]})")
        case.flags = Flags(unexpressed=case.flags.unexpressed)
    for mode in () if found else RECOMPUTE:
        try:
            found.append(run_estimate([*case.argv, "--recompute", mode]))
        except InputError as err:
            case.reason = case.reason or f"autotune estimate: {one_line(err)}"
    if not found:
        return
    case.reason = ""
    case.result = max(found, key=lambda r: (r.memory.fits, r.time.tokens_per_s))
    case.predicted = case.result.time.tokens_per_s / case.result.cluster.num_gpus
    case.fits = case.result.memory.fits
    case.notes.insert(0, f"rc-{case.result.plan.recompute}")


def _fit_word(c: Case) -> str:
    """The rows table's fit column: yes, NO, or cache (over only by the allocator's reserve:
    ``MemoryEstimate.cache_bound``)."""
    return "yes" if c.fits else "cache" if c.result.memory.cache_bound else "NO"


def label(row: dict) -> str:
    lay = "".join(f"{k}{row[k]}" for k in ("tp", "pp", "cp", "vp", "ep") if count(row[k]) > 1)
    return (f"{row['container']:<9}{row['model'][:26]:<27}{row['system'][4:]:<6}{row['gpus']:>4} "
            f"{row['precision'][:10]:<11}gbs{row['gbs']:<6}mb{row['mbs']:<2}s{row['seq']:<5} {lay or 'dp'}")


def _container(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def newest_container_rows(cases: list[Case]) -> list[Case]:
    """Of the rows that ran one configuration (model with its variant, system, GPUs, precision, batch, sequence and
    plan) in several containers, the newest container's: the software closest to the releases autotune models."""
    newest: dict[tuple, Case] = {}
    for c in cases:
        r = c.row
        key = tuple(r[k] for k in ("model", "system", "gpus", "precision", "gbs", "mbs", "seq", "fsdp", "tp", "pp",
                                   "cp", "vp", "ep"))
        if key not in newest or _container(r["container"]) > _container(newest[key].row["container"]):
            newest[key] = c
    return list(newest.values())


def _group_keys(c: Case) -> tuple[str, ...]:
    """The accuracy table's groups a row belongs to; the last one is its class, MoE or dense (the issue's targets:
    MoE median <= 12%, dense median <= 8%)."""
    kind = "MoE" if c.result.model.is_moe else "dense"
    return (f"family {c.family}", f"gpu {c.gpu}", f"family {c.family} on {c.gpu}", f"class {kind}")


def accuracy_table(cases: list[Case], show_rows: bool) -> dict:
    done = [c for c in cases if c.predicted is not None]
    print(f"ACCURACY: predicted vs measured tokens/s per GPU ({len(done)} estimated, "
          f"{len(cases) - len(done)} not expressible, of {len(cases)} rows)")
    if show_rows:
        print(f"\n{'row':<84}{'measured':>9}{'pred':>9}{'error':>8}  fits")
        for c in done:
            print(f"{label(c.row):<84}{c.measured:>9.0f}{c.predicted:>9.0f}{c.error:>+8.1%}  "
                  f"{_fit_word(c)}{'  (' + '; '.join(c.notes) + ')' if c.notes else ''}")
    groups: dict[str, list[float]] = defaultdict(list)
    for c in done:
        for key in _group_keys(c):
            groups[key].append(c.error)
    print(f"\n{'group':<44}{'rows':>5}{'med':>7}{'p90':>7}  |error|{'':>4}{'bias':>7}{'fit':>6}")
    for key in sorted(groups, key=lambda k: (k.startswith("gpu"), k.startswith("class"), k)):
        errs = groups[key]
        fits = sum(c.fits for c in done if key in _group_keys(c))
        print(f"{key:<44}{len(errs):>5}{_stats(errs)}{'':>11}{statistics.median(errs):>+7.1%}{fits:>4}/{len(errs)}")
    errs = [c.error for c in done]
    print(f"{'all estimated rows':<44}{len(errs):>5}{_stats(errs)}{'':>11}"
          f"{statistics.median(errs) if errs else 0:>+7.1%}{sum(c.fits for c in done):>4}/{len(errs)}")
    cache = [c for c in done if c.result.memory.cache_bound]
    print(f"rows the ledger puts over the GPU only by the caching allocator's reserve ('cache' above: they fit with "
          f"expandable segments; NVIDIA's launcher did not set them): {len(cache)} of {len(errs) - sum(c.fits for c in done)}"
          " not fitting")
    lofo_summary(groups)
    footnoted_summary(done)
    ep_overlap_table(done)
    newest = newest_container_rows(done)
    print(f"\nthe newest container of each configuration (same model / system / GPUs / precision / batch / plan: "
          f"{len(newest)} rows; older containers ran the same plan on older software)")
    by_family: dict[str, list[float]] = defaultdict(list)
    for c in newest:
        by_family[f"family {c.family}"].append(c.error)
    for c in newest:
        by_family[_group_keys(c)[-1]].append(c.error)
    by_family["all newest rows"] = [c.error for c in newest]
    for key, errs_new in by_family.items():
        print(f"{key:<44}{len(errs_new):>5}{_stats(errs_new)}{'':>11}{statistics.median(errs_new):>+7.1%}")
    reasons: dict[str, list[Case]] = defaultdict(list)
    for c in cases:
        if c.predicted is None:
            reasons[c.reason].append(c)
    print(f"\nnot expressible: {sum(map(len, reasons.values()))} rows")
    for why, members in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
        names = sorted({m.row["model"] for m in members})
        print(f"  {len(members):>3}  {', '.join(names)}: {why}")
    return {"estimated": len(done), "unsupported": len(cases) - len(done), "errors": errs}


LOFO_P90_TARGET = 0.25
"""Issue 17's target: each family's p90 |error| with that family left out of every fit."""


def lofo_summary(groups: dict[str, list[float]]) -> None:
    """Each family's p90 against the leave-one-family-out target. No NVIDIA row is in any fit: the shared
    parameters (autotune.cost.efficiency) are fitted on the published runs only, so a family's figures above are
    already what it gets with itself left out."""
    families = {k.removeprefix("family "): v for k, v in groups.items() if k.startswith("family ") and " on " not in k}
    if not families:
        return
    p90 = {name: p90_abs(errs) for name, errs in families.items()}
    over = sorted((name for name, v in p90.items() if v > LOFO_P90_TARGET), key=lambda n: -p90[n])
    worst = max(p90, key=p90.get)
    print(f"leave-one-family-out: no NVIDIA row is in the fit (the shared parameters are fitted on the published "
          f"runs only), so each family's p90 above is its out-of-family figure; worst {worst} {p90[worst]:.1%}; "
          f"{len(over)} of {len(p90)} families over {LOFO_P90_TARGET:.0%}"
          + (f" ({', '.join(f'{n} {p90[n]:.1%}' for n in over)})" if over else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, help="only the first N rows of the file")
    parser.add_argument("--model", help="only rows whose model name contains this text, any case (e.g. LLAMA3, 'GPT OSS')")
    parser.add_argument("--rows", action="store_true", help="print every row of both tables, not only the summaries")
    args = parser.parse_args(argv)
    rows = [r for r in load_rows() if args.model is None or args.model.lower() in r["model"].lower()][: args.limit]
    if not rows:
        names = sorted({r["model"] for r in load_rows()})
        print(f"no row's model name contains {args.model!r}; the models in the file: {', '.join(names)}",
              file=sys.stderr)
        return 2
    cases = [express(r) for r in rows]
    for c in cases:
        if not c.reason:
            estimate_case(c)
    accuracy_table(cases, args.rows)
    gpu_pairs_table(cases, args.rows)
    plan_changes_table(cases, args.rows)
    settings_table([c for c in cases if c.predicted is not None])
    plan_quality_table(cases, args.rows, label, last_stage=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
