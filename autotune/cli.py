"""`autotune` command line: thin subcommands over the library API.

Each subcommand parses, calls the library, prints. ``--json`` puts the machine-readable
result alone on stdout. Bad input: the problems on stderr, exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from autotune.errors import InputError

__all__ = ["main", "build_parser"]

EXIT_OK, EXIT_PROBLEMS, EXIT_BAD_INPUT = 0, 1, 2


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _preset_epilog() -> str:
    try:
        from autotune.specs.presets import gpu_preset_names, model_preset_names

        return ("model presets: " + ", ".join(model_preset_names()) + "\n\ngpu presets: "
                + ", ".join(gpu_preset_names()))
    except Exception:  # presets unreadable: --help must still work
        return ""


def _add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and cluster")
    g.add_argument("--model", required=True, help="preset name, Hugging Face config.json, or model YAML")
    g.add_argument("--gpu", help="GPU preset name (see the list below)")
    g.add_argument("--num-gpus", type=_positive_int, help="total GPUs")
    g.add_argument("--gpus-per-node", type=_positive_int, help="GPUs per node (default: the GPU preset's)")
    g.add_argument("--cluster", help="cluster YAML (schemas/cluster.schema.json) instead of --gpu/--num-gpus")
    g.add_argument("--seq-len", type=_positive_int, default=4096, help="sequence length in tokens (default 4096)")
    g.add_argument("--global-batch", type=_positive_int, help="sequences per optimizer step (default: micro x dp)")
    p.add_argument("--json", action="store_true", help="print the machine-readable result only")


def _add_plan_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("plan")
    g.add_argument("--tp", type=_positive_int, default=1)
    g.add_argument("--pp", type=_positive_int, default=1)
    g.add_argument("--vpp", type=_positive_int, default=1, help="virtual stages per pipeline rank (interleaved)")
    g.add_argument("--cp", type=_positive_int, default=1)
    g.add_argument("--ep", type=_positive_int, default=1)
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=1, help="ZeRO stage (Megatron: 1 = distributed optimizer)")
    g.add_argument("--micro-batch", type=_positive_int, default=1)
    g.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                   help="Megatron sequence parallelism (default: on when tp > 1)")
    g.add_argument("--recompute", choices=("none", "selective", "full"), default="selective")
    g.add_argument("--recompute-num-layers", type=_positive_int, help="full recompute: layers per stage to recompute")
    g.add_argument("--precision", choices=("bf16", "fp16", "fp8"), default="bf16")
    g.add_argument("--optimizer", choices=("adamw", "sgd", "adafactor", "adamw8bit"), default="adamw")
    g.add_argument("--offload-optimizer", choices=("none", "cpu", "nvme"), default="none")
    g.add_argument("--offload-param", choices=("none", "cpu", "nvme"), default="none")
    g.add_argument("--nvme-path", help="local NVMe folder for nvme offload")
    g.add_argument("--framework", choices=("deepspeed", "megatron"), default="deepspeed",
                   help="engine holding the model states (default deepspeed)")
    g.add_argument("--flash-attention", action=argparse.BooleanOptionalAction, default=True)
    m = p.add_argument_group("memory settings")
    m.add_argument("--overhead-gib", type=float, help="CUDA context + NCCL buffers per GPU (default 1 GiB; 0 on cpu)")
    m.add_argument("--fragmentation", type=float, default=0.05, help="allocator fragmentation fraction (default 0.05)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autotune", description="Plan, estimate and tune large-model training "
                                     "on DeepSpeed and Megatron-LM.")
    sub = parser.add_subparsers(dest="command", required=True)
    est = sub.add_parser("estimate", help="memory ledger of one plan", epilog=_preset_epilog(),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(est)
    _add_plan_flags(est)
    est.set_defaults(handler=_cmd_estimate)
    return parser


def _load_inputs(args: argparse.Namespace):
    """Model and cluster from the common flags; every problem of both reported at once."""
    from autotune.specs.loading import load_cluster, load_model

    problems: list[str] = []
    model = cluster = None
    try:
        model = load_model(args.model)
    except InputError as err:
        problems += list(err.problems)
    if args.cluster is None and (args.gpu is None or args.num_gpus is None):
        problems.append("give --gpu and --num-gpus, or --cluster FILE")
    else:
        try:
            cluster = load_cluster(gpu=args.gpu, num_gpus=args.num_gpus, gpus_per_node=args.gpus_per_node,
                                   cluster_path=args.cluster)
        except InputError as err:
            problems += list(err.problems)
    if problems:
        raise InputError(problems, subject="input")
    return model, cluster


def _cmd_estimate(args: argparse.Namespace) -> int:
    from autotune.api import estimate, make_plan
    from autotune.cost.memory import MemorySettings
    from autotune.report import memory_table

    model, cluster = _load_inputs(args)
    plan = make_plan(
        model, cluster, global_batch_size=args.global_batch, tp=args.tp, pp=args.pp, cp=args.cp,
        micro_batch_size=args.micro_batch, sequence_parallel=args.sequence_parallel, vpp=args.vpp, ep=args.ep,
        zero_stage=args.zero, seq_len=args.seq_len, recompute=args.recompute,
        recompute_num_layers=args.recompute_num_layers, precision=args.precision, optimizer=args.optimizer,
        offload_optimizer=args.offload_optimizer, offload_param=args.offload_param, nvme_path=args.nvme_path,
        framework=args.framework, flash_attention=args.flash_attention,
    )
    settings = MemorySettings(
        cuda_context_bytes=None if args.overhead_gib is None else int(args.overhead_gib * 2**30),
        fragmentation_fraction=args.fragmentation,
    )
    result = estimate(model, cluster, plan, settings)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(memory_table(model, cluster, plan, result.memory))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except InputError as err:
        print(f"autotune {args.command}: {err.render()}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
