"""The package's layers import one way only: every module imports its own layer or the layers below it, and no
two modules import each other, directly or around a circle.

Every import counts: top-level, inside a function, and under ``TYPE_CHECKING``. The layers, lowest first, are
the ones ``docs/architecture.md`` draws; a module in none of them fails the test (add it to a layer there and
here). ``import autotune.x`` counts as importing ``autotune.x``; ``from autotune import x`` as importing both
``autotune.x`` and the package root ``autotune/__init__.py`` (the lazy names of ``import autotune``, and
``__version__``), which is an application: below it, import submodules by their full name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "autotune"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("autotune.errors", "autotune.inputs", "autotune.resources")),
    ("specs", ("autotune.specs",)),
    ("file formats", ("autotune.emit",)),
    ("engines", ("autotune.engines",)),
    ("rules", ("autotune.rules",)),
    ("cost model", ("autotune.cost",)),
    ("report", ("autotune.legend", "autotune.report")),
    ("search", ("autotune.search",)),
    ("bundle", ("autotune.bundle",)),
    ("facade", ("autotune.api", "autotune.job_files", "autotune.job_checkpoint", "autotune.job_checkpoint_load",
                "autotune.job_trainer_args", "autotune.job_plan_json", "autotune.job_megatron_model",
                "autotune.job_megatron_deepspeed", "autotune.job_bridge_model",
                "autotune.job_bridge", "autotune.job_fsdp", "autotune.job_te_fp8", "autotune.lint",
                "autotune.recipebook")),
    ("applications", ("autotune.tune", "autotune.train", "autotune.workloads", "autotune.commands",
                      "autotune.cli", "autotune.demo", "autotune.__main__", "autotune")),
]


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def layer_of(module: str) -> int:
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS here and to docs/architecture.md")
    return best[0]


def _resolve(name: str) -> str | None:
    """The project module an imported name lives in (``autotune.cost.memory.estimate_memory`` ->
    ``autotune.cost.memory``); None for other packages."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """Every project module ``module`` imports, wherever the import statement stands."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
            if base == "autotune":
                names.append("autotune")  # `from autotune import x` runs the package root and reads x from it
        else:
            continue
        for name in names:
            target = _resolve(name) if name.split(".")[0] == "autotune" else None
            if target and target != module and not (target == "autotune" and name != "autotune"):
                found.add(target)
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def test_every_module_is_in_a_layer():
    for module in MODULES:
        layer_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down(module):
    mine = layer_of(module)
    upward = sorted(f"{target} ({LAYERS[layer_of(target)][0]})" for target in GRAPH[module]
                    if layer_of(target) > mine)
    assert not upward, f"{module} ({LAYERS[mine][0]}) imports a higher layer: {', '.join(upward)}"


def _circles() -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    return groups


def test_no_import_circles():
    assert _circles() == []


def test_the_guard_sees_function_level_and_type_checking_imports(tmp_path, monkeypatch):
    """The scan would fail on the import styles that once hid the circle (an import inside a function, one under
    TYPE_CHECKING), so a passing run means there are none upward, not that the scan missed them."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from autotune.api import Estimate\n"
              "def f():\n    from autotune.search.planner import search_plans\n")
    fake = tmp_path / "fake.py"
    fake.write_text(source)
    monkeypatch.setitem(MODULES, "autotune.specs.fake", fake)
    assert imports_of("autotune.specs.fake") == {"autotune.api", "autotune.search.planner"}
    fake.write_text("from autotune import resources\n")
    assert imports_of("autotune.specs.fake") == {"autotune.resources", "autotune"}  # the root's __init__ runs
