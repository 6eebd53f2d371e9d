"""`tune --from FILE...`: the job the user runs now is the study's first trial, and the result says how the
planner's plans measured against it (autotune.tune.current_job). Fake trials (study_fakes.py) for the order and the
refusals; one slow test runs real DeepSpeed trials on 2 CPU ranks from a ds_config.json as autotune emits it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from study_fakes import CLUSTER, KEYS, MODEL, RANKED, FakeRunner, fake_step_time, run  # tests/tune/ is on sys.path

from autotune.api import make_plan
from autotune.errors import InputError
from autotune.tune.current_job import CURRENT_JOB_ATTR, current_job_report
from autotune.tune.sampler import plan_key

REPO = Path(__file__).resolve().parents[2]


def test_the_current_job_is_measured_first_though_the_planner_ranks_it_last(tmp_path, monkeypatch):
    last = RANKED[-1].plan
    runner = FakeRunner()
    result = run(tmp_path, monkeypatch, runner, trials=3, top_k=2, current_job=last)
    assert runner.calls[0] == plan_key(last) and runner.calls[1:] == KEYS[:2]
    assert result.current_job == plan_key(last)
    first = min(result.trials, key=lambda t: t.number)
    assert first.user_attrs[CURRENT_JOB_ATTR] is True
    assert not any(t.user_attrs[CURRENT_JOB_ATTR] for t in result.trials if t.number != first.number)
    line = current_job_report(result.trials, result.current_job)
    assert line.startswith(f"current job (trial {first.number}): ") and "faster" in line, line


def test_a_current_job_outside_the_search_space_is_estimated_and_measured(tmp_path, monkeypatch):
    """A plan the study's space leaves out (selective recompute: study_fakes' constraints allow none and full) is
    still the user's job."""
    mine = make_plan(MODEL, CLUSTER, engine="deepspeed", zero_stage=1, seq_len=64, global_batch_size=8,
                     micro_batch_size=2, recompute="selective")
    assert plan_key(mine) not in KEYS
    runner = FakeRunner()
    result = run(tmp_path, monkeypatch, runner, trials=2, top_k=1, current_job=mine)
    assert runner.calls[0] == plan_key(mine) and plan_key(mine) in result.candidates


def test_a_current_job_the_workload_cannot_run_is_refused_naming_the_way_out(tmp_path, monkeypatch):
    megatron = make_plan(MODEL, CLUSTER, engine="megatron", seq_len=64, global_batch_size=8)  # needs CUDA
    with pytest.raises(InputError) as err:
        run(tmp_path, monkeypatch, FakeRunner(), trials=2, current_job=megatron)
    assert "the current job (--from) is not a plan the builtin workload runs" in err.value.render()
    assert "--workload command" in err.value.render()


def test_the_report_when_the_current_job_is_the_fastest(tmp_path, monkeypatch):
    best = min(RANKED, key=lambda e: fake_step_time(e.plan)).plan
    result = run(tmp_path, monkeypatch, FakeRunner(), trials=3, top_k=3, current_job=best)
    assert "the fastest of the 3 plans measured" in current_job_report(result.trials, result.current_job)


