"""A Megatron-Bridge checkpoint's run_config.yaml as `autotune estimate --from` / `plan --from` input.

Every Bridge checkpoint holds the whole ConfigContainer it trained with, written by ``cfg.to_yaml`` (Megatron-Bridge
0.6 training/checkpointing.py:1468). Here megatron-bridge 0.6.2 builds each library recipe autotune maps a preset to
(autotune.emit.megatron_bridge_recipes.RECIPES, from the offline hub configs of bridge_hub.py), finishes it as a
training run does (``runtime_config_update`` at the recipe's own GPU count, read from its name) and writes it with
that same ``to_yaml``; autotune then reads each file with nothing else: the model (its shape, from the model
section's TransformerConfig fields: GQA, MLA, MoE layer patterns, shared experts, sinks, sliding windows, Q/K norms,
RoPE) must be the preset the recipe was built from, and the plan the config's own parallel sizes, batch, sequence,
recompute and precision. Tooling, stand-ins and hub: as tests/emit/test_megatron_bridge_applied.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from bridge_probe import run_bridge_probe  # tests/emit/ is on sys.path

from autotune.emit.megatron_bridge_recipes import RECIPES
from autotune.job_files import read_job
from autotune.lint import lint_file
from autotune.specs.presets import load_model_preset

PROBE = r"""
import importlib, json, os, sys, traceback, types, typing
import typing_extensions
typing.override = typing_extensions.override  # megatron-core 0.19.2 megatron/training/models/gpt.py (Python 3.12)
import autotune_standins  # noqa: F401
import torch
from megatron.bridge.training.config import runtime_config_update

# an H100 as torch.cuda reports it (the recipes are H100 ones; Bridge's flex dispatcher check reads it)
torch.cuda.get_device_properties = lambda *_: types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0)
out = {}
for name, module, function, world in json.loads(sys.argv[1]):
    try:
        cfg = getattr(importlib.import_module(module), function)()
        os.environ.update(WORLD_SIZE=str(world), RANK="0", LOCAL_RANK="0")
        refused = None
        if cfg.model.seq_length != cfg.dataset.seq_length:
            # Kimi-K2's recipe sets the dataset's 4,096 tokens but not the model's (Bridge 0.6.2 recipes/kimi/h100/
            # kimi_k2.py:134), whose 131,072 from the HF config its own validate() refuses (config.py:1505): a run
            # of it sets both, as DeepSeek-V3's recipe does (deepseek_v3.py:120)
            mismatch = [cfg.model.seq_length, cfg.dataset.seq_length]
            try:
                runtime_config_update(getattr(importlib.import_module(module), function)())
            except AssertionError as err:
                refused = [mismatch, str(err)]
            cfg.model.seq_length = cfg.dataset.seq_length
        runtime_config_update(cfg)
        cfg.to_yaml(os.path.join(sys.argv[2], name, "run_config.yaml"))  # what checkpointing.py:1468 writes
        m, t = cfg.model, cfg.train
        out[name] = {"parallel": [m.tensor_model_parallel_size, m.pipeline_model_parallel_size,
                                  m.virtual_pipeline_model_parallel_size or 1, m.context_parallel_size,
                                  m.expert_model_parallel_size, m.sequence_parallel],
                     "batch": [t.micro_batch_size, t.global_batch_size, cfg.dataset.seq_length],
                     "balancing": [m.moe_router_load_balancing_type, m.moe_aux_loss_coeff], "refused": refused,
                     "recompute": m.recompute_granularity, "fp8": bool(m.fp8),
                     "distributed_optimizer": bool(cfg.ddp.use_distributed_optimizer)}
    except Exception:
        out[name] = {"error": traceback.format_exc()[-3000:]}
