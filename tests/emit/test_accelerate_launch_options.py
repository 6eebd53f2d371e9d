"""A multi-machine accelerate config is judged with the launch line that runs it: ``accelerate launch
--main_process_ip`` supplies what the file leaves out (autotune.emit.accelerate_launch), so autotune's own emitted
bundle validates clean, and a config alone, or launched without the flag, still hears that rank 0 cannot be found."""

from __future__ import annotations

import pytest

from autotune.cli import main
from autotune.emit.accelerate_launch import accelerate_launches

ENGINE_FILES = {"hf": "accelerate_config.yaml", "fsdp": "accelerate_fsdp.yaml"}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    out = {}
    for engine in ENGINE_FILES:
        folder = tmp_path_factory.mktemp(engine) / "job"
        assert main(["emit", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--seq-len",
                     "2048", "--global-batch", "64", "--engine", engine, "--zero", "3", "--out", str(folder)]) == 0
        out[engine] = folder
    return out


def validate(capsys, *paths) -> tuple[int, str]:
    code = main(["validate", *map(str, paths)])
    out, _ = capsys.readouterr()
    return code, out


def test_the_emitted_two_node_bundle_validates_clean_with_its_launch_script(bundles, capsys):
    folder = bundles["hf"]
    config, script = folder / ENGINE_FILES["hf"], folder / "launch_accelerate.sh"
    (launch,) = [x for x in accelerate_launches(script) if x.config_name == config.name]
    assert "--main_process_ip" in launch.options
    code, out = validate(capsys, config, script)
    assert code == 0 and "no problems" in out, out
    code, out = validate(capsys, config)  # alone: nothing says where rank 0 is
    assert code == 1 and "several machines and no main_process_ip" in out and "--main_process_ip" in out


@pytest.mark.parametrize("engine", sorted(ENGINE_FILES))
def test_a_config_launched_by_hand_says_which_flags_each_machine_adds(engine, bundles):
    """The FSDP bundle's accelerate file has no launch script (torchtitan's launches the job): its header said
    `accelerate launch --config_file THIS_FILE train.py`, which on two machines finds no rank 0."""
    header = (bundles[engine] / ENGINE_FILES[engine]).read_text().split("compute_environment")[0]
    assert "--machine_rank i --main_process_ip <machine 0's address>" in header


def test_a_launch_line_without_the_flag_leaves_the_warning(bundles, capsys, tmp_path):
    config = bundles["hf"] / ENGINE_FILES["hf"]
    script = tmp_path / "run.sh"
    script.write_text(f"#!/usr/bin/env bash\naccelerate launch --config_file {config} --machine_rank 0 train.py\n")
    other = tmp_path / "other.sh"  # launches another config with the flag: does not speak for this one
    other.write_text("accelerate launch --config_file other.yaml --main_process_ip 10.0.0.1 train.py\n")
    code, out = validate(capsys, config, script, other)
    assert code == 1 and "several machines and no main_process_ip" in out


def test_launch_options_of_a_script():
    import textwrap

    from autotune.emit import accelerate_launch as al

    text = textwrap.dedent("""\
        DIR=/x
        exec "$HOME"/bin/accelerate launch --config_file "$DIR"/cfg.yaml --main_process_ip=10.1.2.3 \\
            --num_machines 2 -m my.train --lr 1
        accelerate launch train.py
        """)
    got = al._launch(["--config_file", "/x/cfg.yaml", "--main_process_ip=10.1.2.3", "--num_machines", "2", "-m",
                      "my.train", "--lr", "1"])
    assert got.config_name == "cfg.yaml" and got.options == {"--config_file", "--main_process_ip", "--num_machines"}
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "s.sh"
        path.write_text(text)
        first, second = al.accelerate_launches(path)
    assert first == got and second.config_name is None and second.options == frozenset()
