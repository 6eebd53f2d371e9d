"""What the parenthesised model variants of bench/data/nvidia_recipes_blackwell.csv ran beside the family's recipe
("DeepSeekV3 (tokendrop)", "DeepSeekV3 (w/o MTP)"), as estimate flags and notes (bench/accuracy_nvidia_recipes.py)."""

from __future__ import annotations

VARIANT_NOTES = {
    "tokendrop": "token-dropping MoE: capacity factor 1.0, padded",
}

MTP_LAYERS = {"DeepSeekV3": 1}
"""Family -> the multi-token-prediction modules its recipes train (``--mtp-layers``), except rows the table marks
"w/o MTP": Megatron-Bridge's DeepSeek-V3 recipe sets ``mtp_num_layers`` 1 in every release the rows were read at
(recipes/deepseek/deepseek_v3.py@v0.2.1:174 and @v0.3.0:198 as its default argument, @v0.4.0:84 and @v0.5.0:122
``cfg.model.mtp_num_layers = 1``; recipes/deepseek/h100/deepseek_v3.py@067f987df03b:137, which the v0.6 perf recipes
start from), and no performance script overrides it (``git grep mtp scripts/performance`` at v0.2.1-v0.5.0: DeepSeek
nothing); the v0.6 layouts end in "t m L" (the MTP module beside the loss). Kimi-K2's provider has none
(models/kimi/kimi_provider.py@v0.3.0:70 ``mtp_num_layers = None``)."""

VARIANT_FLAGS = {
    # Megatron-Bridge's --use_tokendrop (067f987 scripts/performance/utils/overrides.py:455-457) applies
    # apply_moe_token_drop's defaults (src/megatron/bridge/training/utils/moe_token_drop.py: capacity factor 1.0,
    # moe_pad_expert_input_to_capacity True, the alltoall dispatcher it asserts) and turns force-balancing off
    "tokendrop": ["--moe-capacity-factor", "1.0", "--moe-pad-to-capacity"],
}
"""The estimate flags of a model variant of the table (its parenthesised name)."""


def mtp_layers(family: str, variant: str) -> int | None:
    """The MTP modules a row of ``family`` trains (``MTP_LAYERS``), none where the table says "w/o MTP"."""
    return None if variant == "w/o MTP" else MTP_LAYERS.get(family)
