"""The output layer and loss as K layers of torchtitan's pipeline split (``ParallelPlan.loss_slots`` on the fsdp
engine): the split (``layout.split_scheme`` any+lossK: ``torchtitan_split(L, pp x vpp, 1, K)``, torchtitan's
``pipeline_parallel_last_stage_less_layers = K``), the refusal of a K torchtitan raises on, the stage times, the
emitted TOML and its read-back, torchtitan's own loader and split on it, the opt-in search, and estimate's hint."""

from __future__ import annotations

import dataclasses
import json
import tomllib

import pytest
from torchtitan_source import split_sources, torchtitan_split_function  # tests/ is on sys.path (no __init__)

from autotune.api import estimate, make_plan
from autotune.cli import main
from autotune.engines import engine_for
from autotune.search.last_stage_hint import LOSS_SLOTS_TRIED, last_stage_hint
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints, dimension_values
from autotune.specs.layout import layer_counts, split_scheme, torchtitan_split, virtual_layout
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

try:
    from torchtitan.config import ConfigManager
    TORCHTITAN = None
except Exception as err:  # noqa: BLE001 - any import failure is the reason to skip the loader check
    TORCHTITAN = f"torchtitan 0.2.2 does not import here ({type(err).__name__}: {err})"

SOURCES = split_sources()
GPU = ["--gpu", "h100-sxm-80gb"]
# llama3-8b pp 4 on 16 H100s: its last stage (8 layers + the output layer and loss) is the slowest
LLAMA = ["--model", "llama3-8b", *GPU, "--num-gpus", "16", "--engine", "fsdp", "--pp", "4", "--global-batch", "64"]
INTERLEAVED = ["--model", "llama3-8b", *GPU, "--num-gpus", "32", "--engine", "fsdp", "--zero", "3", "--tp", "2",
               "--pp", "4", "--global-batch", "16"]


