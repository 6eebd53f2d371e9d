"""Recipes: ready plans users reuse as templates (``recipes/*.yaml``, ``schemas/recipe.schema.json``).

A recipe holds its inputs (model, cluster, sequence length, global batch, search constraints,
emit options) and what the tool made of them (the planner's best plan and its predicted
numbers). ``regenerate`` recomputes the second part from the first; a test fails when a
committed recipe is stale, so recipes always say what the current cost model says.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from autotune.api import Estimate, estimate
from autotune.errors import InputError, require_no_problems, suggest_names
from autotune.resources import recipes_dir
from autotune.rules import plan_problems
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster, load_model, read_yaml, schema_problems
from autotune.specs.plan import ParallelPlan

__all__ = ["Recipe", "recipe_names", "load_recipe", "regenerate", "recipe_yaml", "write_recipe", "recipe_estimate"]

_CONSTRAINT_KEYS = {f.name for f in fields(SearchConstraints)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Recipe:
    name: str
    description: str
    model: str
    cluster: dict
    seq_len: int
    global_batch: int
    search: dict
    plan: dict
    predicted: dict
    emit: dict
    path: Path | None = None


def _recipes_dir() -> Path:
    return Path(str(recipes_dir()))


def recipe_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in _recipes_dir().glob("*.yaml")))


def _from_mapping(data: dict, path: Path | None) -> Recipe:
    require_no_problems(schema_problems(data, "recipe.schema.json"), subject=f"recipe {path or data.get('name')}")
    return Recipe(name=data["name"], description=data["description"], model=data["model"], cluster=data["cluster"],
                  seq_len=data["seq_len"], global_batch=data["global_batch"], search=data.get("search", {}),
                  plan=data["plan"], predicted=data["predicted"], emit=data.get("emit", {}), path=path)


def load_recipe(ref: str) -> Recipe:
    """A recipe by name (``recipes/NAME.yaml``) or by path.

    A path that exists (or cannot be looked at: a name too long, a path through a file, a folder we may not
    enter) is read as the recipe file, regular files only (:func:`autotune.inputs.read_text`), so each of those
    is an InputError naming the problem, never a traceback; anything else is a recipe name.
    """
    try:
        os.stat(ref)
        exists = True
    except FileNotFoundError:
        exists = False
    except (OSError, ValueError):  # ENAMETOOLONG, ENOTDIR, EACCES, ELOOP, a NUL byte: the reader names it
        exists = True
    if exists:
        return _from_mapping(read_yaml(ref, subject="recipe"), Path(ref))
    if ref in recipe_names():
        path = _recipes_dir() / f"{ref}.yaml"
        return _from_mapping(read_yaml(path, subject="recipe"), path)
    raise InputError([f"unknown recipe {ref!r}{suggest_names(ref, recipe_names())}; `autotune recipes list` "
                      "shows them, or give a recipe YAML path"], subject="recipe")


def _constraints(search: dict) -> SearchConstraints:
    unknown = sorted(set(search) - _CONSTRAINT_KEYS)
    if unknown:
        raise InputError([f"unknown search constraint {k!r}" for k in unknown], subject="recipe")
    return SearchConstraints(**{k: tuple(v) if isinstance(v, list) else v for k, v in search.items()})


def _cluster(recipe_cluster: dict):
    return load_cluster(gpu=recipe_cluster["gpu"], num_gpus=recipe_cluster["num_gpus"],
                        gpus_per_node=recipe_cluster.get("gpus_per_node"), cluster_path=None)


def _predicted(est: Estimate) -> dict:
    """Rounded predictions (3 significant digits) so that a recipe is stale only when a number moves."""
    def sig(x: float) -> float:
        return float(f"{x:.3g}")

    return {"step_time_s": sig(est.time.step_time_s), "tokens_per_s": sig(est.time.tokens_per_s),
            "mfu": sig(est.time.mfu), "memory_gib": sig(est.memory.total / 2**30), "fits": est.memory.fits}


def regenerate(recipe: Recipe) -> Recipe:
    """The recipe with its plan and predictions recomputed by the planner from its inputs."""
    model = load_model(recipe.model)
    cluster = _cluster(recipe.cluster)
    result = search_plans(model, cluster, seq_len=recipe.seq_len, global_batch_size=recipe.global_batch,
                          constraints=_constraints(recipe.search), top_k=1)
    if not result.candidates:
        raise InputError([f"recipe {recipe.name}: no feasible plan ({result.rejections})"], subject="recipe")
    best = result.candidates[0]
    return Recipe(name=recipe.name, description=recipe.description, model=recipe.model, cluster=recipe.cluster,
                  seq_len=recipe.seq_len, global_batch=recipe.global_batch, search=recipe.search,
                  plan=best.plan.to_dict(), predicted=_predicted(best), emit=recipe.emit, path=recipe.path)


def recipe_estimate(recipe: Recipe) -> Estimate:
    """The recipe's plan, estimated with the current cost model. InputError when the plan disagrees with the
    recipe's inputs (seq_len, global_batch) or breaks a plan rule on its cluster: the recipe's problem, each
    named, with the way to fix it."""
    model = load_model(recipe.model)
    cluster = _cluster(recipe.cluster)
    ref = str(recipe.path) if recipe.path else recipe.name
    problems = []
    for key, plan_key in (("seq_len", "seq_len"), ("global_batch", "global_batch_size")):
        mine, theirs = getattr(recipe, key), recipe.plan.get(plan_key)
        if theirs != mine:
            problems.append(f"{key} is {mine} but plan.{plan_key} is {theirs}: the plan must be made for the "
                            f"recipe's {key}")
    try:
        plan = ParallelPlan(**recipe.plan)
    except InputError as err:
        problems += [f"plan: {p}" for p in err.problems]
    else:
        problems += [f"plan: {msg}" for _, msg in plan_problems(model, cluster, plan)]
    if problems:
        problems.append(f"fix the recipe's plan block to match its inputs, or recompute plan and predicted from "
                        f"them: autotune recipes regenerate {ref}")
        raise InputError(problems, subject=f"recipe {ref}")
    return estimate(model, cluster, plan)


def recipe_yaml(recipe: Recipe) -> str:
    body = {"name": recipe.name, "description": recipe.description, "model": recipe.model,
            "cluster": recipe.cluster, "seq_len": recipe.seq_len, "global_batch": recipe.global_batch,
            "search": recipe.search, "plan": recipe.plan, "predicted": recipe.predicted, "emit": recipe.emit}
    p = recipe.plan
    header = (f"# Recipe {recipe.name}: made by `autotune recipes regenerate` (do not edit plan/predicted by hand).\n"
              f"# {p['tp']} tp x {p['pp']} pp x {p['dp']} dp x {p['cp']} cp = "
              f"{p['tp'] * p['pp'] * p['dp'] * p['cp']} GPUs; global batch {p['global_batch_size']} = "
              f"{p['micro_batch_size']} micro x {p['grad_accum_steps']} accumulation x {p['dp']} dp.\n")
    return header + yaml.safe_dump(body, sort_keys=False, width=100)


def write_recipe(recipe: Recipe, path: Path) -> None:
    """Write atomically; the file is reloaded (schema-checked) before it replaces the old one."""
    text = recipe_yaml(recipe)
    _from_mapping(yaml.safe_load(text), path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
