"""The presets autotune maps to torchtitan's Qwen3 / GPT-OSS flavors have torchtitan's architecture: every field
the cost model reads (widths, layers, heads, KV heads, head_dim, dense FFN, vocabulary, tied embeddings, QK norm,
experts / top-k / expert width / shared experts / router bias, sliding window and its layers, sinks, the SwiGLU
clamp, attention biases), read from torchtitan's source with ``ast`` (tests/torchtitan_flavors.py): the installed
v0.2.2 for the TOML, the 0.3.0 test tool for the module. And 0.3's recipe functions exist and build that flavor."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
from test_torchtitan03 import torchtitan03_path  # tests/emit is on sys.path (no __init__), as tests/
from torchtitan_flavors import FIELDS, flavors_022, flavors_030, preset_fields

from autotune.emit.torchtitan import TORCHTITAN_FLAVORS
from autotune.emit.torchtitan_module import TORCHTITAN_03_RECIPES
from autotune.specs.presets import load_model_preset

CANDIDATES = ("qwen3-8b", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-20b", "gpt-oss-120b")
PACKAGES = ("qwen3", "gpt_oss")


def _root_022() -> Path:
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or not spec.origin:
        pytest.skip("torchtitan 0.2.2 is not installed")
    return Path(spec.origin).parent


def _differences(preset: str, theirs: dict) -> dict:
    ours = preset_fields(load_model_preset(preset))
    return {k: (ours[k], theirs[k]) for k in FIELDS if ours[k] != theirs[k]}


def test_every_v022_mapping_of_qwen3_and_gpt_oss_is_torchtitans_architecture():
    flavors = flavors_022(_root_022())
    mapped = {p: nf for p, nf in TORCHTITAN_FLAVORS.items() if nf[0] in PACKAGES}
    assert set(mapped) == set(CANDIDATES)  # all five: none differs (a difference would leave it out)
    for preset, key in mapped.items():
        assert key in flavors, (preset, key)
        assert _differences(preset, flavors[key]) == {}, preset


def test_every_030_mapping_of_qwen3_and_gpt_oss_is_torchtitans_architecture_and_recipe():
    root = torchtitan03_path() / "torchtitan"
    flavors = flavors_030(root)
    mapped = {p: r for p, r in TORCHTITAN_03_RECIPES.items() if r[0] in PACKAGES}
    assert set(mapped) == {"qwen3-30b-a3b", "gpt-oss-20b", "gpt-oss-120b"}
    for preset, (package, recipe_fn, flavor, registry_args, _, moe) in mapped.items():
        assert _differences(preset, flavors[package, flavor]) == {}, preset
        assert moe == load_model_preset(preset).is_moe and registry_args == ""
        # the recipe function exists and builds exactly this flavor, with model_registry's defaults
        tree = ast.parse((root / "models" / package / "config_registry.py").read_text())
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == recipe_fn)
        calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and ast.unparse(n.func) == "model_registry"]
        assert [ast.unparse(c) for c in calls] == [f"model_registry({flavor!r})"], preset


def test_the_unmapped_030_candidates_have_a_flavor_but_no_pretraining_recipe():
    # qwen3-8b and qwen3-235b-a22b: their flavors match (above, v0.2.2; here 0.3.0), but 0.3.0's config_registry
    # builds "8B" only in SFT recipes and "235B-A22B" in none, so no 0.3 module is written for them.
    root = torchtitan03_path() / "torchtitan"
    flavors = flavors_030(root)
    tree = ast.parse((root / "models/qwen3/config_registry.py").read_text())
    users: dict[str, list[str]] = {}
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call) and ast.unparse(n.func) == "model_registry"):
            users.setdefault(ast.literal_eval(call.args[0]), []).append(fn.name)
    for preset, flavor in (("qwen3-8b", "8B"), ("qwen3-235b-a22b", "235B-A22B")):
        assert preset not in TORCHTITAN_03_RECIPES
        assert _differences(preset, flavors["qwen3", flavor]) == {}, preset
        assert all("sft" in name or "nvfp4" in name for name in users.get(flavor, [])), users.get(flavor)


def test_the_llama3_flavors_scale_rope_as_llama31_and_plan_md_says_so_for_llama3():
    """torchtitan's llama3 flavors always apply Llama 3.1's RoPE scaling (v0.2.2 RoPEScalingArgs' defaults, used by
    precompute_freqs_cis; v0.3.0 ComplexRoPE scaling="llama"): llama3-405b has it, llama3-8b / 70b (Llama 3.0) not,
    so their plan.md says which model torchtitan trains."""
    from autotune.emit.torchtitan import torchtitan_flavor_note

    source = (_root_022() / "models/llama3/model/args.py").read_text()
    for line in ("scaling_factor: float = 8.0", "low_freq_factor: float = 1.0", "high_freq_factor: float = 4.0",
                 "original_max_position_embeddings: int = 8192"):
        assert line in source, line
    assert "scaling_args" in (_root_022() / "models/llama3/model/model.py").read_text()
    p405 = load_model_preset("llama3-405b")
    assert (p405.rope_scaling, p405.rope_scaling_factor, p405.rope_low_freq_factor, p405.rope_high_freq_factor,
            p405.rope_original_max_positions) == ("llama3", 8.0, 1.0, 4.0, 8192)
    assert torchtitan_flavor_note(p405) is None
    for name in ("llama3-8b", "llama3-70b"):
        assert load_model_preset(name).rope_scaling is None
        assert "Llama 3.1's RoPE scaling" in torchtitan_flavor_note(load_model_preset(name))
    v030 = (torchtitan03_path() / "torchtitan/models/llama3/__init__.py").read_text()
    assert v030.count('scaling="llama"') >= 3  # 8B, 70B, 405B


def test_the_deepseek_flavor_norms_at_torchtitans_default_eps_and_plan_md_says_so():
    """torchtitan's DeepSeek-V3 flavors leave the RMSNorm eps at its 1e-5 default (the checkpoint's is 1e-6); the
    mapped Llama 3, Qwen3, GPT-OSS and Llama 4 flavors' eps are their checkpoints' (1e-5, 1e-6, 1e-5, 1e-5)."""
    from autotune.emit.torchtitan import torchtitan_flavor_note

    args = {pkg: (_root_022() / f"models/{pkg}/model/args.py").read_text() for pkg in
            ("deepseek_v3", "llama3", "qwen3", "gpt_oss", "llama4")}
    assert "norm_eps: float = 1e-5" in args["deepseek_v3"] and "norm_eps" not in \
        (_root_022() / "models/deepseek_v3/__init__.py").read_text()
    root = torchtitan03_path() / "torchtitan/models"
    assert "eps: float = 1e-5" in (root / "common/nn_modules.py").read_text()
    assert "eps=" not in (root / "deepseek_v3/__init__.py").read_text()
    assert load_model_preset("deepseek-v3").norm_eps == 1e-6
    assert "rms_norm_eps 1e-6" in torchtitan_flavor_note(load_model_preset("deepseek-v3"))
    for preset, pkg, line in (("llama3-8b", "llama3", "norm_eps: float = 1e-5"),
                              ("qwen3-30b-a3b", "qwen3", "norm_eps: float = 1e-6"),
                              ("gpt-oss-120b", "gpt_oss", "norm_eps: float = 1e-5"),
                              ("llama4-scout", "llama4", "norm_eps: float = 1e-5")):
        assert line in args[pkg] and float(line.rsplit(" ", 1)[1]) == load_model_preset(preset).norm_eps
    # FLAVOR_NORM_EPS, which the note compares with each checkpoint's eps, is each package's own
    from autotune.emit.torchtitan import FLAVOR_NORM_EPS

    for pkg, eps in FLAVOR_NORM_EPS.items():
        assert f"norm_eps: float = {eps:.0e}".replace("e-0", "e-") in args[pkg], pkg
    assert "_EPS = 1e-6" in (root / "qwen3/__init__.py").read_text()


def test_torchtitans_moe_balances_by_expert_bias_alone_and_plan_md_says_so():
    """torchtitan's MoE (v0.2.2 models/moe/moe.py, v0.3.0 models/common/moe.py) balances its experts with the
    auxiliary-loss-free expert bias (load_balance_coeff 1e-3) and computes no load-balancing loss: a checkpoint trained
    with one (Qwen3-MoE, GPT-OSS, DeepSeek-V3's sequence-wise one) gets a plan.md note; a dense one none."""
    from autotune.emit.torchtitan import torchtitan_flavor_note

    for source in ((_root_022() / "models/moe/moe.py").read_text(),
                   (torchtitan03_path() / "torchtitan/models/common/moe.py").read_text()):
        assert "load_balance_coeff: float | None = 1e-3" in source and "aux_loss" not in source
    for name, weight in (("qwen3-30b-a3b", "0.001"), ("gpt-oss-120b", "0.9"), ("deepseek-v3", "0.0001 per sequence")):
        note = torchtitan_flavor_note(load_model_preset(name))
        assert f"load-balancing loss (weight {weight})" in note and "expert bias alone" in note, note
    assert torchtitan_flavor_note(load_model_preset("llama3-405b")) is None
