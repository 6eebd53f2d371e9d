"""What a new user sees in the first hour reads as intended (issue 21): the demo says why its first plan does not
fit, CPU figures are real numbers, predicted numbers say so, a finished study does not promise an ETA, and a long
op build says what it is doing, how long it takes, and how long it has taken so far."""

from __future__ import annotations

import sys

import pytest

from autotune.tune import ops


def test_a_long_op_build_says_what_it_builds_and_for_how_long(tmp_path, monkeypatch):
    # A stand-in builder that takes ~1.2 s; reports every 0.3 s instead of every 15 s.
    script = "import sys, time; time.sleep(1.2); [print('OP', n, 'built', flush=True) for n in sys.argv[1:]]"
    monkeypatch.setattr(ops, "_builder_argv", lambda todo: [sys.executable, "-c", script, *todo])
    monkeypatch.setattr(ops, "REPORT_EVERY_S", 0.3)
    said: list[str] = []
    state = ops.ensure_ops(["deepspeed_shm_comm"], env={"TORCH_EXTENSIONS_DIR": str(tmp_path)}, say=said.append)
    assert state == {"deepspeed_shm_comm": "built"}
    assert "building DeepSpeed's shm_comm op once" in said[0] and "about 1-6 minutes on" in said[0]
    assert "longer under load" in said[0] and "~60 s" not in " ".join(said)
    ticks = [s for s in said[1:-1] if "elapsed" in s]
    assert ticks and all("shm_comm" in s and "about 1-6 minutes" in s for s in ticks), said
    assert said[-1].startswith("built DeepSpeed's shm_comm op in ")


def test_a_build_past_its_timeout_is_stopped_and_named(tmp_path, monkeypatch):
    monkeypatch.setattr(ops, "_builder_argv", lambda todo: [sys.executable, "-c", "import time; time.sleep(30)"])
    monkeypatch.setattr(ops, "REPORT_EVERY_S", 0.2)
    with pytest.raises(ops.OpsError, match="cpu_adam op took over"):
        ops.ensure_ops(["cpu_adam"], env={"TORCH_EXTENSIONS_DIR": str(tmp_path)}, timeout_s=0.5)
