"""A search across engines gives each engine's plans its own release's defaults (``SearchConstraints.engine_versions``,
``Engine.release_defaults``): torchtitan 0.3's 8-chunk loss and rowwise Float8 in the fsdp plans, none in the
others'; a setting the constraints fix wins for every engine; no release named, no release defaults."""

from __future__ import annotations

import json

import pytest

from autotune.api import estimate_from_dict
from autotune.cli import main
from autotune.engines import engine_for
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset
from autotune.train.fsdp import unsupported_reason

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


def test_a_tied_embedding_model_keeps_its_loss_whole(tmp_path):
    """torchtitan 0.3 chunks the loss, but a tied-embedding model's bundle runs the built-in trainer, which chunks a
    separate output layer only: the default is not taken for it (the bundle emitted for such a model on one H200
    was refused by its own launch script), neither by the search nor by emit."""
    tied = load_model_preset("megatron-gpt-1.7b")
    assert tied.tied_embeddings and "loss_chunks" not in engine_for("fsdp").release_defaults("0.3", tied)
    assert engine_for("fsdp").release_defaults("0.3", MODEL)["loss_chunks"] == 8
    result = search_plans(tied, CLUSTER, seq_len=2048, global_batch_size=16, top_k=3,
                          constraints=SearchConstraints(**SPACE, engine_versions={"fsdp": "0.3"}))
    assert result.ranked and all(e.plan.loss_chunks is None for e in result.ranked if e.plan.engine == "fsdp")
    assert main(["emit", "--model", "megatron-gpt-1.7b", "--gpu", "h200", "--num-gpus", "1", "--seq-len", "2048",
                 "--global-batch", "16", "--engine", "fsdp", "--zero", "0", "--micro-batch", "8", "--recompute",
                 "none", "--engine-version", "fsdp=0.3", "--out", str(tmp_path / "job")]) == 0
    est = estimate_from_dict(json.loads((tmp_path / "job" / "plan.json").read_text()))
    assert est.plan.loss_chunks is None and unsupported_reason(est.model, est.plan) is None
