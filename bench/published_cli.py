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
from autotune.cost.published_runs import PublishedRun, predict_run, published_runs
from autotune.specs.hardware import GIB
from autotune.specs.plan import ParallelPlan

__all__ = ["CliCase", "cli_argv", "not_expressible", "compare_run"]

def not_expressible(run: PublishedRun, plan: ParallelPlan) -> str:
    """Why no `autotune estimate` command line states this run as the bench estimates it; empty when one does."""
    if run.layer_timing:
        return "a one-layer timing (Korthikanti Table 4), not a training step: the bench times one layer"
    if run.time_overrides.get("tp_backward_overlap") is False:
        return ("2021-22 code reduced the TP input gradient synchronously in backward; no release the CLI models "
                "(Megatron-core 0.16-0.19, Megatron-DeepSpeed) does, and no flag states it")
    if run.time_overrides.get("pp_overlap_interleaved") is False and plan.pp > 1 and plan.vpp > 1:
        return ("Megatron-LM before mid-2023 waited for every send of its interleaved pipeline schedule; the releases "
                "the CLI models overlap them (overlap_p2p_comm, autotune.cost.pp_sends), and no flag states it")
    if run.time_overrides.get("zero3_list_collectives"):
        return ("DeepSpeed before v0.5.5 gathered and reduce-scattered ZeRO-3 parameters through per-rank tensor "
                "lists (autotune.cost.zero3_gathers); the release the CLI models (0.19) coalesces them")
    if run.time_overrides.get("attention_kernel"):
        return (f"its attention kernel ({run.time_overrides['attention_kernel']}: llm-foundry 2023's Triton "
                "FlashAttention) runs in none of the engines the CLI models, and no flag states it")
    if plan.cp > 1 and run.time_overrides.get("cp_repeat_kv"):
        return ("torchtitan before v0.2.2 repeated K and V to every query head (repeat_kv, v0.2.0 models/llama3/model/"
                "model.py:236), so context parallelism exchanged them at the query width; the releases the CLI "
                "models pass enable_gqa instead")
    return ""


def _run_setting_flags(plan: ParallelPlan, run: PublishedRun) -> list[str]:
    """The plan's run settings and the run's stated ones (``time_overrides``, and ``memory_overrides``' saved linear
    inputs, gradient accumulation and pipeline buffers) as flags."""
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
    gathered = run.memory_overrides.get("linear_inputs_gathered")
    if gathered is not None:  # the run's code saves what its engine's would not (Llama 3: Korthikanti's shards)
        out += ["--linear-inputs", "gathered" if gathered else "shard"]
    sharded = run.memory_overrides.get("grad_accumulation_sharded")
    if sharded is not None:  # Llama 3: gradients reduce-scattered every micro-batch
        out += ["--grad-accumulation", "sharded" if sharded else "unsharded"]
    released = run.memory_overrides.get("pipeline_buffers_released")
    if released is not None:  # Llama 3: stage inputs and outputs freed once unused
        out += ["--pipeline-buffers", "released" if released else "kept"]
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
