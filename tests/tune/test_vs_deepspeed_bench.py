"""bench/vs_deepspeed_autotuner.py without running either tuner: its flags, its missing-tool message
and its verdict (the bench itself is run by hand: it takes tens of minutes)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "vs_deepspeed_autotuner.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("vs_deepspeed_autotuner", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def runs(bench):
    """bench/vs_deepspeed_runs.py, as the bench imported it (the bench puts its folder on sys.path)."""
    import vs_deepspeed_runs

    return vs_deepspeed_runs


@pytest.mark.slow
def test_help_names_the_tools_and_the_target():
    proc = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for text in ("--autotuning", "pdsh", "tabulate", "LOCAL_SIZE", "--fresh", "half"):
        assert text in proc.stdout


def test_missing_pdsh_is_named_with_the_install_command(bench, monkeypatch, tmp_path, capsys):
    real = bench.shutil.which
    monkeypatch.setattr(bench.shutil, "which", lambda name: None if name == "pdsh" else real(name))
    assert bench.main(["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "pdsh" in err and "apt-get install -y pdsh" in err
    assert not (tmp_path / "out").exists()  # nothing started


@pytest.mark.parametrize("flags, problem", [(["--global-batch", "7"], "not a multiple of --ranks"),
                                            (["--zero", "0,4"], "--zero must be"),
                                            (["--repeats", "0"], "--repeats must be >= 1")])
def test_bad_flags_exit_2(bench, flags, problem, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(flags)
    assert exc.value.code == 2 and problem in capsys.readouterr().err


def test_common_config_keeps_the_global_batch(bench, runs):
    args = bench.parse_args(["--global-batch", "8", "--max-micro-batch", "4"])
    assert runs.micro_batches(args) == [1, 2, 4]
    user = runs.user_config(args)
    assert user["zero_optimization"]["stage"] == [0, 1, 2, 3] and user["autotuning"]["fast"] is True
    for mbs in runs.micro_batches(args):
        cfg = runs.common_config(args, 2, mbs, 4 // mbs)
        assert cfg["train_batch_size"] == 8 and cfg["zero_optimization"] == {"stage": 2}
        assert "autotuning" not in cfg


def _state(ds_runs, at_runs, ds_wall, at_wall):
    tool = lambda wall, extra: {"wall_s": wall, "pick": {"zero": 1, "mbs": 4, "gas": 1}, **extra}
    return {"deepspeed": tool(ds_wall, {"experiments": 12, "profile_runs": 1,
                                        "own": {"tokens_per_s": 1e3, "latency": 2e6, "throughput_samples_per_s": 8.0}}),
            "autotune": tool(at_wall, {"trials": 5, "reruns": 4, "own": {"tokens_per_s": 1e3}}),
            "remeasure": [{"tool": "deepspeed", "run": i, "tokens_per_s": t} for i, t in enumerate(ds_runs)]
            + [{"tool": "autotune", "run": i, "tokens_per_s": t} for i, t in enumerate(at_runs)]}


def test_verdict_uses_the_measured_noise_and_the_wall_ratio(bench):
    args = bench.parse_args([])
    # paired ratios 0.95, 0.857, 1.042: median 0.95 >= 1 - (1.0421 - 0.8571) / 2 = 0.9075; a third of the wall time
    text = bench.report(args, _state([1000, 1050, 950], [950, 900, 990], 900.0, 300.0))
    assert "-> HOLDS" in text and "median 0.950" in text and "(paired median 0.950 >= 0.908)" in text
    # paired ratios 0.8, 0.797, 0.803: median 0.8 < 1 - 0.003: missed
    assert "-> MISSED" in bench.report(args, _state([1000, 1010, 990], [800, 805, 795], 900.0, 300.0))
    # as fast, but 60% of the wall time: missed
    assert "-> MISSED" in bench.report(args, _state([1000, 1000, 1000], [1000, 1000, 1000], 900.0, 540.0))


def test_saved_results_of_other_settings_are_not_mixed_in(bench, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "missing_tools", lambda: [])
    (tmp_path / "results.json").write_text(json.dumps({"settings": {"ranks": 4}, "remeasure": []}))
    assert bench.main(["--out", str(tmp_path)]) == 2
    assert "--fresh" in capsys.readouterr().err


@pytest.mark.slow
def test_user_script_takes_the_deepspeed_launchers_arguments():
    script = BENCH.parent / "workloads" / "ds_user_script.py"
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for flag in ("--deepspeed_config", "--local_rank", "--max-steps", "--seq-len"):
        assert flag in proc.stdout
