"""Llama 4 Scout and Maverick map to torchtitan v0.2.2's iRoPE flavors (17bx16e_irope, 17bx128e_irope): every field
the cost model reads, read from torchtitan's own source with ``ast`` (models/llama4: the registry, the args
dataclass, MoEArgs, the blocks' FFN sizing), is the preset's; what the flavor trains otherwise costs nothing and
plan.md says it; 0.2.2's refusal of context parallelism with flex attention leaves the TOML out with its message;
0.3.0 has no llama4 package, so no 0.3 module is written."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
from torchtitan_flavors import _class_defaults, _kwargs, _module_dict, _tree

from autotune.cli import main
from autotune.emit.torchtitan import TORCHTITAN_FLAVORS, torchtitan_flavor_note
from autotune.emit.torchtitan_module import TORCHTITAN_03_RECIPES
from autotune.specs.presets import load_model_preset

PRESETS = {"llama4-scout": "17bx16e_irope", "llama4-maverick": "17bx128e_irope"}


def _root() -> Path:
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or not spec.origin:
        pytest.skip("torchtitan 0.2.2 is not installed")
    return Path(spec.origin).parent


def _ffn(dim: int, multiplier: float, multiple_of: int, denominator: int = 1) -> int:
    """torchtitan v0.2.2's FFN sizing (models/llama4/model/model.py:326-330 dense, :390-402 MoE experts)."""
    hidden = int(multiplier * int(2 * 4 * dim / 3))
    if denominator == 1:
        return multiple_of * ((hidden + multiple_of - 1) // multiple_of)
    hidden = int(hidden / denominator)
    return hidden + (-hidden % multiple_of)


def _flavor(root: Path, name: str) -> dict:
    defaults = _class_defaults(root / "models/llama4/model/args.py", "TransformerModelArgs")
    moe_defaults = _class_defaults(root / "models/moe/moe.py", "MoEArgs")
    table = _module_dict(_tree(root / "models/llama4/__init__.py"), "llama4_args")
    call = next(v for k, v in zip(table.keys, table.values) if k.value == name)
    a = defaults | _kwargs(call)
    moe = moe_defaults | _kwargs(a["moe_args"])
    scaling = a.get("rope_scaling_args")
    rope = None if not isinstance(scaling, ast.Call) else _class_defaults(
        root / "models/llama4/model/args.py", "RoPEScalingArgs") | _kwargs(scaling)
    layers, step, nope = a["n_layers"], a["interleave_moe_layer_step"], a["every_n_layers_nope"]
    denominator = moe["top_k"] + moe["num_shared_experts"] if a["auto_scale_hidden_dim"] else 1
    return {
        "hidden": a["dim"], "layers": layers, "heads": a["n_heads"], "kv_heads": a["n_kv_heads"],
        "vocab": a["vocab_size"], "norm_eps": a["norm_eps"], "rope_theta": a["rope_theta"],
        "rope_scaling": rope and (rope["scaling_factor"], rope["low_freq_factor"], rope["high_freq_factor"],
                                  rope["original_max_position_embeddings"]),
        # blocks with (layer_id + 1) % step == 0 are MoE (model.py:387); NoPE where layer_id % nope == 0 (:379)
        "moe_layers": sum((i + 1) % step == 0 for i in range(layers)),
        "nope_layers": sum(i % nope == 0 for i in range(layers)), "chunk": a["fixed_attn_block_size"],
        "experts": moe["num_experts"], "top_k": moe["top_k"], "shared": moe["num_shared_experts"],
        "router": (moe["score_func"], moe["gate_bias"], moe["score_before_experts"]),
        "expert_ffn": _ffn(a["dim"], a["ffn_dim_multiplier"], a["multiple_of"], denominator),
        "dense_ffn": _ffn(a["dim"], a["ffn_dim_multiplier"], a["multiple_of"]),
    }


def _preset(name: str) -> dict:
    s = load_model_preset(name)
    m = s.moe
    return {
        "hidden": s.hidden_size, "layers": s.num_layers, "heads": s.num_attention_heads, "kv_heads": s.kv_heads,
        "vocab": s.vocab_size, "norm_eps": s.norm_eps, "rope_theta": s.rope_theta,
        "rope_scaling": s.rope_scaling and (s.rope_scaling_factor, s.rope_low_freq_factor, s.rope_high_freq_factor,
                                            s.rope_original_max_positions),
        "moe_layers": sum(s.is_moe_layer(i) for i in range(s.num_layers)),
        "nope_layers": sum(not s.is_rotary_layer(i) for i in range(s.num_layers)),
        "chunk": s.sliding_window if s.chunked_attention else None,
        "experts": m.num_experts, "top_k": m.top_k, "shared": m.num_shared_experts,
        "router": (m.router_score, m.router_bias, m.router_probs_on_input),
        "expert_ffn": m.expert_ffn_hidden_size, "dense_ffn": s.ffn_hidden_size,
    }


@pytest.mark.parametrize("preset", list(PRESETS))
def test_the_irope_flavor_is_the_presets_architecture(preset):
    assert TORCHTITAN_FLAVORS[preset] == ("llama4", PRESETS[preset])
    assert _flavor(_root(), PRESETS[preset]) == _preset(preset)
    assert preset not in TORCHTITAN_03_RECIPES  # 0.3.0: no models/llama4


def test_what_the_flavor_trains_otherwise_is_in_plan_md():
    root = _root()
    model = (root / "models/llama4/model/model.py").read_text()
    # torchtitan's NoPE test and no Q/K norm or temperature tuning in its Llama 4 attention
    assert "layer_id % model_args.every_n_layers_nope == 0" in model
    assert "qk_norm" not in model and "temperature" not in model
    scout = torchtitan_flavor_note(load_model_preset("llama4-scout"))
    maverick = torchtitan_flavor_note(load_model_preset("llama4-maverick"))
    for note in (scout, maverick):
        assert "NoPE layers at 0, 4, 8" in note and "layers 3, 7, 11" in note and "block_causal" in note
        assert "load-balancing loss (weight 0.001)" in note
    assert "use_qk_norm" in scout and "use_qk_norm" not in maverick  # Maverick's checkpoint has none


def test_context_parallelism_is_refused_by_the_flex_attention_rule(tmp_path, capsys):
    source = (_root() / "models/llama4/model/args.py").read_text()
    assert "Context Parallel only supports SDPA attention" in source
    out = tmp_path / "bundle"
    assert main(["emit", "--model", "llama4-scout", "--gpu", "h100-sxm-80gb", "--num-gpus", "64", "--engine", "fsdp",
                 "--seq-len", "16384", "--cp", "2", "--recompute", "full", "--out", str(out)]) == 0
    assert not (out / "torchtitan_job.toml").exists()
    md = (out / "plan.md").read_text()
    assert "Context Parallel only supports SDPA attention" in md and "use --cp 1" in md
