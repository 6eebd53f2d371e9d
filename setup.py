"""Only the package list; everything else is in pyproject.toml.

pyproject.toml alone can either discover packages or list them, not both: autotune and its
subpackages are discovered (so a new autotune/<sub>/ folder ships without editing this file),
and the repo-root data folders are added as the packages pyproject.toml's package-dir maps.
"""

from setuptools import find_namespace_packages, setup

DATA_PACKAGES = ["autotune.templates", "autotune.schemas", "autotune.recipes"]

setup(
    packages=find_namespace_packages(include=["autotune", "autotune.*"], exclude=["*__pycache__*"])
    + DATA_PACKAGES,
)
