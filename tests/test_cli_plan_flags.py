"""Bad values of the plan's newer flags, given on the command line: exit 2, the message names the flag (not the
ParallelPlan field behind it) and the way out; nothing is estimated, planned or written."""

from __future__ import annotations

import pytest

from autotune.cli import main
from autotune.commands import FLOAT_RANGES, INT_RANGES, LEAVE_OUT

LLAMA = ["--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--zero", "1"]
MIXTRAL = ["--model", "mixtral-8x7b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--zero", "1"]


def run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own refusal (a choice, a switch given a value)
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


# (flags, the flag the message must name, a way out it must give; None: the range itself is the way out)
OUT_OF_RANGE = [
    (["--engine", "megatron", "--recompute", "none", "--activation-offload-layers", "0"],
     "--activation-offload-layers", "leave --activation-offload-layers out to offload no layer"),
    (["--engine", "megatron", "--activation-offload-layers", "-3"], "--activation-offload-layers", "leave"),
    (["--engine", "megatron", "--activation-offload-layers", "5000"], "--activation-offload-layers", "<= 4,096"),
    (["--engine", "megatron", "--etp", "0"], "--etp", "leave --etp out for etp = tp"),
    (["--engine", "fsdp", "--zero", "3", "--dp-replicate", "0"], "--dp-replicate", ">= 1"),
    (["--engine", "megatron", "--loss-chunks", "0"], "--loss-chunks", "leave --loss-chunks out"),
    (["--engine", "megatron", "--peft", "lora", "--lora-rank", "0"], "--lora-rank", "leave --lora-rank out"),
    (["--engine", "megatron", "--peft", "lora", "--lora-rank", "100000000"], "--lora-rank", "<= 1,048,576"),
    (["--engine", "megatron", "--peft", "lora", "--lora-alpha", "0"], "--lora-alpha", "leave --lora-alpha out"),
    (["--engine", "megatron", "--peft", "lora", "--lora-alpha", "nan"], "--lora-alpha", "finite"),
]


@pytest.mark.parametrize("flags, flag, way_out", OUT_OF_RANGE, ids=[" ".join(c[0][2:]) for c in OUT_OF_RANGE])
def test_an_out_of_range_value_names_the_flag_and_the_way_out(capsys, flags, flag, way_out):
    code, out, err = run(["estimate", *LLAMA, *flags], capsys)
    assert code == 2 and out == "", err
    assert flag in err and way_out in err, err
    field = flag[2:].replace("-", "_")  # the ParallelPlan field (etp is spelled alike)
    assert (field == "etp" or field not in err) and "Traceback" not in err, err


@pytest.mark.parametrize("command", ["plan", "emit"])
def test_plan_and_emit_name_the_flag_too(capsys, tmp_path, command):
    out_dir = tmp_path / "job"
    extra = ["--engine", "megatron", "--out", str(out_dir)] if command == "emit" else []
    code, _, err = run([command, *LLAMA[:-2], *extra, "--activation-offload-layers", "0"], capsys)
    assert code == 2 and "--activation-offload-layers must be >= 1" in err and "offload no layer" in err, err
    assert not out_dir.exists()


def test_every_way_out_belongs_to_a_checked_flag():
    assert set(LEAVE_OUT) <= set(INT_RANGES) | set(FLOAT_RANGES)
    for dest, text in LEAVE_OUT.items():
        assert "--" + dest.replace("_", "-") in text, dest


# the other recently added flags: a value the plan cannot take names the flag in the way out
PLAN_PROBLEMS = [
    (["estimate", *LLAMA, "--engine", "megatron", "--cuda-graph-scope", "attn"], "--cuda-graph-scope"),
    (["estimate", *LLAMA, "--engine", "megatron", "--cuda-graph", "full-iteration", "--cuda-graph-scope", "attn"],
     "drop --cuda-graph-scope"),
    (["estimate", *LLAMA, "--engine", "megatron", "--cuda-graph-scope", "everything"], "--cuda-graph-scope"),
    (["estimate", *LLAMA, "--engine", "megatron", "--ep-overlap", "a2a"], "drop --ep-overlap"),
    (["estimate", *LLAMA, "--engine", "megatron", "--moe-dispatcher", "flex-deepep"], "drop --moe-dispatcher"),
    (["estimate", *MIXTRAL, "--ep", "8", "--engine", "deepspeed", "--moe-dispatcher", "flex-deepep"],
     "drop --moe-dispatcher"),
    (["estimate", *LLAMA, "--linear-inputs", "fp8"], "--linear-inputs"),
    (["estimate", *LLAMA, "--expandable-segments=yes"], "--expandable-segments"),
]


@pytest.mark.parametrize("argv, says", PLAN_PROBLEMS, ids=[" ".join(c[0][9:]) for c in PLAN_PROBLEMS])
def test_the_newer_flags_name_themselves_when_refused(capsys, argv, says):
    code, out, err = run(argv, capsys)
    assert code == 2 and out == "", err
    assert says in err and "Traceback" not in err, err
