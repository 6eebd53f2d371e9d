"""`autotune validate job/*` on a whole job folder: the hostfile and the launch scripts are checked as what they are
(DeepSpeed's hostfile grammar, bash syntax, the files a script takes from its own folder), plan.md is skipped with a
note (issue 21: `validate job/*` failed on the bundle's hostfile)."""

from __future__ import annotations

import glob

import pytest

from autotune.cli import main
from autotune.emit.launch_lint import hostfile_problems, launch_script_problems
from autotune.emit.validate_files import file_kind


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundles")
    common = ["--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--hosts", "n1,n2"]
    assert main(["emit", *common, "--zero", "1", "--out", str(root / "ds")]) == 0
    assert main(["emit", *common, "--tp", "2", "--engine", "megatron", "--out", str(root / "mcore")]) == 0
    return root


@pytest.mark.parametrize("name", ["ds", "mcore"])
def test_validate_a_whole_job_folder(bundles, name, capsys):
    capsys.readouterr()
    code = main(["validate", *sorted(glob.glob(str(bundles / name / "*")))])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "skipped" in err and "plan.md: notes, not a config" in err and "no problems for world size 16" in out


def test_kinds_of_a_job_folders_files(bundles):
    assert file_kind(bundles / "ds" / "hostfile") == "hostfile"
    assert file_kind(bundles / "ds" / "launch_torchrun.sh") == "launch"
    assert file_kind(bundles / "ds" / "launch_slurm.sbatch") == "launch"
    assert file_kind(bundles / "mcore" / "launch_torchrun.sh") == "megatron"  # its Megatron arguments are inline


def test_hostfile_lines_as_deepspeed_reads_them(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("# nodes\nn1 slots=8\nn1 slots=8\nbad line\nn3 slots=99999999999999999999\n\n")
    found = {(p.path, p.line): p.message for p in hostfile_problems(path, world_size=16)}
    assert "listed twice" in found[("n1", 3)] and "not a hostfile line" in found[("bad line", 4)]
    assert "not a rank count" in found[("n3", 5)]
    path.write_text("n1 slots=8\nn2 slots=4\n")
    (problem,) = hostfile_problems(path, world_size=16)
    assert "add up to 12 ranks, the job has 16" in problem.message
    path.write_text("n1 slots=8\nn2 slots=8\n")
    assert hostfile_problems(path, world_size=16) == []


def test_a_launch_script_missing_its_files_or_broken(bundles, tmp_path):
    script = tmp_path / "launch_torchrun.sh"
    script.write_text((bundles / "ds" / "launch_torchrun.sh").read_text())
    missing = {p.path for p in launch_script_problems(script)}
    assert missing == {"plan.json", "ds_config.json"}
    script.write_text("#!/usr/bin/env bash\nif true; then\n  echo unterminated\n")
    (problem,) = launch_script_problems(script)
    assert problem.source == "bash" and "bash cannot parse it" in problem.message
