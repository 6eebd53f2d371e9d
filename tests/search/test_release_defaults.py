"""A search across engines gives each engine's plans its own release's defaults (``SearchConstraints.engine_versions``,
``Engine.release_defaults``): torchtitan 0.3's 8-chunk loss and rowwise Float8 in the fsdp plans, none in the
others'; a setting the constraints fix wins for every engine; no release named, no release defaults."""

from __future__ import annotations

import pytest

from autotune.engines import engine_for
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

MODEL = load_model_preset("llama3-8b")
CLUSTER = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
SPACE = dict(engines=("fsdp", "deepspeed"), tp=1, pp=1, cp=1, precisions=("bf16", "fp8"), recompute=("none",),
             allow_offload=False)


def _ranked(**kw):
    return search_plans(MODEL, CLUSTER, seq_len=4096, global_batch_size=16,
                        constraints=SearchConstraints(**SPACE, **kw), top_k=5)


def _settings(result, engine):
    return {(e.plan.precision, e.plan.loss_chunks, e.plan.fp8_recipe) for e in result.ranked if e.plan.engine == engine}


def test_each_engine_runs_its_own_releases_defaults():
    release = engine_for("fsdp").release_defaults("0.3")
    assert release  # what this test is about: a release with defaults of its own
    result = _ranked(engine_versions={"fsdp": "0.3", "deepspeed": "0.19"})
    fsdp, deepspeed = _settings(result, "fsdp"), _settings(result, "deepspeed")
    assert fsdp == {("bf16", release["loss_chunks"], None), ("fp8", release["loss_chunks"], release["fp8_recipe"])}
    assert deepspeed and all(chunks is None and recipe is None for _, chunks, recipe in deepspeed)
    assert result.release_defaults == {"fsdp": {"release": "0.3", "settings": release}}
    assert result.engine_versions == {"fsdp": "0.3", "deepspeed": "0.19"}


@pytest.mark.parametrize("versions", [{}, {"fsdp": "0.2"}])
def test_no_release_or_one_without_defaults_searches_the_modelled_defaults(versions):
    result = _ranked(engine_versions=versions)
    assert {(chunks, recipe) for _, chunks, recipe in _settings(result, "fsdp")} == {(None, None)}
    assert result.release_defaults == {}


def test_a_setting_the_constraints_fix_wins_over_the_release():
    result = _ranked(engine_versions={"fsdp": "0.3"}, loss_chunks=1)
    assert {chunks for _, chunks, _ in _settings(result, "fsdp")} == {1}
    assert result.release_defaults["fsdp"]["settings"] == {"fp8_recipe": "torchao-rowwise"}


BASE = dict(tp=1, pp=1, dp=8, global_batch_size=8, micro_batch_size=1, grad_accum_steps=1, seq_len=4096)


@pytest.mark.parametrize("bad", [dict(loss_chunks=0), dict(loss_chunks=True), dict(loss_chunks=4097),
                                 dict(fp8_recipe="torchao-rowwise"), dict(precision="fp8", fp8_recipe="rowwise"),
                                 dict(torch_compile=1), dict(tp_overlap="ring"), dict(grad_dtype="fp32")])
def test_the_plans_fast_check_of_set_run_settings_still_refuses_a_bad_one(bad):
    """ParallelPlan's fast path takes valid run settings (the release defaults are in every plan a search builds);
    each invalid one still goes to the full check, which names it."""
    from autotune.errors import InputError
    from autotune.specs.plan import ParallelPlan

    with pytest.raises(InputError, match=next(iter(bad)) if "fp8_recipe" not in bad else "fp8_recipe"):
        ParallelPlan(**{**BASE, **bad})
    good = ParallelPlan(**BASE, precision="fp8", fp8_recipe="torchao-rowwise", loss_chunks=4096, torch_compile=False,
                        tp_overlap="none", grad_dtype="bf16")
    assert good.loss_chunks == 4096