print("PROBE-RESULT " + json.dumps(out))
"""


def _world(function: str) -> int:
    """The GPU count a library recipe is for, from its name (``..._pretrain_16gpu_h100_bf16_config``)."""
    return int(re.search(r"_(\d+)gpu_", function).group(1))


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    """Each recipe's run_config.yaml as Bridge writes it, and what Bridge's config held (one subprocess for all)."""
    root = tmp_path_factory.mktemp("run_config")
    jobs = []
    for name, recipe in RECIPES.items():
        (root / name).mkdir()
        jobs.append([name, recipe.module, recipe.name, _world(recipe.name)])
    return root, run_bridge_probe(root, PROBE, json.dumps(jobs), str(root))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RECIPES))
def test_a_checkpoints_run_config_reads_as_its_model_and_plan(dumped, name):
    root, configs = dumped
    got = configs[name]
    assert "error" not in got, got.get("error")
    path = root / name / "run_config.yaml"
    world = _world(RECIPES[name].name)
    job = read_job([str(path)], gpu="h100-sxm-80gb", num_gpus=world)
    preset = load_model_preset(name)
    assert job.model.name == preset.name, job.notes  # the reader found the preset by the shape the file states
    assert f"model: the shape {path} states is the preset {name}'s" in job.notes
    for field in ("num_layers", "hidden_size", "num_attention_heads", "kv_heads", "ffn_hidden_size", "vocab_size",
                  "mla", "tied_embeddings", "qk_norm", "attention_sinks", "sliding_window", "sliding_window_layers",
                  "activation", "activation_clamp", "rope_scaling", "rope_theta"):
        assert getattr(job.model, field) == getattr(preset, field), field
    if preset.moe is not None:  # the experts as the preset has them; the balancing loss as the file trains it
        kind, coeff = got["balancing"]
        trained = coeff if kind in ("aux_loss", "seq_aux_loss", "global_aux_loss") and coeff else None
        assert job.model.moe.aux_loss_coeff == trained, (got["balancing"], job.notes)
        assert replace(job.model.moe, aux_loss_coeff=None, aux_loss_per_sequence=False) == replace(
            preset.moe, aux_loss_coeff=None, aux_loss_per_sequence=False)
    p = job.plan
    tp, pp, vpp, cp, ep, sp = got["parallel"]
    assert [p.tp, p.pp, p.vpp, p.cp, p.ep, p.sequence_parallel] == [tp, pp, vpp, cp, ep, sp and tp > 1]
    assert [p.micro_batch_size, p.global_batch_size, p.seq_len] == got["batch"]
    assert p.recompute == (got["recompute"] or "none")
    assert (p.precision == "fp8") is got["fp8"] and (p.zero_stage == 1) is got["distributed_optimizer"]
    assert not [n for n in job.notes if "not modelled" in n], job.notes


@pytest.mark.slow
def test_bridge_refuses_a_model_and_dataset_length_that_differ_and_so_does_validate(dumped, tmp_path):
    """Kimi-K2's library recipe as Bridge 0.6.2 builds it: the model's sequence length from the HF config, the
    dataset's from the recipe; Bridge's validate() refuses it, and `autotune validate` says so of the same file."""
    root, configs = dumped
    refused = configs["kimi-k2"]["refused"]
    assert refused is not None, "Bridge's Kimi-K2 recipe now sets the model's sequence length: drop this test"
    (model_len, data_len), message = refused
    assert "Please ensure sequence length configuration in model config and dataset config match" in message
    text = (root / "kimi-k2" / "run_config.yaml").read_text()
    assert text.count(f"  seq_length: {data_len}\n") == 2  # the dataset's and the model's (set here to run it)
    at = text.index("\nmodel:\n")
    path = tmp_path / "run_config.yaml"
    path.write_text(text[:at] + text[at:].replace(f"  seq_length: {data_len}\n", f"  seq_length: {model_len}\n", 1))
    found = [p for p in lint_file(path, world_size=_world(RECIPES["kimi-k2"].name)) if p.severity == "error"]
    assert [p.path for p in found] == ["$.model.seq_length"], found
