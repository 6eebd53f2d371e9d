"""`autotune` command line: thin subcommands over the library API.

Each subcommand parses, calls the library, prints. ``--json`` puts the machine-readable
result alone on stdout. Bad input: the problems on stderr, exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from autotune.errors import InputError

__all__ = ["main", "build_parser"]

EXIT_OK, EXIT_PROBLEMS, EXIT_BAD_INPUT = 0, 1, 2


def _positive_int(text: str) -> int:
    """An integer; whether it is positive is checked with every other problem (see _flag_problems)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None


_POSITIVE_FLAGS = ("num_gpus", "gpus_per_node", "seq_len", "global_batch", "tp", "pp", "vpp", "cp", "ep",
                   "micro_batch", "recompute_num_layers", "top_k", "max_tp", "max_pp")


def _flag_problems(args: argparse.Namespace) -> list[str]:
    return [f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}"
            for name in _POSITIVE_FLAGS if getattr(args, name, None) is not None and getattr(args, name) < 1]


def _preset_epilog() -> str:
    try:
        from autotune.specs.presets import gpu_preset_names, model_preset_names

        return ("model presets: " + ", ".join(model_preset_names()) + "\n\ngpu presets: "
                + ", ".join(gpu_preset_names()))
    except Exception:  # presets unreadable: --help must still work
        return ""


def _add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and cluster")
    g.add_argument("--model", help="preset name, Hugging Face config.json, or model YAML (required)")
    g.add_argument("--gpu", help="GPU preset name (see the list below)")
    g.add_argument("--num-gpus", type=_positive_int, help="total GPUs")
    g.add_argument("--gpus-per-node", type=_positive_int, help="GPUs per node (default: the GPU preset's)")
    g.add_argument("--cluster", help="cluster YAML (schemas/cluster.schema.json) instead of --gpu/--num-gpus")
    g.add_argument("--seq-len", type=_positive_int, default=4096, help="sequence length in tokens (default 4096)")
    g.add_argument("--global-batch", type=_positive_int, help="sequences per optimizer step (default: micro x dp)")
    p.add_argument("--json", action="store_true", help="print the machine-readable result only")


def _add_plan_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("plan")
    g.add_argument("--tp", type=_positive_int, default=1)
    g.add_argument("--pp", type=_positive_int, default=1)
    g.add_argument("--vpp", type=_positive_int, default=1, help="virtual stages per pipeline rank (interleaved)")
    g.add_argument("--cp", type=_positive_int, default=1)
    g.add_argument("--ep", type=_positive_int, default=1)
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=1, help="ZeRO stage (Megatron: 1 = distributed optimizer)")
    g.add_argument("--micro-batch", type=_positive_int, default=1)
    g.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                   help="Megatron sequence parallelism (default: on when tp > 1)")
    g.add_argument("--recompute", choices=("none", "selective", "full"), default="selective")
    g.add_argument("--recompute-num-layers", type=_positive_int, help="full recompute: layers per stage to recompute")
    g.add_argument("--precision", choices=("bf16", "fp16", "fp8"), default="bf16")
    g.add_argument("--optimizer", choices=("adamw", "sgd", "adafactor", "adamw8bit"), default="adamw")
    g.add_argument("--offload-optimizer", choices=("none", "cpu", "nvme"), default="none")
    g.add_argument("--offload-param", choices=("none", "cpu", "nvme"), default="none")
    g.add_argument("--nvme-path", help="local NVMe folder for nvme offload")
    g.add_argument("--framework", choices=("deepspeed", "megatron"), default="deepspeed",
                   help="engine holding the model states (default deepspeed)")
    g.add_argument("--flash-attention", action=argparse.BooleanOptionalAction, default=True)
    m = p.add_argument_group("memory settings")
    m.add_argument("--overhead-gib", type=float, help="CUDA context + NCCL buffers per GPU (default 1 GiB; 0 on cpu)")
    m.add_argument("--fragmentation", type=float, default=0.05, help="allocator fragmentation fraction (default 0.05)")
    _add_calibration(p)


