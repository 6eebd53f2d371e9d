"""Committed recipes are valid and current: regenerating each from its inputs gives the same file."""

import pytest

from autotune.cli import main
from autotune.recipebook import load_recipe, recipe_estimate, recipe_names, recipe_yaml, regenerate

REQUIRED = {"llama3-8b-8xh100", "llama3-70b-64xh100", "llama3-70b-128xh100", "llama3-405b-1024xh100",
            "mixtral-8x7b-64xh100", "gpt3-175b-1024xa100", "cpu-demo"}


def test_the_promised_recipes_exist():
    assert REQUIRED <= set(recipe_names())


@pytest.mark.parametrize("name", recipe_names())
def test_recipe_is_valid_and_not_stale(name):
    recipe = load_recipe(name)
    assert recipe.path is not None
    committed = recipe.path.read_text(encoding="utf-8")
    assert recipe_yaml(regenerate(recipe)) == committed, (
        f"recipes/{name}.yaml is stale: run `autotune recipes regenerate {name}`")
    est = recipe_estimate(recipe)
    assert est.memory.fits
    p = recipe.plan
    assert p["tp"] * p["pp"] * p["dp"] * p["cp"] == recipe.cluster["num_gpus"]
    assert p["global_batch_size"] == p["micro_batch_size"] * p["grad_accum_steps"] * p["dp"]


def test_recipes_cli(capsys):
    assert main(["recipes", "list"]) == 0
    assert "llama3-70b-128xh100" in capsys.readouterr().out
    assert main(["recipes", "show", "cpu-demo"]) == 0
    assert "tiny-gpt" in capsys.readouterr().out
    assert main(["recipes", "show", "llama3-70b-128"]) == 2
    assert "did you mean" in capsys.readouterr().err
