"""`autotune plan`: every plan ranked by predicted tokens/s; --min-gpus and --max-model capacity questions."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from autotune.commands import (
    EXIT_OK,
    add_calibration,
    add_common,
    add_expandable_segments,
    add_goodput,
    add_peft_flags,
    add_run_settings,
    goodput_inputs,
    int_list,
    json_text,
    load_inputs,
    positive_int,
    preset_epilog,
    peft_args,
    run_setting_args,
    str_list,
    time_settings,
)
from autotune.commands.engine_version import add_engine_version, engine_releases, print_versions, search_releases
from autotune.errors import InputError
from autotune.specs.plan import ENGINE_NAMES

__all__ = ["register", "run"]


def run_setting_engines(args: argparse.Namespace) -> tuple[str, ...]:
    """``--engine``, narrowed to the engines that run every asked run setting (--grad-dtype, --fp8-recipe,
    --tp-overlap, --compile, ...: ``EngineSupport.runs``) when the engines were left to the default (an engine
    named with --engine that does not run one is refused plan by plan, with the rule's reason)."""
    engines = tuple(args.engine)
    asked = run_setting_args(args) | peft_args(args)
    if not asked or engines != tuple(ENGINE_NAMES):
        return engines
    from autotune.engines import engine_for

    def runs(name: str) -> bool:
        support = engine_for(name).support
        return all(support.runs(setting, value) for setting, value in asked.items())

    return tuple(e for e in engines if runs(e))


def register(sub) -> None:
    plan = sub.add_parser("plan", help="search every plan, rank the feasible ones", epilog=preset_epilog(),
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(plan)
    g = plan.add_argument_group("constraints (default: search everything)")
    for dim in ("tp", "pp", "vpp", "cp", "ep"):
        g.add_argument(f"--{dim}", type=positive_int, help=f"fix {dim}")
    g.add_argument("--dp-replicate", type=positive_int,
                   help="fix the hybrid-sharding (FSDP2 HSDP) replica groups (default: search 1 and whole-node shards)")
    g.add_argument("--micro-batch", type=positive_int, help="fix the micro-batch size")
    g.add_argument("--max-tp", type=positive_int, help="largest tp to try (default: GPUs per node)")
    g.add_argument("--max-pp", type=positive_int, help="largest pp to try")
    g.add_argument("--uneven-layouts", action="store_true",
                   help="also search the pipeline splits only Megatron-core's uneven layouts run (embedding / loss "
                        "as a stage slot, asymmetric first/last stages, --pipeline-model-parallel-layout)")
    g.add_argument("--zero", type=int_list((0, 1, 2, 3)), default=(0, 1, 2, 3), help="allowed ZeRO stages, e.g. 1,3")
    g.add_argument("--precision", type=str_list(("bf16", "fp16", "fp8", "fp4")), help="allowed precisions, e.g. bf16,fp8 "
                   "(default bf16, or fp16 without bf16)")
    g.add_argument("--recompute", type=str_list(("none", "selective", "full")), default=("none", "selective", "full"),
                   help="allowed recompute modes, e.g. none,selective (default all)")
    g.add_argument("--engine", "--framework", dest="engine", type=str_list(ENGINE_NAMES), default=ENGINE_NAMES,
                   help=f"engines to rank plans across, e.g. fsdp,megatron (default all: {','.join(ENGINE_NAMES)}; "
                        f"--framework is an alias)")
    g.add_argument("--offload", action=argparse.BooleanOptionalAction, default=True, help="allow ZeRO offload")
    add_run_settings(g)
    add_peft_flags(g)
    g.add_argument("--min-headroom-gib", type=float, default=0.0, help="reject plans closer than this to capacity, "
                   "0-1024 GiB (default 0)")
    add_expandable_segments(g)
    plan.add_argument("--top-k", type=positive_int, default=10, help="plans to show, best first (default 10)")
    plan.add_argument("--objective", choices=("step-time", "goodput"), default="step-time",
                      help="rank by predicted tokens/s (step-time, the default) or by goodput: tokens/s x the share "
                           "of wall time that trains after checkpoint stalls, rework and restarts")
    add_goodput(plan)
    add_calibration(plan)
    from autotune.commands.from_job import add_from

    add_from(plan, "rank the alternatives to")
    add_engine_version(plan)
    q = plan.add_argument_group("capacity questions")
    q.add_argument("--min-gpus", action="store_true", help="the fewest GPUs of --gpu that train --model (no --num-gpus: it is the answer)")
    q.add_argument("--max-model", action="store_true", help="the largest Llama-shaped model this cluster trains")
    q.add_argument("--min-mfu", type=float, default=0.2, help="--max-model: slowest acceptable MFU, 0-1 (default 0.2)")
    plan.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from autotune.report import format_params, plan_summary, plan_table
    from autotune.rules import sequence_problems
    from autotune.search import capacity
    from autotune.search.planner import search_plans
    from autotune.search.space import SearchConstraints
    from autotune.specs.settings import MemorySettings

    if args.engine_version:  # before any search: an unmodelled release is exit 2 at once
        print_versions(engine_releases(args, args.engine), command="plan")
    if args.from_files:
        if args.min_gpus or args.max_model:
            raise InputError(["--from ranks the alternatives to a job: drop --min-gpus / --max-model"],
                             subject="plan request")
        from autotune.commands.from_job import plan_from_job

        return plan_from_job(args)
    if args.seq_len is None:
        args.seq_len = 4096
    if args.recompute_modules and "selective" not in args.recompute:
        raise InputError([f"--recompute-modules says what selective recompute reruns, and --recompute "
                          f"{','.join(args.recompute)} searches no selective plan: add selective to --recompute or "
                          f"drop --recompute-modules"], subject="plan request")
    if args.min_gpus and args.num_gpus is not None:
        raise InputError(["--min-gpus searches the GPU count itself: drop --num-gpus (--gpus-per-node sets the node "
                          "size)"], subject="plan request")
    model, cluster = load_inputs(args, need_model=not args.max_model, need_num_gpus=not args.min_gpus)
    if model is not None and (unrunnable := sequence_problems(model, args.seq_len)):  # no layout can help
        raise InputError([message for _, message in unrunnable], subject="plan request")
    constraints = SearchConstraints(
        tp=args.tp, pp=args.pp, vpp=args.vpp, cp=args.cp, ep=args.ep, dp_replicate=args.dp_replicate,
        micro_batch_size=args.micro_batch,
        max_tp=args.max_tp, max_pp=args.max_pp, zero_stages=args.zero, precisions=args.precision,
        recompute=args.recompute, engines=run_setting_engines(args), allow_offload=args.offload,
        min_headroom_gib=args.min_headroom_gib, uneven_layouts=args.uneven_layouts, **run_setting_args(args),
        **peft_args(args),
        engine_versions=search_releases(args, args.engine))  # each engine's plans: its release's defaults
    progress: Callable[[str], None] | None = None
    if args.max_model or args.min_gpus:
        import time

        started = time.monotonic()
        what = "model sizes" if args.max_model else "GPU counts"
        print(f"autotune plan: searching {what} (each a full plan search; this can take a minute) ...",
              file=sys.stderr, flush=True)

        def print_progress(line: str) -> None:
            print(f"autotune plan: [{time.monotonic() - started:6.1f} s] {line}", file=sys.stderr, flush=True)

        progress = print_progress
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
        refused = capacity.model_refusal(model, cluster, constraints, seq_len=args.seq_len)
        if refused:
            raise InputError([refused], subject="request")
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
    expandable = getattr(args, "expandable_segments", None)  # None: each engine's launcher's own
    memory = MemorySettings(expandable_segments=expandable) if expandable is not None else None
    result = search_plans(model, cluster, seq_len=args.seq_len, global_batch_size=global_batch,
                          time_settings=time_settings(args), memory_settings=memory,
                          constraints=constraints, top_k=args.top_k)
    if not result.num_feasible:
        from autotune.commands.infeasible import no_plan_problems

        raise InputError(no_plan_problems(result, model, cluster, seq_len=args.seq_len, global_batch=global_batch,
                                          batch_given=args.global_batch, constraints=constraints), subject="request")
    if args.objective == "step-time":  # what the opt-in run settings would gain (autotune.search.setting_gains)
        from autotune.search.setting_gains import with_setting_gains

        result = with_setting_gains(result, constraints, memory, time_settings(args))
        if not constraints.uneven_layouts and result.in_order:  # the search itself tries loss slots when uneven
            from autotune.search.last_stage_hint import with_last_stage_hint

            result = with_last_stage_hint(result, memory, time_settings(args))
    if args.objective == "goodput":
        from autotune.search.goodput_rank import rank_by_goodput

        ranking = rank_by_goodput(result, top_k=args.top_k, options=goodput_inputs(args, cluster))
        print(json_text(ranking.to_dict()) if args.json else ranking.to_text())
    elif args.json:
        print(json_text(result.to_dict()))
    else:
        print(plan_table(result))
    return EXIT_OK

