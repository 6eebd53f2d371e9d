"""Rotary-free (NoPE) layers: ModelSpec.rope_layers as the SmolLM3 and EXAONE 4 readers fill it (transformers
SmolLM3Attention ``use_rope = config.no_rope_layers[layer_idx]``; Exaone4Attention.forward rotates only where
``sliding_window is None or is_sliding``), serialised, and costed on those layers only (autotune.cost.rope_kernels)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from autotune.cost.kernels import rates
from autotune.cost.layer_time import layer_time
from autotune.cost.rope_kernels import FUSED_ROPE_BYTES, rotary_share
from autotune.cost.step_time import TimeSettings
from autotune.errors import InputError
from autotune.specs.hf_config import model_from_hf_config
from autotune.specs.loading import load_cluster
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"


def _config(name: str) -> dict:
    return json.loads((FIXTURES / name / "config.json").read_text())


def test_smollm3_rotates_three_layers_of_four():
    spec = model_from_hf_config(FIXTURES / "smollm3-3b")  # no_rope_layer_interval 4, 36 layers
    assert spec.rope_layers == tuple(i for i in range(36) if (i + 1) % 4)
    assert len(spec.rope_layers) == 27 and not spec.is_rotary_layer(3) and spec.is_rotary_layer(4)
    marks = [1, 0] * 18  # an explicit no_rope_layers list wins over the interval
    assert model_from_hf_config(_config("smollm3-3b") | {"no_rope_layers": marks}).rope_layers == tuple(range(0, 36, 2))
    assert model_from_hf_config(_config("smollm3-3b") | {"no_rope_layer_interval": 1000}).rope_layers is None
    with pytest.raises(InputError, match="no_rope_layers"):
        model_from_hf_config(_config("smollm3-3b") | {"no_rope_layers": [1, 0]})


def test_exaone4_rotates_its_sliding_window_layers_only():
    spec = model_from_hf_config(FIXTURES / "exaone4-32b")  # "LLLG" over 64 layers, window 4096
    assert spec.rope_layers == spec.sliding_window_layers and len(spec.rope_layers) == 48
    assert not spec.is_rotary_layer(3) and spec.is_rotary_layer(0)
    cfg = {k: v for k, v in _config("exaone4-32b").items() if k != "layer_types"}
    assert model_from_hf_config(cfg | {"sliding_window": None}).rope_layers is None  # no window: every layer rotates


def test_rope_layers_serialise_and_are_checked():
    spec = model_from_hf_config(FIXTURES / "smollm3-3b")
    data = spec.to_dict()
    assert data["rope_layers"] == list(spec.rope_layers)
    assert ModelSpec.from_dict(data) == spec
    assert "rope_layers" not in dataclasses.replace(spec, rope_layers=None).to_dict()
    for bad in ((3, 1), (0, 36)):
        with pytest.raises(InputError, match="rope_layers"):
            dataclasses.replace(spec, rope_layers=bad)


def test_rope_kernels_run_on_the_rotary_layers_only():
    spec = model_from_hf_config(FIXTURES / "smollm3-3b")
    every = dataclasses.replace(spec, rope_layers=None)
    assert rotary_share(spec, False) == 27 / 36 and rotary_share(every, False) == 1.0
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    eff = TimeSettings().efficiency
    r = rates(cluster, "bf16", eff, "fa3", None)
    plan = ParallelPlan(engine="megatron", dp=8, seq_len=4096, global_batch_size=8)
    nope, rope = (layer_time(m, cluster, plan, False, eff, r) for m in (spec, every))
    # SmolLM3-3B: 9 of 36 layers skip the fused kernel's 4 B forward and 4 B backward per element of q and k
    saved = plan.seq_len * (spec.q_width + spec.kv_width) * 9 / 36 / r.hbm
    assert rope.elementwise_s - nope.elementwise_s == pytest.approx(FUSED_ROPE_BYTES[0] * saved, rel=1e-9)
    assert rope.elementwise_bwd_s - nope.elementwise_bwd_s == pytest.approx(FUSED_ROPE_BYTES[1] * saved, rel=1e-9)


def test_megatron_skips_rope_where_the_model_does_and_reads_it_back():
    """Megatron-core's --no-rope-freq (TransformerConfig.no_rope_freq: an int N, every Nth layer, or a 0/1 list, 1 = no
    RoPE) states the NoPE layers; an argument file's reads back as rope_layers. Megatron-DeepSpeed names them as what
    it cannot build; Bridge's generic recipe takes them (test_bridge_nope.py), EXAONE 4-32B still not (its windows)."""
    from autotune.emit.megatron_attention import position_and_attention_flags
    from autotune.emit.megatron_bridge_recipes import bridge_model_problems
    from autotune.emit.megatron_deepspeed_model import megatron_deepspeed_model_problems
    from autotune.job_megatron_model import megatron_model

    smol, exaone = (model_from_hf_config(FIXTURES / n) for n in ("smollm3-3b", "exaone4-32b"))
    for spec in (smol, exaone):
        args = position_and_attention_flags(spec)
        assert args[args.index("--no-rope-freq") + 1] == "4"
        assert not any("NoPE" in why for why in bridge_model_problems(spec))
        assert any("NoPE" in why for why in megatron_deepspeed_model_problems(spec, 2048))
    assert bridge_model_problems(smol) == [] and any("sliding-window" in why for why in bridge_model_problems(exaone))
    odd = dataclasses.replace(smol, rope_layers=tuple(range(1, 36)))
    args = position_and_attention_flags(odd)
    assert args[args.index("--no-rope-freq") + 1] == "[1" + ",0" * 35 + "]"
    assert "--no-rope-freq" not in position_and_attention_flags(dataclasses.replace(smol, rope_layers=None))
    flags = {"--num-layers": "36", "--hidden-size": "2048", "--num-attention-heads": "16", "--vocab-size": "128256",
             "--position-embedding-type": "rope", "--no-rope-freq": "4"}
    assert megatron_model(flags, "smol.sh", []).rope_layers == smol.rope_layers
    assert megatron_model(flags | {"--no-rope-freq": "[1" + ",0" * 35 + "]"}, "smol.sh", []).rope_layers == \
        tuple(range(1, 36))
