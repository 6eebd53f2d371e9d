"""The builtin profiling workload: train the project's transformer under DeepSpeed for a few steps.

Started by :func:`autotune.tune.trial.run_trial` under ``torchrun``::

    OMP_NUM_THREADS=1 python -m torch.distributed.run --nproc_per_node N \
        -m autotune.tune.workload_builtin --spec WORKDIR/trial_spec.json

``trial_spec.json`` holds the model (already cut to the trial's layer count), the plan, the path of
the DeepSpeed config, and the step counts. Every rank builds the model with
:func:`autotune.workloads.transformer.build_model`, draws synthetic token batches (fixed seed, one
stream per data-parallel rank) and runs ``warmup_steps + steps`` optimizer steps, each of
``grad_accum_steps`` micro-batches. Each optimizer step is timed by wall clock between two barriers.
Rank 0 prints ``STEP {i} {seconds}`` (1-based, warm-up steps included) after every step and, at the
end, one ``RESULT {json}`` line with the step times, the measured (post-warm-up) ones, every rank's
peak memory and the tokens per second. The process group is torn down cleanly
(``engine.destroy(); barrier; destroy_process_group``) because gloo jobs that skip it sometimes
abort at exit.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

UNSUPPORTED_PP = "pipeline parallelism (pp > 1) is not supported by the builtin workload yet"
UNSUPPORTED_TP = "tensor parallelism (tp > 1) is not supported by the builtin workload yet"
UNSUPPORTED_CP = "context parallelism (cp > 1) is not supported by the builtin workload yet"


def trainer_problem(model, plan, *, full_layers: int | None = None) -> str | None:
    """Why neither this workload nor the engine's built-in trainer (``python -m autotune.train``) runs ``plan``.

    Data-parallel DeepSpeed plans run here; tensor, pipeline and sequence parallelism (and the other
    engines) run under the plan's engine's trainer (:mod:`autotune.train`), which says which plans it
    cannot run (its ``unsupported_reason``). ``model`` is the model the trial runs; ``full_layers``: the
    layer count it was cut from (``--num-layers``), so that a pipeline too deep for the cut says which
    flag to raise.
    """
    import importlib

    from autotune.engines import engine_for

    engine = engine_for(plan)
    if not engine.trainer_module:
        return (f"engine {engine.name} ({engine.title}) has no built-in trainer: its own training program needs "
                f"CUDA, so the tuner never launches its plans itself; measure them with --workload command "
                f"--command TEMPLATE ({{megatron_args}} in the template becomes the plan's arguments) "
                f"--metric-pattern REGEX")
    stages = plan.pp * plan.vpp
    if full_layers is not None and plan.pp > 1 and model.num_layers < stages <= full_layers:
        return (f"--num-layers {model.num_layers} leaves fewer layers than the plan's pp x vpp = {stages} "
                f"pipeline stages: give --num-layers {stages} or more")
    if not uses_trainer(plan):
        return None
    module = importlib.import_module(engine.trainer_module)
    check = getattr(module, "unsupported_reason", None)
    return check(model, plan) if check is not None else None


def not_measured(reasons: list[str], limit: int = 3) -> str:
    """The reasons plans are not measured, most frequent first, each with its count ("N plans: reason")."""
    counts: dict[str, int] = {}
    for r in reasons:
        counts[r] = counts.get(r, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    parts = [f"{n} plan{'s' if n > 1 else ''}: {r}" for r, n in ranked[:limit]]
    if len(ranked) > limit:
        parts.append(f"{sum(n for _, n in ranked[limit:])} more for {len(ranked) - limit} other reasons")
    return "; ".join(parts)


def uses_trainer(plan) -> bool:
    """True when the plan runs under ``python -m autotune.train`` rather than this module."""
    from autotune.engines import engine_for

    # this module runs DeepSpeed (the engine whose trainer takes a DeepSpeed config) data parallelism only
    return unsupported_reason(plan) is not None or not engine_for(plan).trainer_takes_deepspeed_config


def unsupported_reason(plan) -> str | None:
    """Why this module's own loop cannot run ``plan`` (None when it can; see :func:`trainer_problem`)."""
    if plan.pp > 1:
        return UNSUPPORTED_PP
    if plan.tp > 1:
        return UNSUPPORTED_TP
    if plan.cp > 1:
        return UNSUPPORTED_CP
    return None


