"""A Megatron-DeepSpeed argument file beside the DeepSpeed JSON it runs with: what neither file shows alone.

``autotune validate megatron_args.sh ds_config.json`` checks each file, then the two together:

- **micro-batch**: Megatron-DeepSpeed hands DeepSpeed its global batch every step, dp x ``--micro-batch-size`` x
  its micro-batch count (microsoft/Megatron-DeepSpeed@f4157bea megatron/training.py:1253-1258), and DeepSpeed divides
  that by the JSON's own ``train_micro_batch_size_per_gpu`` into accumulation steps (DeepSpeed 0.19.8
  ``DeepSpeedEngine.set_train_batch_size``, runtime/engine.py:1320-1335: ValueError where it does not divide). The
  data loader still serves micro-batches of ``--micro-batch-size``, so two values either stop the first step or train
  another batch;
- **ZeRO-3's build**: ``pretrain_gpt.py:46-50`` builds the model under ``deepspeed.zero.Init(enabled=args.zero_stage
  == 3)``: a JSON at stage 3 with ``--zero-stage`` not 3 builds the whole model on every rank before DeepSpeed
  partitions it; ``--zero-stage 3`` with a JSON below stage 3 partitions the weights at build for an engine that
  expects them whole. ``--zero-stage`` is otherwise read only for logging (training.py:1056), and its default is 1;
- **MoE layers under the pipeline engine with tp > 1**: they send their aggregated loss beside the activation, and
  DeepSpeed's pipeline engine, which partitions what it sends when tp > 1 unless the JSON's ``pipeline`` block sets
  ``pipe_partitioned`` / ``grad_partitioned`` false, asserts that no tensor but the first needs a gradient
  (runtime/pipe/engine.py:736; measured here, tests/engines/test_megatron_deepspeed_moe_pipeline.py).

A launch script given without its JSON is checked with the config it writes itself (a here-document, or a template
filled by sed: :func:`written_pair_problems`), each problem at the script's line that writes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from autotune.emit.argv_lint import ParsedArgs, tokenize
from autotune.emit.megatron_flags import MEGATRON_DEEPSPEED_FLAGS_FILE, megatron_deepspeed_flag_table
from autotune.emit.problems import Problem, problem_at
from autotune.emit.shell_args import read_megatron_args_file_with_lines
from autotune.emit.validate_json import read_deepspeed_config
from autotune.emit.written_deepspeed_config import config_name, written_deepspeed_config

__all__ = ["megatron_deepspeed_pair_problems", "pair_problems", "written_pair_problems", "cpu_optimizer_problem",
           "client_cpu_adam", "client_optimizer", "flags_given"]

_FORK = "deepspeedai/Megatron-DeepSpeed@4efb479d"

_MDS_ZERO_DEFAULT = 1
"""Megatron-DeepSpeed's ``--zero-stage`` default (megatron/arguments.py:1487 at f4157bea: ``default=1.0``)."""


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _experts(a: ParsedArgs) -> int:
    """The largest expert count of ``--num-experts`` (nargs '+': one count per MoE layer group)."""
    counts = [int(v) for v in (a.value("--num-experts") or "1").split() if v.lstrip("-").isdigit()]
    return max(counts, default=1)


def flags_given(argv: Sequence[str]) -> set[str]:
    """The canonical names of the Megatron-DeepSpeed flags in ``argv``, underscores as dashes (the fork spells
    ``--cpu_torch_adam`` so): what :func:`client_cpu_adam` and :func:`cpu_optimizer_problem` take."""
    table = megatron_deepspeed_flag_table()
    given, _ = tokenize(list(argv), table, engine="Megatron-DeepSpeed", table_file=MEGATRON_DEEPSPEED_FLAGS_FILE)
    return _dashed(given)


def _dashed(given) -> set[str]:
    return {g.flag.replace("_", "-") for g in given}


def client_cpu_adam(flags) -> bool:
    """The fork hands deepspeed.initialize DeepSpeedCPUAdam: ``--cpu-optimizer`` without ``--cpu_torch_adam``
    (megatron/optimizer/__init__.py:83-94, megatron/training.py:617-623 at 4efb479d). ``flags``: the flag names
    given (dashes)."""
    return "--cpu-optimizer" in flags and "--cpu-torch-adam" not in flags


def client_optimizer(flags) -> str | None:
    """The optimizer the fork passes to deepspeed.initialize as the DeepSpeed config's checks take it
    (``client_optimizer`` of ``autotune.emit.validate.validate_deepspeed_config``): "DeepSpeedCPUAdam" where
    :func:`client_cpu_adam`, else None (another: apex's FusedAdam, torch's Adam or AdamW, none DeepSpeed runs under
    ZeRO-Offload). ``flags``: the flag names given (dashes)."""
    return "DeepSpeedCPUAdam" if client_cpu_adam(flags) else None


