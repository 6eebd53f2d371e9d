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

A module of several configs (torchtitan's own ``models/<family>/config_registry.py``, which ``--module <family>
--config NAME`` picks from; or a user's registry) is read for the one named as ``FILE.py:NAME``: that function's
statements in order, after those of the functions of the same file it starts from (``config = llama3_8b()``), with
``config.<section>.<field> = value`` and ``config.<section> = <Section>Config(...)`` read too. Its model is the recipe
it starts from, else its ``model_registry("<flavor>")`` in the family the file's path names. Without NAME such a
file is refused, naming its configs: merging every function's values described no job.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from autotune.emit.problems import JobSizes, Problem
from autotune.emit.torchtitan_recipes import TORCHTITAN_03_RECIPES
from autotune.errors import InputError
from autotune.inputs import read_text

__all__ = ["read_torchtitan_module", "torchtitan_module_sizes", "torchtitan_module_problems", "module_function"]

_FUNCTION_SUFFIX = re.compile(r"(?s)(.+\.py):([A-Za-z_][A-Za-z0-9_]*)")
_FAMILY_IN_PATH = re.compile(r"models/([A-Za-z0-9_]+)/config_registry\.py$")

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
            given = _literals(value)  # its loss_fn (the loss itself) is no plan field: not said as unread
            if any(kw.arg == "num_chunks" for kw in value.keywords) and "num_chunks" not in given:
                unread.append("num_chunks")
            n = given.get("num_chunks", RECIPE_LOSS_CHUNKS)
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


def module_function(path: str | Path) -> tuple[str, str | None]:
    """(the file, the config function named) of ``FILE.py:NAME``; (path, None) for any other path."""
    found = _FUNCTION_SUFFIX.fullmatch(str(path))
    return (found.group(1), found.group(2)) if found else (str(path), None)


def _config_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """The module's top-level functions that build a trainer config: annotated ``-> Trainer.Config`` or calling
    ``Trainer.Config(...)``."""
    out = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        returns = _name(node.returns) if node.returns is not None else ""
        if returns.endswith("Trainer.Config") or any(isinstance(n, ast.Call) and _name(n.func).endswith(
                "Trainer.Config") for n in ast.walk(node)):
            out[node.name] = node
    return out


def _statements(functions: dict[str, ast.FunctionDef], name: str, seen: tuple[str, ...] = ()) -> list:
    """``name``'s statements in order, each call of another config function of the file replaced by that function's
    own statements (the config it starts from), cycles cut."""
    out: list = []
    for stmt in functions[name].body:
        called = [_name(n.func) for n in ast.walk(stmt) if isinstance(n, ast.Call)]
        for base in (c for c in called if c in functions and c not in (*seen, name)):
            out += [("base", base), *_statements(functions, base, (*seen, name))]
        out.append(stmt)
    return out


def _selected(path: str, tree: ast.Module, name: str | None) -> tuple[list, list[str]]:
    """(the nodes to read, the config functions they run, root first) of the module ``tree``."""
    functions = _config_functions(tree)
    if name is not None and name not in functions:
        raise InputError([f"{path} has no torchtitan config {name!r}: its configs are "
                          f"{', '.join(functions) or 'none (no function returning Trainer.Config)'}"],
                         subject="torchtitan config module")
    if name is None and len(functions) > 1:
        raise InputError([f"{path} holds {len(functions)} torchtitan configs ({', '.join(functions)}): give the one "
                          f"the job runs as {path}:NAME (torchtitan's --config NAME), e.g. {path}:{_example(functions)}"],
                         subject="torchtitan config module")
    if name is None:
        return list(ast.walk(tree)), list(functions)
    imports = [n for n in tree.body if isinstance(n, ast.ImportFrom)]
    body = _statements(functions, name)
    chain = [x[1] for x in body if isinstance(x, tuple)] + [name]
    return imports + [n for stmt in body if not isinstance(stmt, tuple) for n in _in_order(stmt)], chain


def _example(functions: dict) -> str:
    """A config to name in the refusal: the first that is not a debug model's, else the first."""
    return next((f for f in functions if "debug" not in f), next(iter(functions)))


def _in_order(stmt: ast.AST) -> list:
    """The statement's nodes, a whole-section assignment (``config.parallelism = ParallelismConfig(...)``) first
    marked so the section restarts from torchtitan's defaults."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute):
        target = stmt.targets[0]
        if isinstance(stmt.value, ast.Call) and _name(stmt.value.func) in _SECTIONS:
            return [("reset", _SECTIONS[_name(stmt.value.func)]), *ast.walk(stmt)]
        if isinstance(target.value, ast.Attribute) and target.value.attr in _SECTIONS.values():
            return [("set", target.value.attr, target.attr, stmt.value)]
    return list(ast.walk(stmt))


def read_torchtitan_module(path: str | Path) -> dict:
    """The module's settings as the 0.2 TOML sections, plus ``recipe`` (the recipe function's name), ``family`` and
    ``flavor`` (its ``model_registry`` call's), ``model_parts`` (how many stage lists ``module_fqns_per_model_part``
    gives, when it is a literal or ``_stages`` of one) and ``unread`` (keywords whose values are not literals); of the
    config ``FILE.py:NAME`` names in a module of several (module docstring). InputError for a file that is not
    Python, or a module of several configs without NAME."""
    file, name = module_function(path)
    text = read_text(file, subject="torchtitan config module")  # a regular file, bounded
    try:
        tree = ast.parse(text, filename=file)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise InputError([f"{file}: not a Python module ({type(err).__name__}: {err}); a torchtitan 0.3 config "
                          "module is Python (autotune emit --engine-version fsdp=0.3 writes one)"],
                         subject="torchtitan config module") from None
    data: dict = {"parallelism": {}, "training": {}, "compile": {}, "activation_checkpoint": {"mode": "none"},
                  "model": {}, "recipe": None, "model_parts": None, "unread": [],
                  "loss_chunks": RECIPE_LOSS_CHUNKS, "family": None, "flavor": None}
    nodes, chain = _selected(file, tree, name)
    family = _FAMILY_IN_PATH.search(Path(file).as_posix())
    data["family"] = family.group(1) if family else None
    if name is not None:  # the known recipe it is or starts from, else its own name (job_fsdp looks it up)
        known = {recipe[1] for recipe in TORCHTITAN_03_RECIPES.values()}
        data["recipe"] = next((c for c in chain if c in known), name)
    for node in nodes:
        if isinstance(node, tuple):
            if node[0] == "reset":
                data[node[1]] = {}
            elif node[0] == "set":
                try:
                    data[node[1]][node[2]] = ast.literal_eval(node[3])
                except (ValueError, TypeError, SyntaxError, RecursionError):
                    data["unread"].append(node[2])
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith(".config_registry"):
            data["recipe"] = next((a.name for a in node.names), None)
        if isinstance(node, ast.ImportFrom) and data["family"] is None and (
                found := re.fullmatch(r"torchtitan\.models\.([A-Za-z0-9_]+)", node.module or "")):
            data["family"] = found.group(1)
        if isinstance(node, ast.Call) and _name(node.func) == "model_registry" and node.args:
            try:
                data["flavor"] = ast.literal_eval(node.args[0])
            except (ValueError, TypeError, SyntaxError, RecursionError):
                pass
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
