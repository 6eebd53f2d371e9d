#!/usr/bin/env python3
"""Write a Megatron-style argparse flag table (JSON) from a ``megatron/arguments.py`` source file.

Used for ``autotune/emit/megatron_deepspeed_flags.json``: the file is executed with its imports of the
rest of its repository stubbed out, ``parse_args()`` is called, and the parser it built (including
``deepspeed.add_config_arguments``) is captured just before it parses; every option becomes one record
(flags, dest, default, type, choices, action, nargs), the format of ``megatron_flags.json``.

    python scripts/extract_flag_table.py arguments.py --source "deepspeedai/Megatron-DeepSpeed@<commit> ..." --out out.json
"""

import argparse
import json
import sys
import types
from unittest import mock


class _Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


def _record(action: argparse.Action) -> dict:
    kind = action.type
    type_name = "None" if kind is None else getattr(kind, "__name__", type(kind).__name__)
    if type(action).__name__ == "_StoreAction" and kind is None:
        type_name = "str"
    return {"flags": list(action.option_strings), "dest": action.dest, "default": str(action.default),
            "type": type_name, "choices": None if action.choices is None else [str(c) for c in action.choices],
            "action": type(action).__name__, "nargs": None if action.nargs is None else str(action.nargs)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("arguments_py")
    p.add_argument("--source", required=True, help="where the file comes from (repository@commit path)")
    p.add_argument("--out", required=True, help="the JSON file to write (stdout is DeepSpeed's log)")
    opts = p.parse_args()
    for name in ("megatron", "megatron.global_vars", "tools", "tools.retro", "tools.retro.utils",
                 "megatron.core", "megatron.core.transformer"):
        sys.modules.setdefault(name, mock.MagicMock(name=name))
    namespace = types.ModuleType("arguments_under_test")
    code = compile(open(opts.arguments_py, encoding="utf-8").read(), opts.arguments_py, "exec")
    exec(code, namespace.__dict__)  # noqa: S102 - the upstream file, to read the parser it builds

    def capture(self, *a, **k):
        raise _Captured(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", capture), \
            mock.patch.object(argparse.ArgumentParser, "parse_known_args", capture):
        try:
            namespace.parse_args()
        except _Captured as got:
            parser = got.parser
    flags = [_record(a) for a in parser._actions if a.option_strings and a.dest != "help"]
    rows = ",\n".join("  " + json.dumps(f) for f in flags)
    with open(opts.out, "w", encoding="utf-8") as out:
        out.write(f'{{"source": {json.dumps(opts.source)},\n "flags": [\n{rows}\n]}}\n')
    return 0


if __name__ == "__main__":
    sys.exit(main())
