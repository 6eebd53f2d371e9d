"""Linting a Megatron-DeepSpeed argument list against Megatron-DeepSpeed's own flag table.

Flags: ``megatron_deepspeed_flags.json`` (deepspeedai/Megatron-DeepSpeed ``megatron/arguments.py`` at
4efb479 with ``deepspeed.add_config_arguments``). "MDS validate_args N" below is that file's line N;
Megatron-LM-only flags (``--context-parallel-size``, ``--group-query-attention``, ...) are unknown here.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.emit.argv_lint import ParsedArgs, duplicate_problems, tokenize, value_problems
from autotune.emit.megatron_deepspeed_model import experts_whole_per_tp_rank
from autotune.emit.megatron_flags import MEGATRON_DEEPSPEED_FLAGS_FILE, megatron_deepspeed_flag_table
from autotune.emit.problems import Problem, Severity

__all__ = ["megatron_deepspeed_args_problems"]


def _rule_problems(a: ParsedArgs, world_size: int) -> list[Problem]:
    out: list[Problem] = []

    def err(path: str, message: str, fix: str, severity: Severity = "error") -> None:
        out.append(Problem(path=path, severity=severity, message=message, fix=fix, line=a.line(path),
                           source="rules"))

    tp = a.integer("--tensor-model-parallel-size") or 1
    pp = a.integer("--pipeline-model-parallel-size") or 1
    sp = a.integer("--ds-sequence-parallel-size") or 1
    mp = tp * pp * sp
    dp = world_size // mp if world_size % mp == 0 else None
    if dp is None:  # MDS validate_args 75, 104
        err("--tensor-model-parallel-size", f"world size ({world_size}) is not divisible by tensor parallel size "
            f"({tp}) times pipeline parallel size ({pp}) times sequence parallel size ({sp})",
            f"choose tp, pp and --ds-sequence-parallel-size whose product divides {world_size}")
    if a.has("--no-pipeline-parallel") and pp != 1:  # MDS validate_args 94
        err("--no-pipeline-parallel", "pipeline_model_parallel_size must be 1 if pipeline parallel is disabled",
            "drop --no-pipeline-parallel or use --pipeline-model-parallel-size 1")
    zero = a.integer("--zero-stage")
    if zero is not None and zero >= 2 and not a.has("--no-pipeline-parallel"):
        # Without --no-pipeline-parallel the model is a PipelineModule (even at pp 1): deepspeed/runtime/pipe/engine.py:77
        err("--zero-stage", f"ZeRO-{zero} under DeepSpeed's pipeline engine: it asserts 'ZeRO-2 and ZeRO-3 are "
            "incompatible with pipeline parallelism' (runtime/pipe/engine.py:77)",
            "add --no-pipeline-parallel (with pp 1), or use --zero-stage 0/1")
    if zero is not None and not 0 <= zero <= 3:
        err("--zero-stage", f"--zero-stage {zero}: DeepSpeed's stages are 0-3", "use 0, 1, 2 or 3")
    if a.has("--deepspeed") and not (a.has("--deepspeed_config") or a.has("--deepspeed-config")):
        err("--deepspeed", "--deepspeed without --deepspeed_config: deepspeed.initialize has no config",
            "add --deepspeed_config ds_config.json")
    heads, groups = a.integer("--num-attention-heads"), a.integer("--num-key-value-heads")
    if heads is not None and heads % tp:
        err("--num-attention-heads", f"num_attention_heads ({heads}) is not divisible by tensor parallel size "
            f"({tp}) (megatron/model/transformer.py: mpu.divide)", f"use a tp that divides {heads}")
    if heads is not None and groups and heads % groups:  # MDS validate_args 446
        err("--num-key-value-heads", f"num_attention_heads must be divisible by num_key_value_heads (got "
            f"{heads} and {groups})", "use a divisor of the head count")
    hidden = a.integer("--hidden-size")
    if hidden is not None and heads and not a.has("--kv-channels") and hidden % heads:  # MDS validate_args 299
        err("--hidden-size", f"hidden size ({hidden}) is not divisible by the heads ({heads})",
            "give --kv-channels, or a hidden size divisible by the heads")
    seq, max_pos = a.integer("--seq-length"), a.integer("--max-position-embeddings")
    if seq is not None and max_pos is not None and max_pos < seq:  # MDS validate_args 311
        err("--max-position-embeddings", f"--max-position-embeddings ({max_pos}) < --seq-length ({seq})",
            f"use --max-position-embeddings {seq} or more")
    mbs, gbs = a.integer("--micro-batch-size"), a.integer("--global-batch-size")
    if (mbs is None and not a.has("--micro-batch-size")) or (mbs is not None and mbs <= 0):  # MDS validate_args 165
        err("--micro-batch-size", "--micro-batch-size is required and must be > 0", "give --micro-batch-size N")
    elif mbs is not None and gbs is not None and dp and gbs % (mbs * dp):
        err("--global-batch-size", f"global batch size ({gbs}) is not divisible by micro batch size ({mbs}) times "
            f"data parallel size ({dp})", f"use a multiple of {mbs * dp}")
    if a.has("--num-layers-per-virtual-pipeline-stage") and pp <= 2:  # MDS validate_args 174
        err("--num-layers-per-virtual-pipeline-stage", "pipeline-model-parallel size should be greater than 2 with "
            "interleaved schedule", "raise pp or drop the flag")
    if a.has("--fp16") and a.has("--bf16"):  # MDS validate_args 188
        err("--fp16", "--fp16 and --bf16 are both given (Megatron-DeepSpeed asserts)", "keep one")
    lr, min_lr = a.number("--lr"), a.number("--min-lr")
    if lr is not None and min_lr is not None and min_lr > lr:  # MDS validate_args 319
        err("--min-lr", f"--min-lr ({min_lr:g}) > --lr ({lr:g})", "make --min-lr at most --lr")
    if (a.has("--fp8-hybrid") or a.has("--fp8-e4m3")) and a.value("--transformer-impl") != "transformer_engine":
        err("--fp8-hybrid", "transformer-engine required for fp8 training and inference (MDS validate_args 373)",
            "add --transformer-impl transformer_engine")
    if whole := experts_whole_per_tp_rank(a.integer("--num-experts"), tp, a.has("--enable-expert-tensor-parallelism")):
        err("--num-experts", f"{whole}, so the experts' weights, gradients, optimizer states and FLOPs are not split "
            f"{tp} ways (autotune's estimate of this file splits them)", "add --enable-expert-tensor-parallelism",
            "warning")
    if a.has("--sequence-parallel") and tp == 1:
        err("--sequence-parallel", "sequence parallelism with tensor-model-parallel size 1 does nothing",
            "drop --sequence-parallel or raise tp", "warning")
    return out


def megatron_deepspeed_args_problems(argv: Sequence[str], world_size: int, *,
                                     lines: Sequence[int] | None = None) -> list[Problem]:
    """Every problem in a Megatron-DeepSpeed ``pretrain_gpt.py`` argument list for ``world_size`` ranks:
    unknown flags (nearest Megatron-DeepSpeed flag, line), values, and its validate_args rules."""
    table = megatron_deepspeed_flag_table()
    given, problems = tokenize(list(argv), table, engine="Megatron-DeepSpeed",
                               table_file=MEGATRON_DEEPSPEED_FLAGS_FILE, lines=lines)
    problems += duplicate_problems(given, table)
    parsed = ParsedArgs(given, table)
    problems += value_problems(parsed, table)
    problems += _rule_problems(parsed, world_size)
    return problems
