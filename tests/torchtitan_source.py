"""torchtitan's own pipeline split function, executed from its source file (its module imports torchdata, which
this environment may lack): the installed v0.2.2 (``generate_llm_fqn_per_model_part``) and the 0.3.0 test tool's
copy (``_generate_llm_fqn_per_model_part``) where the cache has it."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from tooling import CACHE

NAMES = ("generate_llm_fqn_per_model_part", "_generate_llm_fqn_per_model_part")


def split_sources() -> list[Path]:
    """torchtitan's pipeline_parallel.py files present here (pip's, then the 0.3.0 tool's)."""
    out = []
    spec = importlib.util.find_spec("torchtitan")
    if spec is not None and spec.origin:
        out.append(Path(spec.origin).parent / "distributed" / "pipeline_parallel.py")
    out.append(CACHE / "torchtitan-0.3.0" / "torchtitan" / "distributed" / "pipeline_parallel.py")
    return [p for p in out if p.exists()]


def torchtitan_split_function(path: Path):
    """``(num_stages, num_layers, input_weight, output_weight) -> module names per stage`` from ``path``."""
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in NAMES)
    scope: dict = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), scope)
    return scope[fn.name]
