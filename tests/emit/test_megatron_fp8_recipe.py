"""Precision files: the Transformer Engine FP8 recipe module the bundle writes (for DeepSpeed and other non-Megatron
users) builds the plan's recipe, and the precision summary of bf16 / fp16 / fp8 plans."""

import importlib
import sys
import types

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.emit.options import EmitOptions
from autotune.emit.precision import precision_summary, te_fp8_recipe_snippet
from autotune.engines import engine_for
from autotune.errors import InputError
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset


# ---- precision: the FP8 recipe module for DeepSpeed users -----------------------------------------
def _fake_transformer_engine(monkeypatch, calls):
    class Format:
        HYBRID = "HYBRID"
        E4M3 = "E4M3"

    def recipe_class(name):  # TransformerEngine common/recipe/__init__.py's four FP8 recipe classes
        def build(**kwargs):
            calls["recipe"], calls["recipe_class"] = kwargs, name
            return ("recipe", kwargs)
        return build

    def fp8_autocast(**kwargs):
        calls["autocast"] = kwargs
        return "context"

    te = types.ModuleType("transformer_engine")
    pytorch = types.ModuleType("transformer_engine.pytorch")
    pytorch.fp8_autocast = fp8_autocast
    common = types.ModuleType("transformer_engine.common")
    recipe = types.ModuleType("transformer_engine.common.recipe")
    recipe.Format = Format
    for name in ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling"):
        setattr(recipe, name, recipe_class(name))
    te.pytorch, te.common, common.recipe = pytorch, common, recipe
    for name, mod in [("transformer_engine", te), ("transformer_engine.pytorch", pytorch),
                      ("transformer_engine.common", common), ("transformer_engine.common.recipe", recipe)]:
        monkeypatch.setitem(sys.modules, name, mod)


def test_te_fp8_recipe_module(tmp_path, monkeypatch):
    plan = ParallelPlan(tp=2, precision="fp8", zero_stage=2)
    text = te_fp8_recipe_snippet(plan)
    compile(text, "te_fp8_recipe.py", "exec")
    (tmp_path / "te_fp8_recipe.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("te_fp8_recipe", None)
    module = importlib.import_module("te_fp8_recipe")  # imports with Transformer Engine absent
    if importlib.util.find_spec("transformer_engine") is None:
        with pytest.raises(ImportError, match="transformer-engine"):
            module.fp8_recipe()
    calls = {}
    _fake_transformer_engine(monkeypatch, calls)
    assert module.fp8_autocast() == "context"
    assert calls["recipe"] == {"fp8_format": "HYBRID", "amax_history_len": 1024, "amax_compute_algo": "max"}
    assert calls["recipe_class"] == "DelayedScaling"
    assert calls["autocast"]["enabled"] is True and calls["autocast"]["fp8_recipe"][0] == "recipe"
    sys.modules.pop("te_fp8_recipe", None)


@pytest.mark.parametrize(("recipe", "te_class", "fmt"), [
    ("te-current", "Float8CurrentScaling", "HYBRID"), ("te-blockwise", "Float8BlockScaling", "HYBRID"),
    ("te-mxfp8", "MXFP8BlockScaling", "E4M3")])
def test_te_fp8_recipe_module_builds_the_plans_recipe(tmp_path, monkeypatch, recipe, te_class, fmt):
    # the bundle's file for a current-scaling / block-scaled plan builds that recipe, not DelayedScaling
    model, cluster = load_model_preset("llama3-8b"), load_cluster(gpu="b200", num_gpus=8)
    est = estimate(model, cluster, make_plan(model, cluster, precision="fp8", fp8_recipe=recipe, engine="megatron",
                                             zero_stage=1, seq_len=2048))
    text = render_bundle(est, EmitOptions()).files["te_fp8_recipe.py"]
    (tmp_path / "te_fp8_recipe.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("te_fp8_recipe", None)
    module = importlib.import_module("te_fp8_recipe")
    calls = {}
    _fake_transformer_engine(monkeypatch, calls)
    module.fp8_autocast()
    assert calls["recipe_class"] == te_class and calls["recipe"] == {"fp8_format": fmt}
    sys.modules.pop("te_fp8_recipe", None)
    with pytest.raises(InputError, match="torchao"):
        te_fp8_recipe_snippet(ParallelPlan(precision="fp8", fp8_recipe="torchao-rowwise", engine="fsdp"))


def test_precision_summary_and_non_fp8_plans():
    assert precision_summary(ParallelPlan(precision="bf16"))["fp8"] is None
    fp16 = precision_summary(ParallelPlan(precision="fp16"))
    assert fp16["loss_scaling"]["dynamic"] and fp16["params_dtype"] == "fp16"
    fp8_plan = ParallelPlan(precision="fp8", zero_stage=1, engine="megatron")
    megatron = engine_for(fp8_plan)
    fp8 = precision_summary(fp8_plan, fp8_param_gather=megatron.fp8_param_gather(fp8_plan), fp8_how=megatron.fp8_how(fp8_plan))
    assert fp8["fp8"]["format"] == "hybrid" and fp8["fp8"]["param_gather"] and fp8["params_dtype"] == "bf16"
    with pytest.raises(InputError, match="fp8 plans"):
        te_fp8_recipe_snippet(ParallelPlan(precision="bf16"))
