"""`autotune emit`: the files a job runs with; its checks of the plan JSON, the recipe's emit block,
the job strings and --out.

Nothing here writes: :func:`autotune.bundle.writer.write_bundle` does, atomically. What is checked
before it runs: every value of a recipe's ``emit:`` block has its field's type (no silent
coercion: ``hosts: "ab"`` is not hosts ``a`` and ``b``), strings that reach a command line do not
start with ``-`` (``--script=--help`` would launch ``torchrun ... --help``), and ``--out`` is a
folder we may replace (not ``.``, not a folder above the current one, not a dangling link).
"""

from __future__ import annotations

import argparse
import os
import sys
import typing
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from autotune.commands import (
    EXIT_OK,
    add_common,
    add_plan_flags,
    add_reliability_flags,
    flag_problems,
    json_text,
    preset_epilog,
    reliability_flags,
    run_code_problems,
    time_settings,
)
from autotune.commands.emit_out import clean_leftovers, out_problems, report_leftovers
from autotune.commands.engine_version import add_engine_version
from autotune.errors import InputError

__all__ = ["register", "run", "emit_options", "read_plan_json", "out_problems", "clean_leftovers",
           "unfit_problems"]

# Strings that end up as a command-line word or a host name.
_COMMAND_LINE_STRINGS = ("hosts", "master_addr", "script", "slurm_partition", "slurm_account", "job_name",
                         "save_dir", "nvme_path", "pretrained_dir")
# The flag that sets a field, where its name is not the field's with dashes.
_FLAG_OF_FIELD = {"pretrained_dir": "pretrained-checkpoint", "interval_steps": "save-interval"}


def _type_problem(where: str, value: Any, hint: Any) -> str | None:
    """Whether ``value`` (from YAML) has the dataclass field type ``hint``; no coercion."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else f"{where}: expected a number, got {value!r}"
    if hint is int or hint is bool or hint is str:
        ok = isinstance(value, hint) and (hint is bool or not isinstance(value, bool))
        name = {int: "an integer", bool: "true or false", str: "a string"}[hint]
        return None if ok else f"{where}: expected {name}, got {value!r}"
    if origin is tuple:
        if not isinstance(value, list):
            return f"{where}: expected a list, got {value!r}"
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        if len(items) != len(value):
            return f"{where}: expected a list of {len(items)}, got {len(value)} items"
        for i, (item, item_hint) in enumerate(zip(value, items, strict=True)):
            problem = _type_problem(f"{where}[{i}]", item, item_hint)
            if problem:
                return problem
        return None
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            return f"{where}: expected a mapping of names to strings, got {value!r}"
        return None
    return None


def _typed_block(cls: type, block: Any, where: str, problems: list[str]) -> dict:
    """The keyword arguments of ``cls`` from a recipe block, lists as tuples; problems appended."""
    if not isinstance(block, dict):
        problems.append(f"{where}: expected a mapping, got {block!r}")
        return {}
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    out = {}
    for key, value in block.items():
        if key not in known:
            problems.append(f"{where}.{key}: unknown key (known: {', '.join(sorted(known))})")
            continue
        problem = _type_problem(f"{where}.{key}", value, hints[key])
        if problem:
            problems.append(problem)
        else:
            out[key] = tuple(value) if isinstance(value, list) else value
    return out


def _dash_problems(where: str, values: dict) -> list[str]:
    """Strings that would be read as an option; ``values`` keyed by field name, ``where`` "--" names the flags."""
    problems = []
    for key in _COMMAND_LINE_STRINGS:
        value = values.get(key)
        name = _FLAG_OF_FIELD.get(key, key).replace("_", "-") if where == "--" else key
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, str) and (item.startswith("-") or not item.strip()):
                problems.append(f"{where}{name} {item!r}: must not be empty or start with '-' (it would be read as "
                                "an option); for a file, write ./" + item.lstrip())
    return problems


def emit_options(args: argparse.Namespace, base: Any = None):
    """EmitOptions from a recipe's emit block, overridden by flags; every problem at once."""
    from autotune.emit.options import (
        CheckpointOptions,
        EmitOptions,
        LaunchOptions,
        OptimizerOptions,
    )

    base = {} if base is None else base
    problems: list[str] = []
    if not isinstance(base, dict):
        raise InputError([f"emit: expected a mapping, got {base!r}"], subject="recipe emit block")
    unknown = sorted(set(base) - {"optimizer", "checkpoint", "launch", "steps_per_print"})
    problems += [f"emit.{k}: unknown key" for k in unknown]
    opt = _typed_block(OptimizerOptions, base.get("optimizer", {}), "emit.optimizer", problems)
    ckpt = _typed_block(CheckpointOptions, base.get("checkpoint", {}), "emit.checkpoint", problems)
    launch = _typed_block(LaunchOptions, base.get("launch", {}), "emit.launch", problems)
    steps_per_print = base.get("steps_per_print", 10)
    if isinstance(steps_per_print, bool) or not isinstance(steps_per_print, int):
        problems.append(f"emit.steps_per_print: expected an integer, got {steps_per_print!r}")
        steps_per_print = 10
    problems += _dash_problems("emit.launch.", launch) + _dash_problems("emit.checkpoint.", ckpt)
    flags = {k: v for k, v in (("lr", args.lr), ("train_steps", args.train_steps),
                               ("warmup_steps", args.warmup_steps)) if v is not None}
    opt = replace(OptimizerOptions(**opt), **flags) if not problems else OptimizerOptions()
    if "lr" in flags and opt.min_lr > opt.lr:
        opt = replace(opt, min_lr=opt.lr / 10)
    flags = {k: v for k, v in (("save_dir", args.save_dir), ("keep_last", args.keep_last),
                               ("interval_steps", args.save_interval),
                               ("pretrained_dir", getattr(args, "pretrained_checkpoint", None))) if v is not None
             } | reliability_flags(args)
    if args.no_async_save:
        flags["async_save"] = False
    problems += _dash_problems("--", flags)
    ckpt = replace(CheckpointOptions(**ckpt), **flags) if not problems else CheckpointOptions()
    nccl = dict(launch.get("nccl_env", {}))
    for item in args.nccl_env:
        key, sep, value = item.partition("=")
        if not sep or not key or not key.replace("_", "").isalnum():
            problems.append(f"--nccl-env {item!r}: expected KEY=VALUE with KEY a variable name (NCCL_IB_HCA=mlx5)")
        else:
            nccl[key] = value
    flags = {k: v for k, v in (("master_addr", args.master_addr), ("master_port", args.master_port),
                               ("script", args.script), ("slurm_partition", args.slurm_partition),
                               ("slurm_account", args.slurm_account)) if v is not None}
    if args.hosts is not None:
        flags["hosts"] = tuple(h.strip() for h in args.hosts.split(","))
    problems += _dash_problems("--", flags)
    if problems:
        raise InputError(problems, subject="emit options")
    if "script" in flags:
        # The launch scripts run from any folder: a script named relative to this one must not depend on where.
        flags["script"] = os.path.abspath(os.path.expanduser(flags["script"]))
    if getattr(args, "wrap_class", None) is not None:
        flags["wrap_class"] = args.wrap_class
    launch = replace(LaunchOptions(**launch), **{**flags, "nccl_env": nccl})
    return EmitOptions(optimizer=opt, checkpoint=ckpt, launch=launch, steps_per_print=steps_per_print)


