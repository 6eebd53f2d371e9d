"""The repository stands alone: no shipped code, docstring, bench or data file points at the ``../shared`` folder
that sits beside a developer's checkout (a user's clone has none). Tests may name it only to skip where a
third-party oracle kept there is missing; the data copied from it says so as its provenance, not as a path."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("autotune", "bench", "schemas", "recipes", "docs", "scripts")


def _text_files():
    for top in SHIPPED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".md", ".yaml", ".yml", ".json", ".toml", ".sh", ".txt"):
                yield path


@pytest.mark.parametrize("top", SHIPPED)
def test_nothing_shipped_points_at_the_shared_folder(top):
    found = [f"{p.relative_to(ROOT)}:{n}" for p in _text_files() if p.relative_to(ROOT).parts[0] == top
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), start=1) if "../shared" in line]
    assert found == [], found


def test_the_readme_points_at_no_shared_folder():
    assert "../shared" not in (ROOT / "README.md").read_text()
