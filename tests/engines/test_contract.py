"""The engine contract: every engine in autotune.engines passes the same suite (as Optuna runs one sampler
suite over every sampler). A new engine is added to the registry and gets all of these for free."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

from autotune.api import estimate, estimate_from_dict, make_plan
from autotune.bundle.writer import render_bundle, write_bundle
from autotune.emit.options import EmitOptions
from autotune.engines import ENGINES, Engine, engine_for
from autotune.errors import InputError
from autotune.rules import engines_that_run, plan_problems
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ENGINE_NAMES, ParallelPlan

CLUSTER = load_cluster(gpu="h100-sxm-80gb", num_gpus=16)  # a preset: it carries the kernel facts
MODEL = ModelSpec(name="m", num_layers=24, hidden_size=2048, num_attention_heads=16, num_kv_heads=8,
                  ffn_hidden_size=5632, vocab_size=32000, activation="swiglu", norm="rmsnorm",
                  position_embedding="rope")
NAMES = sorted(ENGINES)


def plain_plan(name: str, **kw) -> ParallelPlan:
    """Data parallelism over all 16 GPUs with the lowest sharding the engine runs."""
    engine = ENGINES[name]
    stage = 1 if 1 in engine.support.zero_stages else engine.support.zero_stages[-1]
    return make_plan(MODEL, CLUSTER, global_batch_size=64, seq_len=2048, engine=name,
                     zero_stage=kw.pop("zero_stage", stage), **kw)


def test_registry_matches_the_plan_field():
    assert tuple(sorted(ENGINE_NAMES)) == tuple(NAMES)
    for name, engine in ENGINES.items():
        assert isinstance(engine, Engine) and engine.name == name and engine_for(name) is engine
    with pytest.raises(ValueError, match="unknown engine 'torchtitanx'"):
        engine_for("torchtitanx")


@pytest.mark.parametrize("name", NAMES)
def test_every_engine_runs_plain_data_parallelism(name):
    plan = plain_plan(name)
    assert plan_problems(MODEL, CLUSTER, plan) == []
    assert name in engines_that_run(MODEL, CLUSTER, plan)


@pytest.mark.parametrize("name", NAMES)
def test_rules_are_reported_all_at_once_with_their_source(name):
    engine = ENGINES[name]
    s = engine.support
    # Ask for every dimension the engine lacks at once: each one is a separate rule, none hides another.
    asks, expected = {}, set()
    if s.tp is None:
        asks["tp"], expected = 2, expected | {f"{name}:tp"}
    if s.pp is None:
        asks["pp"], expected = 2, expected | {f"{name}:pp"}
    if s.cp is None:
        asks["cp"], expected = 2, expected | {f"{name}:cp"}
    if not s.hybrid_shard:
        asks["dp_replicate"], expected = 2, expected | {f"{name}:hybrid_shard"}
    missing_stage = next(z for z in (0, 1, 2, 3) if z not in s.zero_stages) if len(s.zero_stages) < 4 else None
    if missing_stage is not None:
        asks["zero_stage"], expected = missing_stage, expected | {f"{name}:zero_stage"}
    if "nvme" not in s.offload_optimizer:
        asks["offload_optimizer"], expected = "nvme", expected | {f"{name}:offload_optimizer"}
    if not expected:
        pytest.skip(f"{name} supports every dimension asked here")  # no engine does today
    base = dict(dp=16, global_batch_size=64, grad_accum_steps=4, seq_len=2048, engine=name, nvme_path="/nvme")
    mp = asks.get("tp", 1) * asks.get("pp", 1) * asks.get("cp", 1)
    base["dp"] = 16 // mp
    base["grad_accum_steps"] = 64 // base["dp"]
    found = plan_problems(MODEL, CLUSTER, ParallelPlan(**base, **asks))
    ids = {rule for rule, _ in found}
    assert expected <= ids, (expected - ids, found)
    for rule, message in found:
        if rule.startswith(name + ":"):
            assert message.startswith(engine.title) and message.endswith(")"), message  # "(source)"


REFUSALS = [dict(tp=2, pp=2, sequence_parallel=True, zero_stage=0), dict(zero_stage=1), dict(dp_replicate=2),
            dict(pp=2, vpp=2, zero_stage=0), dict(zero_stage=3, pp=2)]


@pytest.mark.parametrize("name", NAMES)
def test_refusal_names_the_engines_that_would_run_it(name):
    engine = ENGINES[name]
    for kw in REFUSALS:  # the first of these the engine refuses
        try:
            make_plan(MODEL, CLUSTER, global_batch_size=64, seq_len=2048, engine=name, **kw)
        except InputError as err:
            text = str(err)
            break
    else:
        pytest.fail(f"{name} runs every plan of REFUSALS")
    assert f"{engine.title}:" in text
    others = engines_that_run_kw(kw, name)
    if others:
        assert f"engines that can run this plan as it is: {', '.join(others)}" in text
    else:
        assert "no engine runs this plan as it is" in text


def _refused(engine: str, kw: dict) -> bool:
    try:
        make_plan(MODEL, CLUSTER, global_batch_size=64, seq_len=2048, engine=engine, **kw)
    except InputError:
        return True
    return False


def engines_that_run_kw(kw: dict, but: str) -> list[str]:
    """The engines that run the plan ``but`` was given, with the ZeRO stage ``but`` gave it where kw names none."""
    kw = {"zero_stage": ENGINES[but].default_zero_stage} | kw
    return [e for e in ENGINE_NAMES if e != but and not _refused(e, kw)]


@pytest.mark.parametrize("name", NAMES)
def test_ledger_and_step_time_are_finite_and_positive(name):
    est = estimate(MODEL, CLUSTER, plain_plan(name))
    for term, value in est.memory.terms().items():
        assert math.isfinite(value) and value >= 0, term
    assert est.memory.weights + est.memory.optimizer_states > 0
    t = est.time
    assert math.isfinite(t.step_time_s) and t.step_time_s > 0 and 0 < t.mfu < 1


@pytest.mark.parametrize("name", NAMES)
def test_engine_says_how_its_memory_bound_kernels_run(name):
    # Fused (one kernel per op) or eager (op by op); torch.compile fuses either.
    from autotune.cost.layer_time import ELEMENTWISE_KERNELS, elementwise_kernels

    kernels = engine_for(plain_plan(name)).comm.elementwise_kernels
    assert kernels in ELEMENTWISE_KERNELS
    assert elementwise_kernels(kernels, torch_compile=True) == "compiled"
    with pytest.raises(ValueError, match="elementwise_kernels must be one of"):
        elementwise_kernels("eagr", torch_compile=False)


@pytest.mark.parametrize("name", NAMES)
def test_sharding_shrinks_model_states(name):
    engine = ENGINES[name]
    stages = sorted(engine.support.zero_stages)
    if len(stages) < 2:
        pytest.skip(f"{name} has one sharding level")
    low, high = (estimate(MODEL, CLUSTER, plain_plan(name, zero_stage=z)).memory for z in (stages[0], stages[-1]))
    assert high.weights + high.gradients + high.optimizer_states < low.weights + low.gradients + low.optimizer_states


@pytest.mark.parametrize("name", NAMES)
def test_emitted_files_reload_and_the_plan_round_trips(name, tmp_path):
    est = estimate(MODEL, CLUSTER, plain_plan(name))
    bundle = render_bundle(est, EmitOptions())
    assert {"plan.json", "plan.md", "launch_torchrun.sh"} <= set(bundle.files)
    paths = write_bundle(est, tmp_path / "job", EmitOptions())  # reloads every file (engine parsers included)
    assert {p.name for p in paths} == set(bundle.files)
    doc = json.loads((tmp_path / "job" / "plan.json").read_text())
    again = estimate_from_dict(doc)
    assert again.plan == est.plan and again.plan.engine == name
    assert again.memory.total == pytest.approx(est.memory.total)
    plan_md = (tmp_path / "job" / "plan.md").read_text()
    assert ENGINES[name].title in plan_md


@pytest.mark.parametrize("name", NAMES)
def test_the_planner_ranks_only_plans_the_engine_accepts(name):
    result = search_plans(MODEL, CLUSTER, seq_len=2048, global_batch_size=64,
                          constraints=SearchConstraints(engines=(name,), max_micro_batch_size=4), top_k=50)
    assert result.num_feasible > 0
    for est in result.ranked:
        assert est.plan.engine == name
        assert plan_problems(MODEL, CLUSTER, est.plan) == [], est.plan


@pytest.mark.parametrize("name", NAMES)
def test_the_recompute_module_sets_an_engine_searches_pass_its_own_rules(name):
    """``Engine.searched_recompute_modules``: each set, on a plan of that model and precision, breaks none of the
    engine's rules on recompute modules; the set is in the plan field's order."""
    import dataclasses

    from autotune.specs.loading import load_model
    from autotune.specs.plan_values import RECOMPUTE_MODULES

    engine, checked = ENGINES[name], 0
    for model in (MODEL, load_model("deepseek-v3"), load_model("qwen3-30b-a3b")):
        for precision in engine.support.precisions:
            for recipe in engine.support.fp8_recipes if precision == "fp8" else (None,):
                for modules in engine.searched_recompute_modules(model, precision, recipe):
                    assert modules == tuple(m for m in RECOMPUTE_MODULES if m in modules)
                    plan = dataclasses.replace(plain_plan(name), precision=precision, fp8_recipe=recipe,
                                               recompute="selective", recompute_modules=modules)
                    assert not [r for r in engine.plan_problems(model, CLUSTER, plan)
                                if r.id.endswith("recompute_modules")], (model.name, precision, recipe, modules)
                    checked += 1
    assert name != "megatron" or checked >= 8  # Megatron: its MLA and MoE sets at every precision


def test_the_planner_ranks_across_engines():
    result = search_plans(MODEL, CLUSTER, seq_len=2048, global_batch_size=64,
                          constraints=SearchConstraints(engines=tuple(NAMES), max_micro_batch_size=2), top_k=10)
    assert {est.plan.engine for est in result.ranked} == set(NAMES)


def test_no_engine_name_is_tested_outside_the_engines_package():
    """Architecture guard: code outside autotune/engines asks the engine object, never compares its name."""
    root = Path(__file__).resolve().parents[2] / "autotune"
    offenders = []
    for path in root.rglob("*.py"):
        if "engines" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                names = [n for n in [node.left, *node.comparators] if isinstance(n, ast.Attribute)]
                consts = [n for n in [node.left, *node.comparators] if isinstance(n, ast.Constant)]
                if any(n.attr in ("engine", "framework") for n in names) and any(
                        c.value in ENGINE_NAMES or c.value == "megatron" for c in consts):
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert offenders == []
