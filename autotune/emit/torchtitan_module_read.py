"""Reading a torchtitan 0.3 config module (``torchtitan_plan.py``: a function returning ``Trainer.Config``) without
running it: its Python is parsed (``ast``), never imported, so a module whose imports need torchtitan, a GPU or the
user's own code still reads.

What is read are the literal keyword arguments of the config classes autotune writes and torchtitan's own recipes
use (``ParallelismConfig``, ``TrainingConfig``, ``CompileConfig``, ``Float8LinearConverter.Config``,
``MXFP8LinearConverter.Config``), the
activation checkpointing (``FullAC.Config()`` / ``SelectiveAC.Config()`` / None), the recipe function imported from
``torchtitan.models.<family>.config_registry`` and the stage list (``module_fqns_per_model_part``). They come back in
the shape of the 0.2 TOML sections (``parallelism``, ``training``, ...), so one reader (``autotune.job_files``)
turns either file into a plan.
"""

from __future__ import annotations

import ast
from pathlib import Path

from autotune.emit.problems import JobSizes, Problem
from autotune.errors import InputError
from autotune.inputs import read_text

__all__ = ["read_torchtitan_module", "torchtitan_module_sizes", "torchtitan_module_problems"]

_SECTIONS = {"ParallelismConfig": "parallelism", "TrainingConfig": "training", "CompileConfig": "compile"}
RECIPE_LOSS_CHUNKS = 8
"""torchtitan 0.3's recipes (models/*/config_registry.py) set ``loss=ChunkedLossWrapper.Config(...)``, whose
``num_chunks`` defaults to 8 (components/loss.py): a module that keeps the recipe's loss chunks it 8 ways."""


def _loss_chunks(value: ast.AST, unread: list[str]) -> int:
    """Chunks of a ``loss=`` value: ``replace(base.loss, num_chunks=N)`` / ``ChunkedLossWrapper.Config(num_chunks=N)``
    N (8 unsaid); ``base.loss`` 8; any other loss (``base.loss.loss_fn``, ``CrossEntropyLoss.Config(...)``) 1."""
    if isinstance(value, ast.Call):
        name = _name(value.func)
        if name == "replace" or name.endswith("ChunkedLossWrapper.Config"):
            n = _literals(value, unread).get("num_chunks", RECIPE_LOSS_CHUNKS)
            return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else RECIPE_LOSS_CHUNKS
        return 1
    return RECIPE_LOSS_CHUNKS if _name(value).endswith("base.loss") and not _name(value).endswith("loss_fn") else 1


def _name(node: ast.AST) -> str:
    """``a.b.C`` of a call's function (the last two parts for nested classes: ``Float8LinearConverter.Config``)."""
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}".lstrip(".")
    return node.id if isinstance(node, ast.Name) else ""


def _literals(call: ast.Call, unread: list[str] | None = None) -> dict:
    out = {}
    for kw in call.keywords:
        if kw.arg is None:
            continue
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            if unread is not None and kw.arg != "module_fqns_per_model_part":
                unread.append(kw.arg)  # not a literal (a variable, a call): not read, and said
    return out


def read_torchtitan_module(path: str | Path) -> dict:
    """The module's settings as the 0.2 TOML sections, plus ``recipe`` (the recipe function's name) and
    ``model_parts`` (how many stage lists ``module_fqns_per_model_part`` gives, when it is a literal or ``_stages``
    of one) and ``unread`` (keywords whose values are not literals). InputError for a file that is not Python."""
    text = read_text(path, subject="torchtitan config module")  # a regular file, bounded
    try:
        tree = ast.parse(text, filename=str(path))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise InputError([f"{path}: not a Python module ({type(err).__name__}: {err}); a torchtitan 0.3 config "
                          "module is Python (autotune emit --engine-version fsdp=0.3 writes one)"],
                         subject="torchtitan config module") from None
    data: dict = {"parallelism": {}, "training": {}, "compile": {}, "activation_checkpoint": {"mode": "none"},
                  "model": {}, "recipe": None, "model_parts": None, "unread": [],
                  "loss_chunks": RECIPE_LOSS_CHUNKS}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith(".config_registry"):
            data["recipe"] = next((a.name for a in node.names), None)
        if isinstance(node, ast.keyword) and node.arg == "loss":
            data["loss_chunks"] = _loss_chunks(node.value, data["unread"])
        if isinstance(node, ast.keyword) and node.arg == "activation_checkpoint":
            kind = _name(node.value.func) if isinstance(node.value, ast.Call) else ""
            data["activation_checkpoint"]["mode"] = ("full" if kind.startswith("FullAC") else
                                                     "selective" if kind.startswith("SelectiveAC") else "none")
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        if name in _SECTIONS:
            data[_SECTIONS[name]].update(_literals(node, data["unread"]))
            for kw in node.keywords:
                if kw.arg == "module_fqns_per_model_part":
                    parts = kw.value.args[0] if isinstance(kw.value, ast.Call) and kw.value.args else kw.value
                    try:
                        data["model_parts"] = len(ast.literal_eval(parts))
                    except (ValueError, TypeError, SyntaxError, RecursionError):
                        pass
        elif name.endswith("Float8LinearConverter.Config"):
            data["model"]["converters"] = ["quantize.linear.float8"]
            # 0.3's converter is rowwise unless told rowwise_with_gw_hp (components/quantization/float8.py)
            data["quantize"] = {"linear": {"float8": {"recipe_name": _literals(node).get("recipe_name", "rowwise")}}}
        elif name.endswith("MXFP8LinearConverter.Config"):
            # 0.3's MX converter has no recipe name: torchao's MXFP8Linear (components/quantization/mx.py), read
            # as the 0.2 TOML's quantize.linear.mx with its cuBLAS recipe
            data["model"]["converters"] = ["quantize.linear.mx"]
            data["quantize"] = {"linear": {"mx": {"recipe_name": "mxfp8_cublas"}}}
    return data


def torchtitan_module_sizes(path: str | Path) -> JobSizes:
    p = read_torchtitan_module(path)["parallelism"]
    degrees = [p.get(k, d) for k, d in (("data_parallel_replicate_degree", 1), ("data_parallel_shard_degree", -1),
                                        ("context_parallel_degree", 1), ("tensor_parallel_degree", 1),
                                        ("pipeline_parallel_degree", 1))]
    ok = all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in degrees)
    world = degrees[0] * degrees[1] * degrees[2] * degrees[3] * degrees[4] if ok else None
    return JobSizes(world_size=world, tp=p.get("tensor_parallel_degree"), pp=p.get("pipeline_parallel_degree"),
                    cp=p.get("context_parallel_degree"))


def torchtitan_module_problems(path: str | Path, *, world_size: int) -> list[Problem]:
    """What the module itself says against the job: it parses, and its parallel degrees multiply to the world."""
    sizes = torchtitan_module_sizes(path)
    if sizes.world_size is not None and sizes.world_size != world_size:
        return [Problem(path="parallelism", severity="error", source="torchtitan",
                        message=f"the degrees multiply to {sizes.world_size} GPUs, the job has {world_size}",
                        fix="make dp_replicate x dp_shard x cp x tp x pp the world size (or dp_shard -1)")]
    return []