def cpu_optimizer_problem(flags, ds: dict) -> tuple[str, str] | None:
    """(what, way out) where the script's optimizer and the DeepSpeed config's ZeRO-Offload cannot run together, as
    DeepSpeed refuses them; None where they can. ``flags``: the flag names given (dashes)."""
    block = ds.get("zero_optimization") if isinstance(ds.get("zero_optimization"), dict) else {}
    offload = block.get("offload_optimizer") if isinstance(block.get("offload_optimizer"), dict) else {}
    device = str(offload.get("device", "none")).lower() if offload else "none"
    cpu, torch_adam = "--cpu-optimizer" in flags, "--cpu-torch-adam" in flags
    if device != "none" and ds.get("zero_force_ds_cpu_optimizer", True) is not False and not client_cpu_adam(flags):
        passed = "--cpu_torch_adam, so torch.optim.AdamW" if cpu else "no --cpu-optimizer, so Adam on the GPU"
        return (f"the DeepSpeed config offloads the optimizer to {device} (ZeRO-Offload) and the script passes "
                f"{passed} ({_FORK} megatron/optimizer/__init__.py:83-104): DeepSpeed refuses any optimizer but "
                "DeepSpeedCPUAdam there (deepspeed 0.19.8 runtime/engine.py:2342-2346, ZeRORuntimeException)",
                ("drop --cpu_torch_adam" if cpu else "add --cpu-optimizer") + ", or remove offload_optimizer")
    if cpu and device == "none" and not torch_adam:
        return (f"--cpu-optimizer builds DeepSpeedCPUAdam ({_FORK} megatron/optimizer/__init__.py:83-89), which "
                "asserts its parameters are in host memory (deepspeed 0.19.8 ops/adam/cpu_adam.py:148), and the "
                "DeepSpeed config offloads no optimizer",
                "set zero_optimization.offload_optimizer.device to cpu (ZeRO 1-3), or drop --cpu-optimizer")
    return None


def megatron_deepspeed_pair_problems(args_path: str | Path, ds_path: str | Path) -> list[Problem]:
    """The problems of a Megatron-DeepSpeed argument file and a DeepSpeed JSON run together (module docstring); each
    at the JSON key to change, with that file's line."""
    argv, lines, _ = read_megatron_args_file_with_lines(args_path)
    data, key_lines, _ = read_deepspeed_config(ds_path)
    if not isinstance(data, dict):
        return []
    return pair_problems(argv, data, args_name=Path(args_path).name, lines=lines, key_lines=key_lines)


def written_pair_problems(args_path: str | Path, *, world_size: int, tp: int = 1, pp: int = 1, cp: int = 1,
                          template: str | None = None) -> tuple[list[Problem], str | None]:
    """What a launch script and the DeepSpeed config it writes and names with ``--deepspeed_config`` show, as a
    given pair is checked: the config's own problems for ``world_size`` ranks, then :func:`pair_problems`; each at
    the script's line that writes the config; a warning saying what was not checked where the script writes no
    config by the name it gives (:func:`_unchecked_config`) or the written config does not read (a sed template
    neither ``template``, given beside the script, nor next to it; variables the script does not set), and
    InputError where its filled text is not JSON, as the fork's json.load refuses it; with the config checked (how
    the script writes it, and where; None: none)."""
    argv, lines, _ = read_megatron_args_file_with_lines(args_path)
    name = Path(args_path).name
    written = written_deepspeed_config(str(args_path), config_name(argv), template, subject="DeepSpeed config",
                                       give=f"too (autotune validate {args_path} CONFIG.json)")
    if written is None:
        return _unchecked_config(str(args_path), argv, lines), None
    if written.data is None:
        fix = written.fix or "give the config too"
        if written.template:  # the sed template, not found: given beside the script it is filled
            fix = (f"give {written.template} too (autotune validate {args_path} PATH/{written.template}), or the "
                   f"filled config (autotune validate {args_path} CONFIG.json)")
        return [Problem(path="--deepspeed_config", severity="warning", line=written.line, message=(
            f"{written.unread}: the flags are not checked against it (micro-batch, ZeRO-3's build, MoE under the "
            "pipeline engine)"), fix=fix)], None
    from autotune.emit.validate import validate_deepspeed_config

    found = validate_deepspeed_config(written.data, world_size=world_size, tp=tp, pp=pp, cp=cp,
                                      client_optimizer=client_optimizer(flags_given(argv)))
    found += pair_problems(argv, written.data, args_name=name, lines=lines)
    return [dataclasses.replace(p, line=written.line, message=f"in {written.what}: {p.message}")
            for p in found], written.what


