"""Data files shipped with the package: JSON Schemas, presets, launch templates, recipes.

The repo-root folders ``schemas/``, ``templates/`` and ``recipes/`` are installed as the packages
``autotune.schemas``, ``autotune.templates`` and ``autotune.recipes`` (pyproject.toml
``[tool.setuptools.package-dir]``); ``autotune/presets/`` is the package ``autotune.presets``.
Installed (wheel or ``pip install -e .``) they are found through ``importlib.resources``.
Running from a source checkout with no install, where the mapped packages do not exist, the
repo-root folders next to the package are read instead.

Every function returns an ``importlib.resources`` Traversable (``/``, ``read_text()``,
``iterdir()``, ``is_file()``); for a package on disk, which is every layout this project
installs, it is a ``pathlib.Path``.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

__all__ = ["data_path", "package_dir", "recipes_dir", "schema", "templates_dir"]

_CHECKOUT_ROOT = Path(__file__).resolve().parent.parent
# Installed package -> the repo-root folder it is built from (pyproject.toml package-dir).
_CHECKOUT_FOLDERS = {
    "autotune.schemas": "schemas",
    "autotune.templates": "templates",
    "autotune.recipes": "recipes",
}


def package_dir(package: str) -> Traversable:
    """The folder of data package ``package``: ``"autotune.schemas"``, or short, ``"schemas"``."""
    if package != "autotune" and not package.startswith("autotune."):
        package = f"autotune.{package}"
    try:
        return importlib.resources.files(package)
    except ModuleNotFoundError:
        folder = _CHECKOUT_FOLDERS.get(package)
        if folder is None or not (_CHECKOUT_ROOT / folder).is_dir():
            raise
        return _CHECKOUT_ROOT / folder


def data_path(package: str, name: str) -> Traversable:
    """File (or folder) ``name`` of data package ``package``, e.g. ``data_path("presets", "gpus.yaml")``.

    ``name`` may contain ``/`` (``"models/llama3-70b.yaml"``). Whether it exists is the caller's
    question (``.is_file()``); reading a missing one raises ``FileNotFoundError``.
    """
    return package_dir(package).joinpath(*name.split("/"))


def templates_dir() -> Traversable:
    """The launch-script templates (repo-root ``templates/``)."""
    return package_dir("autotune.templates")


def recipes_dir() -> Traversable:
    """The ready recipes (repo-root ``recipes/``)."""
    return package_dir("autotune.recipes")


@functools.cache
def schema(name: str) -> dict:
    """The parsed JSON Schema ``name``: ``"model.schema.json"``, or short, ``"model"``.

    Cached: the same dict is returned on every call, so do not modify it.
    """
    file_name = name if name.endswith(".json") else f"{name}.schema.json"
    path = data_path("autotune.schemas", file_name)
    if not path.is_file():
        available = sorted(p.name for p in package_dir("autotune.schemas").iterdir() if p.name.endswith(".json"))
        raise FileNotFoundError(
            f"no JSON Schema {file_name!r} in autotune.schemas; there are: {', '.join(available) or 'none'}"
        )
    return json.loads(path.read_text(encoding="utf-8"))