def _add_calibration(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calibration", help="efficiency parameters fitted by `autotune tune` on this hardware "
                   "(default: fitted on published Megatron-LM runs)")


def _time_settings(args: argparse.Namespace):
    from autotune.cost.efficiency import load_efficiency
    from autotune.cost.step_time import TimeSettings

    path = getattr(args, "calibration", None)
    return TimeSettings(efficiency=load_efficiency(path)) if path else TimeSettings()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autotune", description="Plan, estimate and tune large-model training "
                                     "on DeepSpeed and Megatron-LM.")
    sub = parser.add_subparsers(dest="command", required=True)
    est = sub.add_parser("estimate", help="memory ledger of one plan", epilog=_preset_epilog(),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(est)
    _add_plan_flags(est)
    est.set_defaults(handler=_cmd_estimate)

    plan = sub.add_parser("plan", help="search every plan, rank the feasible ones", epilog=_preset_epilog(),
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(plan)
    g = plan.add_argument_group("constraints (default: search everything)")
    for dim in ("tp", "pp", "vpp", "cp", "ep"):
        g.add_argument(f"--{dim}", type=_positive_int, help=f"fix {dim}")
    g.add_argument("--micro-batch", type=_positive_int, help="fix the micro-batch size")
    g.add_argument("--max-tp", type=_positive_int, help="largest tp to try (default: GPUs per node)")
    g.add_argument("--max-pp", type=_positive_int, help="largest pp to try")
    g.add_argument("--zero", type=_int_list((0, 1, 2, 3)), default=(0, 1, 2, 3), help="allowed ZeRO stages, e.g. 1,3")
    g.add_argument("--precision", type=_str_list(("bf16", "fp16", "fp8")), help="allowed precisions, e.g. bf16,fp8 "
                   "(default bf16, or fp16 without bf16)")
    g.add_argument("--recompute", type=_str_list(("none", "selective", "full")), default=("none", "selective", "full"))
    g.add_argument("--framework", type=_str_list(("megatron", "deepspeed")), default=("megatron", "deepspeed"))
    g.add_argument("--offload", action=argparse.BooleanOptionalAction, default=True, help="allow ZeRO offload")
    g.add_argument("--min-headroom-gib", type=float, default=0.0, help="reject plans closer than this to capacity")
    plan.add_argument("--top-k", type=_positive_int, default=10)
    _add_calibration(plan)
    q = plan.add_argument_group("capacity questions")
    q.add_argument("--min-gpus", action="store_true", help="the fewest GPUs of --gpu that train --model")
    q.add_argument("--max-model", action="store_true", help="the largest Llama-shaped model this cluster trains")
    q.add_argument("--min-mfu", type=float, default=0.2, help="--max-model: slowest acceptable MFU (default 0.2)")
    plan.set_defaults(handler=_cmd_plan)

    emit = sub.add_parser("emit", help="write ds_config.json, Megatron args, launch scripts, plan.md for a plan",
                          epilog=_preset_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    src = emit.add_argument_group("the plan (one of)")
    src.add_argument("--recipe", help="a recipe name (`autotune recipes list`) or recipe YAML")
    src.add_argument("--plan-json", help="output of `autotune estimate --json` or `autotune plan --json`")
    src.add_argument("--candidate", type=int, default=1, help="with a plan --json file: which candidate (default 1)")
    _add_common(emit)
    _add_plan_flags(emit)
    out = emit.add_argument_group("output and job settings")
    out.add_argument("--out", required=True, help="folder to create")
    out.add_argument("--force", action="store_true", help="replace an existing folder")
    out.add_argument("--lr", type=float, help="peak learning rate (default 3e-4)")
    out.add_argument("--train-steps", type=int, help="optimizer steps (default 100000)")
    out.add_argument("--warmup-steps", type=int, help="warm-up steps (default 2000)")
    out.add_argument("--save-dir", help="checkpoint folder (default checkpoints)")
    out.add_argument("--storage-gb-per-s", type=float, help="checkpoint storage write bandwidth (default 5)")
    out.add_argument("--gpu-mtbf-hours", type=float, help="mean time between failures of one GPU (default 50000)")
    out.add_argument("--keep-last", type=int, help="checkpoints to keep (default 3)")
    out.add_argument("--save-interval", type=int, help="override the Young/Daly checkpoint interval (steps)")
    out.add_argument("--no-async-save", action="store_true", help="blocking checkpoint writes")
    out.add_argument("--hosts", help="comma-separated host names, one per node")
    out.add_argument("--master-addr")
    out.add_argument("--master-port", type=int)
    out.add_argument("--script", help="training script (default train.py; pretrain_gpt.py for Megatron-LM)")
    out.add_argument("--slurm-partition")
    out.add_argument("--slurm-account")
    out.add_argument("--nccl-env", action="append", default=[], metavar="KEY=VALUE",
                     help="extra NCCL_* setting for every rank (repeatable)")
    emit.set_defaults(handler=_cmd_emit, recompute=None, zero=None)

    from autotune.commands import recipes, tune, validate

    validate.register(sub)
    recipes.register(sub)
    tune.register(sub)
    return parser


def _int_list(choices):
    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(v) for v in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        bad = [v for v in values if v not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad} not among {list(choices)}")
        return values
    return parse


def _str_list(choices):
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(v.strip() for v in text.split(",") if v.strip())
        bad = [v for v in values if v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(choices)} (comma-separated)")
        return values
    return parse


def _load_inputs(args: argparse.Namespace, *, need_model: bool = True):
    """Model and cluster from the common flags; every problem of both reported at once."""
    from autotune.specs.loading import load_cluster, load_model

    problems: list[str] = _flag_problems(args)
    model = cluster = None
    if args.model is None:
        if need_model:
            problems.append("give --model (a preset name, a config.json or a model YAML)")
    else:
        try:
            model = load_model(args.model)
        except InputError as err:
            problems += list(err.problems)
    if args.cluster is None and (args.gpu is None or args.num_gpus is None):
        problems.append("give --gpu and --num-gpus, or --cluster FILE")
    elif any(getattr(args, n) is not None and getattr(args, n) < 1 for n in ("num_gpus", "gpus_per_node")):
        if args.gpu is not None:  # the counts are already reported; still check the GPU name
            from autotune.specs.presets import load_gpu_preset

            try:
                load_gpu_preset(args.gpu)
            except InputError as err:
                problems += list(err.problems)
    else:
        try:
            cluster = load_cluster(gpu=args.gpu, num_gpus=args.num_gpus, gpus_per_node=args.gpus_per_node,
                                   cluster_path=args.cluster)
        except InputError as err:
            problems += list(err.problems)
    if problems:
        raise InputError(problems, subject="input")
    return model, cluster


def _estimate_from_flags(args: argparse.Namespace):
    from autotune.api import estimate, make_plan
    from autotune.cost.memory import MemorySettings

    model, cluster = _load_inputs(args)
    plan = make_plan(
        model, cluster, global_batch_size=args.global_batch, tp=args.tp, pp=args.pp, cp=args.cp,
        micro_batch_size=args.micro_batch, sequence_parallel=args.sequence_parallel, vpp=args.vpp, ep=args.ep,
        zero_stage=args.zero, seq_len=args.seq_len, recompute=args.recompute,
        recompute_num_layers=args.recompute_num_layers, precision=args.precision, optimizer=args.optimizer,
        offload_optimizer=args.offload_optimizer, offload_param=args.offload_param, nvme_path=args.nvme_path,
        framework=args.framework, flash_attention=args.flash_attention,
    )
    settings = MemorySettings(
        cuda_context_bytes=None if args.overhead_gib is None else int(args.overhead_gib * 2**30),
        fragmentation_fraction=args.fragmentation,
    )
    return estimate(model, cluster, plan, settings, _time_settings(args))


def _cmd_estimate(args: argparse.Namespace) -> int:
    from autotune.report import memory_table

    result = _estimate_from_flags(args)
    model, cluster, plan = result.model, result.cluster, result.plan
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(memory_table(model, cluster, plan, result.memory))
    return EXIT_OK


def _emit_options(args: argparse.Namespace, base: dict | None = None):
    """EmitOptions from a recipe's emit block, overridden by flags."""
    from dataclasses import replace

    from autotune.emit.options import CheckpointOptions, EmitOptions, LaunchOptions, OptimizerOptions

    base = base or {}
    problems = []
    try:
        opt = OptimizerOptions(**base.get("optimizer", {}))
        ckpt = CheckpointOptions(**base.get("checkpoint", {}))
        launch = LaunchOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in base.get("launch", {}).items()})
    except TypeError as err:
        raise InputError([f"recipe emit block: {err}"], subject="emit options") from None
    pick = {k: v for k, v in (("lr", args.lr), ("train_steps", args.train_steps),
                              ("warmup_steps", args.warmup_steps)) if v is not None}
    opt = replace(opt, **pick)
    if "lr" in pick and opt.min_lr > opt.lr:
        opt = replace(opt, min_lr=opt.lr / 10)
    pick = {k: v for k, v in (("save_dir", args.save_dir), ("storage_bandwidth_gb_per_s", args.storage_gb_per_s),
                              ("gpu_mtbf_hours", args.gpu_mtbf_hours), ("keep_last", args.keep_last),
                              ("interval_steps", args.save_interval)) if v is not None}
    if args.no_async_save:
        pick["async_save"] = False
    ckpt = replace(ckpt, **pick)
    nccl = dict(launch.nccl_env)
    for item in args.nccl_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            problems.append(f"--nccl-env {item!r}: expected KEY=VALUE")
        else:
            nccl[key] = value
    pick = {k: v for k, v in (("master_addr", args.master_addr), ("master_port", args.master_port),
                              ("script", args.script), ("slurm_partition", args.slurm_partition),
                              ("slurm_account", args.slurm_account)) if v is not None}
    if args.hosts:
        pick["hosts"] = tuple(h.strip() for h in args.hosts.split(","))
    launch = replace(launch, nccl_env=nccl, **pick)
    if problems:
        raise InputError(problems, subject="emit options")
    return EmitOptions(optimizer=opt, checkpoint=ckpt, launch=launch,
                       steps_per_print=base.get("steps_per_print", 10))


def _cmd_emit(args: argparse.Namespace) -> int:
    from autotune.api import estimate_from_dict
    from autotune.emit.bundle import write_bundle

    sources = [s for s in ("recipe", "plan_json", "model") if getattr(args, s)]
    if len(sources) != 1:
        raise InputError(["give exactly one of --recipe NAME, --plan-json FILE, or --model with the plan flags"],
                         subject="emit")
    emit_block: dict = {}
    if args.recipe:
        from autotune.recipebook import load_recipe, recipe_estimate

        recipe = load_recipe(args.recipe)
        est = recipe_estimate(recipe)
        emit_block = recipe.emit
    elif args.plan_json:
        try:
            with open(args.plan_json, encoding="utf-8") as fh:
                doc = json.load(fh)
        except OSError as err:
            raise InputError([f"cannot read {args.plan_json}: {err.strerror}"], subject="plan JSON") from None
        except json.JSONDecodeError as err:
            raise InputError([f"{args.plan_json} is not JSON: {err}"], subject="plan JSON") from None
        if "candidates" in doc:
            if not 1 <= args.candidate <= len(doc["candidates"]):
                raise InputError([f"--candidate {args.candidate}: the file has {len(doc['candidates'])} candidates"],
                                 subject="plan JSON")
            doc = doc["candidates"][args.candidate - 1]
        est = estimate_from_dict(doc)
    else:
        args.recompute = args.recompute or "selective"
        args.zero = 1 if args.zero is None else args.zero
        est = _estimate_from_flags(args)
    options = _emit_options(args, emit_block)
    paths = write_bundle(est, args.out, options, force=args.force)
    if args.json:
        print(json.dumps({"out": args.out, "files": [str(p) for p in paths]}, indent=2))
    else:
        from autotune.report import plan_summary

        print(f"wrote {len(paths)} files for {plan_summary(est.plan)} ({est.plan.framework}) to {args.out}/:")
        for p in paths:
            print(f"  {p.name}")
    return EXIT_OK


def _cmd_plan(args: argparse.Namespace) -> int:
    from autotune.report import format_params, plan_summary, plan_table
    from autotune.search import capacity
    from autotune.search.planner import search_plans
    from autotune.search.space import SearchConstraints

    model, cluster = _load_inputs(args, need_model=not args.max_model)
    constraints = SearchConstraints(
        tp=args.tp, pp=args.pp, vpp=args.vpp, cp=args.cp, ep=args.ep, micro_batch_size=args.micro_batch,
        max_tp=args.max_tp, max_pp=args.max_pp, zero_stages=args.zero, precisions=args.precision,
        recompute=args.recompute, frameworks=args.framework, allow_offload=args.offload,
        min_headroom_gib=args.min_headroom_gib)
    if args.max_model:
        ans = capacity.max_model(cluster, seq_len=args.seq_len, global_batch=args.global_batch,
                                 constraints=constraints, min_mfu=args.min_mfu)
        out = {"largest": None if ans.largest is None else ans.largest.to_dict(),
               "num_params": None if ans.largest is None else ans.largest.num_params,
               "best": None if ans.best is None else ans.best.candidates[0].to_dict(),
               "binding_limit": ans.binding_limit, "next_size": ans.next_size.to_dict(),
               "next_size_best_mfu": ans.next_best_mfu}
        if args.json:
            print(json.dumps(out, indent=2))
        elif ans.largest is None:
            print(f"no Llama-shaped model trains on {cluster.num_gpus} x {cluster.gpu.name} at MFU >= {args.min_mfu:.0%}")
        else:
            best = ans.best.candidates[0]
            print(f"largest Llama-shaped model on {cluster.num_gpus} x {cluster.gpu.name} at seq {args.seq_len}: "
                  f"{format_params(ans.largest.num_params)} params (hidden {ans.largest.hidden_size}, "
                  f"{ans.largest.num_layers} layers) with {plan_summary(best.plan)}, MFU {best.time.mfu:.1%}")
            nxt = ("no plan fits in memory" if ans.binding_limit == "memory"
                   else f"plans fit, but the best reaches only {ans.next_best_mfu:.1%} MFU")
            print(f"binding limit: {ans.binding_limit} (the next size, {format_params(ans.next_size.num_params)}: {nxt})")
        return EXIT_OK
    if args.min_gpus:
        ans = capacity.min_gpus(model, cluster, seq_len=args.seq_len, global_batch=args.global_batch,
                                constraints=constraints)
        out = {"with_offload": ans.with_offload, "without_offload": ans.without_offload}
        if args.json:
            print(json.dumps(out, indent=2))
        else:
            print(capacity.infeasibility_hint(model, cluster, seq_len=args.seq_len, global_batch=None,
                                              constraints=constraints).replace(" needs ", " trains on "))
        return EXIT_OK
    global_batch = args.global_batch or cluster.num_gpus
    result = search_plans(model, cluster, seq_len=args.seq_len, global_batch_size=global_batch,
                          time_settings=_time_settings(args),
                          constraints=constraints, top_k=args.top_k)
    if not result.num_feasible:
        problems = [f"no plan of the {result.num_enumerated:,} enumerated is feasible: "
                    + ", ".join(f"{k} {v:,}" for k, v in result.rejections.items())]
        if set(result.rejections) <= {"batch_triple", "interleave_microbatches"}:
            problems.append(f"global batch {global_batch} is not divisible by micro-batch x dp for any layout: "
                            f"use a multiple of {cluster.num_gpus} (or of a divisor of it that tp*pp*cp leaves)")
        else:
            problems.append(capacity.infeasibility_hint(model, cluster, seq_len=args.seq_len,
                                                        global_batch=args.global_batch, constraints=constraints))
        raise InputError(problems, subject="request")
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(plan_table(result))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except InputError as err:
        print(f"autotune {args.command}: {err.render()}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
