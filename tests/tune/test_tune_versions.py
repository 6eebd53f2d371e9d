"""`autotune tune --engine-version`: the release asked decides the candidates' run settings (its own defaults:
torchtitan 0.3 chunks the loss 8 ways), the trials' files and the winner's files (0.3: the config module, 0.2: the
TOML), and plan.json records it. Nothing trains: run_trial is replaced by a fake that measures nothing real, and the
check that this machine has the GPUs by one that says it has.

Space: llama3-8b (a model torchtitan's registry has, so its files are written) on 8 H100, FSDP2 full shard,
tp = pp = cp = 1, micro-batch 1, seq 4096, global batch 8.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune.cli import main
from autotune.commands import tune as tune_command
from autotune.tune import study as study_mod
from autotune.tune import trial as trial_mod

TUNE = ["tune", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--seq-len", "4096",
        "--global-batch", "8", "--engine", "fsdp", "--zero", "3", "--no-offload", "--tp", "1", "--pp", "1", "--cp",
        "1", "--micro-batch", "1", "--trials", "2", "--top-k", "2", "--finalists", "0", "--steps", "2",
        "--warmup-steps", "1", "--json"]


@pytest.fixture
def trials(monkeypatch) -> list:
    """The TrialSpecs the study ran, each "measured" at 0.1 s a step."""
    seen: list = []

    def fake(spec, on_step=None, on_phase=None, on_launch=None):
        seen.append(spec)
        spec.workdir.mkdir(parents=True, exist_ok=True)
        log = spec.workdir / "trial.log"
        log.write_text("fake\n")
        for i in range(1, spec.warmup_steps + spec.steps + 1):
            if on_step is not None:
                on_step(i, 0.1)
        return trial_mod.TrialResult(status="completed", reason="", log_path=log, step_time_s=0.1,
                                     tokens_per_s=spec.plan.global_batch_size * spec.plan.seq_len / 0.1,
                                     tflops_per_gpu=0.01, peak_memory_bytes=10**8, step_times_s=(0.1, 0.1),
                                     returncode=0)

    monkeypatch.setattr(trial_mod, "run_trial", fake)
    monkeypatch.setattr(tune_command, "_machine_problems", lambda cluster: [])  # no GPU here: nothing runs on one
    monkeypatch.setattr(study_mod.ops, "ensure_ops", lambda names, **_: {name: "cached" for name in names})
    return seen


def _tune(out: Path, capsys, *extra: str) -> tuple[int, dict | None, str]:
    code = main([*TUNE, "--out", str(out), *extra])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else None, captured.err


@pytest.mark.parametrize("release", ["0.2", "0.3"])
def test_the_release_asked_sets_the_trials_plans_and_the_winners_files(tmp_path, capsys, trials, release):
    out = tmp_path / release
    code, doc, err = _tune(out, capsys, "--engine-version", f"fsdp={release}")
    assert code == 0, err
    assert f"torchtitan {release} (asked for)" in err
    chunks = 8 if release == "0.3" else None  # torchtitan 0.3's recipes chunk the loss 8 ways; 0.2.x does not
    assert len(trials) == 2 and all(spec.plan.loss_chunks == chunks for spec in trials)
    assert all(spec.emit_options.torchtitan_version == release for spec in trials)  # the trials' file formats
    assert doc["best"]["plan"].get("loss_chunks") == chunks and doc["engine_versions"] == {"fsdp": release}
    winner = Path(doc["winner_dir"])
    written = json.loads((winner / "plan.json").read_text())
    assert written["engine_version"] == {"engine": "fsdp", "package": "torchtitan", "release": release}
    assert written["plan"] == doc["best"]["plan"]
    if release == "0.3":
        assert not (winner / "torchtitan_job.toml").exists()
        assert "num_chunks=8" in (winner / "torchtitan_plan.py").read_text()
    else:
        assert not (winner / "torchtitan_plan.py").exists()
        assert (winner / "torchtitan_job.toml").is_file()
    study = optuna.load_study(study_name="autotune", storage=f"sqlite:///{out / 'study.db'}")
    assert study.user_attrs["engine_versions"] == {"fsdp": release}


def test_a_release_autotune_does_not_model_exits_2_before_any_trial(tmp_path, capsys, trials):
    code, _, err = _tune(tmp_path / "out", capsys, "--engine-version", "fsdp=0.5")
    assert code == 2 and not trials
    assert "torchtitan 0.5 is not a release autotune models (it models 0.2, 0.3)" in err
    assert "--engine-version fsdp=0.3" in err  # the nearest
    assert not (tmp_path / "out").exists()


def test_a_resume_asking_another_release_is_refused(tmp_path, capsys, trials):
    out = tmp_path / "out"
    assert _tune(out, capsys, "--engine-version", "fsdp=0.3")[0] == 0
    code, _, err = _tune(out, capsys, "--engine-version", "fsdp=0.2", "--resume")
    assert code == 2 and "tunes the engine releases fsdp=0.3" in err and "--engine-version fsdp=0.3" in err
    assert len(trials) == 2  # the refused run measured nothing
