"""Tuning efficiency: how close does `autotune tune` get to the exhaustive best, with how many trials?

Two spaces (``--space``), each the feasible plans of the planner, seq 64, global batch 16:

* ``dp`` (2 cpu ranks, tiny-gpt, deepspeed, tp = pp = 1): ZeRO 0-3 x micro-batch 1..8 x recompute
  none/full x offload none/cpu.
* ``tp-pp`` (4 cpu ranks, tiny-llama cut to 2 layers, deepspeed): tp 1/2 (AutoTP) x pp 1/2
  (PipelineModule) x ZeRO 0-2 x micro-batch 1/2/4, no offload, no recompute: 24 plans (DeepSpeed
  runs AutoTP without pp, and ZeRO-2 without pp, so the planner drops those).

1. Exhaustive: every feasible plan measured once (one study that runs them all), then its
   ``--noise-plans`` best plans re-run ``--noise-runs`` more times, interleaved (the study's finalist
   re-runs). Each plan's reference throughput is its exhaustive trial's (one measurement per plan,
   taken in one pass: the re-runs come later, when the shared machine may be busier, so mixing them in
   would favour plans that were not re-run); the spread of the re-run plans over all their
   measurements ((max - min) / median) is the measured run-to-run noise, drift of the machine included.
2. Tuner: a fresh study with a budget of ``--budget`` x that count (planner top-3 first), then its
   ``--finalists`` best plans re-run ``--finalist-runs`` times each, interleaved, the winner chosen on
   the medians (the re-runs are counted and shown separately from the trials), repeated.

3. Replay (``--replays``, no trials): the tuner's own sampler run many times on the exhaustive pass's
   reference throughputs, each trial and re-run drawing log-normal noise of the measured size, so the
   share of tuner runs that reach the target is a figure with more than 3 samples behind it.

For each repeat: the tuner's pick, its reference throughput over the best reference throughput
(both from the exhaustive pass: the same measurements of both, so the tuner's own lucky run does not
count), its own trial's throughput over the best, and the trials spent. Resumable: rerunning the
same command continues the exhaustive pass, its re-runs and each repeat's study (``--fresh``: redo the
repeats).

    flock /tmp/bench.lock python bench/tuning_efficiency.py --space tp-pp [--repeats 3] [--budget 0.3]
          [--steps 3] [--finalists 3] [--finalist-runs 2] [--noise-plans 4] [--noise-runs 2] [--replays 100]
          [--fresh] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from optuna.trial import TrialState  # noqa: E402

from autotune.cost.efficiency import DEFAULT_EFFICIENCY  # noqa: E402
from autotune.report import plan_summary  # noqa: E402
from autotune.search.space import SearchConstraints  # noqa: E402
from autotune.specs.loading import load_cluster, load_model  # noqa: E402
from autotune.specs.plan import ParallelPlan  # noqa: E402
from autotune.tune.sampler import PARAM, CalibratedRank, PlanSampler, plan_region, trial_key  # noqa: E402
from autotune.tune.study import tune  # noqa: E402
from autotune.tune.trial import Workload  # noqa: E402

TARGET, BUDGET_CAP = 0.95, 0.30


def _space(args) -> dict:
    """Model, cluster and constraints of the chosen space, and the tune() settings they need."""
    if args.space == "dp":
        return dict(model=load_model("tiny-gpt"), cluster=load_cluster(gpu="cpu", num_gpus=args.ranks or 2),
                    constraints=SearchConstraints(tp=1, pp=1, cp=1, engines=("deepspeed",),
                                                  recompute=("none", "full"),
                                                  max_micro_batch_size=args.max_micro_batch or 8),
                    num_layers=args.num_layers or 2, trial_timeout_s=300)
    # 4 ranks on 2 cores: a trial takes 30-45 s here (AutoTP the slowest), so a generous timeout
    return dict(model=load_model("tiny-llama"), cluster=load_cluster(gpu="cpu", num_gpus=args.ranks or 4),
                constraints=SearchConstraints(max_tp=2, max_pp=2, cp=1, engines=("deepspeed",), recompute=("none",),
                                              zero_stages=(0, 1, 2), allow_offload=False,
                                              max_micro_batch_size=args.max_micro_batch or 4),
                num_layers=args.num_layers or 2, trial_timeout_s=900)


def _runs(result) -> dict[str, list[float]]:
    """Plan key -> every throughput the study measured for it (its trial, then its finalist re-runs)."""
    out: dict[str, list[float]] = {}
    for t in result.trials:
        if t.state == TrialState.COMPLETE and t.value:
            out.setdefault(trial_key(t), []).append(t.value)
    for f in result.finalists:
        out.setdefault(f.key, []).extend(f.measured)
    return out


def _replay(candidates, reference: dict[str, float], run_model, cluster, *, budget: int, finalists: int,
            finalist_runs: int, sigma: float, seed: int) -> str | None:
    """One simulated tuner run on the exhaustive pass's numbers: each trial and re-run of a plan measures its
    reference throughput times log-normal noise of ``sigma``; the tuner's own sampler picks the plans
    (planner top-3, then :class:`CalibratedRank` with exploration) and the winner is the best median
    re-run of its ``finalists`` best. Only plans the exhaustive pass measured are offered."""
    import random

    import optuna

    rng = random.Random(seed)
    plans = {k: e.plan for k, e in candidates.items() if k in reference}
    order = list(plans)
    tokens = {k: p.global_batch_size * p.seq_len for k, p in plans.items()}
    draw = lambda k: reference[k] * math.exp(rng.gauss(0.0, sigma))  # noqa: E731
    sampler = PlanSampler(order, top_k=3, regions={k: plan_region(p) for k, p in plans.items()}, plans=plans,
                          rank=CalibratedRank(plans, order, run_model, cluster, DEFAULT_EFFICIENCY))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    measured: dict[str, float] = {}
    for _ in range(min(budget, len(plans))):
        trial = study.ask(sampler.search_space)
        key = study._storage.get_trial_system_attrs(trial._trial_id)[PARAM]
        measured[key] = draw(key)
        trial.set_user_attr("measurement", {"step_time_s": tokens[key] / measured[key]})
        study.tell(trial, measured[key])
    top = sorted(measured, key=measured.get, reverse=True)[:max(finalists, 1)]
    if finalists < 2 or len(top) < 2:
        return top[0]
    return max(top, key=lambda k: statistics.median(draw(k) for _ in range(finalist_runs)))


def _relative_noise(finalists) -> float | None:
    """Median over the re-run plans of (max - min) / median of their re-runs, each re-run round (one run of
    every plan, interleaved) first divided by that round's geometric mean: drift common to a round cancels."""
    rounds = min((len(f.measured) for f in finalists), default=0)
    if len(finalists) < 2 or rounds < 2:
        return None
    norm = {f.key: [] for f in finalists}
    for k in range(rounds):
        geo = math.exp(statistics.fmean(math.log(f.measured[k]) for f in finalists))
        for f in finalists:
            norm[f.key].append(f.measured[k] / geo)
    return statistics.median((max(v) - min(v)) / statistics.median(v) for v in norm.values())


