"""``estimate --from`` / ``plan --from``: the job a user already has (``autotune.job_files``), its ledger and step
time, and the planner's alternatives with what changes and the predicted gain, on its own GPUs or on another number
of them (:func:`job_and_search_cluster`)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from autotune.commands import EXIT_OK, flag_problems, json_text, run_setting_args, time_settings
from autotune.errors import InputError
from autotune.specs.peft import PEFT_SETTINGS
from autotune.specs.plan import ENGINE_NAMES, RUN_SETTINGS

__all__ = ["add_from", "read_job_from_args", "estimate_from_job", "job_estimate", "plan_from_job", "plan_diff",
           "alternatives", "best_alternative", "job_and_search_cluster"]

# The plan fields a change of layout shows, in the order the diff lists them.
_DIFF_FIELDS = ("tp", "pp", "vpp", "loss_slots", "dp", "cp", "ep", "dp_replicate", "micro_batch_size",
                "grad_accum_steps", "zero_stage", "sequence_parallel", "recompute", "recompute_num_layers", "precision",
                "offload_optimizer", "offload_param", *RUN_SETTINGS)


def add_from(p: argparse.ArgumentParser, what: str, *, recompute_default: bool = False) -> None:
    p.add_argument("--from", dest="from_files", nargs="+", metavar="FILE",
                   help=f"{what} the job these files state: ds_config.json (+ --model, --tp/--pp; --num-gpus where its "
                        "batch triple leaves the world size open), "
                        "Megatron-LM argument scripts (megatron_args.sh, a torchrun ... pretrain_gpt.py line), "
                        "Megatron-Bridge overrides (bridge_overrides.yaml / .args, + --num-gpus) or a Bridge "
                        "checkpoint's run_config.yaml (its model too), a torchtitan TOML or "
                        "0.3 config module (*.py), an accelerate YAML, plan.json, or a checkpoint folder: "
                        "Megatron-LM's (its saved arguments), Megatron-Bridge's (run_config.yaml), DeepSpeed's (its "
                        "config and world size) or a Hugging "
                        "Face Trainer's checkpoint-N (training_args.bin; config.json as the model); flags fill what "
                        "the files do not state (plan, emit --best and tune: --num-gpus N other than the files' "
                        "world size plans the job on N GPUs)")
    p.set_defaults(seq_len=None)  # --from: the file's unless --seq-len is given
    if recompute_default:
        p.set_defaults(recompute=None)  # --from a DeepSpeed config: its activation_checkpointing unless given


def read_job_from_args(args: argparse.Namespace, *, tp: int = 1, pp: int = 1, cp: int = 1,
                       recompute: str | None = None, micro_batch: int | None = None, precision: str | None = None):
    from autotune.job_files import read_job

    problems = flag_problems(args)
    if problems:
        raise InputError(problems, subject="input")
    job = read_job(args.from_files, model=args.model, gpu=args.gpu, num_gpus=args.num_gpus,
                   gpus_per_node=args.gpus_per_node, cluster_path=args.cluster, seq_len=args.seq_len,
                   global_batch=args.global_batch, tp=tp, pp=pp, cp=cp, recompute=recompute, micro_batch=micro_batch,
                   precision=precision)
    read = ", ".join(f"{path} ({kind})" for path, kind in job.kinds)  # on stderr: --json keeps stdout the JSON
    print(f"autotune {args.command}: read {read}", file=sys.stderr)
    for note in job.notes:
        print(f"autotune {args.command}: {note}", file=sys.stderr)
    expandable = getattr(args, "expandable_segments", None)  # the run's allocator setting, its files need not state
    if expandable is not None:
        from autotune.specs.settings import MemorySettings

        job = replace(job, settings=replace(job.settings or MemorySettings(), expandable_segments=expandable))
    return job


def estimate_from_job(args: argparse.Namespace):
    """The Estimate of the job ``--from`` states (tp/pp/cp flags: for a DeepSpeed JSON, which does not hold them)."""
    return job_estimate(args)[0]


def job_estimate(args: argparse.Namespace):
    """(the Estimate of the job ``--from`` states, its MemorySettings, its TimeSettings)."""
    from autotune.cost.estimate import estimate

    job = read_job_from_args(args, tp=args.tp, pp=args.pp, cp=args.cp, recompute=args.recompute,
                             micro_batch=getattr(args, "micro_batch", None),  # for files that leave them to
                             precision=getattr(args, "precision", None))  # the script (accelerate FSDP / DDP)
    plan = job.plan
    _say_unapplied(args, plan)
    asked = {k: v for k, v in run_setting_args(args).items() if v != getattr(plan, k)}
    if asked:
        # --grad-dtype / --fp8-recipe / --tp-overlap / --compile with --from: the job with those settings, where its
        # engine runs them
        from autotune.rules import plan_problems

        try:
            plan = plan.with_(**asked)
        except InputError as e:
            raise InputError(e.problems, subject="run settings with --from") from None
        refused = [message for rule, message in plan_problems(job.model, job.cluster, plan)
                   if rule.split(":")[-1] in asked]
        if refused:
            raise InputError(refused, subject="run settings with --from")
    policy = job.settings.selective_policy if job.settings is not None else None  # a 0.3 module's SAC save set
    ts = time_settings(args)
    ts = replace(ts, selective_policy=policy) if policy else ts
    # What the run's own code does that the files' engine release does not (autotune.commands.run_code_flags)
    from autotune.commands.run_code_flags import run_code_plan_problems, run_code_settings, run_code_time_settings
    from autotune.specs.settings import MemorySettings

    refused = run_code_plan_problems(args, plan, job.cluster)
    if refused:
        raise InputError(refused, subject="run-code flags")
    memory = job.settings
    if run_code_settings(args):
        memory = replace(memory or MemorySettings(), **run_code_settings(args))
    ts = replace(ts, **run_code_time_settings(args))
    return estimate(job.model, job.cluster, plan, memory, ts), memory, ts


# Plan flags --from does not apply where the files state the field (flag, argparse dest, plan field, the flag's
# default): "flags fill what the files do not state".
_PLAN_FLAGS = (("--tp", "tp", "tp", 1), ("--pp", "pp", "pp", 1), ("--cp", "cp", "cp", 1), ("--vpp", "vpp", "vpp", 1),
               ("--ep", "ep", "ep", 1), ("--zero", "zero", "zero_stage", None),
               ("--micro-batch", "micro_batch", "micro_batch_size", 1), ("--precision", "precision", "precision", "bf16"),
               ("--engine", "engine", "engine", "deepspeed"),
               ("--offload-optimizer", "offload_optimizer", "offload_optimizer", "none"),
               ("--offload-param", "offload_param", "offload_param", "none"), ("--recompute", "recompute", "recompute", None))


def _say_unapplied(args: argparse.Namespace, plan) -> None:
    """Stderr names each plan flag given with --from that the files state otherwise (it is not applied)."""
    unapplied = [f"{flag} {getattr(args, dest)} (the files: {getattr(plan, field)})"
                 for flag, dest, field, default in _PLAN_FLAGS
                 if getattr(args, dest, default) not in (default, getattr(plan, field))]
    if unapplied:
        print(f"autotune: not applied, the files state the job otherwise: {', '.join(unapplied)}; without --from the "
              f"flags give the plan (`autotune plan --from` ranks the alternatives)", file=sys.stderr)


def _key(plan) -> tuple:
    return (plan.engine,) + tuple(getattr(plan, f) for f in _DIFF_FIELDS)


def plan_diff(current, other) -> dict[str, tuple]:
    """{field: (current, other)} for each plan field that differs."""
    return {f: (getattr(current, f), getattr(other, f)) for f in _DIFF_FIELDS
            if getattr(current, f) != getattr(other, f)}


def _outside(plan, order) -> str:
    """Why a fitting job is not among the searched plans: the fields in which the nearest one differs (the search
    leaves that value out, or a limit of it does)."""
    nearest = min(order[:NEAREST_LOOKED_AT], key=lambda e: len(plan_diff(plan, e.plan)), default=None)
    if nearest is None:
        return "outside the search space or its limits"
    changes = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in plan_diff(plan, nearest.plan).items())
    return f"outside the search space or its limits: the nearest plan searched differs in {changes}"


NEAREST_LOOKED_AT = 2000
"""Searched plans (in the planner's order) compared with a job outside the search for the nearest one."""


def alternatives(job, settings, *, top_k: int = 10, asked: dict | None = None, setting_gains: bool = False,
                 cluster=None, **limits):
    """(the job's Estimate, the planner's search of its alternatives): the same engine, model, global batch,
    sequence length, precision and run settings as the job, unless ``limits`` (SearchConstraints fields) or
    ``asked`` (run settings from the command line) say otherwise; on the job's cluster, or on ``cluster`` (the job
    rescaled: :func:`job_and_search_cluster`). ``setting_gains``: the search also says what the opt-in run settings
    the job leaves at the engine's defaults would gain (``autotune.search.setting_gains``)."""
    from autotune.cost.estimate import estimate
    from autotune.search.planner import search_plans

    plan = job.plan
    policy = job.settings.selective_policy if job.settings is not None else None  # a 0.3 module's SAC save set
    settings = replace(settings, selective_policy=policy) if policy else settings  # the job's, as estimate --from
    current = estimate(job.model, job.cluster, plan, job.settings, settings)
    constraints = job_constraints(job, asked, **limits)
    cluster = cluster or job.cluster
    result = search_plans(job.model, cluster, seq_len=plan.seq_len, global_batch_size=plan.global_batch_size,
                          memory_settings=job.settings, time_settings=settings, constraints=constraints,
                          top_k=top_k)
    if setting_gains:
        from autotune.search.setting_gains import with_setting_gains

        result = with_setting_gains(result, constraints, job.settings, settings)
    return current, result


def job_constraints(job, asked: dict | None = None, **limits):
    """The SearchConstraints of a job's alternatives (:func:`alternatives`): its engine, precision and run settings
    unless ``limits`` / ``asked`` say otherwise."""
    from autotune.search.space import SearchConstraints

    kept = {name: getattr(job.plan, name) for name in RUN_SETTINGS + PEFT_SETTINGS  # a LoRA job's alternatives: LoRA
            if getattr(job.plan, name) is not None}
    limits = {"engines": (job.plan.engine,), "precisions": (job.plan.precision,)} | {
        k: v for k, v in limits.items() if v is not None}
    return SearchConstraints(**limits, **(kept | (asked or {})))


def job_and_search_cluster(args: argparse.Namespace):
    """(the job ``--from`` states at its own world size, the cluster to plan on): with ``--num-gpus N`` where the
    files state another world size, the job is read at its own size and the search runs on N GPUs of the same kind
    and node size (the job rescaled); else both are the job's (``--num-gpus`` then gives a size the files leave
    out)."""
    tp, pp, cp = args.tp or 1, args.pp or 1, args.cp or 1
    if args.num_gpus is None:
        job = read_job_from_args(args, tp=tp, pp=pp, cp=cp)
        return job, job.cluster
    try:  # the size the files state, if they state one
        job = read_job_from_args(argparse.Namespace(**{**vars(args), "num_gpus": None}), tp=tp, pp=pp, cp=cp)
    except InputError:  # they do not (or say more is missing): --num-gpus is the job's size
        job = read_job_from_args(args, tp=tp, pp=pp, cp=cp)
        return job, job.cluster
    if job.cluster.num_gpus == args.num_gpus:
        return job, job.cluster
    from autotune.specs.loading import load_cluster

    # the job's node size where it spans nodes; a one-node job's says nothing of a node: the GPU preset's
    per_node = args.gpus_per_node or (job.cluster.gpus_per_node if job.cluster.num_nodes > 1 else None)
    gpu = args.gpu or (job.cluster.gpu.name if args.cluster is None else None)  # a plan.json states its GPU
    target = load_cluster(gpu=gpu, num_gpus=args.num_gpus, cluster_path=args.cluster, gpus_per_node=per_node)
    n = job.cluster.num_gpus
    print(f"autotune {args.command}: the job runs on {n:,} GPU{'s' if n != 1 else ''} (its files); planning it on "
          f"{target.num_gpus:,} (--num-gpus): same model, global batch {job.plan.global_batch_size:,}, sequence "
          f"{job.plan.seq_len:,}, engine and precision", file=sys.stderr)
    return job, target


def _rescaled_lines(current, best, target, best_here) -> list[str]:
    """What the planner's first plan on ``target`` GPUs gives against the job on its own size: tokens/s, per GPU, the
    speed-up, and how much of it the plan change (``best_here``: the planner's first plan on the job's own GPUs, or
    None) and the scale each give."""
    n0, n1 = current.cluster.num_gpus, target.num_gpus
    tps0, tps1 = current.time.tokens_per_s, best.time.tokens_per_s
    head = (f"#1 on {n1:,} GPUs: {tps1:,.0f} tokens/s ({tps1 / n1:,.0f} per GPU) against the job's {tps0:,.0f} on "
            f"{n0:,} ({tps0 / n0:,.0f} per GPU)")
    if tps0 <= 0:
        return [head]
    spread = max(current.uncertainty.relative, best.uncertainty.relative)
    lines = [head, f"speed-up x{tps1 / tps0:.2f} ±{spread:.1%} for x{n1 / n0:.2f} the GPUs"]
    if best_here is not None and best_here.time.tokens_per_s > 0:
        here = best_here.time.tokens_per_s
        lines[-1] += (f": the plan change alone gives {here / tps0 - 1:+.1%} on the job's {n0:,} GPUs (the planner's "
                      f"first plan there, {here:,.0f} tokens/s), the scale {tps1 / here * n0 / n1:.0%} of linear "
                      f"(tokens per GPU-second, best plan against best plan)")
    else:
        lines[-1] += f": {tps1 / tps0 * n0 / n1:.0%} of linear scaling (tokens per GPU-second)"
    return lines


def plan_from_job(args: argparse.Namespace) -> int:
    """Rank the alternatives to the job ``--from`` states: same engine, model, global batch, sequence length and
    precision (unless --engine / --precision say otherwise); the current job's rank, the diff, the gain."""
    from autotune.report import plan_summary, plan_table

    job, target = job_and_search_cluster(args)
    rescaled = target is not job.cluster
    plan = job.plan
    engines = None if tuple(args.engine) == tuple(ENGINE_NAMES) else args.engine
    limits = dict(tp=args.tp, pp=args.pp, vpp=args.vpp, cp=args.cp, ep=args.ep, dp_replicate=args.dp_replicate,
                  micro_batch_size=args.micro_batch, max_tp=args.max_tp, max_pp=args.max_pp, zero_stages=args.zero,
                  precisions=args.precision, recompute=args.recompute, engines=engines, allow_offload=args.offload,
                  min_headroom_gib=args.min_headroom_gib)
    current, result = alternatives(job, time_settings(args), top_k=args.top_k, asked=run_setting_args(args),
                                   setting_gains=True, cluster=target, **limits)
    order = result.in_order
    rank = None if rescaled else next((i for i, est in enumerate(order, 1) if _key(est.plan) == _key(plan)), None)
    best = order[0] if order else None
    diff = plan_diff(plan, best.plan) if best is not None else {}
    cur_tps, u_cur = current.time.tokens_per_s, current.uncertainty
    gain = best.time.tokens_per_s / cur_tps - 1 if best is not None and cur_tps > 0 else None
    spread = max(u_cur.relative, best.uncertainty.relative) if best is not None else u_cur.relative
    tied = best is not None and (not diff or (rank is not None and rank <= result.tied) or
                                 (gain is not None and abs(gain) <= spread))
    best_here = None
    if rescaled:
        tied = False  # another cluster: the job is not among the plans searched
        here = alternatives(job, time_settings(args), top_k=1, asked=run_setting_args(args), **limits)[1].in_order
        best_here = here[0] if here else None  # the planner's first plan on the job's own GPUs: the plan's share
    if args.json:
        print(json_text({"current": current.to_dict(), "current_fits": current.memory.fits, "current_rank": rank,
                         "diff": {k: list(v) for k, v in diff.items()}, "gain": gain, "gain_uncertainty": spread,
                         "tied": tied, "search": result.to_dict(),
                         "num_gpus": {"job": job.cluster.num_gpus, "planned": target.num_gpus},
                         "best_on_job_gpus": None if best_here is None else best_here.to_dict()}))
        return EXIT_OK
    fit = "fits" if current.memory.fits else "does NOT fit in memory"
    low, high = u_cur.bounds(cur_tps)
    print(f"current job: {plan.engine} {plan_summary(plan)}: {cur_tps:,.0f} tokens/s ±{u_cur.relative:.1%} "
          f"({low:,.0f}-{high:,.0f}), MFU {current.time.mfu:.1%}, {fit}")
    if rescaled:
        print(f"planned on {target.num_gpus:,} GPUs (--num-gpus) instead of its {job.cluster.num_gpus:,}")
    elif rank is not None:
        print(f"its rank among the {result.num_feasible:,} feasible plans: #{rank}")
    else:
        print(f"it is not among the {result.num_feasible:,} feasible plans searched "
              f"({'it does not fit' if not current.memory.fits else _outside(plan, order)})")
    print()
    if not order:  # why, and the way out (the GPU count the job needs, another split), as `plan` says it
        from autotune.commands.infeasible import no_plan_problems

        raise InputError(no_plan_problems(result, job.model, target, seq_len=plan.seq_len,
                                          global_batch=plan.global_batch_size, batch_given=plan.global_batch_size,
                                          constraints=job_constraints(job, run_setting_args(args), **limits)),
                         subject="request")
    print(plan_table(result))
    print()
    if rescaled:
        changes = ", ".join(f"{k} {a}->{b}" for k, (a, b) in diff.items()) or "none"
        print(f"#1 vs the current job: {changes}")
        print("\n".join(_rescaled_lines(current, best, target, best_here)))
        return EXIT_OK
    if not diff:
        print("the planner's first plan is the current job's: keep it")
    else:
        changes = ", ".join(f"{k} {a}->{b}" for k, (a, b) in diff.items())
        print(f"#1 vs the current job: {changes}")
        verdict = ("a tie: within the prediction's uncertainty, the simpler plan is ranked first" if tied
                   else "beyond the uncertainty")
        print(f"predicted gain: {gain:+.1%} tokens/s ±{spread:.1%} ({verdict})" if gain is not None else
              "predicted gain: unknown")
    return EXIT_OK


def best_alternative(args: argparse.Namespace):
    """The Estimate of the planner's #1 alternative to the job ``--from`` states (``plan --from``'s first row), for
    ``emit --best``; on ``--num-gpus`` GPUs where they differ from the files' (:func:`job_and_search_cluster`)."""
    from autotune.report import plan_summary

    job, target = job_and_search_cluster(args)
    current, result = alternatives(job, time_settings(args), top_k=1, asked=run_setting_args(args), cluster=target)
    if not result.in_order:
        raise InputError([f"no alternative of the {result.num_enumerated:,} plans searched is feasible: "
                          + ", ".join(f"{k} {v:,}" for k, v in result.rejections.items())], subject="emit --best")
    best = result.in_order[0]
    gain = best.time.tokens_per_s / current.time.tokens_per_s - 1 if current.time.tokens_per_s > 0 else 0.0
    on = f" on {target.num_gpus:,} GPUs" if target is not job.cluster else ""
    print(f"autotune emit: --best writes {best.plan.engine} {plan_summary(best.plan)}{on} (predicted {gain:+.1%} "
          f"tokens/s ±{best.uncertainty.relative:.1%} over the job's {plan_summary(job.plan)} on "
          f"{job.cluster.num_gpus:,})", file=sys.stderr)
    return best
