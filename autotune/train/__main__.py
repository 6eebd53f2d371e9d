"""``python -m autotune.train --plan plan.json [--steps N] [--warmup-steps N] [--device D] [engine args]``.

Reads ``plan.json`` (the estimate document ``autotune emit`` writes: model spec, cluster spec, plan),
asks the plan's engine for its trainer module and runs it; see :mod:`autotune.train` for the output
protocol. Works under torchrun (``torchrun ... -m autotune.train ...``) and the deepspeed runner
(``deepspeed ... --module --no_local_rank autotune.train ...``). Bad input: a message naming the
problem and the fix on stderr, exit code 2.

``AUTOTUNE_TRAIN_ARGS`` (environment): more arguments, split as the shell would and appended to the command
line (so they win), for launch scripts that pass none of their own: ``AUTOTUNE_TRAIN_ARGS="--steps 20
--save-interval 5" bash launch_torchrun.sh``. Checkpoint flags: :mod:`autotune.train.checkpointing`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import sys
from dataclasses import dataclass

from autotune.errors import InputError


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m autotune.train",
                                 description="Train a plan's model with its engine's own APIs (synthetic data).")
    ap.add_argument("--plan", required=True, help="plan.json written by `autotune emit` (or `estimate --json`)")
    ap.add_argument("--steps", type=int, default=5, help="measured optimizer steps (default 5)")
    ap.add_argument("--warmup-steps", type=int, default=1, help="optimizer steps before the measured ones (default 1)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto: cuda when torch sees a GPU, else cpu (gloo)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return ap


@dataclass(frozen=True, slots=True)
class Job:
    """What a trainer needs from plan.json: the model, the cluster and the plan (no cost model run)."""

    model: object
    cluster: object
    plan: object


def job_from_dict(doc: dict) -> Job:
    """The model, cluster and plan of an estimate document, checked by the plan rules (as estimate_from_dict
    does it, without re-running the cost model, which training does not need)."""
    from autotune.specs.loading import load_cluster, model_from_mapping
    from autotune.specs.plan import ParallelPlan
    from autotune.rules import plan_problems

    problems = [f"missing '{k}' block{'' if k == 'plan' else ' with its spec'} (give the plan.json of an emitted "
                f"bundle)" for k in ("model", "cluster", "plan") if not isinstance(doc.get(k), dict)
                or (k != "plan" and not isinstance(doc[k].get("spec"), dict))]
    if problems:
        raise InputError(problems, subject="plan JSON")
    model = model_from_mapping(doc["model"]["spec"], origin="plan JSON model")
    spec = dict(doc["cluster"]["spec"])
    try:
        gpu, nodes, per_node = spec.pop("gpu"), spec.pop("num_nodes"), spec.pop("gpus_per_node")
        cluster = load_cluster(gpu=gpu, num_gpus=nodes * per_node, gpus_per_node=per_node, **spec)
        plan = ParallelPlan(**doc["plan"])
    except (KeyError, TypeError) as err:
        raise InputError([f"cluster or plan block: {err}"], subject="plan JSON") from None
    problems = [msg for _, msg in plan_problems(model, cluster, plan)]
    if problems:
        raise InputError(problems, subject="plan JSON")
    return Job(model=model, cluster=cluster, plan=plan)


def load_estimate(path: str) -> Job:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as err:
        raise InputError([f"--plan {path!r}: {err.strerror or err}; give the plan.json of an emitted bundle"],
                         subject="plan file") from None
    except ValueError as err:
        raise InputError([f"--plan {path!r} is not JSON ({err}); give the plan.json of an emitted bundle"],
                         subject="plan file") from None
    if not isinstance(doc, dict):
        raise InputError([f"--plan {path!r}: expected a JSON object with model, cluster and plan blocks"],
                         subject="plan file")
    return job_from_dict(doc)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv) + shlex.split(os.environ.get("AUTOTUNE_TRAIN_ARGS", ""))
    args, rest = parser().parse_known_args(argv)
    try:
        if args.steps < 1 or args.warmup_steps < 0:
            raise InputError(["--steps must be >= 1 and --warmup-steps >= 0"], subject="arguments")
        est = load_estimate(args.plan)
        from autotune.engines import engine_for

        engine = engine_for(est.plan)
        if not engine.trainer_module:
            raise InputError([f"engine {engine.name} ({engine.title}) has no built-in trainer: launch its own "
                              f"program with the bundle's arguments (see plan.md)"], subject="plan")
        trainer = importlib.import_module(engine.trainer_module)
    except InputError as err:
        print(f"autotune.train: {err.render()}", file=sys.stderr, flush=True)
        return 2
    return int(trainer.main(est, args, rest) or 0)


def exit_now(code: int) -> None:
    """Flush and leave without running the interpreter's finalisation. The trainers have already torn down
    (engine.destroy, barrier, destroy_process_group) and printed RESULT; what finalisation would still run is
    C++ destructors of torch / DeepSpeed background threads, and one of those, a thread still joinable,
    aborts the rank now and then (``terminate called without an active exception``, SIGABRT, exit 250 from
    the DeepSpeed launcher after a complete, correct run: a resumed 2-stage pipeline run in CI)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