def _summary(key: str) -> str:
    return plan_summary(ParallelPlan(**json.loads(key)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", choices=("dp", "tp-pp"), default="dp")
    ap.add_argument("--ranks", type=int, default=None, help="cpu ranks (default: 2 for dp, 4 for tp-pp)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=float, default=BUDGET_CAP, help="tuner trials as a fraction of the plans")
    ap.add_argument("--max-micro-batch", type=int, default=None, help="default: 8 for dp, 4 for tp-pp")
    ap.add_argument("--num-layers", type=int, default=None, help="layers the trials run (default 2)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup-steps", type=int, default=1)
    ap.add_argument("--finalists", type=int, default=3, help="tuner: best plans re-run before the winner (0: none)")
    ap.add_argument("--finalist-runs", type=int, default=2)
    ap.add_argument("--noise-plans", type=int, default=4, help="exhaustive pass: best plans re-measured (0: none)")
    ap.add_argument("--noise-runs", type=int, default=2)
    ap.add_argument("--replays", type=int, default=100,
                    help="simulated tuner runs on the exhaustive numbers with the measured noise (0: none)")
    ap.add_argument("--fresh", action="store_true", help="redo the tuner repeats (the exhaustive pass is kept)")
    ap.add_argument("--out", default=None, help="default out/bench_tuning (dp), out/bench_tuning_tp_pp (tp-pp)")
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # each repeat's line reaches the log as it ends
    if not 0 < args.budget <= 1 or args.repeats < 1 or args.steps < 1:
        print("error: --budget must be in (0, 1], --repeats and --steps at least 1", file=sys.stderr)
        return 2

    space = _space(args)
    model, cluster = space.pop("model"), space.pop("cluster")
    common = dict(seq_len=64, global_batch=16, workload=Workload(kind="builtin"), steps=args.steps,
                  warmup_steps=args.warmup_steps, **space)
    out = Path(args.out or ("out/bench_tuning" if args.space == "dp" else "out/bench_tuning_tp_pp"))
    started = time.monotonic()
    # Exhaustive pass and its noise re-runs (resumable: rerunning the bench continues both).
    exhaustive = tune(model, cluster, out_dir=out / "exhaustive", trials=10_000, top_k=0, resume=True,
                      prune_ratio=None, finalists=args.noise_plans, finalist_runs=args.noise_runs, **common)
    runs = _runs(exhaustive)
    if not runs:
        print(f"error: no exhaustive trial completed: {exhaustive.failure_summary}", file=sys.stderr)
        return 1
    reference = {k: v[0] for k, v in runs.items()}  # the exhaustive trial (re-runs follow it in _runs)
    num_plans = len(exhaustive.candidates)
    best_key = max(reference, key=reference.get)
    best = reference[best_key]
    print(f"space {args.space}: {model.name}, {cluster.num_gpus} cpu ranks; {num_plans} feasible plans, "
          f"{len(runs)} measured, {time.monotonic() - started:.0f} s")
    print(f"\nexhaustive pass, best {min(len(runs), 8)} plans and the re-run ones (reference: the plan's trial, "
          "then its re-runs):")
    print(f"{'plan':<44}{'measurements tokens/s':>34}{'reference':>11}{'/best':>7}{'spread':>8}")
    spreads = []
    shown = sorted(reference, key=reference.get, reverse=True)[:8]
    shown += [f.key for f in exhaustive.finalists if f.key in reference and f.key not in shown]
    for key in shown:  # the best 8, and every re-run plan
        ms = runs[key]
        spread = (max(ms) - min(ms)) / statistics.median(ms) if len(ms) >= 2 else None
        if spread is not None:
            spreads.append(spread)
        print(f"{_summary(key):<44}{', '.join(f'{m:,.0f}' for m in ms):>34}{reference[key]:>11,.0f}"
              f"{reference[key] / best:>7.1%}{'-' if spread is None else f'{spread:.0%}':>8}")
    noise = statistics.median(spreads) if spreads else None
    if spreads:
        print(f"run-to-run noise (re-measured plans, (max - min) / median of all their measurements, the "
              f"machine's drift included): median {noise:.1%}, max {max(spreads):.1%} over {len(spreads)} plans")
    relative = _relative_noise(exhaustive.finalists)
    if relative is not None:
        print(f"relative noise (each interleaved re-run round divided by its geometric mean over the plans, so "
              f"load that slows every plan alike cancels): median {relative:.1%}")
        noise = relative
    dims = {"tp": lambda p: p.tp, "pp": lambda p: p.pp}
    for name, get in dims.items():
        by = {}
        for k, v in reference.items():
            by.setdefault(get(ParallelPlan(**json.loads(k))), []).append(v)
        print(f"best by {name}: " + ", ".join(f"{name}{v} {max(xs):,.0f}" for v, xs in sorted(by.items())))

    budget = max(1, int(args.budget * num_plans))  # at most the fraction: round down
    if args.replays and noise:
        # (max - min) of n normal draws is ~1.13 sigma (n = 2) or ~1.69 sigma (n = 3) on average
        sigma = noise / (1.13 if relative is not None and args.noise_runs == 2 else 1.69)
        import dataclasses

        run_model = dataclasses.replace(model, num_layers=space["num_layers"])
        fracs = [reference[_replay(exhaustive.candidates, reference, run_model, cluster, budget=budget,
                                   finalists=args.finalists, finalist_runs=args.finalist_runs, sigma=sigma,
                                   seed=i)] / best for i in range(args.replays)]
        print(f"\nreplay: {args.replays} simulated tuner runs (the tuner's sampler on the exhaustive references, "
              f"log-normal noise sigma {sigma:.1%} from the {'relative' if relative is not None else 'measured'} "
              f"noise, budget {budget}, {args.finalists} finalists x "
              f"{args.finalist_runs}): pick/best mean {statistics.fmean(fracs):.1%}, worst {min(fracs):.1%}, "
              f">= {TARGET:.0%} in {sum(f >= TARGET for f in fracs) / len(fracs):.0%} of them")
    rows = []
    for r in range(args.repeats):
        folder = out / f"tuner_{r}"
        if args.fresh:
            shutil.rmtree(folder, ignore_errors=True)
        t0 = time.monotonic()
        res = tune(model, cluster, out_dir=folder, trials=budget, top_k=3, finalists=args.finalists,
                   finalist_runs=args.finalist_runs, resume=True, **common)
        tried = [t for t in res.trials if t.user_attrs.get("status") not in ("interrupted", "duplicate")]
        reruns = sum(len(f.runs_tokens_per_s) for f in res.finalists)
        tp_pp = sorted({(p.tp, p.pp) for p in (ParallelPlan(**json.loads(trial_key(t))) for t in tried)})
        tried_dims = " ".join(f"{a}/{b}" for a, b in tp_pp)
        if res.best is None:
            rows.append((r, "-", 0.0, 0.0, len(tried), reruns, "-", tried_dims, time.monotonic() - t0))
            continue
        key = trial_key(res.best)
        pick = next((f for f in res.finalists if f.key == key), None)
        spread = f"{pick.spread:.0%}" if pick is not None and pick.spread is not None else "-"
        own = (pick.median if pick is not None and pick.median else res.best.value) / best
        rows.append((r, _summary(key), reference.get(key, 0.0) / best, own, len(tried), reruns, spread,
                     tried_dims, time.monotonic() - t0))
        print(f"repeat {r}: pick {rows[-1][1]}, {rows[-1][2]:.1%} of the best (exhaustive), tried "
              + ", ".join(_summary(trial_key(t)) + ("" if t.state == TrialState.COMPLETE
                                                    else f" ({t.state.name.lower()})") for t in tried))

    print(f"\ntuner budget: {budget} of {num_plans} trials ({budget / num_plans:.0%}), then {args.finalists} "
          f"finalists x {args.finalist_runs} re-runs")
    print(f"{'run':>3}  {'tuner pick':<40}{'pick/best (exh.)':>17}{'pick/best (own)':>16}{'trials':>7}"
          f"{'re-runs':>8}{'spread':>7}  {'tp/pp tried':<16}{'time s':>7}")
    for r, summary, frac_exh, frac_own, spent, reruns, spread, tried_dims, secs in rows:
        print(f"{r:>3}  {summary:<40}{frac_exh:>17.1%}{frac_own:>16.1%}{spent:>7}{reruns:>8}{spread:>7}  "
              f"{tried_dims:<16}{secs:>7.0f}")
    fracs = [row[2] for row in rows]
    hit = sum(f >= TARGET for f in fracs)
    noise_text = (f"noise {noise:.1%} ({'relative' if relative is not None else 'median spread'}, see above)"
                  if noise is not None else "noise not measured")
    print(f"\nmean pick/best {statistics.fmean(fracs):.1%}, worst {min(fracs):.1%}; {hit}/{len(fracs)} repeats at "
          f">= {TARGET:.0%} with {budget / num_plans:.0%} of the trials (target: <= {BUDGET_CAP:.0%}); {noise_text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
