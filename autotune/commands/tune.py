"""`autotune tune`: an Optuna study of short profiling trials on this machine; the winner emitted.

Exit codes: 0 a trial completed (winner in OUT/winner), 1 every trial failed (the reasons are
printed, the study is kept), 2 bad input before any trial, 130 Ctrl-C (the study is resumable).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

__all__ = ["register", "run"]


def register(subparsers) -> None:
    from autotune.cli import _add_common, _int_list, _positive_int, _preset_epilog, _str_list

    p = subparsers.add_parser("tune", help="Optuna study of short profiling trials on real hardware",
                              epilog=_preset_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(p)
    s = p.add_argument_group("search space (default: everything the planner allows)")
    for dim in ("tp", "pp", "cp"):
        s.add_argument(f"--{dim}", type=_positive_int, help=f"fix {dim}")
    s.add_argument("--micro-batch", type=_positive_int, help="fix the micro-batch size")
    s.add_argument("--max-micro-batch", type=_positive_int, default=16, help="largest micro-batch (default 16)")
    s.add_argument("--zero", type=_int_list((0, 1, 2, 3)), default=(0, 1, 2, 3), help="allowed ZeRO stages, e.g. 1,3")
    s.add_argument("--recompute", type=_str_list(("none", "selective", "full")), default=("none", "selective", "full"))
    s.add_argument("--framework", type=_str_list(("megatron", "deepspeed")), default=("deepspeed",),
                   help="engines to try (default deepspeed: what the builtin workload runs)")
    s.add_argument("--offload", action=argparse.BooleanOptionalAction, default=True, help="allow ZeRO offload")
    t = p.add_argument_group("study")
    t.add_argument("--trials", type=_positive_int, default=8, help="finished trials the study should hold (default 8)")
    t.add_argument("--timeout", type=float, help="stop starting trials after this many seconds")
    t.add_argument("--top-k", type=_positive_int, default=3, help="planner's best plans measured first (default 3)")
    t.add_argument("--steps", type=_positive_int, default=6, help="measured steps per trial (default 6)")
    t.add_argument("--warmup-steps", type=int, default=2, help="unmeasured steps first (default 2)")
    t.add_argument("--trial-timeout", type=float, default=300.0, help="a trial is 'hung' past this (default 300 s)")
    t.add_argument("--host-memory-limit-gib", type=float, help="a trial is 'oom' past this resident memory")
    t.add_argument("--num-layers", type=_positive_int, help="builtin workload: run this many layers")
    t.add_argument("--storage", help="Optuna storage URL (default sqlite:///OUT/study.db)")
    t.add_argument("--study-name", default="autotune")
    t.add_argument("--resume", action="store_true", help="continue the study (trials left running are failed)")
    t.add_argument("--worker", action="store_true", help="join a study other processes also run")
    t.add_argument("--calibration", metavar="FILE", help="write the fitted efficiency here (estimate/plan read it)")
    t.add_argument("--out", default="out/tune", help="output folder (default out/tune)")
    w = p.add_argument_group("workload")
    w.add_argument("--workload", choices=("builtin", "script", "command"), default="builtin")
    w.add_argument("--script", help="your DeepSpeed script (arguments after --)")
    w.add_argument("--command", dest="command_template", help="command template ({nproc}, {ds_config}, {workdir}, {megatron_args})")
    w.add_argument("--metric-pattern", help="regex with (?P<step_time_s>...) or (?P<tokens_per_s>...)")
    w.add_argument("script_args", nargs="*", help=argparse.SUPPRESS)
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


def run(args: argparse.Namespace) -> int:
    from autotune.cli import _load_inputs
    from autotune.cost.efficiency import DEFAULT_EFFICIENCY
    from autotune.emit.bundle import write_bundle
    from autotune.errors import InputError
    from autotune.report import plan_summary
    from autotune.search.space import SearchConstraints
    from autotune.tune.calibrate import format_report
    from autotune.tune.progress import ProgressLine, summary_table, write_plots
    from autotune.tune.study import tune

    model, cluster = _load_inputs(args)
    workload, problems = _workload(args)
    problems += _machine_problems(cluster)
    if args.warmup_steps < 0:
        problems.append("--warmup-steps must be >= 0")
    if args.resume and args.worker:
        problems.append("give --resume or --worker, not both")
    if problems:
        raise InputError(problems, subject="tune")
    constraints = SearchConstraints(tp=args.tp, pp=args.pp, cp=args.cp, micro_batch_size=args.micro_batch,
                                    max_micro_batch_size=args.max_micro_batch, zero_stages=args.zero,
                                    recompute=args.recompute, frameworks=args.framework, allow_offload=args.offload)
    out = Path(args.out)
    progress = ProgressLine(args.trials)
    limit = int(args.host_memory_limit_gib * 2**30) if args.host_memory_limit_gib else None
    try:
        result = tune(model, cluster, seq_len=args.seq_len, global_batch=args.global_batch or cluster.num_gpus,
                      constraints=constraints, workload=workload, out_dir=out, trials=args.trials,
                      timeout_s=args.timeout, trial_timeout_s=args.trial_timeout, top_k=args.top_k,
                      steps=args.steps, warmup_steps=args.warmup_steps, storage_url=args.storage,
                      study_name=args.study_name, resume=args.resume, worker=args.worker,
                      host_memory_limit_bytes=limit, num_layers=args.num_layers,
                      calibration_path=args.calibration, start_efficiency=DEFAULT_EFFICIENCY, progress=progress)
    except KeyboardInterrupt:
        progress.close()
        print("autotune tune: interrupted; the running trial was stopped and marked FAIL 'interrupted'. "
              "Continue with --resume.", file=sys.stderr)
        return 130
    progress.close()
    log = sys.stderr if args.json else sys.stdout
    print(summary_table(result.trials), file=log)
    plots = write_plots(result.trials, out, result.calibration)
    if result.calibration is not None:
        print("\ncalibration (predicted vs measured step time):\n" + format_report(result.calibration), file=log)
        if args.calibration:
            print(f"calibration saved to {args.calibration}", file=log)
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
    write_bundle(est, winner, force=True,
                 measured={k: v for k, v in measurement.items() if k != "step_times_s" and v is not None})
    if args.json:
        print(json.dumps({"best": {"trial": best.number, "plan": best.user_attrs["plan"],
                                   "measurement": measurement, "predicted": best.user_attrs.get("predicted")},
                          "states": result.state_counts, "storage": result.storage_url,
                          "study_name": result.study_name, "winner_dir": str(winner),
                          "plots": [str(p) for p in plots],
                          "calibration": result.calibration.to_dict() if result.calibration else None}, indent=2))
    else:
        print(f"\nbest: trial {best.number} {plan_summary(est.plan)}: {measurement['tokens_per_s']:,.0f} tokens/s, "
              f"step {measurement['step_time_s']:.4f} s")
        print(f"states: {', '.join(f'{k} {v}' for k, v in sorted(result.state_counts.items()))}")
        print(f"winner written to {winner}/ (plan.md has the measured numbers); plots: "
              f"{', '.join(str(p) for p in plots) or 'none'}; study: {result.storage_url}")
    return 0
