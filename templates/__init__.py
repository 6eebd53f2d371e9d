"""Marks the repo-root templates/ folder as the package autotune.templates (see pyproject.toml), so
``importlib.resources.files("autotune.templates")`` finds it in a wheel and in an editable install."""
