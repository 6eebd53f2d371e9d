"""Which autotune presets torchtitan 0.3.0 has a recipe for: a table of its own, so the v0.2 TOML writer
(autotune/emit/torchtitan.py) can name 0.3 as a fix without importing the 0.3 module writer (which imports it)."""

from __future__ import annotations

__all__ = ["TORCHTITAN_03_RECIPES", "NO_RECIPE_03", "ROPE_POSITIONS_03"]

# Our presets -> (torchtitan model package, its recipe function, model_registry flavor, extra model_registry
# arguments as the recipe passes them, Float8 filter_fqns, MoE), from torchtitan 0.3.0 models/*/config_registry.py.
TORCHTITAN_03_RECIPES = {
    "llama3-8b": ("llama3", "llama3_8b", "8B", "", ["lm_head"], False),
    "llama3-70b": ("llama3", "llama3_70b", "70B", "", ["lm_head"], False),
    "llama3-405b": ("llama3", "llama3_405b", "405B", "", ["lm_head"], False),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b", "671B", ', attn_backend="flex"', ["lm_head", "router.gate"],
                    True),
    # Qwen3 and GPT-OSS where 0.3.0 has a pretraining recipe for the flavor (qwen3/config_registry.py:295-327,
    # gpt_oss/config_registry.py:70-129) and the flavor equals the preset (tests/emit/test_torchtitan_flavors.py).
    # Not mapped: qwen3-8b (its model_registry has "8B", but the only recipes are sft_qwen3_8b_math, a GSM8K chat
    # fine-tune, and its NVFP4 variant: qwen3/config_registry.py:235-257, 449-498) and qwen3-235b-a22b (flavor
    # "235B-A22B", models/qwen3/__init__.py:557-595, with no recipe at all): the 0.2 TOML writes both.
    "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b", "30B-A3B", "", ["lm_head", "router.gate"], True),
    "gpt-oss-20b": ("gpt_oss", "gpt_oss_20b", "20b", "", ["lm_head", "router.gate"], True),
    "gpt-oss-120b": ("gpt_oss", "gpt_oss_120b", "120b", "", ["lm_head", "router.gate"], True),
}
# Presets whose flavor 0.3.0's model_registry has, with no pretraining recipe to start from (see above).
NO_RECIPE_03 = {"qwen3-8b": "flavor \"8B\" is built only by the SFT recipe sft_qwen3_8b_math (and its NVFP4 variant, "
                            "qwen3/config_registry.py:235-257, 449-498)",
                "qwen3-235b-a22b": "flavor \"235B-A22B\" (models/qwen3/__init__.py:557-595) has no recipe in "
                                   "qwen3/config_registry.py"}
# The positions each mapped flavor's RoPE tables hold (``max_seq_len`` of its RoPE config, torchtitan 0.3.0):
# llama3 models/llama3/__init__.py:267, 308, 349; deepseek_v3 models/deepseek_v3/__init__.py:577 (4096 * 4);
# qwen3 models/qwen3/__init__.py:549; gpt_oss models/gpt_oss/__init__.py:324, 368. 0.3.0 refuses a training.seq_len
# above it ("Training sequence length ... exceeds attention RoPE maximum supported sequence length",
# models/common/decoder.py:166-174, Decoder.Config.update_from_config, which the trainer calls); 0.2.2 warned and
# raised it (models/*/model/args.py update_from_config).
ROPE_POSITIONS_03 = {"llama3-8b": 131072, "llama3-70b": 131072, "llama3-405b": 131072, "deepseek-v3": 16384,
                     "qwen3-30b-a3b": 40960, "gpt-oss-20b": 131072, "gpt-oss-120b": 131072}