def hf_wrap_class(model_ref: str | None) -> str | None:
    """The decoder layer class transformers builds for ``--model`` when it is a Hugging Face config.json (or its
    folder), for accelerate's FSDP2 wrap; None for presets, model YAMLs and architectures not known here."""
    from autotune.emit.accelerate import hf_decoder_layer
    from autotune.specs.hf_config import read_hf_config
    from autotune.specs.presets import model_preset_names

    if not model_ref or model_ref in model_preset_names():
        return None
    try:
        path = Path(model_ref).expanduser()  # RuntimeError: "~name" of a user with no home here
        if path.is_dir():
            path = path / "config.json"
        if path.suffix != ".json" or not path.is_file():
            return None
        data = read_hf_config(path)
    except (OSError, ValueError, RuntimeError, InputError):
        return None
    return hf_decoder_layer(data) if "model_type" in data else None


def read_plan_json(path: str, candidate: int) -> dict:
    """One estimate document from ``estimate --json`` or candidate ``candidate`` of ``plan --json``."""
    from autotune.inputs import read_json

    subject = f"plan JSON {path!r}"
    doc = read_json(path, subject="plan JSON")
    if isinstance(doc, dict) and "candidates" in doc:
        candidates = doc["candidates"]
        if not isinstance(candidates, list) or not candidates:
            raise InputError(["'candidates' must be a non-empty list (the output of `autotune plan --json`)"],
                             subject=subject)
        if not 1 <= candidate <= len(candidates):
            raise InputError([f"--candidate {candidate}: the file has {len(candidates)} candidates"], subject=subject)
        versions = doc.get("engine_versions")  # the releases the search modelled: written for them
        doc, where = candidates[candidate - 1], f"candidates[{candidate - 1}]"
        if isinstance(doc, dict) and isinstance(versions, dict):
            doc = {**doc, "engine_versions": versions}
    else:
        where = "$"
    if not isinstance(doc, dict):
        raise InputError([f"{where}: expected an object (the output of `autotune estimate --json` or "
                          f"`autotune plan --json`), got {type(doc).__name__}"], subject=subject)
    problems = []
    for block in ("model", "cluster", "plan"):
        if not isinstance(doc.get(block), dict):
            problems.append(f"{where}.{block}: expected an object, got {doc.get(block)!r}"[:200])
    if not problems:
        for block in ("model", "cluster"):
            if not isinstance(doc[block].get("spec"), dict):
                problems.append(f"{where}.{block}.spec: expected an object (written by autotune 0.1+)")
    if not problems:
        spec = doc["cluster"]["spec"]
        if not isinstance(spec.get("gpu"), str | dict):
            problems.append(f"{where}.cluster.spec.gpu: expected a GPU preset name or an inline GPU")
        for key in ("num_nodes", "gpus_per_node"):
            value = spec.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**20:
                problems.append(f"{where}.cluster.spec.{key}: expected an integer in 1..1,048,576, got {value!r}")
    if problems:
        raise InputError(problems, subject=subject)
    return doc