def _json(capsys, *argv) -> dict:
    assert main(["estimate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("layers", [16, 32, 61, 80, 126])
@pytest.mark.parametrize("pp, vpp", [(2, 1), (4, 1), (4, 2), (4, 3), (8, 1), (8, 2), (16, 2)])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
def test_the_split_is_torchtitans_with_the_output_as_k_layers(layers, pp, vpp, k):
    scheme = split_scheme("any", None, layers, pp, vpp, k)
    chunks = virtual_layout(layers, pp, vpp, scheme)
    assert chunks == torchtitan_split(layers, pp * vpp, 1, k)
    if chunks is None:
        assert layer_counts(layers, pp, scheme) is None
        return
    assert sum(chunks) == layers
    # each rank (virtual stages s, s + pp, ...) holds what the cost model gives its stage
    assert [sum(chunks[s::pp]) for s in range(pp)] == list(layer_counts(layers, pp, scheme))
    if SOURCES:  # torchtitan's own function, from its source
        names = torchtitan_split_function(SOURCES[0])(pp * vpp, layers, 1, k)
        assert tuple(sum(n.startswith("layers.") for n in part) for part in names) == chunks


def test_the_fsdp_engine_splits_so_and_a_1f1b_pipeline_without_it_is_torchtitans_own_split():
    model, cluster = load_model_preset("llama3-8b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=16)
    plan = make_plan(model, cluster, engine="fsdp", pp=4, seq_len=4096, global_batch_size=64)
    engine = engine_for(plan)
    # 1F1B: the TOML writes no split, so torchtitan's defaults (first / last_stage_less_layers 1) place the layers
    assert engine.support.loss_slots and engine.layer_split_of(plan, 32) == "any+loss1"
    assert layer_counts(32, 4, "any+loss1") == torchtitan_split(32, 4) == (8, 9, 8, 7)
    assert engine.layer_split_of(plan.with_(loss_slots=2), 32) == "any+loss2"
    assert engine.layer_split_of(plan.with_(loss_slots=2, vpp=2), 32) == "any+loss2+vpp2"
    assert engine.layer_split_of(plan.with_(vpp=2), 32) == "any"  # interleaved: the split the TOML writes
    assert layer_counts(32, 4, "any+loss2") == torchtitan_split(32, 4, 1, 2) == (8, 9, 9, 6)
    # the cost model prices each stage by those layers
    plain, light = estimate(model, cluster, plan), estimate(model, cluster, plan.with_(loss_slots=2))
    assert [(s, n) for s, n, _ in plain.time.stage_times_s] == [(0, 8), (1, 9), (2, 8), (3, 7)]
    assert [(s, n) for s, n, _ in light.time.stage_times_s] == [(0, 8), (1, 9), (3, 6)]
    assert estimate(model, cluster, plan.with_(loss_slots=1)).time.tokens_per_s == plain.time.tokens_per_s


@pytest.mark.parametrize("layers, pp, vpp", [(32, 4, 1), (32, 4, 4), (80, 8, 3), (16, 4, 2)])
def test_the_rule_refuses_what_torchtitan_raises_on_and_names_the_largest_k(layers, pp, vpp):
    from autotune.engines.support_rules import support_problems
    from autotune.specs.plan import ParallelPlan

    model = dataclasses.replace(load_model_preset("llama3-8b"), num_layers=layers)
    largest = max(k for k in range(1, 40) if torchtitan_split(layers, pp * vpp, 1, k) is not None)
    for k in range(1, largest + 3):
        plan = ParallelPlan(pp=pp, vpp=vpp, dp=1, micro_batch_size=1, global_batch_size=pp * 2,
                            grad_accum_steps=pp * 2, seq_len=4096, engine="fsdp", zero_stage=3, loss_slots=k)
        rules = [r for r in support_problems(engine_for(plan), model, plan) if r.id == "fsdp:loss_slots"]
        assert bool(rules) == (k > largest), k
        if rules:
            assert f"use --loss-slots {largest} or less" in rules[0].message


def test_the_cli_refusal_says_what_torchtitan_raises(capsys):
    assert main(["estimate", *INTERLEAVED, "--vpp", "4", "--loss-slots", "3"]) == 2
    err = capsys.readouterr().err
    assert ("--loss-slots 3: torchtitan counts the embedding as 1 layer and the output layer and loss as 3 "
            "(pipeline_parallel_last_stage_less_layers), 32 + 1 + 3 = 36 effective layers over 16 virtual stages, 2 a "
            "stage, and raises \"output_weight (3) exceeds minimum layers per stage (2)\": use --loss-slots 2 or less"
            ) in err and "Traceback" not in err
    assert main(["estimate", *INTERLEAVED, "--vpp", "4", "--loss-slots", "2"]) == 0


@pytest.mark.parametrize("vpp, keys", [
    (1, {}),  # 1F1B: pp stages, torchtitan's own count (pipeline_parallel.py:110-115)
    (3, {"pipeline_parallel_layers_per_stage": 3}),  # ceil(35 / 3) = 12 = 4 x 3
    (2, None),  # no layers_per_stage gives 8 stages of 35 effective layers: the split as module names
])
def test_emit_writes_the_key_and_estimate_from_reads_it_back(tmp_path, capsys, vpp, keys):
    flags = [*INTERLEAVED, "--vpp", str(vpp), "--loss-slots", "2"]
    out = tmp_path / "job"
    assert main(["emit", *flags, "--out", str(out)]) == 0
    capsys.readouterr()
    toml = out / "torchtitan_job.toml"
    p = tomllib.loads(toml.read_text())["parallelism"]
    assert p["pipeline_parallel_first_stage_less_layers"] == 1 and p["pipeline_parallel_last_stage_less_layers"] == 2
    if keys is None:
        names = p["module_fqns_per_model_part"]
        assert tuple(sum(n.startswith("layers.") for n in part) for part in names) == torchtitan_split(32, 8, 1, 2)
    else:
        assert {k: p[k] for k in keys} == keys and "module_fqns_per_model_part" not in p
    stated = _json(capsys, *flags)
    read = _json(capsys, "--from", str(toml), *GPU, "--num-gpus", "32")
    assert read["plan"] == stated["plan"] and read["plan"]["loss_slots"] == 2 and read["plan"]["vpp"] == vpp
    assert read["time"]["tokens_per_s"] == pytest.approx(stated["time"]["tokens_per_s"], rel=1e-9)
    assert read["time"]["stage_times_s"] == stated["time"]["stage_times_s"]


def test_a_file_with_the_default_weights_reads_as_the_engines_own_split(tmp_path, capsys):
    out = tmp_path / "job"
    assert main(["emit", *LLAMA, "--out", str(out)]) == 0
    capsys.readouterr()
    toml = out / "torchtitan_job.toml"
    assert "less_layers" not in toml.read_text()
    assert "loss_slots" not in _json(capsys, "--from", str(toml), *GPU, "--num-gpus", "16")["plan"]
    text = toml.read_text().replace("[parallelism]", "[parallelism]\npipeline_parallel_last_stage_less_layers = 1")
    toml.write_text(text)
    assert "loss_slots" not in _json(capsys, "--from", str(toml), *GPU, "--num-gpus", "16")["plan"]
    toml.write_text(text.replace("less_layers = 1", "less_layers = 3"))
    assert _json(capsys, "--from", str(toml), *GPU, "--num-gpus", "16")["plan"]["loss_slots"] == 3


@pytest.mark.skipif(TORCHTITAN is not None, reason=TORCHTITAN or "")
@pytest.mark.skipif(not SOURCES, reason="no torchtitan source here (pip's 0.2.2 or the 0.3.0 test tool)")
@pytest.mark.parametrize("vpp", [1, 2, 3])
def test_torchtitans_loader_takes_the_file_and_its_split_is_the_plans(tmp_path, capsys, vpp):
    out = tmp_path / "job"
    assert main(["emit", *INTERLEAVED, "--vpp", str(vpp), "--loss-slots", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    pa = ConfigManager().parse_args(["--job.config_file", str(out / "torchtitan_job.toml")]).parallelism
    assert pa.pipeline_parallel_last_stage_less_layers == 2 and pa.pipeline_parallel_first_stage_less_layers == 1
    names = pa.module_fqns_per_model_part
    if names is None:  # torchtitan's stage count (v0.2.2 pipeline_parallel.py:71-115) and its own split function
        per = pa.pipeline_parallel_layers_per_stage
        stages = 4 if per is None else -(-(32 + 1 + 2) // per)
        names = torchtitan_split_function(SOURCES[0])(stages, 32, 1, 2)
    counts = tuple(sum(n.startswith("layers.") for n in part) for part in names)
    assert counts == torchtitan_split(32, 4 * vpp, 1, 2) == virtual_layout(32, 4, vpp, split_scheme("any", None, 32,
                                                                                                   4, vpp, 2))


def test_the_search_takes_them_only_with_uneven_layouts():
    model, cluster = load_model_preset("llama3-8b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=16)
    kw = dict(seq_len=4096, global_batch_size=64, top_k=10**6, ties=False)
    default = SearchConstraints(engines=("fsdp",))
    assert dimension_values(model, cluster, 4096, 64, default).loss_slots == ()
    assert all(e.plan.loss_slots is None for e in search_plans(model, cluster, constraints=default, **kw).ranked)
    uneven = search_plans(model, cluster, constraints=SearchConstraints(engines=("fsdp",), uneven_layouts=True), **kw)
    slots = {e.plan.loss_slots for e in uneven.ranked}
    assert slots - {None} and slots <= {None, *LOSS_SLOTS_TRIED}
    assert all(e.plan.pp > 1 for e in uneven.ranked if e.plan.loss_slots)
    assert uneven.rejections.get("fsdp:loss_slots", 0) > 0  # the ks torchtitan's split raises on, counted
    for e in uneven.ranked:  # each k searched gives the ranks layers the engine's own split does not
        if e.plan.loss_slots:
            p = e.plan
            assert layer_counts(32, p.pp, split_scheme("any", None, 32, p.pp, p.vpp, p.loss_slots)) != \
                layer_counts(32, p.pp, "any")


def test_estimate_hints_a_lighter_last_stage_for_a_torchtitan_plan(capsys):
    # 1F1B runs torchtitan's own split, whose slowest stage is a middle one (9 layers): no hint
    assert _json(capsys, *LLAMA)["last_stage_hint"] is None
    interleaved = [*INTERLEAVED, "--vpp", "3"]  # the TOML's split, 8 layers a rank: the last stage the slowest
    plain = _json(capsys, *interleaved)
    stages = {s["stage"]: s["s_per_microbatch"] for s in plain["time"]["stage_times_s"]}
    assert max(stages, key=stages.get) == 3  # the output layer's stage is the slowest
    speeds = {}
    for k in LOSS_SLOTS_TRIED:
        code = main(["estimate", *interleaved, "--loss-slots", str(k), "--json"])
        out = capsys.readouterr().out
        if code == 0:
            speeds[k] = json.loads(out)["time"]["tokens_per_s"]
    best = max(speeds, key=speeds.get)  # the first of equals
    hint = plain["last_stage_hint"]
    assert hint["loss_slots"] == best == 2
    assert hint["gain"] == pytest.approx(speeds[best] / plain["time"]["tokens_per_s"] - 1, rel=1e-12)
    assert hint["gain"] > 0.05
    model, cluster = load_model_preset("llama3-8b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=16)
    result = estimate(model, cluster, make_plan(model, cluster, engine="fsdp", pp=4, seq_len=4096,
                                                global_batch_size=64))
    assert last_stage_hint(result) is None


def test_a_1f1b_file_with_even_weights_says_it_is_estimated_with_torchtitans_default(tmp_path, capsys):
    out = tmp_path / "job"
    assert main(["emit", *LLAMA, "--out", str(out)]) == 0
    capsys.readouterr()
    toml = out / "torchtitan_job.toml"
    even = "[parallelism]\npipeline_parallel_first_stage_less_layers = 0\npipeline_parallel_last_stage_less_layers = 0"
    toml.write_text(toml.read_text().replace("[parallelism]", even))
    assert main(["estimate", "--from", str(toml), *GPU, "--num-gpus", "16"]) == 0
    assert "0 / 0 with 1F1B (layers even over the stages) is not modelled" in capsys.readouterr().err
