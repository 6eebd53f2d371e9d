"""Shared fixtures for tests that start processes.

- ``free_port``: a TCP port nobody listens on (bound to port 0 and read back). Every test that starts a
  rendezvous passes one (``MASTER_PORT`` for the emitted scripts, ``PET_MASTER_PORT`` for ``torchrun``,
  ``--master_port`` for the deepspeed runner); none relies on 29500 being free (tests/test_no_fixed_ports.py).
- ``default_port_taken``: holds the emitted scripts' default port (29500) busy, as on a shared CI machine, so
  a test that forgot to pass a free port fails at once with EADDRINUSE instead of sometimes.
- ``deepspeed_ops``: DeepSpeed's JIT-built CPU ops (shm_comm, cpu_adam) built once per session, before any
  test's own timeout starts (autotune/tune/ops.py); a probe's timeout then covers the probe only.
- ``no_shm_leftovers`` (autouse): after each test, the /dev/shm segments DeepSpeed's CPU all-reduce left
  behind (autotune/tune/shm_leftovers.py) are removed, whoever started DeepSpeed (a trial, an emitted launch
  script, a test's own run): without it a full run leaves gigabytes of RAM in /dev/shm.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from pathlib import Path

import pytest

from autotune.emit.options import LaunchOptions

DEFAULT_PORT = LaunchOptions().master_port  # what the emitted scripts use when MASTER_PORT is unset

# As the Makefile exports it: one build folder for the ops, whether pytest runs under make or not.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))


NATIVE_ABORT = "terminate called without an active exception"
"""A rank of a 2-process CPU DeepSpeed run aborts, rarely (SIGABRT from the C++ runtime: a joinable thread
destroyed), after its ZeRO init or at exit after the run's work: seen in two CI runs on 2026-12-04, in tests that
passed before and after unchanged (tests/engines/test_user_scripts_fsdp_hf.py, test_user_script_bundles.py), and on
2026-12-05 in tests/engines/test_hf_consolidated_save.py after both ranks had trained and written their shards,
and on 2026-12-06 there twice in a row (one CI run; the same test passed in the CI run before and 2 of 2 times after);
every 2-rank DeepSpeed launch of the suite goes through :func:`run_launcher` (test_deepspeed_bundles.py and
emit/test_accelerate.py too)."""
NATIVE_ABORT_RETRIES = 2
"""Launches started again after a :data:`NATIVE_ABORT` (each from the same empty state), before its failure counts."""


def run_launcher(cmd: list[str], *, before_retry=None, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, **kwargs)`` of an emitted launch script, started again
    (``before_retry()`` first: clear what the run wrote) where a rank died with :data:`NATIVE_ABORT`, up to
    :data:`NATIVE_ABORT_RETRIES` times; any other failure, or that one every time, is returned as it is."""
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    for _ in range(NATIVE_ABORT_RETRIES):
        if proc.returncode == 0 or NATIVE_ABORT not in proc.stdout + proc.stderr:
            break
        if before_retry is not None:
            before_retry()
        proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    return proc


def pick_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def no_shm_leftovers():
    yield
    from autotune.tune.shm_leftovers import remove_leftovers

    remove_leftovers()


@pytest.fixture
def free_port() -> int:
    return pick_free_port()


@pytest.fixture(scope="module")
def default_port_taken():
    """Listen on the default port for the module's tests (or find it already taken: just as good)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(OSError):
            sock.bind(("0.0.0.0", DEFAULT_PORT))  # noqa: S104 - a test holding the port, never serving
            sock.listen(1)
        yield DEFAULT_PORT
    finally:
        sock.close()


@pytest.fixture(scope="session")
def deepspeed_ops(request):
    """Build DeepSpeed's CPU ops once (a warm cache is recognised in milliseconds); returns their state. A cold
    build takes minutes: what it is doing is written to the terminal as it goes, past pytest's output capture."""
    from autotune.tune.ops import CPU_ADAM, SHM_COMM, ensure_ops

    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")

    def say(line: str) -> None:
        if reporter is None or capture is None:
            print(line)
            return
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"[tests] {line}")

    return ensure_ops([SHM_COMM, CPU_ADAM], env=dict(os.environ), timeout_s=3600, say=say)
