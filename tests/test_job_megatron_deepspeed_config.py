"""The DeepSpeed config a Megatron-DeepSpeed launch script writes before it launches (a here-document, or a template
filled by sed, as the fork's examples_deepspeed scripts do: tests/fixtures/megatron_deepspeed/SOURCES.md), read as the
config the job runs; ZeRO-Offload with the fork's --cpu-optimizer; PR-MoE's per-layer expert counts."""

import json
import shutil
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.emit.bash_reader import BashReader, ShellState
from autotune.emit.shell_files import read_written_files

FIXTURES = Path(__file__).parent / "fixtures" / "megatron_deepspeed"


def _estimate(capsys, *args: str) -> tuple[int, dict | None, str]:
    code = main(["estimate", "--from", *args, "--gpu", "h100-sxm-80gb", "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def test_here_document_is_read_as_the_jobs_config(capsys):
    # run-1t.sh:67-111 writes ZeRO-3 with offload_optimizer cpu and fp16; --cpu-optimizer (DeepSpeedCPUAdam)
    code, got, err = _estimate(capsys, str(FIXTURES / "azure" / "run-1t.sh"), "--num-gpus", "8")
    assert code == 0, err  # refused before: "Megatron-DeepSpeed: no optimizer offload to cpu"
    plan = got["plan"]
    assert (plan["zero_stage"], plan["offload_optimizer"], plan["precision"]) == (3, "cpu", "fp16")
    assert "here-document writes to ds_config.json" in err and "run-1t.sh:67" in err
    assert got["memory"]["optimizer_states"] == 0  # in host memory, as the DeepSpeed engine's ZeRO-Offload


@pytest.mark.parametrize("script, stage, gpus", [("MoE/ds_pretrain_gpt_1.3B_PR-MoE64or128.sh", 2, 64),
                                                 ("rebase/ds_pretrain_gpt_125M.sh", 1, 8)])
def test_sed_template_next_to_the_script_is_filled_and_read(script, stage, gpus, capsys):
    code, got, err = _estimate(capsys, str(FIXTURES / script), "--num-gpus", str(gpus))
    assert code == 0, err
    assert got["plan"]["zero_stage"] == stage  # the MoE script passes no --zero-stage: 0 before
    assert got["plan"]["precision"] == "fp16"
    assert "its sed commands write to ds_config_" in err


def test_template_elsewhere_is_named_or_taken_from_from(tmp_path, capsys):
    script = tmp_path / "run" / "ds_pretrain_gpt_1.3B_PR-MoE64or128.sh"
    script.parent.mkdir()
    shutil.copy(FIXTURES / "MoE" / script.name, script)
    code, got, err = _estimate(capsys, str(script), "--num-gpus", "64")
    assert code == 0, err
    assert "neither next to the script nor given" in err and "give ds_config_gpt_Zero2_TEMPLATE.json with --from" in err
    assert got["plan"]["zero_stage"] == 0  # the flags' (none): said above, not silent
    template = FIXTURES / "MoE" / "ds_config_gpt_Zero2_TEMPLATE.json"
    code, got, err = _estimate(capsys, str(script), str(template), "--num-gpus", "64")
    assert code == 0, err
    assert got["plan"]["zero_stage"] == 2 and "its sed commands write" in err


def test_placeholder_left_unfilled_is_refused_with_its_name(tmp_path, capsys):
    text = (FIXTURES / "rebase" / "ds_pretrain_gpt_125M.sh").read_text().replace(
        '    | sed "s/ZERO_STAGE/${zero_stage}/" \\\n', "")
    (tmp_path / "run.sh").write_text(text)
    shutil.copy(FIXTURES / "rebase" / "ds_config_gpt_TEMPLATE.json", tmp_path)
    code, _, err = _estimate(capsys, str(tmp_path / "run.sh"), "--num-gpus", "8")
    assert code == 2 and "Traceback" not in err
    assert "placeholders left: ZERO_STAGE" in err and "training.py:77-79" in err


SCRIPT = """DS=ds.json
GBS=16
cat <<{delim} > $DS
{{"train_batch_size": $GBS, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {{"stage": 2{offload}}},
 "bf16": {{"enabled": true}}}}
EOT
deepspeed --num_gpus 8 pretrain_gpt.py --num-layers 12 --hidden-size 768 --num-attention-heads 12 \\
  --seq-length 2048 --max-position-embeddings 2048 --vocab-size 50257 --fp16 --use-flash-attn-v2 \\
  --deepspeed --deepspeed_config $DS --zero-stage 1 --no-pipeline-parallel {extra}
"""


def _script(tmp_path, delim="EOT", offload="", extra="") -> str:
    (tmp_path / "run.sh").write_text(SCRIPT.format(delim=delim, offload=offload, extra=extra))
    return str(tmp_path / "run.sh")


def test_config_decides_stage_precision_and_missing_batch_sizes(tmp_path, capsys):
    code, got, err = _estimate(capsys, _script(tmp_path), "--num-gpus", "8")
    assert code == 0, err
    plan = got["plan"]
    # DeepSpeed runs its config's stage and dtype; the flags state no batch sizes, the config's are taken
    assert (plan["zero_stage"], plan["precision"]) == (2, "bf16")
    assert (plan["micro_batch_size"], plan["global_batch_size"]) == (2, 16)
    assert "--zero-stage 1, the DeepSpeed config's stage 2" in err and "precision bf16" in err


def test_quoted_delimiter_is_not_expanded(tmp_path, capsys):
    code, got, err = _estimate(capsys, _script(tmp_path, delim="'EOT'"), "--num-gpus", "8")
    assert code == 0, err
    assert "uses $GBS, which the script does not set" in err
    assert got["plan"]["zero_stage"] == 1  # the flag's, the config not read (and said)


def test_here_document_reader_keeps_lines_and_strips_tabs():
    text = "A=3\ncat <<-END >out.json\n\t{\"a\": $A, \"b\": \"\\$A\"}\n\tEND\necho done\n"
    reader = BashReader(text, ShellState())
    reader.state.variables["A"] = ("3", (1,))
    reader.command()
    reader.command()
    assert ("<<", '{"a": 3, "b": "$A"}\n') in reader.redirects and (">", "out.json") in reader.redirects
    assert [w for w, _ in reader.command()] == ["echo", "done"] and reader.line == 6


@pytest.mark.parametrize("offload, extra, problem", [
    (', "offload_optimizer": {"device": "cpu"}', "", "add --cpu-optimizer"),
    (', "offload_optimizer": {"device": "cpu"}', "--cpu-optimizer --cpu_torch_adam", "drop --cpu_torch_adam"),
    ("", "--cpu-optimizer", "cpu_adam.py:148")])
def test_offload_combinations_deepspeed_refuses_are_refused(offload, extra, problem, tmp_path, capsys):
    code, _, err = _estimate(capsys, _script(tmp_path, offload=offload, extra=extra), "--num-gpus", "8")
    assert code == 2 and "Traceback" not in err
    assert problem in err


def test_cpu_optimizer_with_offload_is_estimated_as_zero_offload(tmp_path, capsys):
    code, got, err = _estimate(capsys, _script(tmp_path, offload=', "offload_optimizer": {"device": "cpu"}',
                                               extra="--cpu-optimizer"), "--num-gpus", "8")
    assert code == 0, err
    assert got["plan"]["offload_optimizer"] == "cpu" and got["memory"]["optimizer_states"] == 0
    assert got["time"]["offload_s"] > 0 and got["memory"]["host_per_node"] > 0  # the DeepSpeed engine's costs
    assert got["plan"]["zero_stage"] == 2


def test_written_files_of_a_sed_pipeline():
    files = read_written_files(FIXTURES / "rebase" / "ds_pretrain_gpt_125M.sh")
    (written,) = files.values()
    assert written.template == "ds_config_gpt_TEMPLATE.json" and written.line == 289
    assert ("ZERO_STAGE", "1", False) in written.subs and written.unread is None


def test_pyramid_moe_says_the_parameters_it_adds(capsys):
    code, got, err = _estimate(capsys, str(FIXTURES / "MoE" / "ds_pretrain_gpt_1.3B_PR-MoE64or128.sh"),
                               "--num-gpus", "64")
    assert code == 0, err
    assert got["model"]["spec"]["moe"]["num_experts"] == 128
    # 10 layers of 64 experts estimated with 128: 640 experts of 2 x 2048 x 8192 + biases more (the PR-MoE paper's
    # 1.3B+PR-MoE-64/128 holds 31B parameters)
    extra = 640 * (2 * 2048 * 8192 + 8192 + 2048)
    assert f"{extra / 1e9:.2f}B parameters more than the per-layer counts hold" in err
    assert abs(got["model"]["num_params"] - extra - 31e9) < 0.5e9


def test_expert_count_list_of_the_wrong_length_is_refused(tmp_path, capsys):
    code, _, err = _estimate(capsys, _script(tmp_path, extra="--num-experts 8 8 16"), "--num-gpus", "8")
    assert code == 2 and "3 counts for 6 MoE layers" in err and "transformer.py:1651-1652" in err


def test_a_job_outside_the_search_is_told_the_field_that_puts_it_there(capsys):
    # the fork's rebase/ds_pretrain_gpt_125M.sh runs tp2 without --sequence-parallel; the planner turns sequence
    # parallelism on wherever tp > 1, so the job is not among the searched plans: the line says which field
    script = FIXTURES / "rebase" / "ds_pretrain_gpt_125M.sh"
    assert main(["plan", "--from", str(script), "--gpu", "h100-sxm-80gb", "--num-gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "it is not among the" in out
    assert "the nearest plan searched differs in sequence_parallel False -> True" in out