@pytest.mark.slow
def test_tune_from_a_deepspeed_config_measures_it_first(tmp_path):
    """Real trials: the job's ds_config.json (ZeRO-2, micro-batch 2 x 2), then the planner's best; never pruned so
    that both complete and compare."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    job = tmp_path / "job"
    subprocess.run([sys.executable, "-m", "autotune", "emit", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus",
                    "2", "--seq-len", "64", "--global-batch", "8", "--engine", "deepspeed", "--zero", "2",
                    "--micro-batch", "2", "--out", str(job)], check=True, env=env, capture_output=True)
    out = tmp_path / "tune"
    done = subprocess.run([sys.executable, "-m", "autotune", "tune", "--from", str(job / "ds_config.json"),
                           "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64",  # not in it
                           "--trials", "2",
                           "--finalists", "0", "--prune-ratio", "0", "--steps", "3", "--warmup-steps", "1",
                           "--out", str(out), "--json"], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    current = result["current_job"]
    assert current["trial"] == 0 and current["state"] == "complete" and current["tokens_per_s"] > 0
    import optuna

    study = optuna.load_study(study_name="autotune", storage=result["storage"])
    first = study.trials[0]
    assert (first.user_attrs["plan"]["zero_stage"], first.user_attrs["plan"]["micro_batch_size"]) == (2, 2)
    assert (first.user_attrs["plan"]["seq_len"], first.user_attrs["plan"]["global_batch_size"]) == (64, 8)
    assert "current job (trial 0): " in done.stderr


def _tune_from_checkpoint(tmp_path, monkeypatch, capsys, *flags: str) -> tuple[int, object, FakeRunner]:
    """`autotune tune --from FOLDER ...` on a DeepSpeed save of 2 ranks (``latest`` -> the tag's rank-0 model states,
    whose ``ds_config`` and world sizes autotune.job_checkpoint reads; DeepSpeed's own saver writes the same in
    tests/test_job_checkpoint_real.py), through the command's own code with fake trials: (exit code, captured
    output, the runner that saw each trial's plan)."""
    import torch

    from autotune.cli import main
    from autotune.tune import study as study_mod
    from autotune.tune import trial as trial_mod

    config = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
              "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}
    tag = tmp_path / "ckpt" / "global_step3"
    tag.mkdir(parents=True)
    torch.save({"module": {}, "ds_config": config, "dp_world_size": 2, "mp_world_size": 1, "ds_version": "0.19.8"},
               tag / "mp_rank_00_model_states.pt")
    (tmp_path / "ckpt" / "latest").write_text("global_step3")
    runner = FakeRunner()
    monkeypatch.setattr(trial_mod, "run_trial", runner)
    monkeypatch.setattr(study_mod.ops, "ensure_ops", lambda names, **_: {name: "cached" for name in names})
    code = main(["tune", "--from", str(tmp_path / "ckpt"), "--model", "tiny-gpt", "--gpu", "cpu", "--seq-len", "64",
                 *flags, "--trials", "2", "--finalists", "0", "--steps", "2", "--warmup-steps", "1",
                 "--out", str(tmp_path / "tune"), "--json"])
    return code, capsys.readouterr(), runner


def test_tune_from_a_deepspeed_checkpoint_folder_measures_its_job_first(tmp_path, monkeypatch, capsys):
    """`tune --from CHECKPOINT_FOLDER`: the job DeepSpeed saved with its weights is the study's first trial."""
    code, out, runner = _tune_from_checkpoint(tmp_path, monkeypatch, capsys)
    assert code == 0, out.err[-2000:]
    result = json.loads(out.out)
    assert result["current_job"]["trial"] == 0 and result["current_job"]["state"] == "complete"
    assert "the DeepSpeed state saved with global_step3" in out.err  # which save was read, on stderr with --json
    first = json.loads(runner.calls[0])  # the checkpoint's job: ZeRO-2, micro-batch 2 x 2 on its 2 ranks, its
    # overlap_comm DeepSpeed's ZeRO-2 default (off), as the config leaves it
    assert {k: first[k] for k in ("engine", "zero_stage", "micro_batch_size", "grad_accum_steps", "dp",
                                  "global_batch_size", "overlap_comm")} == {
        "engine": "deepspeed", "zero_stage": 2, "micro_batch_size": 2, "grad_accum_steps": 2, "dp": 2,
        "global_batch_size": 8, "overlap_comm": False}, first


def test_tune_from_a_checkpoint_on_more_gpus_tunes_the_same_job_there(tmp_path, monkeypatch, capsys):
    """`tune --from FOLDER --num-gpus 4` where the save states 2 ranks: the job (model, batch 8, sequence 64,
    DeepSpeed) is tuned on 4, as `plan --from` plans it; its own plan needs its 2 ranks, so it is not a trial, and
    stderr says so. Before, the world sizes' conflict was refused."""
    code, out, runner = _tune_from_checkpoint(tmp_path, monkeypatch, capsys, "--num-gpus", "4")
    assert code == 0, out.err[-2000:]
    result = json.loads(out.out)
    assert result["current_job"] is None
    assert "the job runs on 2 GPUs (its files); planning it on 4" in out.err
    assert "the study measures the planner's plans on 4, not the job itself" in out.err
    measured = [json.loads(call) for call in runner.calls]
    assert measured and all(p["tp"] * p["pp"] * p["cp"] * p["dp"] == 4 and p["engine"] == "deepspeed"
                            and p["global_batch_size"] == 8 and p["seq_len"] == 64 for p in measured), measured
