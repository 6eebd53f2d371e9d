"""Marks the repo-root schemas/ folder as the package autotune.schemas (see pyproject.toml), so
``importlib.resources.files("autotune.schemas")`` finds it in a wheel and in an editable install."""
