"""How the later real-world files (tests/emit/realworld_more.py) read wrong before: each case reads as bash runs it."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_a_value_the_file_leaves_to_its_launch_is_not_checked(tmp_path, capsys):
    """Megatron-LM core_v0.19.0 examples/academic_paper_scripts/detxoify_lm/finetune_gpt_distributed-1.3b.sh takes
    `lr=$3`, `bs=$4` from its own arguments: "--lr expects a number, got '$3'" was an error (bash passes the number
    given at launch); a variable the file never sets is the run's environment likewise."""
    from autotune.cli import main

    path = tmp_path / "run.sh"
    path.write_text("#!/bin/bash\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\nlr=$3\n"
                    "torchrun pretrain_gpt.py --tensor-model-parallel-size 2 --num-layers 2 --hidden-size 64 "
                    "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
                    "--micro-batch-size ${MBS} --global-batch-size 8 --vocab-size 1000 --bf16 --lr $lr "
                    "--lr-decay-style ${STYLE}\n")
    assert main(["validate", str(path), "--world-size", "8", "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)
    assert sorted((p["path"], p["severity"]) for p in problems) == [
        ("--lr", "warning"), ("--lr-decay-style", "warning"), ("--micro-batch-size", "warning")], problems
    assert all("leaves to its launch" in p["message"] for p in problems)


def test_model_optimizers_flags_parse_on_the_hybrid_script_too():
    """pretrain_hybrid.py passes extra_args_provider=add_modelopt_args as pretrain_gpt.py does (core_v0.19.0
    pretrain_hybrid.py:459; pretrain_mamba.py runs it): its Model Optimizer flags were parser-exit errors."""
    from autotune.emit.megatron_lint import megatron_args_problems

    argv = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--modelopt-enabled"]
    for script in ("pretrain_hybrid.py", "../pretrain_mamba.py", "pretrain_gpt.py"):
        got = [p for p in megatron_args_problems(argv, 1, script=script) if p.path == "--modelopt-enabled"]
        assert [p.severity for p in got] == ["warning"] and "nvidia-modelopt is installed" in got[0].message, script


def test_a_test_of_the_scripts_own_arguments_reads_the_default_run():
    """examples/mimo/scripts/run_mock_train.sh (core_v0.19.0): `if [ "$1" = "-d" ]` is false when run without
    arguments (as `$#` is 0 and "$@" gives none): the debug branch was read as an unknown test's first branch."""
    text = ('MODE=run\nif [ "$1" = "-d" ]; then\n  MODE=debug\nfi\nif [[ -n "${2}" ]]; then MODE=two; fi\n'
            'torchrun pretrain_gpt.py --mode $MODE\n')
    assert parse_shell_args(text)[0] == ["--mode", "run"]


def test_a_mimo_job_is_not_estimated_as_a_gpt(capsys):
    """examples/mimo/train.py trains a MimoModel (model_providers/mock.py: encoders, projections, a language model):
    with --model it was estimated as a GPT job; now refused naming what it trains, as examples/multimodal is."""
    from autotune.cli import main

    path = Path(__file__).resolve().parents[1] / "fixtures" / "realworld" / "good" / "megatron_mimo_run_mock_train.sh"
    assert main(["estimate", "--from", str(path), "--model", "llama3-8b", "--gpu", "h100-sxm-80gb"]) == 2
    assert "train.py: a multimodal model (examples/mimo" in capsys.readouterr().err


def test_a_bridge_peft_override_without_target_is_the_recipes_lora(capsys):
    """Bridge's tutorial fine-tune override (`peft: {dim: 8, alpha: 16}`, no `_target_`) sets the LoRA of the recipe
    it runs on (03_finetune_with_yaml.py:89): it was estimated as full fine-tuning (every weight's gradient and Adam
    state), in silence."""
    from autotune.cli import main

    path = Path(__file__).resolve().parents[1] / "fixtures" / "realworld" / "good" / "bridge_llama32_1b_finetune.yaml"
    code = main(["estimate", "--from", str(path), "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8",
                 "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert (plan.get("peft"), plan.get("lora_rank"), plan.get("lora_alpha")) == ("lora", 8, 16)
    assert (plan["micro_batch_size"], plan["grad_accum_steps"], plan["seq_len"]) == (2, 8, 4096)
    assert "its peft block sets alpha, dim of the base recipe's PEFT: read as LoRA" in err
