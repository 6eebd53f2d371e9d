"""What a new user sees in the first hour reads as intended (issue 21): the demo says why its first plan does not
fit, CPU figures are real numbers, predicted numbers say so, a finished study does not promise an ETA, and a long
op build says what it is doing, how long it takes, and how long it has taken so far."""

from __future__ import annotations

import sys

import pytest

from autotune.tune import ops


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_build_past_its_timeout_is_stopped_and_named(tmp_path, monkeypatch):
    monkeypatch.setattr(ops, "_builder_argv", lambda todo: [sys.executable, "-c", "import time; time.sleep(30)"])
    monkeypatch.setattr(ops, "REPORT_EVERY_S", 0.2)
    with pytest.raises(ops.OpsError, match="cpu_adam op took over"):
        ops.ensure_ops(["cpu_adam"], env={"TORCH_EXTENSIONS_DIR": str(tmp_path)}, timeout_s=0.5)


def _study(finished: int, finalist_runs_done: int = 0):
    import datetime as dt

    import optuna
    from optuna.trial import TrialState, create_trial

    study = optuna.create_study(direction="maximize")
    start = dt.datetime(2025, 1, 1)
    for i in range(finished):
        trial = create_trial(value=1000.0 + i, state=TrialState.COMPLETE)
        trial.datetime_start, trial.datetime_complete = start, start + dt.timedelta(seconds=40)
        study.add_trial(trial)
    if finalist_runs_done:
        study.set_user_attr("finalists", {"runs": {"a": [1.0] * (finalist_runs_done // 2 + finalist_runs_done % 2),
                                                   "b": [1.0] * (finalist_runs_done // 2)}})
    return study


def test_a_resumed_finished_study_promises_no_eta():
    import io

    from autotune.tune.progress import ProgressLine

    out = io.StringIO()
    progress = ProgressLine(3, stream=out, finalist_runs=4)
    progress("start", _study(3, finalist_runs_done=4))
    assert "ETA none, nothing left to run" in out.getvalue() and "after the first trial" not in out.getvalue()
    # Resumed with work left: the earlier trials' durations give the ETA (1 trial + 4 re-runs of ~40 s).
    out = io.StringIO()
    ProgressLine(3, stream=out, finalist_runs=4)("start", _study(2))
    assert "ETA 3m20s" in out.getvalue(), out.getvalue()
    out = io.StringIO()
    ProgressLine(3, stream=out)("start", _study(0))
    assert "ETA after the first trial" in out.getvalue()


def test_cpu_figures_are_real_numbers_and_say_the_peak_is_nominal(capsys):
    from autotune.cli import main
    from autotune.report import flop_rate, peak_text
    from autotune.specs.loading import load_cluster

    assert main(["estimate", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--gpus-per-node", "2",
                 "--seq-len", "64", "--global-batch", "8"]) == 0
    out = capsys.readouterr().out
    assert " 0.0 TFLOP/s" not in out and "GFLOP/s per GPU" in out
    assert "nominal 50 GFLOP/s peak" in out and "no datasheet peak" in out
    assert peak_text(load_cluster(gpu="cpu", num_gpus=2).gpu).startswith("cpu: no datasheet peak; nominal bf16 50 GF")
    assert peak_text(load_cluster(gpu="h100-sxm-80gb", num_gpus=8).gpu).startswith("peak ")
    assert (flop_rate(989.4), flop_rate(0.0339), flop_rate(0.05)) == ("989 TFLOP/s", "33.9 GFLOP/s", "50 GFLOP/s")


def test_plan_md_cpu_figures_keep_their_digits(tmp_path, capsys):
    from autotune.cli import main

    assert main(["emit", "--recipe", "cpu-demo", "--out", str(tmp_path / "job")]) == 0
    text = (tmp_path / "job" / "plan.md").read_text()
    assert "TFLOP/s bf16 0" not in text and " 0.0 TFLOP/s" not in text
    assert "GFLOP/s per GPU" in text and "cpu: no datasheet peak; nominal bf16 50 GFLOP/s" in text


def test_recipes_list_says_its_numbers_are_predicted(capsys):
    from autotune.cli import main

    assert main(["recipes", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "predicted" in lines[0]
    row = next(ln for ln in lines if ln.startswith("cpu-demo "))
    assert "tok/s pred." in row and "%*" in row
    assert any("not a measurement" in ln for ln in lines) and any("no datasheet peak" in ln for ln in lines)


def test_the_demo_says_what_each_step_shows_before_it_runs():
    import contextlib
    import io

    from autotune import demo

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert demo.main(["--no-tune"]) == 0
    lines = out.getvalue().splitlines()
    commands = [i for i, ln in enumerate(lines) if ln.startswith("$ autotune ")]
    assert len(commands) == len(demo.DEMO_STEPS) - 1  # --no-tune: the study is skipped
    for n, i in enumerate(commands, 1):
        head = next(j for j in range(i, -1, -1) if lines[j].startswith("# Step "))
        assert lines[head].startswith(f"# Step {n} of {len(commands)}. ") and all(
            lines[j].startswith("# ") for j in range(head, i)), lines[head:i + 1]
    first = " ".join(ln[2:] for ln in lines[:commands[0]])
    assert "Llama-3-70B on 8 H100: does not fit, on purpose" in first
    # The result the narration announces follows it.
    assert "fits: NO" in "\n".join(lines[commands[0]:commands[1]])


def test_the_readme_says_how_long_each_quick_start_command_takes_and_what_it_prints():
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    demo = re.search(r"^- `make demo`: (.*?)(?=^- |\Z)", quick, flags=re.S | re.M)
    test = re.search(r"^- `make test`: (.*?)(?=^- |\Z)", quick, flags=re.S | re.M)
    assert demo and test, quick
    assert re.search(r"\d+(\.\d+)? minutes", demo.group(1)) and re.search(r"\d+ minutes", test.group(1))
    assert "fits: NO" in demo.group(1) and "on purpose" in demo.group(1) and "winner written" in demo.group(1)
    assert "passed" in test.group(1)


# A stand-in builder that records itself as autotune's builder does, then waits on torch's baton as
# torch.utils.file_baton.FileBaton.wait does: polls until the lock file is gone.
_WAITING_BUILDER = """
import json, os, socket, sys, time, psutil
op_dir = sys.argv[1]
me = psutil.Process()
open(os.path.join(op_dir, f"autotune-builder-{me.pid}.json"), "w").write(json.dumps(
    {"pid": me.pid, "start_time": me.create_time(), "host": socket.gethostname(), "op": "cpu_adam"}))
while os.path.exists(os.path.join(op_dir, "lock")):
    time.sleep(0.05)
print("OP cpu_adam built", flush=True)
"""


def _dead_holder(op_dir, monkeypatch, *, ours: bool):
    """A lock left by a build that was killed: nobody holds it open; with ``ours``, autotune's record of the
    killed builder (a pid that is gone, started before the lock was made) is beside it."""
    import json
    import socket

    op_dir.mkdir(parents=True)
    if ours:
        (op_dir / "autotune-builder-999999.json").write_text(json.dumps(
            {"pid": 999999, "start_time": 1.0, "host": socket.gethostname(), "op": "cpu_adam"}))
    monkeypatch.setattr(ops, "_builder_argv", lambda todo: [sys.executable, "-c", _WAITING_BUILDER, str(op_dir)])
    monkeypatch.setattr(ops, "REPORT_EVERY_S", 0.2)

    def lock_appears_once_the_build_starts(todo, **kwargs):
        (op_dir / "lock").touch()  # made by the other builder, which then died holding it
        return real(todo, **kwargs)

    real = ops._run_builder
    monkeypatch.setattr(ops, "_run_builder", lock_appears_once_the_build_starts)


@pytest.mark.slow
def test_a_lock_whose_builder_died_while_ours_waits_is_cleared_and_the_build_goes_on(tmp_path, monkeypatch):
    # issue 21: the waiting builder's own record made the dead lock look alive; the build slept until its timeout.
    root = tmp_path / "ext"
    _dead_holder(root / "cpu_adam", monkeypatch, ours=True)
    said: list[str] = []
    state = ops.ensure_ops(["cpu_adam"], env={"TORCH_EXTENSIONS_DIR": str(root)}, timeout_s=30, say=said.append)
    assert state == {"cpu_adam": "built"}
    assert any("clearing" in s and "pid 999999, is gone" in s for s in said), said
    assert not (root / "cpu_adam" / "lock").exists()


@pytest.mark.slow
def test_a_dead_lock_of_someone_elses_stops_the_waiting_build_at_once(tmp_path, monkeypatch):
    import time

    root = tmp_path / "ext"
    _dead_holder(root / "cpu_adam", monkeypatch, ours=False)
    t0 = time.monotonic()
    with pytest.raises(ops.OpsError, match="waits on a lock nobody holds.*not created by autotune"):
        ops.ensure_ops(["cpu_adam"], env={"TORCH_EXTENSIONS_DIR": str(root)}, timeout_s=60)
    assert time.monotonic() - t0 < 10
    assert (root / "cpu_adam" / "lock").exists()  # never removed: not ours
