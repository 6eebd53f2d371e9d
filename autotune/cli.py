"""`autotune` command line: thin subcommands over the library API.

Each subcommand parses, calls the library, prints. ``--json`` puts the machine-readable
result alone on stdout. Bad input: the problems on stderr, exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from autotune.commands import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK, json_text
from autotune.commands import flag_problems as _flag_problems
from autotune.commands import positive_int as _positive_int
from autotune.errors import InputError
from autotune.specs.plan import ENGINE_NAMES

__all__ = ["main", "build_parser"]


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
    g.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel size (default 1)")
    g.add_argument("--pp", type=_positive_int, default=1, help="pipeline-parallel stages (default 1)")
    g.add_argument("--vpp", type=_positive_int, default=1, help="virtual stages per pipeline rank (interleaved)")
    g.add_argument("--cp", type=_positive_int, default=1, help="context-parallel size: the sequence split (default 1)")
    g.add_argument("--ep", type=_positive_int, default=1, help="expert-parallel size, MoE models (default 1)")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=1, help="ZeRO stage (Megatron: 1 = distributed optimizer)")
    g.add_argument("--micro-batch", type=_positive_int, default=1, help="sequences per GPU per forward pass (default 1)")
    g.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                   help="Megatron sequence parallelism (default: on when tp > 1)")
    g.add_argument("--recompute", choices=("none", "selective", "full"), default="selective",
                   help="activation recompute: none, selective (attention only) or full (default selective)")
    g.add_argument("--recompute-num-layers", type=_positive_int, help="full recompute: layers per stage to recompute")
    g.add_argument("--precision", choices=("bf16", "fp16", "fp8"), default="bf16",
                   help="training precision (default bf16)")
    g.add_argument("--optimizer", choices=("adamw", "sgd", "adafactor", "adamw8bit"), default="adamw",
                   help="optimizer, which sets the optimizer-state bytes (default adamw)")
    g.add_argument("--offload-optimizer", choices=("none", "cpu", "nvme"), default="none",
                   help="ZeRO offload of the optimizer states (default none)")
    g.add_argument("--offload-param", choices=("none", "cpu", "nvme"), default="none",
                   help="ZeRO-3 offload of the parameters (default none)")
    g.add_argument("--nvme-path", help="local NVMe folder for nvme offload")
    g.add_argument("--engine", "--framework", dest="engine", choices=ENGINE_NAMES, default="deepspeed",
                   help="the engine that trains the plan (default deepspeed; --framework is an alias)")
    g.add_argument("--dp-replicate", type=_positive_int, default=1,
                   help="hybrid sharding (FSDP2 HSDP): replica groups of the dp ranks (default 1: shard over all)")
    g.add_argument("--flash-attention", action=argparse.BooleanOptionalAction, default=True,
                   help="flash attention: no seq x seq score matrix kept (default on)")
    m = p.add_argument_group("memory settings")
    m.add_argument("--overhead-gib", type=float, help="CUDA context + NCCL buffers per GPU, 0-1024 (default 1 GiB; "
                   "0 on cpu)")
    m.add_argument("--fragmentation", type=float, default=0.05, help="allocator fragmentation fraction, 0-0.9 "
                   "(default 0.05)")
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
    from autotune import __version__

    parser = argparse.ArgumentParser(prog="autotune", description="Plan, estimate and tune large-model training "
                                     "on DeepSpeed and Megatron-LM.")
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
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
    g.add_argument("--recompute", type=_str_list(("none", "selective", "full")), default=("none", "selective", "full"),
                   help="allowed recompute modes, e.g. none,selective (default all)")
    g.add_argument("--engine", "--framework", dest="engine", type=_str_list(ENGINE_NAMES), default=ENGINE_NAMES,
                   help=f"engines to rank plans across, e.g. fsdp,megatron (default all: {','.join(ENGINE_NAMES)}; "
                        f"--framework is an alias)")
    g.add_argument("--offload", action=argparse.BooleanOptionalAction, default=True, help="allow ZeRO offload")
    g.add_argument("--min-headroom-gib", type=float, default=0.0, help="reject plans closer than this to capacity, "
                   "0-1024 GiB (default 0)")
    plan.add_argument("--top-k", type=_positive_int, default=10, help="plans to show, best first (default 10)")
    _add_calibration(plan)
    q = plan.add_argument_group("capacity questions")
    q.add_argument("--min-gpus", action="store_true", help="the fewest GPUs of --gpu that train --model")
    q.add_argument("--max-model", action="store_true", help="the largest Llama-shaped model this cluster trains")
    q.add_argument("--min-mfu", type=float, default=0.2, help="--max-model: slowest acceptable MFU, 0-1 (default 0.2)")
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
    out.add_argument("--master-addr", help="rendezvous host (default: the first host)")
    out.add_argument("--master-port", type=int, help="rendezvous port (default 29500)")
    out.add_argument("--script", help="your training script (default: the built-in `python -m autotune.train` for "
                                      "deepspeed/fsdp/hf plans, pretrain_gpt.py for Megatron-LM)")
    out.add_argument("--slurm-partition", help="SLURM partition for the sbatch script")
    out.add_argument("--slurm-account", help="SLURM account for the sbatch script")
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


def _named_problems(err: InputError) -> list[str]:
    """The problems of a file's InputError, each naming the file (its subject) when one does."""
    if "'" not in err.subject:  # "--model", "cluster": the problems already say what they are about
        return list(err.problems)
    return [f"{err.subject}: {p}" for p in err.problems]


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
            problems += _named_problems(err)
    if args.cluster is None and (args.gpu is None or args.num_gpus is None):
        problems.append("give --gpu and --num-gpus, or --cluster FILE")
    elif any(p.startswith(("--num-gpus ", "--gpus-per-node ")) for p in problems):
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
            problems += _named_problems(err)
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
        engine=args.engine, dp_replicate=args.dp_replicate, flash_attention=args.flash_attention,
    )
    settings = MemorySettings(
        cuda_context_bytes=None if args.overhead_gib is None else int(args.overhead_gib * 2**30),
        fragmentation_fraction=args.fragmentation,
    )
    return estimate(model, cluster, plan, settings, _time_settings(args))


