#!/usr/bin/env python3
"""Write ``autotune/emit/torchtitan_keys.json``: every section and field of torchtitan's TOML job config, from
``torchtitan/config/job_config.py`` (``JobConfig`` and the dataclasses it nests), with each field's type,
default and, for ``Literal`` fields, its choices. torchtitan's ``ConfigManager._dict_to_dataclass`` raises on
any field not there.

    git -C torchtitan show v0.2.2:torchtitan/config/job_config.py > job_config.py
    python scripts/extract_torchtitan_keys.py job_config.py --source "pytorch/torchtitan v0.2.2 (73a0e69...)" \
        --out autotune/emit/torchtitan_keys.json
"""

import argparse
import dataclasses
import json
import sys
import types
import typing
from unittest import mock


def _describe(tp) -> dict:
    out = {"type": tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")}
    literals = [a for a in (typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType)
                            else (tp,)) if typing.get_origin(a) is typing.Literal]
    if literals:
        out["choices"] = [str(c) for lit in literals for c in typing.get_args(lit)]
    return out


def _walk(cls, hints_of) -> dict:
    out = {}
    hints = hints_of(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out[f.name] = {"section": _walk(tp, hints_of)}
        else:
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            out[f.name] = _describe(tp) | {"default": default if isinstance(default, (int, float, str, bool, list,
                                                                                         type(None))) else str(default)}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("job_config_py")
    p.add_argument("--source", required=True)
    p.add_argument("--out", required=True)
    opts = p.parse_args()
    for name in ("torchtitan", "torchtitan.tools", "torchtitan.tools.logging"):
        sys.modules.setdefault(name, mock.MagicMock(name=name))
    module = types.ModuleType("job_config_under_test")
    sys.modules[module.__name__] = module
    exec(compile(open(opts.job_config_py, encoding="utf-8").read(), opts.job_config_py, "exec"), module.__dict__)
    data = {"source": opts.source, "sections": _walk(module.JobConfig, lambda c: typing.get_type_hints(c))}
    with open(opts.out, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=1, sort_keys=True)
        out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
