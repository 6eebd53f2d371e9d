"""A fresh clone of the committed repository, with nothing beside it, passes a fast subset of the suite.

The clone lands in an empty temporary folder (no ``../shared`` next to it), runs with
``AUTOTUNE_REFERENCE_DIR`` unset and with the developer's editable install hidden, so that every
file a test reads must come from the clone itself: the package, its data (schemas, presets,
recipes, published runs) and the tests' fixtures.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # git clone + a pytest subprocess
ROOT = Path(__file__).resolve().parent.parent
FAST_TESTS = [
    "tests/specs/test_loading.py",
    "tests/specs/test_hf_config.py",
    "tests/specs/test_presets.py",
    "tests/cost/test_golden_published.py",
    "tests/test_plots.py",
    "tests/test_readme.py::test_reading_the_output_section_matches_the_legend",
    "tests/test_readme.py::test_the_readme_links_stay_inside_the_repository",
    "tests/test_cli.py::test_every_flag_of_every_subcommand_has_help",
    "tests/test_cli.py::test_estimate_prints_the_step_time_breakdown_and_a_legend",
]
# Run pytest with the editable install's import hooks removed: `autotune` and its data packages
# (autotune.schemas -> schemas/, ...) must resolve inside the clone, never in this checkout.
RUNNER = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path_hooks[:] = [h for h in sys.path_hooks if not getattr(h, "__module__", "").startswith("__editable__")]
sys.path_importer_cache.clear()
import autotune, autotune.resources as r
clone = sys.argv[1]
for where in (autotune.__file__, r.package_dir("schemas"), r.recipes_dir(), r.templates_dir()):
    assert str(where).startswith(clone), f"{where} is outside the clone {clone}"
import pytest
sys.exit(pytest.main(["-q", "-x", "-p", "no:cacheprovider", *sys.argv[2:]]))
"""


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_fresh_clone_passes_its_fast_tests(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an installed copy): nothing to clone")
    clone = tmp_path / "alone" / "autotune"
    clone.parent.mkdir()
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True, timeout=300)
    assert sorted(p.name for p in clone.parent.iterdir()) == ["autotune"]  # nothing beside it
    missing = [t for t in FAST_TESTS if not (clone / t.split("::")[0]).is_file()]
    assert not missing, f"not committed: {missing}"
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOTUNE_REFERENCE_DIR", "PYTHONPATH")}
    env.update(PYTHONPATH=str(clone), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(clone), *FAST_TESTS], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]
