"""`autotune recipes list | show NAME | regenerate [NAME...]`."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["register"]


def register(subparsers) -> None:
    p = subparsers.add_parser("recipes", help="ready recipes: list, show, regenerate",
                              description="Ready plans (recipes/*.yaml). With no action: list them.")
    p.add_argument("action", nargs="?", default="list", choices=("list", "show", "regenerate"),
                   help="list (the default), show NAME, or regenerate [NAME...] with the current cost model")
    p.add_argument("names", nargs="*", help="recipe names (show: one; regenerate: default all)")
    p.add_argument("--json", action="store_true", help="print the machine-readable result only")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from autotune.commands import json_text
    from autotune.errors import InputError
    from autotune.recipebook import load_recipe, recipe_names, recipe_yaml, regenerate, write_recipe

    if args.action == "list":
        if args.names:
            raise InputError(["`autotune recipes list` takes no names (use `autotune recipes show NAME`)"],
                             subject="command")
        recipes = [load_recipe(n) for n in recipe_names()]
        if args.json:
            print(json_text([{"name": r.name, "description": r.description, "model": r.model,
                               "cluster": r.cluster, "predicted": r.predicted} for r in recipes]))
        else:
            print(f"{'recipe':<26}{'model':<14}{'GPUs':<22}{'predicted':>22}  {'MFU':>4}  description")
            for r in recipes:
                gpus = f"{r.cluster['num_gpus']} x {r.cluster['gpu']}"
                nominal = "*" if r.cluster["gpu"] == "cpu" else " "
                print(f"{r.name:<26}{r.model:<14}{gpus:<22}{r.predicted['tokens_per_s']:>12,.0f} tok/s pred."
                      f"  {r.predicted['mfu']:>4.0%}{nominal} {r.description}")
            print("\npredicted: the cost model's tokens/s and MFU for the recipe's plan, not a measurement "
                  "(`autotune tune` measures;\n`autotune recipes show NAME` gives the plan). "
                  "* MFU of the cpu preset's nominal peak: a CPU has no datasheet peak.")
        return 0
    if args.action == "show":
        if len(args.names) != 1:
            raise InputError(["`autotune recipes show` takes one recipe name"], subject="command")
        recipe = load_recipe(args.names[0])
        if args.json:
            print(json_text({k: getattr(recipe, k) for k in ("name", "description", "model", "cluster", "seq_len",
                                                                "global_batch", "search", "plan", "predicted", "emit")}))
        else:
            print(recipe_yaml(recipe), end="")
        return 0
    names = args.names or list(recipe_names())
    for name in names:
        recipe = load_recipe(name)
        fresh = regenerate(recipe)
        path = recipe.path or Path(name)
        changed = recipe_yaml(fresh) != path.read_text(encoding="utf-8")
        write_recipe(fresh, path)
        print(f"{name}: {'updated' if changed else 'unchanged'} ({path})")
    return 0
