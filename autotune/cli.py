"""`autotune` command line: assembles the subcommands of ``autotune.commands`` and runs one.

Each subcommand parses, calls the library, prints. ``--json`` puts the machine-readable
result alone on stdout. Bad input: the problems on stderr, exit code 2, no traceback;
Ctrl-C: exit 130.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from autotune.commands import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK, HelpParser
from autotune.errors import InputError

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    from autotune import __version__
    from autotune.commands import emit, estimate, plan, recipes, tune, validate

    parser = HelpParser(prog="autotune", description="Plan, estimate and tune large-model training on "
                                     "DeepSpeed, Megatron-LM / Megatron-core, Megatron-DeepSpeed, PyTorch FSDP2 / "
                                     "torchtitan and Hugging Face Trainer / accelerate.")
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (estimate, plan, emit, validate, recipes, tune):
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return args.handler(args)
    except InputError as err:
        print(f"autotune {args.command}: {err.render()}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        print("autotune: interrupted (Ctrl-C); nothing half-written was left behind", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
