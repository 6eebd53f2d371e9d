"""Linting a Megatron-LM argument list: unknown flags (nearest flag, line), values, validate_args rules.

Rules cite NVIDIA/Megatron-LM ``megatron/training/arguments.py`` at d98e8a6: "validate_args N" is that
file's line N. Flags are checked against the flag table of the Megatron-core release in use; a flag only another
modelled release has is a version mismatch (``autotune.emit.megatron_versions``). Where Megatron-LM's own
``megatron.training`` is importable and is the release in use, its parser runs too.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace

from autotune.emit.argv_lint import ParsedArgs, duplicate_problems, tokenize, value_problems
from autotune.emit.megatron_flags import MEGATRON_CORE_RELEASES, megatron_flag_table, megatron_flags_file
from autotune.emit.megatron_model_flags import ROUTER_FP32_EXPERTS
from autotune.emit.megatron_scripts import script_flags
from autotune.emit.megatron_versions import version_problems
from autotune.emit.problems import Problem, Severity

__all__ = ["megatron_args_problems"]


def _rule_problems(a: ParsedArgs, world_size: int, env: Mapping[str, str] | None) -> list[Problem]:
    out: list[Problem] = []

    def err(path: str, message: str, fix: str, severity: Severity = "error") -> None:
        out.append(Problem(path=path, severity=severity, message=message, fix=fix, line=a.line(path),
                           source="rules"))

    tp = a.integer("--tensor-model-parallel-size") or 1
    pp = a.integer("--pipeline-model-parallel-size") or 1
    cp = a.integer("--context-parallel-size") or 1
    ep = a.integer("--expert-model-parallel-size") or 1
    mp = tp * pp * cp
    dp = world_size // mp if world_size % mp == 0 else None
    if dp is None:  # validate_args 433
        err("--tensor-model-parallel-size", f"world size ({world_size}) is not divisible by total_model_size "
            f"tp*pp*cp = {tp}*{pp}*{cp} = {mp}", f"choose tp, pp and cp whose product divides {world_size}")
    heads = a.integer("--num-attention-heads")
    if heads is not None and heads % tp:  # TransformerConfig
        err("--num-attention-heads", f"num_attention_heads ({heads}) must be a multiple of "
            f"tensor_model_parallel_size ({tp})", f"use a tp that divides {heads}")
    groups = a.integer("--num-query-groups")
    if a.has("--group-query-attention") and groups and groups % tp and tp % groups:
        err("--num-query-groups", f"num_query_groups ({groups}) must be a multiple or a divisor of tp ({tp})",
            "change tp or the query groups")
    layers = a.integer("--num-layers")
    first, last = a.integer("--decoder-first-pipeline-num-layers"), a.integer("--decoder-last-pipeline-num-layers")
    per_stage = None
    layout = a.value("--pipeline-model-parallel-layout")
    if layers is not None and layout is None:  # a layout spells the stages out (validate_args 941)
        # The embedding / loss take a layer's slot each in the split (validate_args 962-967, 991-995).
        layers += a.has("--account-for-embedding-in-pipeline-split") + a.has("--account-for-loss-in-pipeline-split")
        if first is None and last is None:
            if layers % pp:  # validate_args 969
                err("--pipeline-model-parallel-size", f"Number of layers should be divisible by the "
                    f"pipeline-model-parallel size ({layers} layers, pp={pp})",
                    "choose pp dividing the layers, or give --decoder-first/last-pipeline-num-layers")
            else:
                per_stage = layers // pp
        else:
            middle = pp - (first is not None) - (last is not None)
            rest = layers - (first or 0) - (last or 0)
            if rest < 0 or (middle > 0 and rest % middle) or (middle == 0 and rest):
                err("--decoder-first-pipeline-num-layers", f"{layers} layers minus the first/last stage layers "
                    f"({first}, {last}) do not split evenly over the other {middle} stage(s)",
                    "adjust the first/last stage layer counts")
    vpp_layers = a.integer("--num-layers-per-virtual-pipeline-stage")
    vpp_stages = a.integer("--num-virtual-stages-per-pipeline-rank")
    if sum(x is not None for x in (vpp_layers, vpp_stages, a.value("--pipeline-model-parallel-layout"))) > 1:
        err("--num-layers-per-virtual-pipeline-stage", "give at most one of --num-layers-per-virtual-pipeline-stage, "
            "--num-virtual-stages-per-pipeline-rank and --pipeline-model-parallel-layout (validate_args 933)",
            "keep one")
    if vpp_layers is not None or vpp_stages is not None:
        flag = ("--num-layers-per-virtual-pipeline-stage" if vpp_layers is not None
                else "--num-virtual-stages-per-pipeline-rank")
        if per_stage is not None and (vpp_layers or vpp_stages) and per_stage % (vpp_layers or vpp_stages):  # 973/998
            err(flag, f"number of layers per pipeline stage ({per_stage}) must be divisible by {flag[2:]} "
                f"({vpp_layers or vpp_stages})", "pick a divisor of the layers per stage")
        need = 2 if a.has("--no-overlap-p2p-communication") else 1
        if pp <= need:  # 1003/1007
            err(flag, f"the interleaved schedule needs pipeline-model-parallel size > {need} (got {pp})",
                "raise pp or drop the virtual-pipeline flag")
    mbs, gbs = a.integer("--micro-batch-size"), a.integer("--global-batch-size")
    if (mbs is None and not a.has("--micro-batch-size")) or (mbs is not None and mbs <= 0):  # 693
        err("--micro-batch-size", "--micro-batch-size is required and must be > 0", "give --micro-batch-size N")
    elif mbs is not None and gbs is not None and dp and gbs % (mbs * dp):  # num_microbatches_calculator.py:381
        err("--global-batch-size", f"global batch size ({gbs}) is not divisible by micro batch size ({mbs}) times "
            f"data parallel size ({dp})", f"use a multiple of {mbs * dp}")
    if a.has("--step-batch-size-schedule") and a.has("--global-batch-size"):  # 700
        err("--step-batch-size-schedule", "Cannot specify both --step-batch-size-schedule and --global-batch-size",
            "drop one")
    seq = a.integer("--seq-length")
    if cp > 1 and seq is not None and seq % (2 * cp):  # 1337
        err("--seq-length", f"seq-length ({seq}) should be a multiple of 2 * context-parallel-size ({2 * cp})",
            f"use a multiple of {2 * cp}")
    mfsdp = a.has("--use-megatron-fsdp")
    dist_opt = a.has("--use-distributed-optimizer") or mfsdp  # Megatron-FSDP v1 turns it on (1124-1135)
    if a.has("--overlap-param-gather"):  # 1025/1029
        if not dist_opt:
            err("--overlap-param-gather", "--overlap-param-gather only supported with distributed optimizer, megatron "
                "fsdp, or dist_muon", "add --use-distributed-optimizer or drop --overlap-param-gather")
        if not a.has("--overlap-grad-reduce"):
            err("--overlap-param-gather", "Must use --overlap-param-gather with --overlap-grad-reduce",
                "add --overlap-grad-reduce")
    if mfsdp and a.value("--ckpt-format") != "fsdp_dtensor":  # 1169-1170 (the default is torch_dist)
        err("--ckpt-format", "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format",
            "use --ckpt-format fsdp_dtensor")
    if mfsdp and env is not None and env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":  # 1166-1167
        err("CUDA_DEVICE_MAX_CONNECTIONS", "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset",
            "unset CUDA_DEVICE_MAX_CONNECTIONS")
    if a.has("--fp8-param-gather") and not (dist_opt or a.has("--use-torch-fsdp2") or a.has("--use-megatron-fsdp")):
        err("--fp8-param-gather", "--fp8-param-gather only supported with distributed optimizer, torch fsdp2, "
            "megatron fsdp (validate_args 1097)", "add --use-distributed-optimizer")
    if a.has("--fp4-format") and a.has("--fp8-format"):  # d98e8a6 arguments.py:1100-1101
        err("--fp4-format", "--fp4-format and --fp8-format cannot be used simultaneously", "keep one")
    if a.has("--fp4-param-gather") and not a.has("--fp4-format"):  # arguments.py:1104-1105
        err("--fp4-param-gather", "--fp4-param-gather must be used together with --fp4-format",
            "add --fp4-format e2m1 or drop --fp4-param-gather")
    if a.has("--bf16") and a.has("--fp16"):  # 1196
        err("--fp16", "--fp16 and --bf16 are both given (Megatron fails a bare assert)", "keep one")
    if a.has("--save") and not (a.integer("--save-interval") or 0) > 0:  # 1362
        err("--save", "--save requires --save-interval > 0", "add --save-interval N")
    granularity = a.value("--recompute-granularity")
    if granularity == "selective" and a.has("--recompute-method"):  # 1427
        err("--recompute-method", "recompute method is not yet supported for selective recomputing granularity",
            "drop --recompute-method (and --recompute-num-layers) with selective recompute")
    if granularity == "full" and (not a.has("--recompute-method") or a.integer("--recompute-num-layers") is None):
        err("--recompute-granularity", "full recompute needs --recompute-method (uniform|block) and "
            "--recompute-num-layers (TransformerConfig)", "add --recompute-method block --recompute-num-layers N")
    if granularity is None and (a.has("--recompute-method") or a.has("--recompute-num-layers")):
        err("--recompute-method", "--recompute-method/--recompute-num-layers without --recompute-granularity do "
            "nothing", "add --recompute-granularity full", "warning")
    if a.has("--sequence-parallel") and tp == 1:  # 1436
        err("--sequence-parallel", "sequence parallelism with tensor-model-parallel size 1: Megatron silently "
            "disables it", "drop --sequence-parallel or raise tp", "warning")
    if a.has("--tp-comm-overlap") and not (a.has("--sequence-parallel") and tp > 1):  # 1442
        err("--tp-comm-overlap", "Tensor parallel communication/GEMM overlap can happen only when sequence "
            "parallelism is enabled", "add --sequence-parallel (with tp > 1)")
    experts = a.integer("--num-experts")
    if ep > 1:  # 1656/1658
        if experts is None:
            err("--expert-model-parallel-size", f"expert parallelism ({ep}) without --num-experts",
                "give --num-experts")
        elif experts % ep:
            err("--expert-model-parallel-size", f"--num-experts ({experts}) must be divisible by "
                f"expert-model-parallel size ({ep})", "pick an ep dividing the expert count")
        if tp > 1 and not a.has("--sequence-parallel"):  # ModelParallelConfig.__post_init__ raises
            err("--expert-model-parallel-size", "When using expert parallelism and tensor parallelism, sequence "
                "parallelism must be used", "add --sequence-parallel")
        etp = a.integer("--expert-tensor-parallel-size") or tp
        if world_size % (etp * ep * pp):
            err("--expert-model-parallel-size", f"world size ({world_size}) is not divisible by expert tensor x expert "
                f"x pipeline parallel ({etp}*{ep}*{pp})", "choose ep so that etp*ep*pp divides the world size")
    if experts is not None and experts >= ROUTER_FP32_EXPERTS and a.value("--moe-router-dtype") is None:
        err("--num-experts", f"{experts} experts routed in the model's dtype: Megatron-core warns \"Using a large "
            "number of experts (e.g. >=32) without fp32 routing\" (transformer_config.py:2794-2802, core 0.19)",
            "add --moe-router-dtype fp32 (Megatron-Bridge sets it for DeepSeek-V3, GLM-4.5 and Kimi)", "warning")
    if a.has("--async-save") and not a.has("--use-persistent-ckpt-worker"):  # 1817
        err("--async-save", "--async-save without --use-persistent-ckpt-worker: Megatron silently drops it and "
            "every save blocks training", "add --use-persistent-ckpt-worker")
    if env is not None and (tp > 1 or cp > 1) and not mfsdp and env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":  # 1478
        err("CUDA_DEVICE_MAX_CONNECTIONS", "tp or cp > 1 needs CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell "
            "(Megatron raises on Ampere/Hopper)", "export CUDA_DEVICE_MAX_CONNECTIONS=1", "warning")
    return out


def _megatron_own_problems(argv: Sequence[str], world_size: int) -> list[Problem]:
    """Megatron's own parse_args + validate_args, when ``megatron.training`` is importable.

    Not exercised by this project's tests (Megatron-LM is not installed here). Megatron reads the
    world size from ``WORLD_SIZE``; its assertions, argparse exits and errors become Problems.
    """
    try:
        from megatron.training import arguments as mt  # type: ignore[import-not-found]
    except ImportError:
        return []
    saved_argv, saved_env = sys.argv, {k: os.environ.get(k) for k in ("WORLD_SIZE", "RANK")}
    sys.argv = ["pretrain_gpt.py", *argv]
    os.environ.update(WORLD_SIZE=str(world_size), RANK="0")
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            mt.validate_args(mt.parse_args())
        return []
    except SystemExit:
        message = stderr.getvalue().strip().splitlines()[-1:] or ["Megatron's parser exited"]
        return [Problem(path="argv", severity="error", message=message[0], fix="fix the arguments", source="megatron")]
    except (AssertionError, ValueError, RuntimeError, TypeError) as exc:
        return [Problem(path="argv", severity="error", message=f"Megatron validate_args: {exc}",
                        fix="fix the arguments", source="megatron")]
    finally:
        sys.argv = saved_argv
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def megatron_args_problems(argv: Sequence[str], world_size: int, *, env: Mapping[str, str] | None = None,
                           lines: Sequence[int] | None = None, release: str | None = None,
                           installed: str | None = None, declared: str | None = None,
                           script: str | None = None) -> list[Problem]:
    """Every problem in a Megatron-LM argument list for ``world_size`` GPUs: unknown flags (nearest flag
    suggested), values outside a flag's type, choices or sane range, and the validate_args rules. ``env``
    (the job's exported variables), when given, is checked for CUDA_DEVICE_MAX_CONNECTIONS; ``lines[i]``
    is ``argv[i]``'s line in its file (see :func:`autotune.emit.shell_args.parse_shell_args_with_lines`).
    ``release``: the Megatron-core release in use (default the newest modelled), whose flag table applies;
    ``installed`` (the installed megatron-core) and ``declared`` (the release the file names) word mismatches;
    ``script``: the training script the launch line runs, whose own flags parse too (``megatron_scripts``)."""
    release = release or MEGATRON_CORE_RELEASES[-1]
    extra = script_flags(script)
    table = {**extra.table, **megatron_flag_table(release)}
    mismatched, covered = version_problems(argv, release, installed=installed, declared=declared, lines=lines)
    given, problems = tokenize(list(argv), table, engine=f"Megatron-core {release}",
                               table_file=megatron_flags_file(release), lines=lines)
    problems = mismatched + [_script_flag(p, script) if extra.open else p for p in problems if p.path not in covered]
    if extra.conditional:
        problems += [Problem(path=g.flag, severity="warning", source="rules", line=g.line, message=extra.conditional,
                             fix="install nvidia-modelopt where the job runs, or drop it")
                     for g in given if g.flag in extra.table and g.flag not in megatron_flag_table(release)]
    problems += duplicate_problems(given, table)
    parsed = ParsedArgs(given, table)
    problems += value_problems(parsed, table)
    problems += _rule_problems(parsed, world_size, env)
    if installed is None or installed.startswith(release + "."):  # the installed parser is the release in use
        problems += _megatron_own_problems(argv, world_size)
    return problems


def _script_flag(problem: Problem, script: str | None) -> Problem:
    """An unknown flag on a script that adds its own (not Megatron-LM's GPT scripts): a warning naming it."""
    if not problem.message.startswith("unrecognized argument"):
        return problem
    return replace(problem, severity="warning", message=f"{problem.path} is no flag of Megatron-core's parser: "
                   f"{script} may add it (its extra_args_provider); not checked",
                   fix=f"check it against {script}'s own arguments")
