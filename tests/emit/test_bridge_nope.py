"""Rotary-free (NoPE) layers in Megatron-Bridge's overrides: the generic recipe's ``model.no_rope_freq``
(megatron-core TransformerConfig.no_rope_freq: an int N, every Nth layer skips RoPE, or a 0/1 list, 1 = no RoPE;
core_v0.19.0 transformer_config.py:284, __post_init__ :2813-2830, attention.py:1321), the value Megatron-LM's
``--no-rope-freq`` takes (emit/megatron_attention.py ``no_rope_freq``), read back by ``estimate --from`` /
``validate`` (job_bridge_model) and built by megatron-bridge 0.6.2 itself (bridge_probe.py: the overrides applied to
the generic recipe, then ``runtime_config_update``, whose ``ConfigContainer.validate()`` finalizes the
TransformerConfig and so runs its no_rope_freq checks; the checkpoint's run_config.yaml it then writes reads back as
the same rotary layers)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from bridge_cases import case_files  # tests/emit/ is on sys.path
from bridge_probe import run_bridge_probe

from autotune.api import make_plan
from autotune.cli import main
from autotune.emit.megatron_attention import no_rope_freq, position_and_attention_flags
from autotune.emit.megatron_bridge import BRIDGE_ARGS, BRIDGE_YAML
from autotune.emit.megatron_bridge_recipes import GENERIC, bridge_recipe, generic_model_fields
from autotune.job_files import read_job
from autotune.specs.hf_config import model_from_hf_config
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

SMOL = Path(__file__).parents[1] / "fixtures" / "hf" / "smollm3-3b"


def _smol():
    return model_from_hf_config(SMOL)  # no_rope_layer_interval 4 over 36 layers: every 4th layer has no RoPE


def _no_rope(model) -> list[int]:
    """What autotune means: 1 where the layer does not rotate Q and K."""
    return [int(not model.is_rotary_layer(i)) for i in range(model.num_layers)]


def _files(model, tmp_path: Path, name: str) -> Path:
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    plan = make_plan(model, cluster, engine="megatron", seq_len=4096, zero_stage=1, global_batch_size=64)
    folder = tmp_path / name
    folder.mkdir()
    for file, text in case_files(model, cluster, plan).items():
        (folder / file).write_text(text)
    return folder


def test_no_rope_freq_is_the_int_or_the_per_layer_list_megatron_takes():
    smol = _smol()
    assert no_rope_freq(smol) == 4 and generic_model_fields(smol)["no_rope_freq"] == 4
    first = dataclasses.replace(smol, rope_layers=tuple(range(1, 36)))  # only layer 0 skips RoPE: no period
    assert no_rope_freq(first) == [1] + [0] * 35 == _no_rope(first)
    args = position_and_attention_flags(first)
    assert args[args.index("--no-rope-freq") + 1] == "[1" + ",0" * 35 + "]"  # the same helper, the flag's text
    every = dataclasses.replace(smol, rope_layers=None)
    assert no_rope_freq(every) is None and "no_rope_freq" not in generic_model_fields(every)
    scout = load_model_preset("llama4-scout")  # its global layers (every 4th of 48) skip RoPE
    assert no_rope_freq(scout) == 4 and _no_rope(scout) == ([0, 0, 0, 1] * 12)


def test_smollm3_gets_bridge_files_that_read_back_as_the_same_model(tmp_path):
    smol = _smol()
    assert bridge_recipe(smol) is GENERIC
    folder = _files(smol, tmp_path, "smol")
    assert yaml.safe_load((folder / BRIDGE_YAML).read_text())["model"]["no_rope_freq"] == 4
    assert "model.no_rope_freq=4" in (folder / BRIDGE_ARGS).read_text().splitlines()
    job = read_job([str(folder / BRIDGE_YAML)], gpu="h100-sxm-80gb", num_gpus=8)
    assert job.model.rope_layers == smol.rope_layers and len(job.model.rope_layers) == 27
    first = dataclasses.replace(smol, rope_layers=tuple(range(1, 36)))
    folder = _files(first, tmp_path, "first")
    assert yaml.safe_load((folder / BRIDGE_YAML).read_text())["model"]["no_rope_freq"] == [1] + [0] * 35
    assert read_job([str(folder / BRIDGE_YAML)], gpu="h100-sxm-80gb", num_gpus=8).model.rope_layers == \
        tuple(range(1, 36))
    assert main(["validate", str(folder / BRIDGE_YAML), "--world-size", "8"]) == 0


@pytest.mark.parametrize("value", [5, [0, 1], -4])
def test_a_no_rope_freq_megatron_refuses_exits_2_naming_it(tmp_path, capsys, value):
    folder = _files(_smol(), tmp_path, "smol")
    data = yaml.safe_load((folder / BRIDGE_YAML).read_text())
    data["model"]["no_rope_freq"] = value  # 36 layers: 5 does not divide them, [0, 1] is not one entry a layer
    (folder / BRIDGE_YAML).write_text(yaml.safe_dump(data))
    assert main(["estimate", "--from", str(folder / BRIDGE_YAML), "--gpu", "h100-sxm-80gb", "--num-gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert "no_rope_freq" in err and "divides 36" in err and "Traceback" not in err


PROBE = r"""
import json, os, sys, types, typing
import typing_extensions
typing.override = typing_extensions.override  # megatron-core 0.19.2 megatron/training/models/gpt.py (Python 3.12)
import autotune_standins  # noqa: F401
import torch
from megatron.bridge.recipes.gpt.h100.vanilla_gpt import vanilla_gpt_pretrain_1gpu_h100_bf16_config as recipe
from megatron.bridge.training.config import runtime_config_update
from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

torch.cuda.get_device_properties = lambda *_: types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0)
os.environ.update(WORLD_SIZE="8", RANK="0", LOCAL_RANK="0")
out = {}
for folder in sys.argv[1:]:
    args = [l.strip() for l in open(os.path.join(folder, "bridge_overrides.args")) if l.strip() and l[0] != "#"]
    built = []
    for how in ({"config_filepath": os.path.join(folder, "bridge_overrides.yaml")}, {"cli_overrides": args}):
        cfg = process_config_with_overrides(recipe(), **how)
        runtime_config_update(cfg)  # ConfigContainer.validate(): model.finalize(), TransformerConfig.__post_init__
        built.append([cfg.model.num_layers, cfg.model.position_embedding_type, list(cfg.model.no_rope_freq)])
    cfg.to_yaml(os.path.join(folder, "run_config.yaml"))  # what a checkpoint holds (training/checkpointing.py:1468)
    out[os.path.basename(folder)] = built
print("PROBE-RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_megatron_bridge_builds_the_nope_layers_autotune_means(tmp_path):
    smol = _smol()
    first = dataclasses.replace(smol, rope_layers=tuple(range(1, 36)))
    folders = [_files(smol, tmp_path, "smol"), _files(first, tmp_path, "first")]
    built = run_bridge_probe(tmp_path, PROBE, *map(str, folders))
    for name, model in (("smol", smol), ("first", first)):
        want = [36, "rope", _no_rope(model)]
        assert built[name] == [want, want], name  # the YAML file and the run_recipe.py arguments alike
    assert sum(built["smol"][0][2]) == 9  # 27 of 36 layers rotate
    for folder, model in zip(folders, (smol, first)):  # Bridge's own dump: no_rope_freq as the finalized 0/1 list
        job = read_job([str(folder / "run_config.yaml")], gpu="h100-sxm-80gb", num_gpus=8)
        assert job.model.rope_layers == model.rope_layers, job.notes
