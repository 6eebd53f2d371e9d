#!/usr/bin/env python3
"""Write a Megatron-style argparse flag table (JSON) from a ``megatron/arguments.py`` source file.

Used for ``autotune/emit/megatron_deepspeed_flags.json``: the file is executed with its imports of the
rest of its repository stubbed out, ``parse_args()`` is called, and the parser it built (including
``deepspeed.add_config_arguments``) is captured just before it parses; every option becomes one record
(flags, dest, default, type, choices, action, nargs), the format of ``megatron_flags_core_v0.*.json``.

    python scripts/extract_flag_table.py arguments.py --source "deepspeedai/Megatron-DeepSpeed@<commit> ..." --out out.json

``--tree DIR`` (the per-release Megatron-core tables ``autotune/emit/megatron_flags_core_v0.*.json``): DIR holds a
whole ``megatron/`` package (``git archive core_v0.16.1 megatron | tar -x -C DIR``, or an installed
megatron-core wheel, which ships ``megatron/training``); its own ``megatron.training.arguments`` is imported
with its real ``megatron.core`` (arguments.py >= 0.16 builds flags from ``TransformerConfig``'s fields, which
stubs cannot stand in for), only ``triton`` stubbed (absent without a GPU), and the parser is captured as above.

    python scripts/extract_flag_table.py --tree DIR --source "NVIDIA/Megatron-LM@core_v0.16.1 (55ac708)" --out out.json

``--provider FILE:FUNCTION`` (the ``autotune/emit/megatron_flags_*_core_v0.*.json`` tables of a training script's own
flags): FILE defines an ``extra_args_provider`` (``add_modelopt_args`` in megatron/post_training/arguments.py, which
pretrain_gpt.py passes where nvidia-modelopt is installed; ``add_multimodal_extra_args`` in examples/multimodal/
multimodal_args.py, examples/multimodal/train.py's), run with megatron stubbed and called on an empty parser.

    python scripts/extract_flag_table.py --provider multimodal_args.py:add_multimodal_extra_args --source ... --out out.json
"""

import argparse
import importlib
import importlib.abc
import importlib.machinery
import json
import os
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


class _InertFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports the named top-level packages (triton: GPU-only) as MagicMock modules."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__, module.__version__ = [], spec, "3.4.0"
        return module

    def exec_module(self, module):
        del module


def _tree_parse_args(tree: str):
    """``megatron.training.arguments.parse_args`` of the ``megatron/`` package under ``tree``."""
    sys.path.insert(0, tree)
    import torch  # noqa: F401 - imported before the triton stand-in: torch probes for the real triton
    import torch._dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    sys.meta_path.insert(0, _InertFinder(("triton",)))
    import typing
    if not hasattr(typing, "override"):  # megatron-core >= 0.19 imports typing.override (Python 3.12)
        import typing_extensions
        typing.override = typing_extensions.override
    arguments = importlib.import_module("megatron.training.arguments")
    if not arguments.__file__.startswith(os.path.abspath(tree)):
        raise SystemExit(f"imported {arguments.__file__}, not the tree {tree}")
    return arguments.parse_args


def _stubbed_parse_args(path: str):
    for name in ("megatron", "megatron.global_vars", "tools", "tools.retro", "tools.retro.utils",
                 "megatron.core", "megatron.core.transformer"):
        sys.modules.setdefault(name, mock.MagicMock(name=name))
    namespace = types.ModuleType("arguments_under_test")
    code = compile(open(path, encoding="utf-8").read(), path, "exec")
    exec(code, namespace.__dict__)  # noqa: S102 - the upstream file, to read the parser it builds
    return namespace.parse_args


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("arguments_py", nargs="?", help="a megatron/arguments.py run with its imports stubbed")
    p.add_argument("--tree", help="a folder holding a whole megatron/ package, imported for real")
    p.add_argument("--provider", help="FILE:FUNCTION, an extra_args_provider called on an empty parser")
    p.add_argument("--source", required=True, help="where the file comes from (repository@commit path)")
    p.add_argument("--out", required=True, help="the JSON file to write (stdout is DeepSpeed's log)")
    opts = p.parse_args()
    if opts.provider:
        file, function = opts.provider.rsplit(":", 1)
        for name in ("megatron", "megatron.core", "megatron.core.models", "megatron.core.models.multimodal",
                     "megatron.core.models.multimodal.llava_model"):
            sys.modules.setdefault(name, mock.MagicMock(name=name))
        namespace: dict = {}
        exec(compile(open(file, encoding="utf-8").read(), file, "exec"), namespace)  # noqa: S102 - the upstream file
        parser = argparse.ArgumentParser(add_help=False)
        namespace[function](parser)
        return _write(parser, opts)
    if bool(opts.tree) == bool(opts.arguments_py):
        p.error("give either arguments_py or --tree")
    parse_args = _tree_parse_args(opts.tree) if opts.tree else _stubbed_parse_args(opts.arguments_py)

    def capture(self, *a, **k):
        raise _Captured(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", capture), \
            mock.patch.object(argparse.ArgumentParser, "parse_known_args", capture):
        try:
            parse_args()
        except _Captured as got:
            parser = got.parser
    return _write(parser, opts)


def _write(parser: argparse.ArgumentParser, opts) -> int:
    flags = [_record(a) for a in parser._actions if a.option_strings and a.dest != "help"]
    rows = ",\n".join("  " + json.dumps(f) for f in flags)
    with open(opts.out, "w", encoding="utf-8") as out:
        out.write(f'{{"source": {json.dumps(opts.source)},\n "flags": [\n{rows}\n]}}\n')
    return 0


if __name__ == "__main__":
    sys.exit(main())
