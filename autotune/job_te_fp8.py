"""``te_fp8_recipe.py`` read back: the FP8 recipe an FP8 bundle's training script runs under (autotune.emit.precision
``te_fp8_recipe_snippet``). DeepSpeed has no FP8 config key, so a DeepSpeed job's FP8 is this file's, not its
ds_config.json's (whose bf16 block is the Transformer Engine layers' parameter dtype): ``--from ds_config.json
te_fp8_recipe.py`` reads the plan the bundle was written for."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

from autotune.emit.precision import TE_RECIPE_CLASSES
from autotune.errors import InputError
from autotune.inputs import read_text

__all__ = ["TE_FP8_FILE", "is_te_fp8_recipe", "te_fp8_recipe", "with_te_fp8_recipe"]

TE_FP8_FILE = "te_fp8_recipe.py"
_MARK = "the transformer_engine.common.recipe class of autotune's"  # the RECIPE line's comment the emitter writes


def is_te_fp8_recipe(path: str) -> bool:
    """Whether ``path`` is autotune's FP8 recipe module: by its name, or (renamed) by the line that names the recipe."""
    p = Path(str(path))
    if p.name == TE_FP8_FILE:
        return True
    if p.suffix != ".py" or not p.is_file():
        return False
    try:
        return _MARK in read_text(p, subject="FP8 recipe module")[:1 << 16]
    except InputError:  # not UTF-8, too large, unreadable: not the module autotune writes
        return False


def te_fp8_recipe(path: str) -> str:
    """The te-* recipe whose Transformer Engine class the module's ``RECIPE = "..."`` names; InputError otherwise."""
    text = read_text(path, subject="FP8 recipe module")  # a regular UTF-8 file (a FIFO named so would block)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError) as err:
        raise InputError([f"{path}: not a readable Python module ({err})"], subject="--from files") from None
    by_class = {cls: name for name, cls in TE_RECIPE_CLASSES.items()}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "RECIPE" for t in node.targets):
            value = node.value.value if isinstance(node.value, ast.Constant) else None
            if value in by_class:
                return by_class[value]
            raise InputError([f"{path}: RECIPE {value!r} is not a Transformer Engine recipe class autotune models "
                              f"({', '.join(by_class)}): set it to one"], subject="--from files")
    raise InputError([f"{path}: no RECIPE = \"<Transformer Engine recipe class>\" line (te_fp8_recipe.py names its "
                      f"recipe there): emit the FP8 plan again, or drop the file from --from"], subject="--from files")


def with_te_fp8_recipe(job, path: str):
    """``job`` (a JobFiles) trained under the module's FP8 recipe: a bf16 plan (DeepSpeed's config cannot say FP8)
    becomes fp8 with it; an fp8 plan whose files name another recipe keeps theirs, with a note."""
    recipe = te_fp8_recipe(path)
    plan, notes = job.plan, list(job.notes)
    if plan.precision == "bf16":
        plan = plan.with_(precision="fp8", fp8_recipe=recipe)
        notes.append(f"{path}: FP8 GEMMs under Transformer Engine's {TE_RECIPE_CLASSES[recipe]} ({recipe}) over the "
                     f"bf16 the other files state")
    elif plan.precision != "fp8":
        notes.append(f"{path}: not applied: the other files train in {plan.precision}, not bf16 with FP8 GEMMs")
    elif plan.fp8_recipe not in (None, recipe):
        notes.append(f"{path}: names {recipe}; the other files state {plan.fp8_recipe}, which is estimated")
    return replace(job, plan=plan, kinds=(*job.kinds, (path, "te-fp8-recipe")), notes=tuple(notes))
