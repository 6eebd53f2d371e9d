"""The launchers' command lines and verdicts, without starting anything (the real runs: test_slurm.py).

DeepSpeed's runner parses the deepspeed argv here with its own parser (deepspeed/launcher/runner.py parse_args).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from deepspeed.launcher.runner import parse_args as deepspeed_parse_args

from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset
from autotune.tune import launchers
from autotune.tune.slurm_step import parse_srun_line, slurm_argv
from autotune.tune.trialspec import TrialResult, TrialSpec, Workload


def _spec(tmp_path: Path, num_gpus: int = 2, gpu: str = "cpu", **kw) -> TrialSpec:
    cluster = load_cluster(gpu=gpu, num_gpus=num_gpus)
    plan = ParallelPlan(dp=num_gpus, global_batch_size=num_gpus * 2, micro_batch_size=1, grad_accum_steps=2,
                        seq_len=64, zero_stage=1)
    return TrialSpec(model=load_model_preset("tiny-gpt"), cluster=cluster, plan=plan,
                     workload=Workload(kind="builtin"), workdir=tmp_path / "0007", **kw)


def test_torchrun_prefix_is_what_trials_always_ran(tmp_path):
    argv = launchers.launch_argv(_spec(tmp_path))
    assert argv[:7] == [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                        "127.0.0.1"]
    assert argv[7] == "--master_port" and argv[8].isdigit() and len(argv) == 9


def test_deepspeed_prefix_parsed_by_deepspeed(tmp_path):
    spec = _spec(tmp_path, launcher="deepspeed")
    argv = launchers.launch_argv(spec) + ["-m", "autotune.train", "--plan", "plan.json"]
    assert argv[:2] == ["env", "LOCAL_SIZE=2"]  # the CPU accelerator's device count
    args = deepspeed_parse_args(argv[argv.index("deepspeed.launcher.runner") + 1:])
    assert (args.num_nodes, args.num_gpus, args.no_python, args.no_local_rank) == (1, 2, True, True)
    assert args.user_script == sys.executable and args.user_args[:2] == ["-m", "autotune.train"]

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=4\n")
    spec = _spec(tmp_path, launcher="deepspeed", hostfile=str(hostfile), include="localhost:1,3")
    argv = launchers.launch_argv(spec)
    args = deepspeed_parse_args(argv[argv.index("deepspeed.launcher.runner") + 1:] + ["train.py"])
    assert args.no_ssh and args.node_rank == 0 and args.include == "localhost:1,3"
    assert args.num_gpus == -1 and args.master_addr == "127.0.0.1"  # --num_gpus excludes --include
    assert launchers.launcher_for(launchers.LaunchSettings(name="deepspeed", hostfile=str(hostfile),
                                                           include="localhost:1,3")).problems(spec.cluster,
                                                                                              "builtin") == []


@pytest.mark.parametrize("num_gpus,per_node,expected", [(2, 8, (1, 2)), (16, 8, (2, 8)), (12, 4, (3, 4)),
                                                        (4, 4, (1, 4))])
def test_slurm_placement(num_gpus, per_node, expected):
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=num_gpus, gpus_per_node=per_node)
    assert launchers.slurm_placement(cluster, num_gpus) == expected


def test_slurm_time_limit_leaves_slurm_room_before_the_trial_timeout():
    # (timeout - 30 s enforcement slack) in whole minutes, at least 1
    assert [launchers.slurm_time_limit_min(t) for t in (5, 90, 110, 300, 3600)] == [1, 1, 1, 4, 59]


def test_slurm_step_and_job_command_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    spec = _spec(tmp_path, num_gpus=16, gpu="h100-sxm-80gb", launcher="slurm")
    prefix = launchers.launch_argv(spec)
    params = json.loads(prefix[prefix.index("autotune.tune.slurm_step") + 1])
    assert params["mode"] == "step" and (params["nodes"], params["tasks_per_node"], params["ntasks"]) == (2, 8, 16)
    step = slurm_argv(params, ["python", "-m", "x"])
    assert step[0] == "srun" and "--nodes=2" in step and "--ntasks=16" in step and "--ntasks-per-node=8" in step
    assert "--gpus-per-node=8" in step and "--kill-on-bad-exit=1" in step and "--time=4" in step
    assert f"--output={Path(params['workdir']) / 'rank-%t.log'}" in step and step[-3:] == ["python", "-m", "x"]
    monkeypatch.delenv("SLURM_JOB_ID")
    params = json.loads(launchers.launch_argv(spec)[prefix.index("autotune.tune.slurm_step") + 1])
    job = slurm_argv(params, ["python", "-m", "x"])
    assert params["mode"] == "job" and job[:2] == ["sbatch", "--parsable"] and job[-2] == "--wrap"
    assert job[-1].startswith("srun ")


def test_srun_messages_and_review(tmp_path):
    assert parse_srun_line("srun: error: node3: tasks 0-2,5: Killed") == \
        ("tasks", {0: "Killed", 1: "Killed", 2: "Killed", 5: "Killed"})
    line = "slurmstepd-vm: error: *** STEP 3.0 ON vm CANCELLED AT 2026-12-01T09:54:56 DUE TO TIME LIMIT ***"
    assert parse_srun_line(line) == ("ended", ("time limit", line))
    spec = _spec(tmp_path, launcher="slurm")
    spec.workdir.mkdir(parents=True)
    crashed = TrialResult(status="crashed", reason="exit code 143: ...", log_path=spec.workdir / "trial.log")
    record = {"kind": "job", "id": "9", "name": "n", "time_limit_min": 1, "tasks": {"1": "Terminated"},
              "ended": "time limit", "line": line, "stopped_by_tuner": False}
    (spec.workdir / launchers.SLURM_RECORD_NAME).write_text(json.dumps(record))
    hung = launchers.review(spec, crashed)
    assert hung.status == "hung" and "time limit (1 min)" in hung.reason and "task 1: Terminated" in hung.reason
    record.update(ended="cancelled", line="*** JOB 9 ON vm CANCELLED AT 2026-12-01T10:00:00 ***")
    (spec.workdir / launchers.SLURM_RECORD_NAME).write_text(json.dumps(record))
    cancelled = launchers.review(spec, crashed)
    assert cancelled.status == "crashed" and "SLURM job 9 was cancelled" in cancelled.reason
    record.update(stopped_by_tuner=True)  # the tuner stopped it (pruned / its own timeout): its verdict stands
    (spec.workdir / launchers.SLURM_RECORD_NAME).write_text(json.dumps(record))
    assert launchers.review(spec, crashed) is crashed


def test_slurm_without_a_reachable_controller_is_refused_before_the_study(monkeypatch, tmp_path):
    """sbatch on PATH but no controller it can reach: the first trial failed on it ('sbatch: fatal: Could not
    establish a configuration source') and counted against the study."""
    import shutil

    if shutil.which("sbatch") is None or shutil.which("scontrol") is None:
        pytest.skip("the SLURM client (sbatch, scontrol) is not installed")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    (tmp_path / "slurm.conf").write_text("")  # no ClusterName, no controller: scontrol fails at once
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    slurm = launchers.launcher_for(launchers.LaunchSettings(name="slurm"))
    problems = slurm.problems(load_cluster(gpu="cpu", num_gpus=2), "builtin")
    assert any("cannot reach a SLURM controller" in p and "scontrol ping" in p for p in problems), problems
