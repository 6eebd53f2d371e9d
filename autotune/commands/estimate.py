"""`autotune estimate`: one plan's per-GPU memory ledger and step time."""

from __future__ import annotations

import argparse
from dataclasses import replace

from autotune.commands import (
    EXIT_OK,
    add_common,
    add_goodput,
    add_plan_flags,
    goodput_inputs,
    json_text,
    load_inputs,
    peft_args,
    preset_epilog,
    time_settings,
)
from autotune.commands.run_code_flags import run_code_plan_problems, run_code_settings, run_code_time_settings
from autotune.errors import InputError
from autotune.commands.engine_version import (
    add_engine_version,
    engine_releases,
    print_versions,
    release_cost_settings,
    release_run_settings,
)

__all__ = ["register", "run", "estimate_from_flags", "flags_estimate"]


def register(sub) -> None:
    est = sub.add_parser("estimate", help="memory ledger and step time of one plan", epilog=preset_epilog(),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(est)
    add_plan_flags(est)
    add_goodput(est)
    from autotune.commands.from_job import add_from

    add_from(est, "estimate", recompute_default=True)
    add_engine_version(est)
    est.set_defaults(handler=run)


def estimate_from_flags(args: argparse.Namespace):
    """The Estimate of the plan the flags state."""
    return flags_estimate(args)[0]


def flags_estimate(args: argparse.Namespace):
    """(the Estimate of the plan the flags state, its MemorySettings, its TimeSettings)."""
    from autotune.api import estimate, make_plan
    from autotune.specs.settings import MemorySettings

    model, cluster = load_inputs(args)
    plan = make_plan(
        model, cluster, global_batch_size=args.global_batch, tp=args.tp, pp=args.pp, cp=args.cp,
        micro_batch_size=args.micro_batch, sequence_parallel=args.sequence_parallel, vpp=args.vpp, ep=args.ep,
        **({} if getattr(args, "etp", None) is None else {"etp": args.etp}),
        zero_stage=args.zero, seq_len=4096 if args.seq_len is None else args.seq_len,
        recompute=args.recompute or "selective",
        recompute_num_layers=args.recompute_num_layers, precision=args.precision, optimizer=args.optimizer,
        offload_optimizer=args.offload_optimizer, offload_param=args.offload_param, nvme_path=args.nvme_path,
        engine=args.engine, dp_replicate=args.dp_replicate, flash_attention=args.flash_attention,
        loss_slots=getattr(args, "loss_slots", None),
        overlap_comm=args.overlap_comm,
        **release_run_settings(args, args.engine, (args.precision,), command=args.command, model=model),
        **peft_args(args),
    )
    refused = run_code_plan_problems(args, plan, cluster)
    if refused:
        raise InputError(refused, subject="run-code flags")
    from autotune.engines import engine_for

    release = engine_releases(args, [plan.engine])[plan.engine][0]
    engine = engine_for(plan)
    if broken := engine.release_problems(release, model, plan):
        from autotune.search.nearest_plan import nearest_valid_plan

        nearest = nearest_valid_plan(model, cluster, plan,
                                     accept=lambda other: not engine.release_problems(release, model, other))
        raise InputError([r.render() for r in broken] + ([nearest.describe()] if nearest else []),
                         subject=f"plan for {plan.engine} {release}")
    # What the release's code does that the plan does not say (torchtitan 0.3's SAC save set): both settings.
    cost = release_cost_settings(args, args.engine)
    settings = MemorySettings(
        cuda_context_bytes=None if args.overhead_gib is None else int(args.overhead_gib * 2**30),
        **({} if args.fragmentation is None else {"fragmentation_fraction": args.fragmentation}), **cost,
        expandable_segments=getattr(args, "expandable_segments", None),
        **run_code_settings(args),
    )
    timing = replace(time_settings(args), **cost, **run_code_time_settings(args))
    return estimate(model, cluster, plan, settings, timing), settings, timing


def run(args: argparse.Namespace) -> int:
    from autotune.legend import plan_legend
    from autotune.report import assumed_settings, memory_table, step_time_table

    from autotune.cost.goodput import goodput

    if getattr(args, "from_files", None):
        from autotune.commands.from_job import job_estimate

        result, memory, timing = job_estimate(args)
    else:
        result, memory, timing = flags_estimate(args)
    model, cluster, plan = result.model, result.cluster, result.plan
    gains = _setting_gains(result, memory, timing)
    from autotune.search.last_stage_hint import last_stage_hint

    lighter = last_stage_hint(result, memory, timing)
    releases = engine_releases(args, [plan.engine])
    if args.engine_version:
        print_versions(releases, command="estimate")
    kept = goodput(result, goodput_inputs(args, cluster))
    from autotune.cost.logged_flops import logged_tflops_per_gpu

    logged = logged_tflops_per_gpu(model, plan, result.time.tokens_per_s)
    if args.json:
        out = result.to_dict()
        if logged is not None:
            out["time"]["megatron_bridge_tflops_per_gpu"] = logged
        print(json_text({**out, "goodput": kept.to_dict(),
                         "assumed_settings": assumed_settings(plan, timing, cluster),
                         "setting_gains": None if gains is None else gains.to_dict(),
                         "last_stage_hint": None if lighter is None else lighter.to_dict()}))
    else:
        print(memory_table(model, cluster, plan, result.memory,
                           host_at_save=kept.policy.host_at_save))
        print()
        print(step_time_table(result.time, logged))
        u = result.uncertainty
        low, high = u.bounds(result.time.tokens_per_s)
        print(f"uncertainty: ±{u.relative:.1%}, {low:,.0f}-{high:,.0f} tokens/s ({u.basis()}); ±{u.relative_90:.1%} "
              "held nine in ten of the shipped runs out of their family")
        print(f"assumed run settings ({plan.engine}): " + "; ".join(assumed_settings(plan, timing, cluster)))
        if gains is not None:
            print(gains.text())
        if lighter is not None:
            print(lighter.text())
        if model.num_mtp_layers and not plan.mtp_layers:
            n = model.num_mtp_layers
            print(f"not trained: the checkpoint's {n} multi-token-prediction module{'s' if n > 1 else ''} "
                  f"(--mtp-layers {n} trains {'them' if n > 1 else 'it'} with --engine megatron, as Megatron-Bridge's "
                  "DeepSeek-V3 recipe does)")
        if model.note:  # what a config.json's count leaves out (a multimodal model's vision tower)
            print(f"model: {model.note}")
        print(kept.summary())
        if kept.policy.save_memory_note:
            print(f"checkpoint: {kept.policy.save_memory_note}")
        print()
        print(plan_legend([plan]))
    return EXIT_OK


def _setting_gains(result, memory, timing):
    """What the opt-in run settings the command line and the job's files left at the engine's defaults would gain
    on this plan (``autotune.search.setting_gains.plan_setting_gains``); None where none gains enough. A setting the
    plan holds (given as a flag, read from the job's files or taken from the engine release's defaults) is kept."""
    from autotune.search.setting_gains import plan_setting_gains
    from autotune.specs.plan import RUN_SETTINGS

    fixed = [name for name in RUN_SETTINGS if getattr(result.plan, name) is not None]
    return plan_setting_gains(result, fixed, memory, timing)