def _peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux reports ru_maxrss in KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="trial_spec.json written by run_trial")
    args = ap.parse_args(argv)
    with open(args.spec) as f:
        spec = json.load(f)

    import torch

    from autotune.specs.model import ModelSpec
    from autotune.specs.plan import ParallelPlan
    from autotune.workloads.transformer import build_model

    model_spec = ModelSpec.from_dict(spec["model"])
    plan = ParallelPlan(**spec["plan"])
    reason = unsupported_reason(plan)
    if reason:
        print(f"UNSUPPORTED {reason}", flush=True)
        raise SystemExit(reason)
    with open(spec["ds_config_path"]) as f:
        ds_config = json.load(f)
    steps, warmup = int(spec["steps"]), int(spec["warmup_steps"])
    seed = int(spec.get("seed", 1234))

    import deepspeed
    import deepspeed.comm as dist

    cuda = spec.get("device", "cpu") == "cuda"
    if os.environ.get("RANK", "0") == "0":
        print("PHASE initialising the process group", flush=True)
    if cuda and not torch.cuda.is_available():
        raise SystemExit("the trial's cluster has GPUs but torch sees no CUDA device")
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        deepspeed.init_distributed(dist_backend="nccl")
    else:
        deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    dtype = torch.float16 if plan.precision == "fp16" else torch.bfloat16
    torch.manual_seed(seed)
    model = build_model(model_spec, seq_len=plan.seq_len, recompute=plan.recompute,
                        flash_attention=plan.flash_attention, dtype=dtype)
    if rank == 0:
        print("PHASE initialising the engine", flush=True)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    if cuda:
        torch.cuda.reset_peak_memory_stats()

    gen = torch.Generator().manual_seed(seed + 7919 * rank)
    mbs, gas, seq = plan.micro_batch_size, plan.grad_accum_steps, plan.seq_len

    def micro_batch():
        ids = torch.randint(0, model_spec.vocab_size, (mbs, seq + 1), generator=gen)
        return ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)

    step_times: list[float] = []
    losses: list[float] = []
    for i in range(1, warmup + steps + 1):
        batches = [micro_batch() for _ in range(gas)]
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = None
        boundaries = []
        for ids, labels in batches:
            loss = engine(ids, labels)
            engine.backward(loss)
            boundaries.append(engine.is_gradient_accumulation_boundary())
            engine.step()  # DeepSpeed updates the weights only at the accumulation boundary
        # exactly one optimizer update per step, after the last micro-batch
        assert boundaries[-1] and not any(boundaries[:-1]), f"accumulation boundaries off: {boundaries}"
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        dt = time.perf_counter() - t0
        step_times.append(dt)
        losses.append(float(loss.detach().float()))
        if rank == 0:
            print(f"STEP {i} {dt:.6f}", flush=True)

    peak = int(torch.cuda.max_memory_allocated()) if cuda else _peak_rss_bytes()
    peaks: list = [None] * world
    dist.all_gather_object(peaks, peak)
    measured = step_times[warmup:]
    median = statistics.median(measured) if measured else None
    tokens_per_step = plan.global_batch_size * seq
    if rank == 0:
        result = {
            "step_times_s": step_times,
            "measured_step_times_s": measured,
            "median_step_time_s": median,
            "tokens_per_step": tokens_per_step,
            "tokens_per_s": tokens_per_step / median if median else None,
            "peak_memory_bytes_per_rank": peaks,
            "peak_memory_kind": "cuda_max_memory_allocated" if cuda else "peak_rss",
            "losses": losses,
            "world_size": world,
            "num_params": model_spec.num_params,
        }
        print("RESULT " + json.dumps(result), flush=True)
    engine.destroy()
    dist.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
