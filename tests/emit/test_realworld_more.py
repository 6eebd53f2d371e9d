"""How the later real-world files (tests/emit/realworld_more.py) read wrong before: each case reads as bash runs it."""

from __future__ import annotations

from autotune.emit.shell_args import parse_shell_args, parse_shell_launch


def test_an_array_given_a_new_value_lists_that_value_once():
    """Megatron-LM core_v0.19.0 examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh: `PRETRAIN_ARGS=(
    "${PRETRAIN_ARGS[@]}" --use-megatron-fsdp ...)` twice, its launch line inside a string run by `sbatch <<EOF`:
    every earlier value was listed too (each flag given 3 times)."""
    text = 'A=( --x 1 )\nif [ "1" = 1 ]; then\n  A=(\n    "${A[@]}"\n    --y 2\n  )\nfi\nA+=( --z 3 )\n'
    assert parse_shell_args(text + 'sbatch <<EOF\n#!/bin/bash\nsrun bash -c "python pretrain_gpt.py"\nEOF\n')[0] == \
        ["--x", "1", "--y", "2", "--z", "3"]


def test_an_array_expanded_in_an_assignment_is_one_string():
    """bash joins "${A[@]}" with blanks in an assignment (no word splitting there): the first element only was kept,
    the rest read as a command of their own."""
    text = 'A=( --x 1 --y 2 )\nCMD="\ncd /m;\nexport P=/m;\npython pretrain_gpt.py ${A[@]}"\n'
    for run in ('srun bash -x -c "${CMD}" 2>&1 | tee log\n', 'bash -ec "$CMD"\n'):  # the launch line, read
        argv, _, _, script = parse_shell_launch(text + run)
        assert (argv, script) == (["--x", "1", "--y", "2"], "pretrain_gpt.py")
    # as command arguments, each element is its own word still
    assert parse_shell_args('A=( "--x 1" --y )\npython pretrain_gpt.py "${A[@]}"\n')[0] == ["--x 1", "--y"]
