"""The presets are parsed with libyaml's safe loader where PyYAML has it (faster start-up): every shipped preset
file reads the same as with ``yaml.safe_load``."""

import yaml

from autotune.specs import presets


def test_every_preset_file_reads_as_safe_load_reads_it():
    folder = presets._presets_dir()
    files = [folder.joinpath("gpus.yaml")] + [p for p in folder.joinpath("models").iterdir() if p.name.endswith(".yaml")]
    assert len(files) > 10
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert repr(presets._load_shipped_yaml(text)) == repr(yaml.safe_load(text)), path.name  # types too
