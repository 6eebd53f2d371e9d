"""The accelerate linter's fp8_config values against what accelerate 1.16 itself does with them: `accelerate launch`
reads the config file and exports each value, and the training script's ``Accelerator()`` reads the backend back."""

import json
import subprocess
import sys

import pytest
import yaml

from autotune.emit.accelerate_lint import accelerate_config_problems

accelerate = pytest.importorskip("accelerate")  # a dependency (pyproject); absent only in a broken install

BASE = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO", "mixed_precision": "fp8",
        "num_machines": 1, "num_processes": 1, "use_cpu": True}

# In a fresh interpreter: launch's own config reading (_validate_launch_command) and environment (setup_fp8_env), then
# the script side's Accelerator() under that environment; prints, per config file, whether it raised and why.
ACCELERATE_SIDE = r"""
import json, os, sys
from accelerate import Accelerator
from accelerate.commands.launch import launch_command_parser, _validate_launch_command
from accelerate.state import AcceleratorState
from accelerate.utils.launch import setup_fp8_env
out = {}
for path in sys.argv[1:]:
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", path, "train.py"]))
    env = setup_fp8_env(args, {})
    os.environ.update(env)
    try:
        Accelerator(cpu=True)
        out[path] = ""
    except ValueError as err:
        out[path] = str(err)
    finally:
        AcceleratorState._reset_state(True)
        for key in env:
            os.environ.pop(key, None)
print(json.dumps(out))
"""


def _config(tmp_path, name: str, fp8: dict):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**BASE, "fp8_config": fp8}))
    return path


def test_fp8_backend_errors_exactly_where_accelerate_raises(tmp_path):
    """launch lists --fp8_backend ao|te, but a config with "te" makes every Accelerator() raise; "TE" (what
    `accelerate config` writes: FP8BackendType) and "AO" run. The linter flags exactly the values accelerate refuses."""
    values = ("te", "TE", "ao", "AO", "NO", "msamp")
    paths = {v: _config(tmp_path, f"backend_{v}", {"fp8_backend": v}) for v in values}
    run = subprocess.run([sys.executable, "-c", ACCELERATE_SIDE, *map(str, paths.values())], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    raised = json.loads(run.stdout.strip().splitlines()[-1])
    for value, path in paths.items():
        flagged = [p for p in accelerate_config_problems(path, world_size=1) if p.severity == "error"]
        assert bool(flagged) == bool(raised[str(path)]), (value, flagged, raised[str(path)])
    assert raised[str(paths["te"])] and not raised[str(paths["TE"])]  # the case that decides it
    message = next(p.message for p in accelerate_config_problems(paths["te"], world_size=1))
    assert "case" in message and "TE" in message


@pytest.mark.parametrize("fp8, flagged", [
    ({"fp8_format": "hybrid"}, False),  # TERecipeKwargs upper-cases it
    ({"fp8_format": "E4M3"}, False),
    ({"fp8_format": "e3m4"}, True),
    ({"fp8_amax_compute_algo": "MOST_RECENT"}, False),  # lower-cased
    ({"fp8_amax_compute_algo": "mean"}, True),
])
def test_fp8_recipe_values_compared_as_accelerate_normalises_them(tmp_path, monkeypatch, fp8, flagged):
    from accelerate.utils import dataclasses as accelerate_dataclasses
    from accelerate.utils.dataclasses import TERecipeKwargs

    # TERecipeKwargs first asks for Transformer Engine (a GPU library not installed here); its value checks after
    # that are plain Python, so they run as they are with the import check answered yes.
    monkeypatch.setattr(accelerate_dataclasses, "is_transformer_engine_available", lambda: True)

    key, value = next(iter(fp8.items()))
    field = {"fp8_format": "fp8_format", "fp8_amax_compute_algo": "amax_compute_algo"}[key]
    try:
        TERecipeKwargs(**{field: value})
        accepted = True
    except ValueError:
        accepted = False
    assert accepted is not flagged  # the parametrisation agrees with accelerate's own check
    found = [p for p in accelerate_config_problems(_config(tmp_path, "recipe", fp8), world_size=1)
             if p.severity == "error"]
    assert bool(found) is flagged, found


def test_shipped_key_table_is_what_the_installed_accelerate_gives(tmp_path):
    """autotune/emit/accelerate_keys.json is scripts/extract_accelerate_keys.py's output for the installed (pinned)
    accelerate, the fp8_config overrides above included."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "keys.json"
    run = subprocess.run([sys.executable, str(root / "scripts" / "extract_accelerate_keys.py"), "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    shipped = json.loads((root / "autotune" / "emit" / "accelerate_keys.json").read_text())
    assert json.loads(out.read_text()) == shipped
    assert shipped["blocks"]["fp8_config"]["fp8_backend"]["choices"] == ["NO", "TE", "AO"]