def _cmd_estimate(args: argparse.Namespace) -> int:
    from autotune.report import memory_table

    from autotune.legend import plan_legend
    from autotune.report import step_time_table

    result = _estimate_from_flags(args)
    model, cluster, plan = result.model, result.cluster, result.plan
    if args.json:
        print(json_text(result.to_dict()))
    else:
        print(memory_table(model, cluster, plan, result.memory))
        print()
        print(step_time_table(result.time))
        print()
        print(plan_legend([plan]))
    return EXIT_OK


def _cmd_emit(args: argparse.Namespace) -> int:
    from autotune.api import estimate_from_dict
    from autotune.commands.emit import emit_options, out_problems, read_plan_json, report_leftovers
    from autotune.emit.bundle import write_bundle

    sources = [s for s in ("recipe", "plan_json", "model") if getattr(args, s)]
    problems = _flag_problems(args) + out_problems(args.out)
    if len(sources) != 1:
        problems.append("give exactly one of --recipe NAME, --plan-json FILE, or --model with the plan flags")
    if problems:
        raise InputError(problems, subject="emit request")
    report_leftovers(args.out)
    emit_block: dict = {}
    if args.recipe:
        from autotune.recipebook import load_recipe, recipe_estimate

        recipe = load_recipe(args.recipe)
        est = recipe_estimate(recipe)
        emit_block = recipe.emit
    elif args.plan_json:
        est = estimate_from_dict(read_plan_json(args.plan_json, args.candidate))
    else:
        args.recompute = args.recompute or "selective"
        args.zero = 1 if args.zero is None else args.zero
        est = _estimate_from_flags(args)
    options = emit_options(args, emit_block)
    try:
        paths = write_bundle(est, args.out, options, force=args.force)
    except OSError as err:
        raise InputError([f"--out {args.out!r}: cannot write it ({err.strerror or err}); nothing was replaced"],
                         subject="output folder") from None
    if args.json:
        print(json_text({"out": args.out, "files": [str(p) for p in paths]}))
    else:
        from autotune.report import plan_summary

        print(f"wrote {len(paths)} files for {plan_summary(est.plan)} (engine {est.plan.engine}) to {args.out.rstrip('/') or '/'}/:")
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
        recompute=args.recompute, engines=args.engine, allow_offload=args.offload,
        min_headroom_gib=args.min_headroom_gib)
    progress = None
    if args.max_model or args.min_gpus:
        import time

        started = time.monotonic()
        what = "model sizes" if args.max_model else "GPU counts"
        print(f"autotune plan: searching {what} (each a full plan search; this can take a minute) ...",
              file=sys.stderr, flush=True)

        def progress(line: str) -> None:
            print(f"autotune plan: [{time.monotonic() - started:6.1f} s] {line}", file=sys.stderr, flush=True)
    if args.max_model:
        ans = capacity.max_model(cluster, seq_len=args.seq_len, global_batch=args.global_batch,
                                 constraints=constraints, min_mfu=args.min_mfu, progress=progress)
        out = {"largest": None if ans.largest is None else ans.largest.to_dict(),
               "num_params": None if ans.largest is None else ans.largest.num_params,
               "best": None if ans.best is None else ans.best.candidates[0].to_dict(),
               "binding_limit": ans.binding_limit, "next_size": ans.next_size.to_dict(),
               "next_size_best_mfu": ans.next_best_mfu}
        if args.json:
            print(json_text(out))
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
                                constraints=constraints, progress=progress)
        out = {"with_offload": ans.with_offload, "without_offload": ans.without_offload}
        if args.json:
            print(json_text(out))
        else:
            print(capacity.infeasibility_hint(model, cluster, seq_len=args.seq_len, global_batch=None,
                                              constraints=constraints,
                                              answer=None if args.global_batch else ans).replace(" needs ", " trains on "))
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
        print(json_text(result.to_dict()))
    else:
        print(plan_table(result))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return args.handler(args)
    except InputError as err:
        print(f"autotune {args.command}: {err.render()}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        print("autotune: interrupted (Ctrl-C); nothing half-written was left behind", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
