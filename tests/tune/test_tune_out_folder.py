"""`tune --out` that cannot hold a study, and a storage that cannot be written, are named: exit 2 (or 1 for the
storage, which is the machine's problem, not the request's) with the way out, never a traceback (issue 21)."""

from __future__ import annotations

import errno
import os

import pytest

from autotune.cli import main

TINY = ["tune", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "256", "--trials", "1",
        "--steps", "1", "--warmup-steps", "0"]


def _run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def _loop(tmp_path):
    a, b = tmp_path / "loop_a", tmp_path / "loop_b"
    os.symlink(b, a)
    os.symlink(a, b)
    return str(a / "study")


@pytest.mark.parametrize("make_out, needle", [
    (lambda tmp: "/proc/autotune-tune-test", "cannot hold the study: No such file or directory"),
    (lambda tmp: str(tmp / ("a" * 300)), "a name of 300 bytes"),
    (_loop, "cannot hold the study: Too many levels of symbolic links"),
    (lambda tmp: (tmp / "a_file").write_text("x") and str(tmp / "a_file"), "is a file, not a folder"),
], ids=["proc", "too-long", "symlink-loop", "a-file"])
def test_an_out_folder_that_cannot_hold_the_study_is_named(tmp_path, capsys, make_out, needle):
    code, out, err = _run([*TINY, "--out", make_out(tmp_path)], capsys)
    assert code == 2 and needle in err and out == ""


def test_a_read_only_out_folder_is_named(tmp_path, capsys, monkeypatch):
    import autotune.inputs as command  # out_folder_problem lives there

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(command.tempfile, "NamedTemporaryFile", read_only)
    code, _, err = _run([*TINY, "--out", str(tmp_path / "ro")], capsys)
    assert code == 2 and "Read-only file system (a read-only file system)" in err and "give a folder" in err


def test_a_storage_that_cannot_be_written_says_what_to_do(tmp_path, capsys, monkeypatch):
    from optuna.exceptions import StorageInternalError

    import autotune.tune.study as study

    def full_disk(*args, **kwargs):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as cause:
            raise StorageInternalError("An exception is raised during the commit.") from cause

    monkeypatch.setattr(study, "tune", full_disk)
    code, _, err = _run([*TINY, "--out", str(tmp_path / "study"), "--resume"], capsys)
    assert code == 1
    assert "No space left on device" in err and "full disk" in err and "--resume" in err


def test_a_refused_request_leaves_no_folder_behind(tmp_path, capsys):
    out = tmp_path / "new" / "study"
    code, _, err = _run([*TINY, "--steps", "1", "--warmup-steps", "1000000", "--out", str(out)], capsys)
    assert code == 2 and "--warmup-steps" in err
    assert not (tmp_path / "new").exists()


def test_a_refused_storage_leaves_no_folder_and_shows_no_password(tmp_path, capsys):
    out = tmp_path / "study"
    code, _, err = _run([*TINY, "--storage", "postgresql://user:s3cret@127.0.0.1:1/db", "--out", str(out)], capsys)
    assert code == 2 and "user:***@127.0.0.1" in err and "s3cret" not in err and "leave --storage out" in err
    assert not out.exists()  # the empty folder was left behind


def test_a_calibration_file_that_cannot_be_written_is_refused_before_the_study(tmp_path, capsys):
    # os.access passes /proc; the write failed after every trial had run (a traceback, no winner)
    code, _, err = _run([*TINY, "--calibration", "/proc/cal.json", "--out", str(tmp_path / "study")], capsys)
    assert code == 2 and "--calibration '/proc/cal.json': cannot write in '/proc'" in err
    assert not (tmp_path / "study").exists()


def test_a_cut_models_measurement_is_not_set_against_the_whole_models_prediction(tmp_path, capsys):
    """tune --num-layers measures a cut of the model: plan.md put its 8,116 tokens/s beside the 4-layer prediction
    (ratio 2.53) without a word of the cut."""
    code, out, err = _run([*TINY, "--num-layers", "1", "--finalists", "0", "--no-offload", "--global-batch", "8",
                           "--out", str(tmp_path / "study")], capsys)
    assert code == 0, err
    # the trial table's "pred s" is the cut model's too (it was the whole model's beside the cut one's step s)
    assert "pred s: predicted for the model the trials ran (1 of its 4 layers, tune --num-layers)" in out
    assert "calibration (predicted vs measured step time, both of the 1-layer cut the trials ran)" in out
    text = (tmp_path / "study" / "winner" / "plan.md").read_text()
    table = text.split("## Measured", 1)[1].split("\n## ", 1)[0]
    assert "1 of the model's 4 layers" in table
    rows = [r for r in table.splitlines() if r.startswith("| step_time_s") or r.startswith("| peak_memory")]
    assert rows and all(r.rstrip().endswith("|  |") for r in rows), rows  # no measured / predicted ratio
