"""Marks the repo-root recipes/ folder as the package autotune.recipes (see pyproject.toml), so
``importlib.resources.files("autotune.recipes")`` finds it in a wheel and in an editable install."""
