"""``autotune validate FILE``: lint a DeepSpeed JSON (and Megatron-LM arguments) for a world size.

Exit 0: no problems; 1: any problem (warnings included); 2: unusable input (the CLI's main turns
the InputError into a message on stderr).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from autotune.errors import InputError

__all__ = ["register", "run"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("validate", help="lint a DeepSpeed config (and Megatron-LM arguments) for a world size",
                              description="Check a DeepSpeed JSON against our schema, DeepSpeed's own parser and "
                                          "cross-field rules for a world size; report every problem with its fix.")
    p.add_argument("file", metavar="FILE", help="the DeepSpeed JSON config")
    p.add_argument("--world-size", type=_positive_int,
                   help="ranks of the job (default: train_batch_size / (micro-batch x accumulation) x tp x pp x cp)")
    for dim in ("tp", "pp", "cp"):
        p.add_argument(f"--{dim}", type=_positive_int, default=1, help=f"{dim} size of the job (default 1)")
    p.add_argument("--hf", action="store_true", help="a Hugging Face Trainer / accelerate config: fill 'auto' first")
    p.add_argument("--megatron-args", metavar="FILE", help="a file of Megatron-LM arguments to check as well")
    m = p.add_argument_group("memory check (both --model and --gpu)")
    m.add_argument("--model", help="model preset, Hugging Face config.json or model YAML")
    m.add_argument("--gpu", help="GPU preset name")
    m.add_argument("--gpus-per-node", type=_positive_int, help="GPUs per node (default: the GPU preset's)")
    m.add_argument("--seq-len", type=_positive_int, default=4096, help="sequence length (default 4096)")
    m.add_argument("--recompute", choices=("none", "selective", "full"),
                   help="activation recompute (default: full if the config configures activation checkpoints)")
    p.add_argument("--json", action="store_true", help="print the problems as a JSON list only")
    p.set_defaults(handler=run)
    return p


def _world_size(args: argparse.Namespace) -> int:
    """--world-size, else the one the config's batch triple implies (said on stderr)."""
    from autotune.emit.validate import read_deepspeed_config

    if args.world_size:
        return args.world_size
    data = read_deepspeed_config(args.file)[0] or {}
    t, m, g = (data.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                     "gradient_accumulation_steps"))
    block = data.get("tensor_parallel")
    autotp = block.get("autotp_size") if isinstance(block, dict) else 0
    tp = autotp if args.tp == 1 and isinstance(autotp, int) and autotp > 1 else args.tp
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (t, m, g)) and t % (m * g) == 0:
        world = t // (m * g) * tp * args.pp * args.cp
        print(f"autotune validate: no --world-size: assuming {world} (train_batch_size / (micro-batch x "
              f"accumulation) x tp x pp x cp)", file=sys.stderr)
        return world
    raise InputError(["give --world-size: the config's batch sizes do not say it"], subject="validate request")


def _megatron_problems(path: str, world_size: int) -> list:
    try:
        from autotune.emit import megatron
    except ImportError as err:
        raise InputError([f"--megatron-args needs autotune.emit.megatron, which is not available: {err}"],
                         subject="validate request") from None
    reader = getattr(megatron, "read_megatron_args_file_with_env", None)
    if reader is not None:  # a shell file: continuations, arrays, a launch line, exports
        argv, env = reader(path)
        return megatron.megatron_args_problems(argv, world_size=world_size, env=env)
    try:
        text = Path(path).read_text(encoding="utf-8")
        argv = shlex.split(text.replace("\\\n", " "), comments=True)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise InputError([f"cannot read --megatron-args {path!r}: {getattr(err, 'strerror', None) or err}"],
                         subject="validate request") from None
    return megatron.megatron_args_problems(argv, world_size=world_size)


def run(args: argparse.Namespace) -> int:
    from autotune.emit.validate import has_errors, memory_problems, validate_deepspeed_config

    world = _world_size(args)
    problems = validate_deepspeed_config(args.file, world_size=world, tp=args.tp, pp=args.pp, cp=args.cp, hf=args.hf)
    if args.megatron_args:
        problems += _megatron_problems(args.megatron_args, world)
    if (args.model is None) != (args.gpu is None):
        raise InputError(["the memory check needs both --model and --gpu"], subject="validate request")
    if args.model is not None:
        from autotune.specs.loading import load_cluster, load_model

        model = load_model(args.model)
        cluster = load_cluster(gpu=args.gpu, num_gpus=world, gpus_per_node=args.gpus_per_node)
        if has_errors(problems):
            print("autotune validate: memory check skipped: fix the errors first", file=sys.stderr)
        else:
            problems += memory_problems(args.file, model=model, cluster=cluster, tp=args.tp, pp=args.pp, cp=args.cp,
                                        seq_len=args.seq_len, recompute=args.recompute)
    if args.json:
        print(json.dumps([p.to_dict() for p in problems], indent=2))
    elif problems:
        for p in problems:
            print(p.render())
        errors = sum(p.severity == "error" for p in problems)
        print(f"{args.file}: {errors} error(s), {len(problems) - errors} warning(s) for world size {world}")
    else:
        print(f"{args.file}: no problems for world size {world}")
    return 1 if problems else 0
