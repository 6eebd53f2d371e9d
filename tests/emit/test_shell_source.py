"""A launch script's ``source``d settings files read in place (autotune.emit.shell_source): the variables they set
reach the flags of the launch line, as bash runs them, for `estimate --from`, `validate` and the launch line's
world size alike; a file that is not there is left out, a loop of sources read once."""

import json

import pytest

from autotune.cli import main
from autotune.emit.job_args import launch_sizes
from autotune.emit.shell_args import read_megatron_launch

LAUNCH = ("torchrun --nproc_per_node $GPUS --nnodes $NODES pretrain_gpt.py --tensor-model-parallel-size $TP "
          "--pipeline-model-parallel-size $PP --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
          "--seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size $GBS --bf16 "
          "--use-distributed-optimizer --train-iters 10 --lr 1e-4 --tokenizer-type NullTokenizer --vocab-size 32000\n")
SETTINGS = "TP=4\nPP=2\nGBS=256\nGPUS=8\nNODES=2\n"


def _script(tmp_path, source_line: str, settings_at: str = "settings.sh"):
    (tmp_path / settings_at).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / settings_at).write_text(SETTINGS)
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\nset -e\n{source_line}\n{LAUNCH}")
    return script


@pytest.mark.parametrize("line", [
    "source settings.sh", ". ./settings.sh", 'source "$(dirname "$0")/settings.sh"',
    'SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)\nsource "${SCRIPT_DIR}/settings.sh"',
    'if [ -f settings.sh ]; then\n  source settings.sh\nfi',
])
def test_sourced_settings_reach_the_flags(tmp_path, line):
    argv, lines, _, script = read_megatron_launch(_script(tmp_path, line))
    assert script == "pretrain_gpt.py"
    flags = dict(zip(argv, argv[1:]))
    assert (flags["--tensor-model-parallel-size"], flags["--pipeline-model-parallel-size"],
            flags["--global-batch-size"]) == ("4", "2", "256")
    # a value set in settings.sh carries the number of train.sh's `source` line, the line the user can find
    source_line = next(i for i, text in enumerate((tmp_path / "train.sh").read_text().splitlines(), start=1)
                       if "settings.sh" in text and "[" not in text)
    assert lines[argv.index("--tensor-model-parallel-size") + 1] == source_line
    assert launch_sizes(str(tmp_path / "train.sh"))[:2] == (2, 8)


def test_estimate_from_a_script_with_its_settings_file(tmp_path, capsys):
    script = _script(tmp_path, "source ./conf/settings.sh", "conf/settings.sh")
    assert main(["estimate", "--from", str(script), "--gpu", "h100-sxm-80gb", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["plan"]["tp"], got["plan"]["pp"], got["plan"]["dp"], got["plan"]["global_batch_size"]) == (4, 2, 2, 256)


def test_nested_and_looping_sources_are_read_once(tmp_path):
    (tmp_path / "a.sh").write_text("TP=2\nsource b.sh\n")
    (tmp_path / "b.sh").write_text("PP=4\nsource a.sh\nsource train.sh\n")  # back to a.sh and to the script itself
    script = tmp_path / "train.sh"
    script.write_text("source a.sh\ntorchrun pretrain_gpt.py --tensor-model-parallel-size $TP "
                      "--pipeline-model-parallel-size $PP\n")
    argv, _, _, _ = read_megatron_launch(script)
    assert argv == ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4"]


def test_a_missing_or_computed_source_is_left_out(tmp_path, capsys):
    script = tmp_path / "train.sh"
    script.write_text("source ~/.bashrc\nsource /opt/conda/bin/activate base\nsource $ENV_FILE\nsource nowhere.sh\n"
                      + LAUNCH.replace("$TP", "2").replace("$PP", "1").replace("$GBS", "16")
                      .replace("$GPUS", "8").replace("$NODES", "1"))
    argv, _, _, _ = read_megatron_launch(script)
    assert dict(zip(argv, argv[1:]))["--tensor-model-parallel-size"] == "2"
    # with the variable unset the flag still says what it could not read, and exits 2
    script.write_text("source nowhere.sh\n" + LAUNCH)
    assert main(["estimate", "--from", str(script), "--gpu", "h100-sxm-80gb"]) == 2
    assert "'$TP', not a number" in capsys.readouterr().err


def test_a_sourced_setting_fills_the_here_document_config(tmp_path, capsys):
    # settings.sh sets the ZeRO stage the script's here-document writes into its DeepSpeed config
    (tmp_path / "settings.sh").write_text("ZERO_STAGE=2\nGBS=16\n")
    (tmp_path / "run.sh").write_text(
        "source ./settings.sh\nconfig_json=ds_config.json\ncat <<EOT > $config_json\n"
        '{"train_batch_size": $GBS, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": $ZERO_STAGE},'
        ' "bf16": {"enabled": true}}\nEOT\n'
        "deepspeed --num_gpus 8 pretrain_gpt.py --num-layers 12 --hidden-size 768 --num-attention-heads 12 "
        "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size $GBS "
        "--vocab-size 50257 --bf16 --deepspeed --deepspeed_config $config_json --use-flash-attn-v2\n")
    assert main(["estimate", "--from", str(tmp_path / "run.sh"), "--gpu", "h100-sxm-80gb", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["plan"]["zero_stage"], got["plan"]["global_batch_size"]) == (2, 16)

