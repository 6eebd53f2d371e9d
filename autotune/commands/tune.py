"""`autotune tune`: an Optuna study of short profiling trials on this machine; the winner emitted.

Exit codes: 0 a trial completed (winner in OUT/winner), 1 every trial failed (the reasons are
printed, the study is kept), 2 bad input (every flag is checked before the study is created),
130 Ctrl-C, 143 SIGTERM, 129 SIGHUP (each ends every trial process; the study is resumable).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import signal
import sys
from pathlib import Path

__all__ = ["register", "run"]


def register(subparsers) -> None:
    from autotune.commands import add_common as _add_common
    from autotune.commands import int_list as _int_list
    from autotune.commands import positive_int as _positive_int
    from autotune.commands import preset_epilog as _preset_epilog
    from autotune.commands import str_list as _str_list
    from autotune.specs.plan import ENGINE_NAMES

    p = subparsers.add_parser("tune", help="Optuna study of short profiling trials on real hardware",
                              epilog=_preset_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(p)
    s = p.add_argument_group("search space (default: everything the planner allows)")
    for dim in ("tp", "pp", "cp"):
        s.add_argument(f"--{dim}", type=_positive_int, help=f"fix {dim}")
    s.add_argument("--dp-replicate", type=_positive_int,
                   help="fix the hybrid-sharding (FSDP2 HSDP) replica groups (default: search 1 and whole-node shards)")
    s.add_argument("--micro-batch", type=_positive_int, help="fix the micro-batch size")
    s.add_argument("--max-micro-batch", type=_positive_int, default=16, help="largest micro-batch (default 16)")
    s.add_argument("--zero", type=_int_list((0, 1, 2, 3)), default=(0, 1, 2, 3), help="allowed ZeRO stages, e.g. 1,3")
    s.add_argument("--recompute", type=_str_list(("none", "selective", "full")), default=("none", "selective", "full"),
                   help="allowed recompute modes, e.g. none,selective (default all)")
    s.add_argument("--engine", "--framework", dest="engine", type=_str_list(ENGINE_NAMES),
                   help="engines to try (default deepspeed, or the --from job's; --framework is an alias)")
    s.add_argument("--offload", action=argparse.BooleanOptionalAction, default=True, help="allow ZeRO offload")
    t = p.add_argument_group("study")
    t.add_argument("--trials", type=_positive_int, default=8, help="finished trials the study should hold (default 8)")
    t.add_argument("--timeout", type=float, help="stop starting trials after this many seconds")
    t.add_argument("--prune-ratio", type=float, default=1.5,
                   help="stop a trial whose step time exceeds this multiple of the best one (default 1.5; 0: never)")
    t.add_argument("--finalists", type=int, default=3,
                   help="re-run this many best plans before declaring the winner (default 3; 0: no re-runs)")
    t.add_argument("--finalist-runs", type=int, default=2,
                   help="re-runs of each finalist, interleaved; the winner has the best median (default 2)")
    t.add_argument("--top-k", type=_positive_int, default=3, help="planner's best plans measured first (default 3)")
    t.add_argument("--steps", type=_positive_int, default=6,
                   help="measured steps per trial (default 6; a --command is ended once it printed that many after "
                        "the warm-up, and its {steps} is the two together; a --script is timed by DeepSpeed, which "
                        "times one step)")
    t.add_argument("--warmup-steps", type=int, default=2, help="unmeasured steps first (default 2)")
    t.add_argument("--trial-timeout", type=float, default=300.0, help="a trial is 'hung' past this (default 300 s)")
    t.add_argument("--host-memory-limit-gib", type=float, help="a trial is 'oom' past this resident memory")
    t.add_argument("--num-layers", type=_positive_int, help="builtin workload: run this many layers")
    t.add_argument("--storage", help="Optuna storage URL (default sqlite:///OUT/study.db)")
    t.add_argument("--study-name", default="autotune", help="the Optuna study's name in the storage (default autotune)")
    t.add_argument("--resume", action="store_true", help="continue the study (trials left running are failed)")
    t.add_argument("--worker", action="store_true", help="join a study other processes also run")
    t.add_argument("--calibration", metavar="FILE",
                   help="write the fitted efficiency here (default OUT/cal.json; estimate/plan --calibration read it)")
    t.add_argument("--out", default="out/tune", help="output folder (default out/tune)")
    w = p.add_argument_group("workload")
    w.add_argument("--workload", choices=("builtin", "script", "command"), default="builtin",
                   help="what a trial runs: the built-in transformer, your --script, or a --command (default builtin)")
    w.add_argument("--script", help="your DeepSpeed script (arguments after --)")
    from autotune.tune.trialspec import placeholder_list

    w.add_argument("--command", dest="command_template",
                   help=f"command template; placeholders {placeholder_list()} ({{steps}}: warm-up + measured steps; "
                        "{accelerate_config}: engine hf / fsdp plans; {torchtitan_config}: fsdp, --engine-version fsdp=0.2)")
    w.add_argument("--metric-pattern", help="regex with (?P<step_time_s>...) or (?P<tokens_per_s>...)")
    w.add_argument("script_args", nargs="*", help=argparse.SUPPRESS)
    lg = p.add_argument_group("launcher (autotune/tune/launchers.py)")
    lg.add_argument("--launcher", choices=("torchrun", "deepspeed", "slurm"), default="torchrun",
                    help="how a trial's ranks start: torchrun on this machine (default), the DeepSpeed launcher "
                         "(--hostfile), or SLURM (an srun step inside the allocation, else an sbatch job per trial)")
    lg.add_argument("--hostfile", help="deepspeed: MPI-style hostfile ('HOST slots=N' lines)")
    lg.add_argument("--include", default="", help="deepspeed: hosts/slots to use, e.g. 'node1:0,1@node2'")
    lg.add_argument("--exclude", default="", help="deepspeed: hosts/slots to leave out")
    from autotune.commands.engine_version import add_engine_version
    from autotune.commands.from_job import add_from

    add_engine_version(p)  # the candidates' release defaults, the trials' and the winner's files
    add_from(p, "measure first, beside the planner's best plans,")
    p.set_defaults(handler=run)


def _check_script(path: str) -> list[str]:
    if not Path(path).is_file():
        return [f"--script {path}: no such file"]
    import subprocess

    # Compiled, not imported: importing a training script may start training.
    proc = subprocess.run([sys.executable, "-m", "py_compile", path], capture_output=True, text=True)
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return [f"--script {path} does not compile: {last}"]
    return []


def _workload(args) -> tuple[object, list[str]]:
    from autotune.tune.launch import command_template_problem
    from autotune.tune.trial import Workload

    problems: list[str] = []
    if args.workload == "script":
        if not args.script:
            problems.append("--workload script needs --script PATH")
        else:
            problems += _check_script(args.script)
        return Workload(kind="script", script=args.script, script_args=tuple(args.script_args)), problems
    if args.workload == "command":
        if not args.command_template or not args.metric_pattern:
            problems.append("--workload command needs --command TEMPLATE and --metric-pattern REGEX")
        elif (why := command_template_problem(args.command_template)):  # a failed trial would use up the study
            problems.append(why)
        return Workload(kind="command", command=args.command_template, metric_pattern=args.metric_pattern), problems
    if args.script or args.command_template:
        problems.append("--script / --command need --workload script / command")
    return Workload(kind="builtin"), problems


def _machine_problems(cluster) -> list[str]:
    n = cluster.num_gpus
    if cluster.gpu.name == "cpu":
        cores = os.cpu_count() or 1
        if n > cores * 4:
            return [f"--num-gpus {n}: this machine runs at most {cores * 4} CPU ranks ({cores} cores x 4)"]
        return []
    try:
        import torch
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        have = 0
    if n > have:
        return [f"--num-gpus {n}: this machine has {have} GPUs (trials run here; use --gpu cpu for CPU trials)"]
    return []


# flag -> (smallest, largest, why the largest); the common flags are checked by autotune.commands.flag_problems
_INT_FLAGS = {"trials": (1, 100_000, "more trials than any study runs"), "steps": (1, 100_000, "a trial is short"),
              "max_micro_batch": (1, 2**24, "the largest batch accepted"), "finalists": (0, 100, ""),
              "finalist_runs": (1, 100, "")}
_WARMUP_PER_STEP, _MAX_WARMUP = 100, 10_000  # --warmup-steps at most 100 x --steps and at most 10,000
_FLOAT_FLAGS = {"timeout": (10**8, "three years"), "trial_timeout": (10**7, "115 days"),
                "host_memory_limit_gib": (2.0**20, "a PiB")}


def _tune_problems(args: argparse.Namespace, model) -> list[str]:
    """Every tune flag that cannot work, found before the study is created (one line each)."""
    from autotune.commands import MAX_STEPS
    from autotune.inputs import out_folder_problem, path_problem, range_problem, write_problem
    from autotune.rules import sequence_problems

    problems = [message for _, message in sequence_problems(model, args.seq_len)] if model is not None else []
    for dest, (lo, hi, why) in _INT_FLAGS.items():
        problems.append(range_problem(f"--{dest.replace('_', '-')}", getattr(args, dest), lo=lo, hi=hi, why_hi=why))
    for dest, (hi, why) in _FLOAT_FLAGS.items():
        value = getattr(args, dest)
        if value is not None:
            problems.append(range_problem(f"--{dest.replace('_', '-')}", value, lo=0, hi=hi, lo_open=True,
                                          why_hi=why))
    if args.prune_ratio != 0:
        problems.append(range_problem("--prune-ratio", args.prune_ratio, lo=1.0, hi=1000.0, lo_open=True,
                                      why_hi="0 turns pruning off"))
    # Warm-up steps run unmeasured before each trial's measured ones: a few settle the allocator and the kernels.
    # (--warmup-steps below 0 or above 10^10 is reported with the common flags.)
    warmup, steps = args.warmup_steps, args.steps
    if isinstance(warmup, int) and isinstance(steps, int) and steps >= 1 and 0 <= warmup <= MAX_STEPS:
        limit = min(_WARMUP_PER_STEP * steps, _MAX_WARMUP)
        if warmup > limit:
            problems.append(f"--warmup-steps {warmup:,} with --steps {steps:,}: warm-up must be at most "
                            f"{_WARMUP_PER_STEP} x --steps and at most {_MAX_WARMUP:,} (here {limit:,}), since every "
                            f"trial runs its warm-up unmeasured before the measured steps; use --warmup-steps "
                            f"{min(2, limit)} (a few settle the allocator and kernels) or raise --steps")
    if args.finalists >= 2 and args.finalist_runs < 2:
        problems.append(f"--finalist-runs must be >= 2 (a median of one run is one lucky measurement), got "
                        f"{args.finalist_runs}; or --finalists 0 for no re-runs")
    if args.num_layers is not None and args.workload != "builtin":  # the trial would run the whole model
        problems.append(f"--num-layers cuts the builtin workload's model; a --workload {args.workload} builds its own, "
                        "which the tuner cannot cut: drop --num-layers (cut the layers in your own program)")
    if args.num_layers is not None and model is not None:
        problems.append(range_problem("--num-layers", args.num_layers, lo=1, hi=model.num_layers,
                                      why_hi=f"{model.name} has {model.num_layers} layers; the flag cuts them"))
    if args.metric_pattern is not None:
        try:
            rx = re.compile(args.metric_pattern)
        except re.error as e:
            problems.append(f"--metric-pattern {args.metric_pattern!r} is not a valid regex: {e}")
        else:
            if not {"step_time_s", "tokens_per_s"} & set(rx.groupindex):
                problems.append(f"--metric-pattern {args.metric_pattern!r} needs a named group (?P<step_time_s>...) "
                                "or (?P<tokens_per_s>...)")
    problems.append(path_problem(args.out, flag="--out") or out_folder_problem(args.out))
    if args.calibration is not None:
        problems.append(path_problem(args.calibration, flag="--calibration"))
        cal, parent = Path(args.calibration), Path(args.calibration).parent
        if cal.is_dir():
            problems.append(f"--calibration {args.calibration!r} is a folder: give a file name, e.g. "
                            f"{cal / 'cal.json'}")
        elif not parent.is_dir():
            problems.append(f"--calibration {args.calibration!r}: the folder {str(parent)!r} does not exist: "
                            "create it or give another path")
        elif (why := write_problem(parent)):  # a test write: os.access passes /proc, whose write fails at the end
            problems.append(f"--calibration {args.calibration!r}: cannot write in {str(parent)!r} ({why}): give "
                            "a path in a writable folder")
    if args.resume and args.worker:
        problems.append("give --resume or --worker, not both")
    return [p for p in problems if p]


class _Stopped(KeyboardInterrupt):
    """SIGTERM / SIGHUP, handled like Ctrl-C (every trial process ended, the study resumable)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum, self.what = signum, signal.Signals(signum).name


