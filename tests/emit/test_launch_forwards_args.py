"""The launch scripts hand their own arguments on to the training script (plan.md: "then your own arguments"):
an argparse-driven script of the user's got none before, so a third-party example stopped at its required flags."""

import json
import os
import subprocess
import sys

from autotune.cli import main


def test_launch_torchrun_passes_its_arguments_on(tmp_path, capsys):
    script = tmp_path / "dump.py"
    script.write_text("import json, os, sys\nopen(os.environ['ARGV_OUT'] + '.' + os.environ.get('RANK', '0'), 'w')"
                      ".write(json.dumps(sys.argv[1:]))\n")
    assert main(["emit", "--model", "tiny-gpt", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "64",
                 "--global-batch", "4", "--engine", "deepspeed", "--script", str(script), "--out",
                 str(tmp_path / "job")]) == 0
    capsys.readouterr()
    for name in ("launch_torchrun.sh", "launch_deepspeed.sh", "launch_slurm.sbatch"):
        assert '"$@"' in (tmp_path / "job" / name).read_text(), name
    env = {**os.environ, "ARGV_OUT": str(tmp_path / "argv"), "PATH": f"{os.path.dirname(sys.executable)}:"
           f"{os.environ.get('PATH', '')}"}
    run = subprocess.run(["bash", str(tmp_path / "job" / "launch_torchrun.sh"), "--epochs", "1", "--name", "a b"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    for rank in (0, 1):
        argv = json.loads((tmp_path / f"argv.{rank}").read_text())
        assert argv[-4:] == ["--epochs", "1", "--name", "a b"] and "--deepspeed_config" in argv
