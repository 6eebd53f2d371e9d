"""Side by side: DeepSpeed's own autotuner and ``autotune tune`` on one user script, this machine.

The script is ``bench/workloads/ds_user_script.py`` (tiny-gpt, 4 layers x 256 wide, random tokens), run as
``--ranks`` gloo CPU ranks; the space is the one DeepSpeed's autotuner searches: ZeRO stage 0-3 x
micro-batch, the global batch fixed (``--global-batch``; micro-batch x accumulation x ranks), bf16,
no offload, tp = pp = 1.

1. DeepSpeed: ``deepspeed --autotuning tune --num_gpus R ds_user_script.py --deepspeed_config
   ds_config.json`` in OUT/deepspeed/, the config's ``autotuning`` block in fast mode (micro-batch
   only per ZeRO stage; deepspeed/autotuning/autotuner.py ``tune_space``) and its ZeRO stage a list
   [0, 1, 2, 3]. ``--ds-micro-batches list`` (default) gives the micro-batches as a list, which
   DeepSpeed then tries as given with accumulation = (largest / micro-batch), so every experiment has
   the global batch fixed; ``auto`` lets it search them itself (capped by ``--max-micro-batch``; its
   first experiments run other global batches). ``--ds-mode run`` also trains with the pick
   afterwards, as ``deepspeed --autotuning run`` does (counted in its wall time). It needs
   ``LOCAL_SIZE=R`` (the CPU accelerator's device count, deepspeed/accelerator/cpu_accelerator.py),
   ``tabulate`` (an assert in Autotuner.__init__) and ``pdsh`` (each experiment's clean-up runs it,
   deepspeed/autotuning/scheduler.py ``clean_up``). Its experiments are the folders of
   OUT/deepspeed/autotuning_results/ (one is the model-info profile run); its pick is
   ``ds_config_optimal.json`` there.
2. autotune: ``python -m autotune tune --workload script --script ds_user_script.py`` on the same
   space (``--model tiny-gpt --engine deepspeed --tp 1 --pp 1 --cp 1 --zero 0,1,2,3 --recompute none
   --no-offload``), its trials and finalist re-runs counted.
3. One harness re-measures both picks: the script under torchrun with each pick's config (``common``:
   the user's config with the pick's ZeRO stage, micro-batch and accumulation, which is exactly
   DeepSpeed's ds_config_optimal.json for its pick; ``own``: each tool's own file, autotune's being
   winner/ds_config.json), alternating A B A B ..., ``--repeats`` times each; a run's throughput is
   global batch x seq len / the median of its measured step times (rank 0's wall clock per
   optimizer step, ``STEP_TIME`` lines).

Both tools' own figures are shown as they wrote them (DeepSpeed's ``latency`` is its timers' mean x
1000, so it reads in the millions; its throughput is samples/s, shown x seq len as tokens/s); the
picks are compared only by the harness. The spread of a tool's runs is (max - min) / median. Run i of
both tools ran next to each other, so the comparison is made on the paired ratios (autotune run i /
DeepSpeed run i), which the machine's drifting load affects less: the target holds when their median
>= 1 - noise (noise: half their range) and autotune's wall time <= half of DeepSpeed's.

Results are saved in OUT/results.json after each step: rerunning the same command skips what is
done (a phase cut short is redone from its start; a larger ``--repeats`` adds harness runs to the
saved ones; ``--fresh`` discards everything).

    flock /tmp/bench.lock python bench/vs_deepspeed_autotuner.py [--out DIR] [--repeats 3] [--fresh]

Exit codes: 0 table printed; 1 a tool or a harness run failed (its log named); 2 missing tools or
bad flags; 130 interrupted (saved results kept).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import signal
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_deepspeed_runs import (  # noqa: E402 - the bench's folder is on sys.path now
    Failed,
    micro_batches,
    remeasure,
    run_autotune,
    run_deepspeed,
)

LABEL = {"deepspeed": "DS", "autotune": "at"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/vs_deepspeed", help="results folder (default out/vs_deepspeed)")
    p.add_argument("--ranks", type=int, default=2, help="gloo CPU ranks (default 2)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default 128)")
    p.add_argument("--global-batch", type=int, default=8, help="sequences per optimizer step (default 8)")
    p.add_argument("--max-micro-batch", type=int, default=4, help="largest micro-batch per rank (default 4)")
    p.add_argument("--zero", default="0,1,2,3", help="ZeRO stages searched by both, e.g. 0,2 (default 0,1,2,3)")
    p.add_argument("--ds-micro-batches", choices=("list", "auto"), default="list",
                   help="DeepSpeed's micro-batches: the divisors as a list, global batch fixed (default), "
                        "or its own search")
    p.add_argument("--ds-mode", choices=("tune", "run"), default="tune",
                   help="deepspeed --autotuning MODE (default tune; run also trains with the pick afterwards)")
    p.add_argument("--trials", type=int, default=5, help="autotune tune --trials (default 5)")
    p.add_argument("--top-k", type=int, default=3, help="autotune tune --top-k (default 3)")
    p.add_argument("--finalists", type=int, default=2, help="autotune tune --finalists (default 2)")
    p.add_argument("--finalist-runs", type=int, default=2, help="autotune tune --finalist-runs (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="harness runs of each pick, alternating (default 3)")
    p.add_argument("--steps", type=int, default=10, help="harness: measured optimizer steps per run (default 10)")
    p.add_argument("--warmup-steps", type=int, default=3, help="harness: unmeasured steps first (default 3)")
    p.add_argument("--remeasure-config", choices=("common", "own"), default="common",
                   help="harness configs: the user's config with each pick (default), or each tool's own file")
    p.add_argument("--phase-timeout-min", type=float, default=60.0,
                   help="a tool's run is stopped past this many minutes (default 60)")
    p.add_argument("--fresh", action="store_true", help="discard the saved results in --out and start over")
    args = p.parse_args(argv)
    problems = [f"--{k.replace('_', '-')} must be >= {lo}, got {getattr(args, k)}" for k, lo in
                (("ranks", 1), ("seq_len", 1), ("global_batch", 1), ("max_micro_batch", 1), ("trials", 1),
                 ("top_k", 1), ("finalists", 0), ("finalist_runs", 1), ("repeats", 1), ("steps", 1),
                 ("warmup_steps", 0), ("phase_timeout_min", 0.1)) if getattr(args, k) < lo]
    try:
        args.zero = tuple(sorted({int(z) for z in args.zero.split(",")}))
    except ValueError:
        args.zero = ()
    if not args.zero or not set(args.zero) <= {0, 1, 2, 3}:
        problems.append("--zero must be a comma-separated list of ZeRO stages 0-3, e.g. 0,1,2,3")
    if args.seq_len > 512:
        problems.append(f"--seq-len must be <= 512 (tiny-gpt's positions), got {args.seq_len}")
    if args.global_batch % args.ranks:
        problems.append(f"--global-batch {args.global_batch} is not a multiple of --ranks {args.ranks}")
    elif not micro_batches(args):
        problems.append(f"no micro-batch <= --max-micro-batch {args.max_micro_batch} divides the "
                        f"{args.global_batch // args.ranks} sequences per rank")
    if problems:
        p.exit(2, "vs_deepspeed_autotuner: " + "\n  ".join(["bad flags:", *problems]) + "\n")
    return args


def missing_tools() -> list[str]:
    """What DeepSpeed's autotuner and the harness need that this machine lacks, with how to get it."""
    out = []
    if shutil.which("pdsh") is None:
        out.append("pdsh (DeepSpeed's autotuner runs it after every experiment, even on one node): "
                   "apt-get update && apt-get install -y pdsh")
    try:
        import tabulate  # noqa: F401  (DeepSpeed's Autotuner asserts it is importable)
    except ImportError:
        out.append("tabulate (DeepSpeed's autotuner refuses to start without it): "
                   "pip install tabulate, or pip install -e '.[bench]'")
    if shutil.which("deepspeed") is None:
        out.append("the `deepspeed` launcher on PATH: pip install deepspeed (it ships the command)")
    for module in ("deepspeed", "hjson"):  # found, not imported (importing deepspeed takes seconds)
        if importlib.util.find_spec(module) is None:
            out.append(f"the Python module {module} (DeepSpeed's autotuner): pip install deepspeed")
    return out