def _on_signal(signum, frame) -> None:
    # Later signals must not interrupt the cleanup this one starts: record them only.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    raise _Stopped(signum)


def _install() -> dict:
    saved = {signal.SIGINT: signal.getsignal(signal.SIGINT)}
    saved.update({sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)})
    return saved


def _restore(handlers: dict) -> None:
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)


def run(args: argparse.Namespace) -> int:
    from autotune.bundle.writer import write_bundle
    from autotune.commands import load_inputs as _load_inputs
    from autotune.cost.efficiency import DEFAULT_EFFICIENCY
    from autotune.errors import InputError
    from autotune.report import plan_summary
    from autotune.search.space import SearchConstraints
    from autotune.tune.calibrate import format_report
    from autotune.tune.progress import ProgressLine, finalists_table, summary_table, write_plots
    from autotune.tune.study import tune

    job = current = None
    if args.from_files:  # the job the user runs now: its model, GPUs, batch and sequence; measured first
        from autotune.commands.from_job import job_and_search_cluster

        job, cluster = job_and_search_cluster(args)  # --num-gpus N other than the files': the job on N GPUs
        model = job.model
        args.seq_len, args.global_batch = job.plan.seq_len, job.plan.global_batch_size
        if cluster is job.cluster:
            current = job.plan
        else:  # its plan runs on the job's own GPUs, not these: no trial of it to compare with
            print(f"autotune tune: the current job's plan needs its {job.cluster.num_gpus:,} GPUs: the study "
                  f"measures the planner's plans on {cluster.num_gpus:,}, not the job itself", file=sys.stderr)
    else:
        args.seq_len = 4096 if args.seq_len is None else args.seq_len
        model, cluster = _load_inputs(args)
    args.engine = args.engine or ((job.plan.engine,) if job is not None else ("deepspeed",))
    workload, problems = _workload(args)
    from autotune.tune.launchers import LaunchSettings, launcher_for

    launch = LaunchSettings(name=args.launcher, hostfile=args.hostfile, include=args.include, exclude=args.exclude)
    launcher = launcher_for(launch)
    problems += launcher.problems(cluster, workload.kind)
    if args.launcher == "torchrun":  # the other launchers place ranks on the hostfile's / allocation's nodes
        problems += _machine_problems(cluster)
    problems += _tune_problems(args, model)
    if problems:
        raise InputError(problems, subject="tune")
    from autotune.commands.engine_version import engine_releases, options_for_versions, print_versions
    from autotune.emit.options import EmitOptions

    releases = engine_releases(args, args.engine)  # an unmodelled release: exit 2, naming the modelled ones
    print_versions(releases, command="tune")
    files = options_for_versions(EmitOptions(), releases)  # torchtitan TOML / module, Megatron flag table
    from autotune.commands.emit import hf_wrap_class

    if wrap := hf_wrap_class(getattr(args, "model", None)):  # {accelerate_config}'s FSDP2 wrap, as emit names it
        files = dataclasses.replace(files, launch=dataclasses.replace(files.launch, wrap_class=wrap))
    constraints = SearchConstraints(tp=args.tp, pp=args.pp, cp=args.cp, dp_replicate=args.dp_replicate,
                                    micro_batch_size=args.micro_batch,
                                    max_micro_batch_size=args.max_micro_batch, zero_stages=args.zero,
                                    recompute=args.recompute, engines=args.engine, allow_offload=args.offload,
                                    engine_versions={e: release for e, (release, _) in releases.items()})
    out = Path(args.out)
    progress = ProgressLine(args.trials, finalist_runs=0 if args.worker or args.finalists < 2
                            else args.finalists * args.finalist_runs)
    limit = int(args.host_memory_limit_gib * 2**30) if args.host_memory_limit_gib else None
    from optuna.exceptions import StorageInternalError

    handlers, existed = _install(), out.exists()
    try:
        result = tune(model, cluster, seq_len=args.seq_len, global_batch=args.global_batch or cluster.num_gpus,
                      constraints=constraints, workload=workload, out_dir=out, trials=args.trials,
                      timeout_s=args.timeout, trial_timeout_s=args.trial_timeout, top_k=args.top_k,
                      steps=args.steps, warmup_steps=args.warmup_steps, storage_url=args.storage,
                      study_name=args.study_name, resume=args.resume, worker=args.worker,
                      host_memory_limit_bytes=limit, num_layers=args.num_layers,
                      calibration_path=args.calibration, launcher=launch, start_efficiency=DEFAULT_EFFICIENCY,
                      finalists=args.finalists, finalist_runs=args.finalist_runs,
                      prune_ratio=args.prune_ratio or None, progress=progress, emit_options=files,
                      current_job=current)
    except InputError:  # refused before any trial (a storage, a resume of another job): no empty --out left
        with contextlib.suppress(OSError):
            None if existed else out.rmdir()
        raise
    except StorageInternalError as err:
        progress.close()
        cause = err.__cause__ or err.__context__ or err
        print(f"autotune tune: the study's storage could not be written ({type(cause).__name__}: "
              f"{str(cause).splitlines()[0][:300] if str(cause) else 'no detail'}). A full disk or a read-only "
              f"folder does this: free space (`df -h {out}`) or give another --storage / --out. The trials stored "
              "so far are kept; continue with --resume.", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:
        progress.close()
        what = getattr(err, "what", "Ctrl-C")
        print(f"autotune tune: interrupted ({what}); the running processes were ended: a trial that was running is "
              "marked FAIL 'interrupted', a finalist re-run in progress is dropped (those finished are kept). "
              "Continue with --resume.", file=sys.stderr)
        return 128 + getattr(err, "signum", signal.SIGINT)
    finally:
        _restore(handlers)
    progress.close()
    log = sys.stderr if args.json else sys.stdout
    print(summary_table(result.trials), file=log)
    if result.not_measured:
        print(f"\nnot measured (never launched): {result.not_measured}", file=log)
    from autotune.tune.current_job import current_job_json, current_job_report

    if result.current_job is not None:
        print("\n" + current_job_report(result.trials, result.current_job), file=log)
    plots = write_plots(result.trials, out, result.calibration)
    if result.finalists:
        print("\nfinalists, re-run alternately:\n" + finalists_table(result.finalists), file=log)
    if result.calibration is not None:
        of = (f", both of the {args.num_layers}-layer cut the trials ran"  # tune --num-layers: as the trials ran
              if args.num_layers not in (None, model.num_layers) else "")
        print(f"\ncalibration (predicted vs measured step time{of}):\n" + format_report(result.calibration), file=log)
        if result.calibration_path:
            print(f"calibration saved to {result.calibration_path}", file=log)
    if result.best is None:
        print(f"autotune tune: {result.failure_summary}\n(study kept in {result.storage_url}, "
              f"name {result.study_name!r})", file=sys.stderr)
        if args.json:
            print(json.dumps({"best": None, "states": result.state_counts, "reason": result.failure_summary,
                              "storage": result.storage_url}, indent=2))
        return 1
    best, est = result.best, result.best_estimate
    measurement = best.user_attrs["measurement"]
    winner = out / "winner"
    kept: list[str] = []  # a winner folder with the user's own files in it is set aside, said
    measured = {k: v for k, v in measurement.items() if k != "step_times_s" and v is not None}
    if args.num_layers and args.num_layers != model.num_layers:  # a cut of the model: no ratio to the whole's
        cut = f" ({args.num_layers} of {model.num_layers} layers)"
        measured = {"measured on": f"{args.num_layers} of the model's {model.num_layers} layers (tune --num-layers):"
                                   " not the prediction's model", **{k + cut: v for k, v in measured.items()}}
    write_bundle(est, winner, files, force=True, notes=kept, measured=measured)
    for note in kept:
        print(f"autotune tune: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps({"best": {"trial": best.number, "plan": best.user_attrs["plan"],
                                   "measurement": measurement, "predicted": best.user_attrs.get("predicted")},
                          "states": result.state_counts, "storage": result.storage_url,
                          "study_name": result.study_name, "winner_dir": str(winner),
                          "engine_versions": dict(constraints.engine_versions),
                          "plots": [str(p) for p in plots],
                          "finalists": [{"trial": f.trial.number, "trial_tokens_per_s": f.trial.value,
                                         "rerun_tokens_per_s": list(f.runs_tokens_per_s), "median": f.median,
                                         "spread": f.spread} for f in result.finalists],
                          "calibration_path": result.calibration_path, "not_measured": result.not_measured,
                          "current_job": current_job_json(result.trials, result.current_job),
                          "calibration": result.calibration.to_dict() if result.calibration else None}, indent=2))
    else:
        won = next((f.median for f in result.finalists if f.trial.number == best.number and f.median), None)
        print(f"\nbest: trial {best.number} {plan_summary(est.plan)}: {measurement['tokens_per_s']:,.0f} tokens/s, "
              f"step {measurement['step_time_s']:.4f} s"
              + (f" (its first run; the median of its re-runs, which made it the winner: {won:,.0f})" if won else ""))
        print(f"states: {', '.join(f'{k} {v}' for k, v in sorted(result.state_counts.items()))}")
        print(f"winner written to {winner}/ (plan.md has the measured numbers); plots: "
              f"{', '.join(str(p) for p in plots) or 'none'}; study: {result.storage_url}")
    return 0

