"""plan.md and emit say when the launch scripts' default program, autotune's built-in trainer, cannot run the plan,
with the reason the trainer itself stops with (one source: autotune.engines.builtin_trainer). Before, plan.md said
the built-in trainer "implements this plan" for Mixtral's fsdp tp4 pp4 plan, and the launch script stopped at once
with UNSUPPORTED."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli import main

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--global-batch", "256", "--seq-len", "4096"]


def _emit(tmp_path, capsys, *flags) -> tuple[Path, str]:
    out = tmp_path / "job"
    assert main(["emit", *ARGS, *flags, "--allow-unfit", "--out", str(out)]) == 0
    return out, capsys.readouterr().err


def test_plan_md_and_emit_name_the_trainers_refusal(tmp_path, capsys):
    out, err = _emit(tmp_path, capsys, "--model", "mixtral-8x7b", "--engine", "fsdp", "--tp", "2", "--zero", "3")
    reason = "tensor parallelism of MoE layers is not implemented by the built-in FSDP trainer"
    text = (out / "plan.md").read_text()
    assert "**The built-in trainer cannot run this plan**: " + reason in text
    assert "which implements this plan" not in text
    assert "cannot run this plan: " + reason in err
    # the trainer, as the launch scripts start it, stops with the same reason (before any process group)
    run = subprocess.run([sys.executable, "-m", "autotune.train", "--plan", "plan.json"], cwd=out, text=True,
                         capture_output=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 2 and run.stdout.startswith("UNSUPPORTED " + reason), (run.stdout, run.stderr)


@pytest.mark.parametrize("flags", [
    ("--model", "llama3-8b", "--engine", "fsdp", "--zero", "3"),  # the trainer runs it
    ("--model", "mixtral-8x7b", "--engine", "fsdp", "--tp", "2", "--zero", "3", "--script", "train.py"),  # yours
])
def test_no_refusal_where_the_scripts_run_a_program_that_runs_it(tmp_path, capsys, flags):
    out, err = _emit(tmp_path, capsys, *flags)
    text = (out / "plan.md").read_text()
    assert "cannot run this plan" not in text and "cannot run this plan" not in err
    assert "## Your own training script" in text


def test_deepspeed_autotp_refusal(tmp_path, capsys):
    """DeepSpeed's built-in trainer runs AutoTP on Llama-style models only: GPT-NeoX with tp 2 is the user's."""
    out, err = _emit(tmp_path, capsys, "--model", "gpt-neox-20b", "--engine", "deepspeed", "--tp", "2",
                     "--zero", "1")
    assert "**The built-in trainer cannot run this plan**: AutoTP: model" in (out / "plan.md").read_text()
    assert "cannot run this plan: AutoTP" in err
