"""Third-party packages some tests run against but the project does not depend on (torchtitan 0.3, Megatron-Bridge,
nvidia-resiliency-ext), pip-installed on first use into a cache folder of the test tooling, never into the
user's environment.

``tool_folder(name, requirements)`` returns ~/.cache/autotune-test-tools/NAME (AUTOTUNE_TEST_TOOLS moves the
cache) holding ``pip install --no-deps --target`` of ``requirements``: under a file lock, into a staging folder
renamed into place at the end, so a reader sees no folder or a complete one; ``pytest.skip`` naming pip's last
words when PyPI cannot be reached.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("AUTOTUNE_TEST_TOOLS", Path.home() / ".cache" / "autotune-test-tools"))


def tool_folder(name: str, requirements: list[str], *, ignore_requires_python: bool = False) -> Path:
    """The folder holding ``requirements`` installed with pip (installed on first use); pytest.skip without PyPI."""
    folder = CACHE / name
    stamp = "\n".join(requirements) + "\n"  # a folder installed from other pins is installed again
    if _complete(folder) == stamp:
        return folder
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer at a time; the others find it complete
        if _complete(folder) == stamp:
            return folder
        staging = CACHE / f"{name}.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        flags = ["--ignore-requires-python"] if ignore_requires_python else []
        run = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *flags,
                              "--disable-pip-version-check", "--target", str(staging), *requirements],
                             capture_output=True, text=True, timeout=900, check=False)
        if run.returncode:
            shutil.rmtree(staging, ignore_errors=True)
            tail = " ".join((run.stderr or run.stdout).strip().splitlines()[-2:])[:300]
            pytest.skip(f"pip could not install {requirements[0]} into {folder} (PyPI unreachable?): {tail}")
        (staging / ".complete").write_text(stamp)
        shutil.rmtree(folder, ignore_errors=True)
        os.rename(staging, folder)  # atomic: a reader sees no folder or a complete one
    return folder


def _complete(folder: Path) -> str | None:
    """The requirements a complete tool folder was installed from; None while it is not there."""
    try:
        return (folder / ".complete").read_text()
    except OSError:
        return None