def unfit_problems(est) -> list[str]:
    """Why the plan does not fit (the ledger's total against the capacity) and the way out."""
    from autotune.report import gib

    mem, plan = est.memory, est.plan
    why = []
    if not mem.fits_gpu:
        why.append(f"the memory ledger needs {gib(mem.total)} GiB per GPU (pipeline stage {mem.stage}) but "
                   f"{est.cluster.gpu.name} has {gib(mem.capacity)} GiB")
    if not mem.fits_host:
        why.append(f"the offloaded states need {gib(mem.host_per_node)} GiB host memory per node but a node has "
                   f"{gib(mem.host_capacity_per_node)} GiB")
    cache = (["only the caching allocator's reserve does not fit: --expandable-segments makes it fit (the launch "
              "scripts then export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)"] if mem.cache_bound else [])
    return ["the plan does not fit: " + "; ".join(why), *cache,
            f"`autotune plan` with the same model and cluster lists plans that fit; or raise --zero (now "
            f"{plan.zero_stage}), offload (--offload-optimizer cpu), recompute (--recompute full) or lower "
            f"--micro-batch (now {plan.micro_batch_size}) (a recipe or plan JSON: those fields of its plan); "
            f"--allow-unfit writes the files anyway"]


def register(sub) -> None:
    emit = sub.add_parser("emit", help="write ds_config.json, Megatron args, launch scripts, plan.md for a plan",
                          epilog=preset_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    src = emit.add_argument_group("the plan (one of)")
    src.add_argument("--recipe", help="a recipe name (`autotune recipes list`) or recipe YAML")
    src.add_argument("--plan-json", help="output of `autotune estimate --json` or `autotune plan --json`")
    src.add_argument("--candidate", type=int, default=1, help="with a plan --json file: which candidate (default 1)")
    add_common(emit)
    add_plan_flags(emit)
    out = emit.add_argument_group("output and job settings")
    out.add_argument("--out", required=True, help="folder to create")
    out.add_argument("--force", action="store_true", help="replace an existing folder")
    out.add_argument("--lr", type=float, help="peak learning rate (default 3e-4)")
    out.add_argument("--train-steps", type=int, help="optimizer steps (default 100000)")
    out.add_argument("--warmup-steps", type=int, help="warm-up steps (default 2000)")
    out.add_argument("--save-dir", help="checkpoint folder (default checkpoints)")
    add_reliability_flags(out)
    out.add_argument("--pretrained-checkpoint", help="with --peft lora: the base model's Megatron checkpoint the "
                     "fine-tuning starts from (Megatron-Bridge checkpoint.pretrained_checkpoint)")
    out.add_argument("--keep-last", type=int, help="checkpoints to keep (default 3)")
    out.add_argument("--save-interval", type=int, help="override the availability-optimal checkpoint interval (steps)")
    out.add_argument("--no-async-save", action="store_true", help="blocking checkpoint writes")
    out.add_argument("--hosts", help="comma-separated host names, one per node")
    out.add_argument("--master-addr", help="rendezvous host (default: the first host)")
    out.add_argument("--master-port", type=int, help="rendezvous port (default 29500)")
    out.add_argument("--script", help="your training script, stored as an absolute path (default: the built-in "
                                      "`python -m autotune.train` for deepspeed/fsdp/hf plans, pretrain_gpt.py "
                                      "for Megatron-LM: emit with --script /path/to/Megatron-LM/pretrain_gpt.py)")
    out.add_argument("--wrap-class", help="your model's transformer block class for accelerate's FSDP2 wrap "
                                          "(accelerate_fsdp.yaml; default: the decoder layer of a Hugging Face "
                                          "config.json's architecture, else the built-in model's Block)")
    out.add_argument("--torchtitan-version", choices=("0.2", "0.3"),
                     help="= --engine-version fsdp=V: torchtitan release of an fsdp plan's torchtitan file (0.3: "
                          "torchtitan_plan.py, a config module for --module/--config; 0.2: torchtitan_job.toml)")
    add_engine_version(out)
    out.add_argument("--slurm-partition", help="SLURM partition for the sbatch script")
    out.add_argument("--slurm-account", help="SLURM account for the sbatch script")
    out.add_argument("--nccl-env", action="append", default=[], metavar="KEY=VALUE",
                     help="extra NCCL_* setting for every rank (repeatable)")
    out.add_argument("--lost-gpus", type=int, help="GPUs lost for the fallback plan written under fallback/ "
                     "(default: one node; 0: no fallback plan)")
    out.add_argument("--allow-unfit", action="store_true",
                     help="write the files even when the memory ledger says the plan does not fit (plan.md says so)")
    from autotune.commands.from_job import add_from

    add_from(emit, "write the files of")
    emit.add_argument("--best", action="store_true",
                      help="with --from: write the planner's first alternative to that job (as `plan --from` ranks "
                           "them: same engine, model, batch, sequence, precision and run settings), not the job itself")
    emit.set_defaults(handler=run, recompute=None, zero=None)


def run(args: argparse.Namespace) -> int:
    from autotune.api import estimate_from_dict
    from autotune.bundle.writer import write_bundle
    from autotune.commands.engine_version import (engine_releases, options_for_versions, print_versions,
                                                  recorded_releases)
    from autotune.commands.estimate import estimate_from_flags

    sources = [s for s in ("recipe", "plan_json", "from_files" if args.from_files else "model") if getattr(args, s)]
    problems = flag_problems(args) + out_problems(args.out) + run_code_problems(args)
    if len(sources) != 1:
        problems.append("give exactly one of --recipe NAME, --plan-json FILE, --from FILE..., or --model with the plan "
                        "flags")
    if args.best and not args.from_files:
        problems.append("--best writes the best alternative to a job: give the job's files with --from")
    if problems:
        raise InputError(problems, subject="emit request")
    report_leftovers(args.out)
    emit_block: dict = {}
    recorded: dict[str, str] = {}  # the releases a --plan-json was made for
    if args.recipe:
        from autotune.recipebook import load_recipe, recipe_estimate

        recipe = load_recipe(args.recipe)
        est = recipe_estimate(recipe)
        emit_block = recipe.emit
    elif args.plan_json:
        doc = read_plan_json(args.plan_json, args.candidate)
        est, recorded = estimate_from_dict(doc), recorded_releases(doc)
    elif args.from_files and args.best:
        from autotune.commands.from_job import best_alternative

        est = best_alternative(args)
    elif args.from_files:
        from autotune.commands.from_job import estimate_from_job

        est = estimate_from_job(args)
    else:
        args.recompute = args.recompute or "selective"
        est = estimate_from_flags(args)
    releases = engine_releases(args, [est.plan.engine], recorded=recorded)
    print_versions(releases, command="emit")
    options = options_for_versions(emit_options(args, emit_block), releases)
    if options.launch.wrap_class is None and args.model:
        wrap = hf_wrap_class(args.model)
        if wrap:
            options = replace(options, launch=replace(options.launch, wrap_class=wrap))
    from autotune.cost.checkpoint import options_for_cluster

    explicit = set(emit_block.get("checkpoint") or {}) | set(reliability_flags(args))
    options = replace(options, checkpoint=options_for_cluster(options.checkpoint, est.cluster, explicit=explicit))
    if not est.memory.fits and not args.allow_unfit:
        raise InputError(unfit_problems(est), subject="plan")
    notes: list[str] = []
    fallback = None
    if args.lost_gpus != 0:
        from autotune.search.fallback import fallback_plan

        fallback = fallback_plan(est, lost_gpus=args.lost_gpus, time_settings=time_settings(args),
                                 storage_bandwidth_gb_per_s=options.checkpoint.storage_bandwidth_gb_per_s)
    try:
        paths = write_bundle(est, args.out, options, force=args.force, notes=notes, fallback=fallback)
    except OSError as err:
        raise InputError([f"--out {args.out!r}: cannot write it ({err.strerror or err}); nothing was replaced"],
                         subject="output folder") from None
    for note in notes:
        print(f"autotune emit: {note}", file=sys.stderr)
    if args.json:
        print(json_text({"out": args.out, "files": [str(p) for p in paths]}))
    else:
        from autotune.report import plan_summary

        print(f"wrote {len(paths)} files for {plan_summary(est.plan)} (engine {est.plan.engine}) to {args.out.rstrip('/') or '/'}/:")
        for p in paths:
            print(f"  {p.relative_to(args.out)}")
    return EXIT_OK
