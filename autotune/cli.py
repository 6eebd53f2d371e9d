"""`autotune` command line: assembles the subcommands of ``autotune.commands`` and runs one.

Each subcommand parses, calls the library, prints. ``--json`` puts the machine-readable
result alone on stdout. Bad input: the problems on stderr, exit code 2, no traceback;
Ctrl-C: exit 130.
"""

from __future__ import annotations

import argparse
import atexit
import gc
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


# The commands whose only output is stdout and stderr (which the interpreter flushes at exit whatever the collector
# does): the exit hook below may leave their cyclic garbage uncollected.
_PRINT_ONLY_COMMANDS = frozenset({"plan", "estimate"})


def _skip_exit_collections() -> None:
    """At the interpreter's exit (an ``atexit`` hook: it runs before the exit's cyclic collections), move every object
    to the collector's permanent generation (``gc.freeze``). The exit runs full collections over the whole heap
    (Py_FinalizeEx, finalize_modules): after a 405B search ~2 x 10^5 objects, 0.15-0.2 s of the command's 1.7 s CPU,
    to free memory the process returns to the system anyway. Objects outside reference cycles are still freed as
    their modules are torn down (reference counts); only cyclic garbage is left to the system, none of which holds
    an open file of a print-only command."""
    gc.freeze()


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] and sys.argv[1] in _PRINT_ONLY_COMMANDS:  # the process's own command line
        atexit.register(_skip_exit_collections)  # the process ends after this command
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