def _unchecked_config(args_path: str, argv: Sequence[str], lines: Sequence[int]) -> list[Problem]:
    """A warning at ``--deepspeed_config`` naming the config a script runs with but neither writes nor was given with:
    nothing checks it or the flags against it; none where the script names none."""
    name = config_name(argv)
    if name is None:
        return []
    at = max((i for i, a in enumerate(argv) if a.partition("=")[0] in ("--deepspeed_config", "--deepspeed-config")),
             default=None)
    unset = "$" in name  # a variable the script leaves to the run's environment
    beside = Path(args_path).parent / name
    given = str(beside) if not unset and beside.is_file() else "CONFIG.json" if unset else f"PATH/{Path(name).name}"
    said = (f"--deepspeed_config {name} names a variable the script does not set" if unset else
            f"--deepspeed_config {name} is neither written by the script (a here-document or sed template) nor given")
    return [Problem(path="--deepspeed_config", severity="warning",
                    line=lines[at] if at is not None and at < len(lines) else None, message=(
        f"{said}: the DeepSpeed config is not checked, nor the flags against it (micro-batch, ZeRO-3's build, "
        "ZeRO-Offload's optimizer, MoE under the pipeline engine)"),
        fix=f"give the config too (autotune validate {args_path} {given})")]


def pair_problems(argv: Sequence[str], data: dict, *, args_name: str, lines: Sequence[int] | None = None,
                  key_lines: dict | None = None) -> list[Problem]:
    """:func:`megatron_deepspeed_pair_problems` of an argument list and a config dict (a checkpoint's: no lines);
    ``args_name`` names where the arguments came from in the messages."""
    table = megatron_deepspeed_flag_table()
    given, _ = tokenize(list(argv), table, engine="Megatron-DeepSpeed", table_file=MEGATRON_DEEPSPEED_FLAGS_FILE,
                        lines=lines)
    a = ParsedArgs(given, table)
    key_lines = key_lines or {}
    out: list[Problem] = []

    mbs, json_mbs = a.integer("--micro-batch-size"), _int(data.get("train_micro_batch_size_per_gpu"))
    if mbs is not None and json_mbs is not None and mbs != json_mbs:
        out.append(problem_at(("train_micro_batch_size_per_gpu",), key_lines, message=(
            f"{json_mbs} here, --micro-batch-size {mbs} in {args_name}: Megatron-DeepSpeed sets DeepSpeed's batch "
            f"each step from its own micro-batch and DeepSpeed divides it by this one (set_train_batch_size), while "
            f"the data loader serves micro-batches of {mbs}: the first step stops, or trains {mbs}/{json_mbs} times "
            "the batch"), fix=f"set train_micro_batch_size_per_gpu to {mbs} (or --micro-batch-size to {json_mbs})"))

    zero = a.integer("--zero-stage")
    args_zero = _MDS_ZERO_DEFAULT if zero is None else zero
    block = data.get("zero_optimization")
    json_zero = _int(block.get("stage", 0)) if isinstance(block, dict) else 0
    if json_zero is not None and (json_zero == 3) != (args_zero == 3):
        said = f"--zero-stage {zero}" if zero is not None else f"no --zero-stage (default {_MDS_ZERO_DEFAULT})"
        if json_zero == 3:
            why = ("so pretrain_gpt.py builds the model without deepspeed.zero.Init: every rank holds all of it "
                   "before DeepSpeed partitions it")
        else:
            why = (f"so pretrain_gpt.py partitions the weights at build (deepspeed.zero.Init) for a stage-{json_zero} "
                   "engine that expects them whole")
        out.append(problem_at(("zero_optimization", "stage"), key_lines, message=(
            f"stage {json_zero} here, {said} in {args_name}: {why}"),
            fix=f"give --zero-stage {json_zero} in {args_name}"))

    tp = a.integer("--tensor-model-parallel-size") or 1
    pp = a.integer("--pipeline-model-parallel-size") or 1
    pipeline = data.get("pipeline") if isinstance(data.get("pipeline"), dict) else {}
    partitioned = [k for k in ("pipe_partitioned", "grad_partitioned") if pipeline.get(k, True) is not False]
    if _experts(a) > 1 and pp > 1 and tp > 1 and not a.has("--no-pipeline-parallel") and partitioned:
        out.append(problem_at(("pipeline",) + ((partitioned[0],) if "pipeline" in data else ()), key_lines, message=(
            f"{args_name} runs MoE layers ({_experts(a)} experts) under DeepSpeed's pipeline engine with tp {tp}, "
            f"which partitions what stages send ({', '.join(partitioned)} on): the MoE loss sent beside the "
            "activation stops the first step (runtime/pipe/engine.py:736)"),
            fix='set "pipeline": {"pipe_partitioned": false, "grad_partitioned": false}'))

    if (found := cpu_optimizer_problem(_dashed(given), data)) is not None:
        what, fix = found
        out.append(problem_at(("zero_optimization", "offload_optimizer"), key_lines, message=(
            f"with {args_name}: {what}"), fix=fix))
    return out
