"""accelerate configs for Amazon SageMaker: linted as accelerate 1.16's loader reads them (a SageMakerConfig, not
a cluster config) and estimated as the processes SageMaker starts."""

import json
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.emit.accelerate_lint import accelerate_config_problems

TEMPLATE = Path(__file__).resolve().parents[1] / "fixtures" / "realworld" / "good" / "accelerate_0_30_0_sagemaker.yaml"


def _loads(path: Path) -> bool:
    from accelerate.commands.config.config_args import load_config_from_file

    try:
        load_config_from_file(str(path))
        return True
    except (ValueError, TypeError, KeyError):
        return False


@pytest.mark.parametrize("edit", [
    {},  # accelerate's own test config: a bare NO (YAML false)
    {"distributed_type: NO": "distributed_type: DATA_PARALLEL"},
    {"distributed_type: NO": "distributed_type: MODEL_PARALLEL"},
    {"distributed_type: NO": 'distributed_type: "NO"'},  # the loader adds num_processes, then refuses it
    {"distributed_type: NO": "distributed_type: FSDP"},  # a cluster type
    {"distributed_type: NO\n": ""},
    {"iam_role_name: MY_ROLE\n": ""},  # a required field
    {"use_cpu: false": "use_cpu: false\nnum_processes: 8"},  # a cluster key
    {"use_cpu: false": "use_cpu: false\nregion: eu-west-1\nnum_machines: 2"},
    {"use_cpu: false": "use_cpu: false\nec2_instance: ml.p5.48xlarge"},  # a typo
])
def test_the_linter_errs_exactly_where_accelerates_loader_refuses(edit, tmp_path):
    text = TEMPLATE.read_text()
    for old, new in edit.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "sagemaker.yaml"
    path.write_text(text)
    errors = [p for p in accelerate_config_problems(path, world_size=1) if p.severity == "error"]
    assert (errors == []) is _loads(path), errors
    assert all(p.source != "accelerate" for p in errors), errors  # found by autotune's own checks, not only the loader


def test_data_parallel_on_known_instances_is_the_world_size_and_the_gpu(tmp_path, capsys):
    path = tmp_path / "sagemaker.yaml"
    path.write_text(TEMPLATE.read_text().replace("distributed_type: NO", "distributed_type: DATA_PARALLEL")
                    .replace("MY_TYPE", "ml.p5.48xlarge") + "num_machines: 2\n")
    assert main(["validate", str(path)]) == 1  # its repeated debug key, no error
    assert "0 error(s)" in capsys.readouterr().out
    assert main(["validate", str(path), "--world-size", "8"]) == 1
    assert "2 x ml.p5.48xlarge runs 16 rank(s)" in capsys.readouterr().out
    code = main(["estimate", "--from", str(path), "--model", "llama3-8b", "--global-batch", "64", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    got = json.loads(out)
    assert (got["cluster"]["num_gpus"], got["cluster"]["gpus_per_node"], got["cluster"]["gpu"]) == \
        (16, 8, "h100-sxm-80gb")
    assert (got["plan"]["dp"], got["plan"]["zero_stage"]) == (16, 0)
    assert main(["estimate", "--from", str(path), "--model", "llama3-8b", "--global-batch", "64", "--gpu", "b200"]) == 0
    assert "--gpu b200 taken, not its instance's h100-sxm-80gb" in capsys.readouterr().err


def test_one_process_an_instance_without_data_parallel(capsys):
    code = main(["estimate", "--from", str(TEMPLATE), "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["cluster"]["num_gpus"] == 1 and "SageMaker, 1 x MY_TYPE" in err