# ---------------------------------------------------------------------------------------------- report


def spread(xs: list[float]) -> float:
    return (max(xs) - min(xs)) / statistics.median(xs) if len(xs) > 1 else 0.0


def minutes(s: float) -> str:
    return f"{int(s // 60)}m{s % 60:04.1f}s"


def table(rows: list[list[str]]) -> str:
    """Rows of [label, DeepSpeed, autotune], left-aligned columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join([lines[0], "-" * max(map(len, lines)), *lines[1:]])


def report(args, state: dict) -> str:
    ds, at = state["deepspeed"], state["autotune"]
    runs = {n: [r["tokens_per_s"] for r in state["remeasure"] if r["tool"] == n] for n in ("deepspeed", "autotune")}
    med = {n: statistics.median(v) for n, v in runs.items()}
    pick = lambda t: f"ZeRO-{t['pick']['zero']} micro-batch {t['pick']['mbs']} x accumulation {t['pick']['gas']}"
    own = ds["own"]
    rows = [["", "DeepSpeed autotuner", "autotune tune"],
            ["experiments", f"{ds['experiments']} + {ds['profile_runs']} model-info profile",
             f"{at['trials']} trials + {at['reruns']} finalist re-runs"],
            ["wall time", minutes(ds["wall_s"]), minutes(at["wall_s"])],
            ["pick", pick(ds), pick(at)],
            ["its own figure, tokens/s", f"{own['tokens_per_s']:,.0f}" if own["tokens_per_s"] else "-",
             f"{at['own']['tokens_per_s']:,.0f}"],
            ["  as it wrote it", f"latency {own['latency']:,.0f}, throughput {own['throughput_samples_per_s']:.2f}"
             if own["tokens_per_s"] else "-", "tokens/s of the winner's trial"],
            [f"re-measured tokens/s, median of {len(runs['deepspeed'])}/{len(runs['autotune'])}",
             f"{med['deepspeed']:,.0f}", f"{med['autotune']:,.0f}"],
            ["spread, (max - min) / median", f"{spread(runs['deepspeed']):.1%}", f"{spread(runs['autotune']):.1%}"]]
    ratio, wall_ratio = med["autotune"] / med["deepspeed"], at["wall_s"] / ds["wall_s"]
    # Run i of each tool ran next to each other, under about the same load from the machine's other
    # users; that load drifts between pairs, so each tool's own spread overstates the comparison's noise.
    paired = [a / d for d, a in zip(runs["deepspeed"], runs["autotune"])]
    pmed, half = statistics.median(paired), (max(paired) - min(paired)) / 2
    fast_ok, wall_ok = pmed >= 1 - half, wall_ratio <= 0.5
    lines = [table(rows), "",
             f"space: ZeRO {','.join(map(str, args.zero))} x micro-batch {micro_batches(args)}, global batch "
             f"{args.global_batch}, seq {args.seq_len}, {args.ranks} gloo ranks, bf16; DeepSpeed micro-batches: "
             f"{args.ds_micro_batches}, --autotuning {args.ds_mode}; harness configs: {args.remeasure_config}, "
             f"{args.warmup_steps} + {args.steps} steps per run, alternating",
             f"throughput ratio autotune / DeepSpeed: of the medians {ratio:.3f}; of the paired runs (run i / run i) "
             f"{', '.join(f'{r:.3f}' for r in paired)}, median {pmed:.3f}, noise +-{half:.1%} (half their range)",
             f"target: pick at least as fast within noise: {'yes' if fast_ok else 'NO'} (paired median {pmed:.3f} >= "
             f"{1 - half:.3f}); at most half the wall time: {'yes' if wall_ok else 'NO'} ({wall_ratio:.3f} <= 0.5)"
             f" -> {'HOLDS' if fast_ok and wall_ok else 'MISSED'}",
             "harness runs (alternating): " + ", ".join(f"{LABEL[r['tool']]}#{r['run']} {r['tokens_per_s']:,.0f}"
                                          for r in state["remeasure"])]
    return "\n".join(lines)


def _on_term(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM / SIGHUP: end the running tool's session, keep the results


def main(argv=None) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_term)
    missing = missing_tools()
    if missing:
        print("vs_deepspeed_autotuner: missing, needed by DeepSpeed's autotuner:\n  " + "\n  ".join(missing),
              file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    if out.exists() and not out.is_dir():
        print(f"vs_deepspeed_autotuner: --out {args.out} is a file; give a folder", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "results.json"
    settings = json.loads(json.dumps({k: v for k, v in vars(args).items()
                                      if k not in ("out", "fresh", "phase_timeout_min", "repeats")}))
    state = json.loads(saved.read_text()) if saved.is_file() and not args.fresh else {}
    if state and state.get("settings") != settings:
        print(f"vs_deepspeed_autotuner: {saved} holds results made with other settings ({state.get('settings')}); "
              "rerun with those, or give --fresh (discards them) or another --out", file=sys.stderr)
        return 2
    state = state or {"settings": settings, "remeasure": []}
    save = lambda: saved.write_text(json.dumps(state, indent=2))
    try:
        for key, fn in (("deepspeed", run_deepspeed), ("autotune", run_autotune)):
            if key in state:
                print(f"{key}: saved result reused ({minutes(state[key]['wall_s'])}); --fresh to redo", flush=True)
            else:
                state[key] = fn(args, out)
                save()
        done = {(r["tool"], r["run"]) for r in state["remeasure"]}
        print(f"[3/3] harness: both picks, alternating, {args.repeats} runs each (logs: {out / 'remeasure'})",
              flush=True)
        for i in range(args.repeats):
            for name in ("deepspeed", "autotune"):
                if (name, i) not in done:
                    state["remeasure"].append(remeasure(args, out, name, state[name], i))
                    save()
                    r = state["remeasure"][-1]
                    print(f"  {name} #{i}: {r['tokens_per_s']:,.0f} tokens/s (step {r['step_s']:.4f} s)", flush=True)
    except Failed as e:
        save()
        print(f"vs_deepspeed_autotuner: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        save()
        print(f"vs_deepspeed_autotuner: interrupted; finished steps are saved in {saved}, rerun to continue",
              file=sys.stderr)
        return 130
    text = report(args, state)
    (out / "table.txt").write_text(text + "\n")
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
