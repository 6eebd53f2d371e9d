"""Megatron's split with multi-token-prediction modules (``autotune.specs.layout.split_scheme``): each module takes two
slots of the last stage where the slot split places the layers, which is NVIDIA's DeepSeek-V3 placement."""

from __future__ import annotations

import pytest

from autotune.emit.megatron_layout import megatron_split
from autotune.specs.layout import layer_counts, split_scheme, virtual_layout

# Megatron-Bridge @067f987df03b src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py:50-68
# ``_get_deepseek_v3_pipeline_layout`` (one MTP layer): decoder layers per virtual stage, in model order.
NVIDIA_DSV3 = {
    (4, 1): (16, 16, 16, 13),
    (8, 1): (8,) * 7 + (5,),
    (4, 2): (8,) * 7 + (5,),
    (16, 1): (4,) * 15 + (1,),
    (8, 2): (4,) * 15 + (1,),
    (4, 4): (4,) * 15 + (1,),
}


@pytest.mark.parametrize(("pp", "vpp"), sorted(NVIDIA_DSV3))
def test_deepseek_v3_with_mtp_splits_as_nvidias_layouts(pp, vpp):
    assert virtual_layout(61, pp, vpp, split_scheme("megatron", 1)) == NVIDIA_DSV3[pp, vpp]


def test_without_mtp_the_slot_split_is_unchanged():
    assert layer_counts(61, 16, split_scheme("megatron", None)) == (3,) + (4,) * 14 + (2,)
    assert split_scheme("megatron", None) == "megatron" and split_scheme("uniform", 1) == "uniform"


def test_even_and_first_last_splits_keep_their_layers():
    """Where pp divides the layers (or the first/last halves exist) Megatron places the modules after the last
    stage's layers without flags: the split is the plain one."""
    assert layer_counts(48, 4, split_scheme("megatron", 1)) == (12,) * 4
    assert layer_counts(126, 16, split_scheme("megatron", 1)) == layer_counts(126, 16)


def test_the_emitted_layout_spells_the_module_where_the_split_put_it():
    split = megatron_split(61, 4, 4, mtp_layers=1)
    assert split.layout is not None and split.layout.endswith("|tmL") and split.layout.startswith("Etttt|")
    assert split.layout.count("t") == 61 and split.layout.count("|") == 15
    plain = megatron_split(61, 4, 4)
    assert plain.layout is None or "m" not in plain.layout


def test_the_cost_models_stages_and_the_emitted_chunks_agree_with_mtp():
    """For every split the planner can write, the layers the cost model puts on each stage (``layer_counts`` of the
    plan's scheme) are the layers of that stage's chunks (``virtual_layout``), with or without the MTP slots."""
    checked = fallback = 0
    for layers in range(2, 100, 3):
        for pp in (2, 3, 4, 8, 16):
            for vpp in (1, 2, 3, 5):
                if virtual_layout(layers, pp, vpp) is None:
                    continue
                scheme = split_scheme("megatron", 1, layers, pp, vpp)
                fallback += scheme == "megatron"
                chunks = virtual_layout(layers, pp, vpp, scheme)
                assert chunks is not None and sum(chunks) == layers
                per_stage = tuple(sum(chunks[c * pp + s] for c in range(vpp)) for s in range(pp))
                assert per_stage == layer_counts(layers, pp, scheme), (layers, pp, vpp)
                checked += 1
    assert checked > 500 and 0 < fallback < checked  # some splits leave the MTP slots no room: the plain one
