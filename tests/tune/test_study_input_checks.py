"""`autotune tune` input: every bad flag or file exits 2 naming it, before any study is created."""

from __future__ import annotations

import pytest

def test_cli_bad_input_exits_2(tmp_path, capsys):
    from autotune.cli import main

    base = ["tune", "--model", "tiny-gpt", "--gpu", "cpu", "--seq-len", "64", "--out", str(tmp_path / "o")]
    assert main(base + ["--num-gpus", "2", "--workload", "script", "--script", str(tmp_path / "nope.py")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.py"
    bad.write_text("def broken(:\n")
    assert main(base + ["--num-gpus", "2", "--workload", "script", "--script", str(bad)]) == 2
    assert "does not compile" in capsys.readouterr().err
    assert main(base + ["--num-gpus", "100000"]) == 2
    assert "CPU ranks" in capsys.readouterr().err
    assert main(base + ["--num-gpus", "2", "--storage", "postgresql://x@127.0.0.1:1/db"]) == 2
    assert "cannot open the storage" in capsys.readouterr().err


@pytest.mark.parametrize("flags, says", [
    (["--trials", "0"], "--trials must be >= 1"), (["--trials", "-1"], "--trials must be >= 1"),
    (["--timeout", "-1"], "--timeout must be > 0"), (["--steps", "0"], "--steps must be >= 1"),
    (["--trial-timeout", "0"], "--trial-timeout must be > 0"), (["--num-layers", "0"], "--num-layers must be >= 1"),
    (["--num-layers", str(10**12)], "tiny-gpt has 4 layers"),
    (["--workload", "command", "--command", "true", "--metric-pattern", "(x"], "not a valid regex"),
    (["--calibration", "/nope/dir/cal.json"], "'/nope/dir' does not exist"),
    (["--max-micro-batch", "0"], "--max-micro-batch must be >= 1"),
    (["--out", "FILE"], "is a file, not a folder"), (["--finalist-runs", "1"], "--finalist-runs must be >= 2"),
    # a template a trial cannot fill: it failed the first trial, which then counted against the study
    (["--workload", "command", "--command", "echo {nosuch}", "--metric-pattern", "x(?P<step_time_s>[0-9.]+)"],
     "cannot be filled (KeyError('nosuch'))"),
    (["--workload", "command", "--command", "echo {nosuch}", "--metric-pattern", "x(?P<step_time_s>[0-9.]+)"],
     "the placeholders are {nproc}, {ds_config}, {workdir}, {steps}, {megatron_args}, {accelerate_config}, "
     "{torchtitan_config}, {micro_batch}, {grad_accum}"),
    # a command the plan never reaches: every trial ran the same program, each set against its plan's prediction
    (["--workload", "command", "--command", "train.sh {nproc} {steps}", "--metric-pattern", "x(?P<step_time_s>[0-9]+)"],
     "names none of {ds_config}, {megatron_args}, {accelerate_config}, {torchtitan_config}, {workdir}"),
    # a command (or script) builds its own model: its trials ran the whole model, calibrated as the cut one
    (["--workload", "command", "--command", "echo {steps}", "--metric-pattern", "x(?P<step_time_s>[0-9.]+)",
      "--num-layers", "1"], "--num-layers cuts the builtin workload's model; a --workload command builds its own"),
])
def test_every_tune_flag_checked_before_the_study(tmp_path, capsys, flags, says):
    from autotune.cli import main

    afile = tmp_path / "afile"
    afile.write_text("x")
    out = ["--out", str(tmp_path / "o")] if "--out" not in flags else []
    flags = [str(afile) if f == "FILE" else f for f in flags]
    rc = main(["tune", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64", *out, *flags])
    assert rc == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()  # no study was created
