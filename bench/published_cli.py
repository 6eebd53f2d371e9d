"""The published runs through `autotune estimate` itself: each run's chosen plan as the command line a user would
type (its model as a model YAML, its GPUs, its plan and run-setting flags), parsed by the CLI's own parser and
estimated by the command's code (``estimate_from_flags``).

``python bench/published_cli.py`` prints, run by run, the published-runs bench's number beside the command's, and
``tests/cost/test_published_cli.py`` asserts they are the same. A run the command line cannot state is named with
the reason (the setting no flag expresses), never silently estimated another way.

    PYTHONPATH=. python bench/published_cli.py          # every run: bench vs CLI, and the command line
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from autotune.cli import build_parser
from autotune.commands.estimate import estimate_from_flags
from autotune.commands.run_code_flags import RUN_CODE_FLAGS, flag_applies
from autotune.cost.published_runs import PublishedRun, predict_run, published_runs
from autotune.specs.hardware import GIB
from autotune.specs.plan import ParallelPlan

__all__ = ["CliCase", "cli_argv", "not_expressible", "compare_run"]

def not_expressible(run: PublishedRun, plan: ParallelPlan) -> str:
    """Why no `autotune estimate` command line states this run as the bench estimates it; empty when one does."""
    if run.layer_timing:
        return "a one-layer timing (Korthikanti Table 4), not a training step: the bench times one layer"
    return ""


def _run_setting_flags(plan: ParallelPlan, run: PublishedRun) -> list[str]:
    """The plan's run settings and the run's stated ones (``time_overrides`` and ``memory_overrides``: the
    run-code flags of ``autotune.commands.run_code_flags``) as flags."""
    over = run.time_overrides
    out: list[str] = []
    if plan.grad_dtype:
        out += ["--grad-dtype", plan.grad_dtype]
    recipe = plan.fp8_recipe or over.get("fp8_recipe")
    if recipe:
        out += ["--fp8-recipe", recipe]
    tp_overlap = plan.tp_overlap or over.get("tp_overlap")
    if tp_overlap:
        out += ["--tp-overlap", tp_overlap]
    compile_on = plan.torch_compile if plan.torch_compile is not None else over.get("torch_compile")
    if compile_on is not None:
        out.append("--compile" if compile_on else "--no-compile")
    if plan.loss_chunks:
        out += ["--loss-chunks", str(plan.loss_chunks)]
    if plan.recompute_modules:
        out += ["--recompute-modules", *plan.recompute_modules]
    if plan.cuda_graph:
        out += ["--cuda-graph", plan.cuda_graph]
    if plan.cuda_graph_scope:
        out += ["--cuda-graph-scope", *plan.cuda_graph_scope]
    if plan.ep_overlap:
        out += ["--ep-overlap", plan.ep_overlap]
    stated = {**run.memory_overrides, **run.time_overrides}
    for flag in RUN_CODE_FLAGS:  # what the run's own code does that its engine's modelled release does not
        if stated.get(flag.setting) is not None and flag_applies(flag, plan):
            out += [flag.flag, next(word for word, value in flag.choices if value == stated[flag.setting])]
    return out


def cli_argv(run: PublishedRun, plan: ParallelPlan, folder: Path) -> list[str]:
    """`autotune estimate --json` arguments stating ``plan`` of ``run``; its model is written to ``folder``."""
    assert run.model is not None and run.cluster is not None
    model_file = folder / f"{run.run_id}.model.yaml"
    model_file.write_text(yaml.safe_dump(run.model.to_dict(), sort_keys=False), encoding="utf-8")
    c = run.cluster
    argv = ["estimate", "--json", "--model", str(model_file), "--gpu", c.gpu.name, "--num-gpus", str(c.num_gpus),
            "--gpus-per-node", str(c.gpus_per_node), "--engine", plan.engine, "--seq-len", str(plan.seq_len),
            "--global-batch", str(plan.global_batch_size), "--micro-batch", str(plan.micro_batch_size),
            "--tp", str(plan.tp), "--pp", str(plan.pp), "--vpp", str(plan.vpp), "--cp", str(plan.cp),
            "--ep", str(plan.ep), "--zero", str(plan.zero_stage), "--precision", plan.precision,
            "--optimizer", plan.optimizer, "--offload-optimizer", plan.offload_optimizer,
            "--offload-param", plan.offload_param, "--recompute", plan.recompute,
            "--sequence-parallel" if plan.sequence_parallel else "--no-sequence-parallel",
            "--flash-attention" if plan.flash_attention else "--no-flash-attention",
            "--overlap-comm" if plan.overlap_comm else "--no-overlap-comm"]
    if plan.etp is not None:
        argv += ["--etp", str(plan.etp)]
    if plan.recompute_num_layers is not None:
        argv += ["--recompute-num-layers", str(plan.recompute_num_layers)]
    if plan.dp_replicate > 1:
        argv += ["--dp-replicate", str(plan.dp_replicate)]
    return argv + _run_setting_flags(plan, run)


@dataclass(frozen=True, slots=True)
class CliCase:
    run_id: str
    bench_tokens_per_s_per_gpu: float
    cli_tokens_per_s_per_gpu: float | None
    bench_memory_gib: float
    cli_memory_gib: float | None
    argv: tuple[str, ...]
    reason: str = ""
    """Why the CLI cannot state the run (then the CLI figures are None)."""


def compare_run(run: PublishedRun, folder: Path) -> CliCase:
    """The bench's prediction of ``run`` and the command's for the same plan."""
    value, plan, _, mem = predict_run(run)
    why = not_expressible(run, plan)
    if why:
        return CliCase(run.run_id, value, None, mem.total / GIB, None, (), why)
    argv = cli_argv(run, plan, folder)
    result = estimate_from_flags(build_parser().parse_args(argv))
    return CliCase(run.run_id, value, result.time.tokens_per_s / result.cluster.num_gpus, mem.total / GIB,
                   result.memory.total / GIB, tuple(argv))


def main() -> int:
    runs = [r for r in published_runs() if not r.skipped and r.tokens_per_s_per_gpu]
    agree = stated = 0
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'run':<48}{'bench tok/s':>12}{'CLI tok/s':>12}{'bench GiB':>10}{'CLI GiB':>9}")
        for run in runs:
            case = compare_run(run, Path(tmp))
            if case.reason:
                print(f"{case.run_id:<48}{case.bench_tokens_per_s_per_gpu:>12.1f}{'-':>12}  ({case.reason})")
                continue
            stated += 1
            same = (abs(case.cli_tokens_per_s_per_gpu / case.bench_tokens_per_s_per_gpu - 1) < 1e-9
                    and abs(case.cli_memory_gib - case.bench_memory_gib) < 1e-6)
            agree += same
            print(f"{case.run_id:<48}{case.bench_tokens_per_s_per_gpu:>12.1f}{case.cli_tokens_per_s_per_gpu:>12.1f}"
                  f"{case.bench_memory_gib:>10.2f}{case.cli_memory_gib:>9.2f}{'' if same else '  DIFFERENT'}")
    print(f"\n{len(runs)} runs: {stated} stated as an `autotune estimate` command line, {agree} of them give the "
          f"bench's tokens/s and memory exactly; {len(runs) - stated} need a setting no flag states (named above)")
    return 0 if agree == stated else 1


if __name__ == "__main__":
    sys.exit(main())
