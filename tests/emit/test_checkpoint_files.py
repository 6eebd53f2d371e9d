"""Every engine's files save at the checkpoint policy's interval (issue 19 item 5): DeepSpeed and FSDP2's built-in
trainers read checkpoint_policy.json, Megatron's --save-interval, torchtitan's [checkpoint] interval, the HF Trainer's
save_steps and accelerate's save_state as plan.md states them."""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from autotune.cli import main


def _emit(tmp_path, *flags):
    out = tmp_path / "job"
    assert main(["emit", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--seq-len", "4096",
                 "--global-batch", "64", "--lost-gpus", "0", "--out", str(out), *flags]) == 0
    policy = json.loads((out / "plan.json").read_text())["checkpoint"]
    return out, policy


def test_torchtitan_saves_at_the_policys_interval(tmp_path):
    out, policy = _emit(tmp_path, "--engine", "fsdp", "--zero", "3", "--torchtitan-version", "0.2")
    saving = tomllib.loads((out / "torchtitan_job.toml").read_text())["checkpoint"]
    assert saving["interval"] == policy["interval_steps"] != 500 and saving["keep_latest_k"] == policy["keep_last"]
    assert saving["async_mode"] == ("async" if policy["async_save"] else "disabled")


@pytest.mark.parametrize("flags", [(), ("--save-interval", "123")])
def test_the_hf_trainer_and_accelerate_are_told_the_policys_interval(tmp_path, flags):
    out, policy = _emit(tmp_path, "--engine", "hf", "--zero", "2", *flags)
    md = (out / "plan.md").read_text()
    steps = int(re.search(r"save_strategy='steps', save_steps=(\d+), save_total_limit=(\d+)", md).group(1))
    assert steps == policy["interval_steps"] and (not flags or steps == 123)
    assert f"every {steps} steps accelerator.save_state(" in md and "resume_from_checkpoint=True" in md


def test_megatron_saves_at_the_policys_interval(tmp_path):
    out, policy = _emit(tmp_path, "--engine", "megatron", "--zero", "1", "--tp", "2")
    args = (out / "megatron_args.sh").read_text()
    assert f"--save-interval {policy['interval_steps']}" in args.replace("\n", " ").replace("  ", " ") or \
        re.search(rf"--save-interval\s+{policy['interval_steps']}\b", args)


def test_the_fsdp2_trainer_starts_from_the_emitted_learning_rate_schedule(tmp_path):
    from autotune.emit.options import OptimizerOptions
    from autotune.train.fsdp import _emitted_optimizer

    out, _ = _emit(tmp_path, "--engine", "fsdp", "--zero", "3", "--lr", "0.01", "--warmup-steps", "3",
                   "--train-steps", "20")
    opt = _emitted_optimizer(str(out / "plan.json"), OptimizerOptions)
    assert (opt.lr, opt.warmup_steps, opt.train_steps) == (0.01, 3, 20)
    assert _emitted_optimizer(str(tmp_path / "missing.json"), OptimizerOptions) == OptimizerOptions()


@pytest.mark.parametrize("engine,flags,says", [("fsdp", ("--zero", "3"), "`step-N` folder marked `autotune_complete`"),
                                               ("deepspeed", ("--zero", "1"), "last complete checkpoint (`latest`)"),
                                               ("megatron", ("--zero", "1", "--tp", "2"), None)])
def test_plan_md_says_how_the_built_in_trainer_saves_and_resumes(tmp_path, engine, flags, says):
    out, _ = _emit(tmp_path, "--engine", engine, *flags)
    md = (out / "plan.md").read_text()
    assert ("The built-in trainer saves at this interval" in md) == (says is not None)
    assert says is None or says in md
