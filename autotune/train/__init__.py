"""The built-in trainers: ``python -m autotune.train --plan plan.json`` trains a plan with its engine's APIs.

This is what a plan *runs*, in both places that run one: the launch scripts ``autotune emit`` writes for
DeepSpeed, FSDP2 and HF bundles, and every ``--workload builtin`` trial of ``autotune tune``
(:mod:`autotune.tune.trial` launches ``python -m autotune.train --plan WORKDIR/plan.json --steps N
--warmup-steps W --device D [--deepspeed-config WORKDIR/ds_config.json]``). The model they train and the
measurement helpers beside it live in :mod:`autotune.workloads` (the project's transformer, memory probes,
ledger checks); the tuner that launches and judges trials is :mod:`autotune.tune`.

It trains the plan's model (built from the ModelSpec in ``plan.json``) with the plan's engine's own
APIs, on synthetic token batches, for ``--warmup-steps + --steps`` optimizer steps. The engine names
its trainer module (:attr:`autotune.engines.base.Engine.trainer_module`: ``autotune.train.deepspeed``,
``autotune.train.fsdp``, ``autotune.train.hf``); each trainer module has ``main(est, args, rest) -> int``
and ``unsupported_reason(model, plan)``, and uses the helpers here, so every engine speaks one output
protocol, which the tuner reads (:mod:`autotune.tune.logs`, :mod:`autotune.tune.judge`):

- rank 0 prints ``PHASE <words>`` while starting, ``STEP <i> <seconds>`` after every optimizer step
  (1-based, warm-up steps included; timed by wall clock between two barriers; a resumed run goes on from
  its checkpoint's step), ``LOSS <i> <loss> <lr>`` after it, and finally one
  ``RESULT {json}`` line (step times, measured post-warm-up ones, median, tokens/s, every rank's peak
  memory, losses);
- a plan the trainer cannot run prints ``UNSUPPORTED <reason>`` and exits 2 (no traceback);
  :func:`plan_problem` says the same without starting any process (the tuner never launches such a plan);
- teardown is clean (engine.destroy, barrier, destroy_process_group): gloo jobs that skip it sometimes
  abort at exit (a rank's gloo threads outliving the interpreter's shutdown).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time

__all__ = [
    "plan_problem",
    "world_size_problem",
    "StepLog",
    "Unsupported",
    "peak_memory_bytes",
    "phase",
    "pick_device",
    "rank0",
    "teardown",
    "token_batches",
    "torch_dtype",
]


class Unsupported(SystemExit):
    """The trainer cannot run this plan: ``UNSUPPORTED <reason>`` on stdout and exit code 2."""

    def __init__(self, reason: str) -> None:
        print(f"UNSUPPORTED {reason}", flush=True)
        print(f"autotune.train: {reason}", file=sys.stderr, flush=True)
        super().__init__(2)


def rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def phase(words: str) -> None:
    if rank0():
        print(f"PHASE {words}", flush=True)


def plan_problem(model, plan, *, full_layers: int | None = None) -> str | None:
    """Why ``python -m autotune.train`` cannot run ``plan`` on ``model`` (None when it can), decided without
    starting a process: the plan's engine has no built-in trainer (Megatron-LM's pretrain_gpt.py needs CUDA),
    the model has fewer layers than the plan has pipeline stages, or the engine's trainer refuses the plan
    (``Engine.builtin_trainer_problem``, the check its ``main`` makes before printing ``UNSUPPORTED``).

    ``full_layers``: the layer count ``model`` was cut from (the tuner's ``--num-layers``), so that a
    pipeline too deep for the cut says which flag to raise.
    """
    from autotune.engines import engine_for

    engine = engine_for(plan)
    if not engine.trainer_module:
        return (f"engine {engine.name} ({engine.title}) has no built-in trainer: its own training program needs "
                f"CUDA, so the tuner never launches its plans itself; measure them with --workload command "
                f"--command TEMPLATE ({{megatron_args}} in the template becomes the plan's arguments) "
                f"--metric-pattern REGEX")
    stages = plan.pp * plan.vpp
    # torch.distributed.pipelining (the fsdp engine, split "any") counts the embedding and the output as a stage's
    # layer each, as torchtitan does (specs.layout.torchtitan_split): pp x vpp stages need pp x vpp - 2 layers.
    need = stages - 2 if engine.support.layer_split == "any" else stages
    if full_layers is not None and plan.pp > 1 and model.num_layers < need <= full_layers:
        return (f"--num-layers {model.num_layers} leaves fewer layers than the plan's pp x vpp = {stages} "
                f"pipeline stages need ({need}): give --num-layers {need} or more")
    return engine.builtin_trainer_problem(model, plan)  # what its main checks too (autotune.engines.builtin_trainer)


def world_size_problem(plan, world: int) -> str | None:
    """Why ``world`` launched ranks cannot run ``plan`` (None when they can)."""
    if world == plan.world_size:
        return None
    return (f"launched with {world} ranks; the plan needs {plan.world_size} "
            f"(tp {plan.tp} x pp {plan.pp} x cp {plan.cp} x dp {plan.dp})")


def pick_device(name: str):
    """``cpu``, ``cuda`` or ``auto`` (cuda when torch sees one) -> torch.device; sets this rank's GPU."""
    import torch

    cuda = name == "cuda" or (name == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise Unsupported("--device cuda: torch sees no CUDA device (use --device cpu)")
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def torch_dtype(plan):
    import torch

    return torch.float16 if plan.precision == "fp16" else torch.bfloat16  # fp8: bf16 outside TE's autocast


def token_batches(vocab_size: int, micro_batch: int, seq_len: int, *, seed: int, stream: int, device, skip: int = 0):
    """An endless iterator of (input_ids, labels) micro-batches; ``stream`` picks the data (same stream,
    same batches: TP ranks of one group share a stream, DP replicas get their own). ``skip``: micro-batches
    of the stream already trained on (a resumed run's data position), drawn and dropped."""
    import torch

    gen = torch.Generator().manual_seed(seed + 7919 * stream)
    for _ in range(skip):
        torch.randint(0, vocab_size, (micro_batch, seq_len + 1), generator=gen)
    while True:
        ids = torch.randint(0, vocab_size, (micro_batch, seq_len + 1), generator=gen)
        yield ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)


def peak_memory_bytes(device) -> tuple[int, str]:
    """(this rank's peak memory, its kind): CUDA's max allocated, else the process's peak RSS (KiB on Linux)."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated()), "cuda_max_memory_allocated"
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "peak_rss"


class StepLog:
    """Times optimizer steps between barriers and prints the STEP / RESULT protocol on rank 0."""

    def __init__(self, *, warmup: int, tokens_per_step: int, device, barrier, first_step: int = 0) -> None:
        """``first_step``: steps already trained (a resumed run): the STEP lines go on from there, and warm-up
        steps before it are not repeated."""
        self.first_step = first_step
        self.warmup = max(0, warmup - first_step)
        self.tokens_per_step, self.device, self.barrier = tokens_per_step, device, barrier
        self.step_times: list[float] = []
        self.losses: list[float] = []
        self.lrs: list[float | None] = []
        self._t0 = 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize()

    def start(self) -> None:
        self.barrier()
        self._sync()
        self._t0 = time.perf_counter()

    def stop(self, loss, lr: float | None = None, *, report_loss: bool = True) -> None:
        """After a step: its time (``STEP i seconds``), then ``LOSS i loss lr`` (rank 0's loss, the learning
        rate the step's update used; full precision) on rank 0. ``report_loss=False``: the loss comes later
        (:meth:`report_loss`: the HF Trainer logs it after the step ends)."""
        self._sync()
        self.barrier()
        dt = time.perf_counter() - self._t0
        self.step_times.append(dt)
        self.losses.append(float(loss) if loss is not None else float("nan"))
        self.lrs.append(None if lr is None else float(lr))
        if rank0():
            print(f"STEP {self.first_step + len(self.step_times)} {dt:.6f}", flush=True)
        if report_loss:
            self.report_loss(self.losses[-1], self.lrs[-1])

    def report_loss(self, loss: float, lr: float | None = None) -> None:
        """The last step's ``LOSS i loss lr`` line (rank 0), its loss and rate recorded."""
        self.losses[-1], self.lrs[-1] = float(loss), (None if lr is None else float(lr))
        if rank0():
            print(f"LOSS {self.first_step + len(self.step_times)} {self.losses[-1]!r} {self.lrs[-1]!r}", flush=True)

    def result(self, *, world_size: int, num_params: int, all_gather_object, extra: dict | None = None) -> dict:
        """Gathers every rank's peak memory (collective: every rank calls it); rank 0 prints RESULT."""
        peak, kind = peak_memory_bytes(self.device)
        peaks: list = [None] * world_size
        all_gather_object(peaks, peak)
        measured = self.step_times[self.warmup:]
        median = statistics.median(measured) if measured else None
        out = {
            "step_times_s": self.step_times,
            "measured_step_times_s": measured,
            "median_step_time_s": median,
            "tokens_per_step": self.tokens_per_step,
            "tokens_per_s": self.tokens_per_step / median if median else None,
            "peak_memory_bytes_per_rank": peaks,
            "peak_memory_kind": kind,
            "losses": self.losses,
            "lrs": self.lrs,
            "first_step": self.first_step,
            "world_size": world_size,
            "num_params": num_params,
            **(extra or {}),
        }
        if rank0():
            print("RESULT " + json.dumps(out), flush=True)
        return out


def teardown(engine=None) -> None:
    """engine.destroy() (when given), a barrier, destroy_process_group()."""
    import torch.distributed as tdist

    if engine is not None and hasattr(engine, "destroy"):
        engine.destroy()
    if tdist.is_initialized():
        tdist.barrier()
        tdist.destroy_process_group()
