"""The wheel is the product: it must carry the code and every data file, and read them installed.

Builds the wheel offline from a copy of this checkout (`python -m build --wheel --no-isolation`),
lists its members, then installs it with `--no-deps` into a fresh virtualenv that sees this
Python's site-packages (torch, DeepSpeed: not reinstalled) and reads the data from there, in a
temp folder and in isolated mode, so the checkout is not on sys.path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds the wheel, pip-installs it into virtualenvs
REPO = Path(__file__).resolve().parent.parent
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", ".venv", "out", "*.db"
)


def _run(cmd: list[str | Path], **kwargs) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; on failure, fail the test with its output (not just an exit code)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=180, **kwargs)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    # A copy, so the build neither leaves build/ in the checkout nor ships a stale build/lib.
    source = tmp / "source"
    shutil.copytree(REPO, source, ignore=_NOT_SOURCE)
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", tmp / "dist", source])
    (built,) = (tmp / "dist").glob("autotune-0.1.0-*.whl")
    return built


def _repo_files(folder: str, pattern: str) -> set[str]:
    root = REPO / folder
    return {p.relative_to(root).as_posix() for p in root.rglob(pattern) if p.is_file() and "__pycache__" not in p.parts}


def test_wheel_carries_code_and_data(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        members = set(archive.namelist())
        (dist_info,) = {m.split("/")[0] for m in members if m.split("/")[0].endswith(".dist-info")}
        top_level = archive.read(f"{dist_info}/top_level.txt").decode().split()
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()

    assert top_level == ["autotune"]  # no tests/, scripts/, bench/ as top-level packages
    assert "autotune = autotune.cli:main" in entry_points
    # Every module, also of subpackages added after this test was written (discovery, not a list).
    assert {f"autotune/{f}" for f in _repo_files("autotune", "*.py")} <= members
    assert {f"autotune/presets/{f}" for f in _repo_files("autotune/presets", "*.yaml")} <= members
    # The repo-root data folders, moved under the package.
    for folder in ("schemas", "templates", "recipes"):
        data = {f for f in _repo_files(folder, "*") if not f.endswith((".py", ".pyc"))}
        assert data, f"{folder}/ is empty"
        assert {f"autotune/{folder}/{f}" for f in data} <= members, f"{folder}/ is not all in the wheel"


# Runs in the virtualenv, from a temp folder in isolated mode: whatever serves these reads is
# what is installed. Prints where each came from; the tests say where that must be.
_CHECK = r"""
import importlib.resources, json
import yaml
import autotune
from autotune.resources import recipes_dir, schema, templates_dir

def walk(folder):
    for entry in folder.iterdir():
        yield from walk(entry) if entry.is_dir() else (entry,)

schemas_dir = importlib.resources.files("autotune.schemas")
schemas = sorted(p.name for p in schemas_dir.iterdir() if p.name.endswith(".json"))
assert schemas, "no JSON Schema in autotune.schemas"
for name in schemas:
    assert isinstance(schema(name), dict)
presets = [p for p in walk(importlib.resources.files("autotune.presets")) if p.name.endswith(".yaml")]
assert presets, "no preset .yaml in autotune.presets"
for p in presets:
    yaml.safe_load(p.read_text(encoding="utf-8"))
assert (templates_dir() / "README.md").is_file() and (recipes_dir() / "README.md").is_file()
print(json.dumps({"autotune": autotune.__file__, "schemas": str(schemas_dir), "presets": str(presets[0]),
                  "templates": str(templates_dir()), "recipes": str(recipes_dir())}))
"""


def _venv(env_dir: Path) -> Path:
    """A fresh virtualenv that sees this Python's site-packages (torch, DeepSpeed); its bin folder.

    No pip of its own: this Python's pip, seen through those site-packages, installs into it.
    """
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    # Run from a virtualenv, "system" is the base Python's; list this environment's folders too.
    # (After the new venv's own site-packages, so what is installed there wins.)
    scheme = "venv" if "venv" in sysconfig.get_scheme_names() else ("nt" if os.name == "nt" else "posix_prefix")
    site_dir = Path(sysconfig.get_path("purelib", scheme, vars={"base": str(env_dir), "platbase": str(env_dir)}))
    here = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (site_dir / "_test_packaging_parent.pth").write_text("\n".join(here) + "\n")
    return env_dir / ("Scripts" if os.name == "nt" else "bin")


def _read_data(python: Path, tmp_path: Path) -> dict[str, Path]:
    work = tmp_path / "cwd"
    work.mkdir()
    found = json.loads(_run([python, "-I", "-c", _CHECK], cwd=work).stdout)
    return {key: Path(value).resolve() for key, value in found.items()}


def test_installed_wheel_reads_its_data(wheel: Path, tmp_path: Path) -> None:
    bin_dir = _venv(tmp_path / "venv")
    # --ignore-installed: an editable autotune in this Python's site-packages must not count.
    _run([bin_dir / "python", "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "--quiet", wheel])

    found = _read_data(bin_dir / "python", tmp_path)
    for key, path in found.items():
        assert path.is_relative_to((tmp_path / "venv").resolve()), f"{key} read from {path}, not the wheel"
    # The console script is installed and runs from the wheel.
    assert "usage: autotune" in _run([bin_dir / "autotune", "--help"], cwd=tmp_path / "cwd").stdout


def test_editable_install_reads_the_checkout(tmp_path: Path) -> None:
    """`pip install -e .` (what scripts/setup.sh does): the same reads, served by the checkout's folders."""
    bin_dir = _venv(tmp_path / "venv")
    _run([bin_dir / "python", "-m", "pip", "install", "--no-deps", "--no-index", "--no-build-isolation",
          "--ignore-installed", "--quiet", "-e", REPO])

    found = _read_data(bin_dir / "python", tmp_path)
    assert found["autotune"] == REPO / "autotune" / "__init__.py"
    assert found["schemas"] == REPO / "schemas"
    assert found["templates"] == REPO / "templates" and found["recipes"] == REPO / "recipes"
    assert found["presets"].is_relative_to(REPO / "autotune" / "presets")
