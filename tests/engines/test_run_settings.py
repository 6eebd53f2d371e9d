"""Run settings as part of the plan (``ParallelPlan.RUN_SETTINGS``: gradient dtype, FP8 recipe, TP overlap,
torch.compile): every value an engine declares it runs (``EngineSupport``) is emitted into the engine's own file,
read back from it by ``autotune.job_files`` (what ``estimate --from`` reads), and gives the same settings and the
same estimate; a value other than the engine's default changes the estimate (the cost model reads it); a value the
engine does not run is refused with the rule, in the library and on the command line (exit 2).
"""

from __future__ import annotations

import json

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.cli import main
from autotune.cost import run_settings
from autotune.cost.cp_ring import cp_kind
from autotune.cost.step_time import TimeSettings
from autotune.emit.options import EmitOptions
from autotune.engines import ENGINES, engine_for
from autotune.errors import InputError
from autotune.job_files import read_job
from autotune.rules import plan_problems
from autotune.specs.loading import load_cluster
from autotune.specs.notation import plan_notation
from autotune.specs.plan import RUN_SETTINGS, ParallelPlan
from autotune.specs.presets import load_model_preset

GPU = "h100-sxm-80gb"
MODEL = load_model_preset("llama3-8b")
MOE = load_model_preset("qwen3-30b-a3b")  # the settings only MoE models have (ep_overlap, moe_dispatcher), with ep 8
MOE_SETTINGS = ("ep_overlap", "moe_dispatcher", "moe_capacity_factor", "moe_pad_to_capacity")
# FP8 attention: Megatron-Bridge files only (Megatron-LM has no flag for it), whose Llama 3 8B recipe holds a registered
# precision name that sets it at setup: on 70B's recipe, which takes the precision field by field
BRIDGE = load_model_preset("llama3-70b")
CLUSTER = load_cluster(gpu=GPU, num_gpus=16)
# The file of each engine that states the whole plan, read back as `estimate --from` reads it: torchtitan's 0.2 TOML
# (it has async TP and tensorwise Float8, which 0.3 has not), its 0.3 module for the chunked loss (which 0.2 has not).
READ_BACK = {"megatron": ("megatron_args.sh", "launch_torchrun.sh"), "fsdp": ("torchtitan_job.toml",)}
READ_BACK_03 = ("torchtitan_plan.py",)


def _files(engine: str, name: str) -> tuple[tuple[str, ...], str]:
    """(the files to read back, the torchtitan release they are written for)."""
    if name == "fp8_attention":
        return ("bridge_overrides.yaml",), "0.2"
    return (READ_BACK_03, "0.3") if engine == "fsdp" and name == "loss_chunks" else (READ_BACK[engine], "0.2")


def _choices(engine: str) -> dict[str, tuple]:
    s = engine_for(engine).support
    return {"grad_dtype": s.grad_dtypes, "fp8_recipe": s.fp8_recipes,
            "tp_overlap": s.tp_overlaps if len(s.tp_overlaps) > 1 else (),  # "none" alone: no choice
            "torch_compile": (True, False) if s.torch_compile else (), "loss_chunks": (1, 8) if s.loss_chunks else (),
            # the default, and modules a dense Llama has (the MoE and MLA ones: test_recompute_modules_of_moe_and_mla)
            "recompute_modules": (("core_attn",), ("mlp",), ("core_attn", "mlp")) if s.recompute_modules else (),
            "cuda_graph": s.cuda_graphs if len(s.cuda_graphs) > 1 else (),
            "cuda_graph_scope": (("attn",), ("mlp",)) if len(s.cuda_graphs) > 1 else (),
            "ep_overlap": s.ep_overlaps if len(s.ep_overlaps) > 1 else (),
            "moe_dispatcher": s.moe_dispatchers if len(s.moe_dispatchers) > 1 else (),
            "cp_comm_type": s.cp_comm_types,
            "activation_offload_layers": (4,) if s.activation_offload else (),
            "mtp_layers": (1,) if s.mtp else (),  # one MTP module after the last layer (DeepSeek-V3's)
            # a capacity (padding needs one: _plan gives it 1.0)
            "moe_capacity_factor": (0.75,) if s.token_drop else (),  # unpadded, 1.5 drops nothing: dropless
            "moe_pad_to_capacity": (True,) if s.token_drop else (),
            "fp8_attention": (True,) if s.fp8_attention else (),
            "fp8_output_proj": (True,) if s.fp8_output_proj else ()}  # under te-mxfp8 (_plan)


CASES = [(engine, name, value) for engine in ENGINES for name, values in _choices(engine).items() for value in values]
# MXFP8 runs on Blackwell only (TransformerEngine pytorch/quantization.py _compute_mxfp8_support; torchtitan
# components/quantization/mx.py): its cases (te-mxfp8, torchao-mxfp8) on B200.
BLACKWELL = "b200"
CLUSTERS = {GPU: CLUSTER, BLACKWELL: load_cluster(gpu=BLACKWELL, num_gpus=16)}


def _gpu(**setting) -> str:
    return BLACKWELL if setting.get("fp8_recipe") in ("te-mxfp8", "torchao-mxfp8") or "fp8_output_proj" in setting \
        else GPU


def _model(**setting):
    if "fp8_attention" in setting:
        return BRIDGE
    return MOE if set(MOE_SETTINGS) & set(setting) else MODEL


def _plan(engine: str, **setting) -> ParallelPlan:
    moe = {"ep": 8} if set(MOE_SETTINGS) & set(setting) else {}
    moe |= {"cp": 2} if "cp_comm_type" in setting else {}  # an exchange needs context parallelism
    fp8 = "fp8_recipe" in setting or "fp8_attention" in setting or "fp8_output_proj" in setting
    if "fp8_output_proj" in setting:  # the MXFP8 head: under the MXFP8 recipe alone (transformer_config.py:1569-1575)
        setting = {"fp8_recipe": "te-mxfp8", **setting}
    selective = "recompute_modules" in setting  # what selective recompute reruns
    if "moe_pad_to_capacity" in setting:  # padding to a capacity: against the same capacity unpadded
        setting = {"moe_capacity_factor": 1.0, **setting}
    if "cuda_graph_scope" in setting:  # what Megatron's own graphs capture (their static buffers are per part;
        setting = {"cuda_graph": "local", **setting}  # Transformer Engine's share theirs along the layers)
    return make_plan(_model(**setting), CLUSTERS[_gpu(**setting)], global_batch_size=64, tp=2, sequence_parallel=True,
                     seq_len=4096, engine=engine, zero_stage=3 if engine == "fsdp" else 1,
                     precision="fp8" if fp8 else "bf16", **({"recompute": "selective"} if selective else {}),
                     **moe, **setting)


def _effective(plan: ParallelPlan) -> tuple:
    engine, ts = engine_for(plan), TimeSettings()
    return (engine.grad_reduce_bytes(plan), run_settings.fp8_recipe(plan, ts, engine) if plan.precision == "fp8"
            else None, run_settings.tp_overlap(plan, ts, engine), run_settings.compiled(plan, ts, engine),
            plan.loss_chunks or 1, run_settings.recompute_modules(plan), plan.cuda_graph or "none",
            plan.cuda_graph_scope, plan.ep_overlap or "none", plan.moe_dispatcher or "alltoall",
            cp_kind(plan, engine.comm.cp_kind), plan.activation_offload_layers, plan.mtp_layers,
            plan.moe_capacity_factor, bool(plan.moe_pad_to_capacity), bool(plan.fp8_attention),
            bool(plan.fp8_output_proj))


def test_every_engine_with_a_choice_has_a_file_read_back():
    assert {e for e, _, _ in CASES} == set(READ_BACK) and {n for _, n, _ in CASES} == set(RUN_SETTINGS)


@pytest.mark.parametrize(("engine", "name", "value"), CASES, ids=[f"{e}-{n}-{v}" for e, n, v in CASES])
def test_emit_read_back_same_settings_same_estimate(tmp_path, engine, name, value):
    plan = _plan(engine, **{name: value})
    gpu = _gpu(**{name: value})
    cluster, model = CLUSTERS[gpu], _model(**{name: value})
    assert not plan_problems(model, cluster, plan)
    est = estimate(model, cluster, plan)
    names, release = _files(engine, name)
    files = render_bundle(est, EmitOptions(torchtitan_version=release)).files
    for file in names:
        (tmp_path / file).write_text(files[file])
    job = read_job([str(tmp_path / f) for f in names], gpu=gpu,
                   **({"num_gpus": cluster.num_gpus} if name == "fp8_attention" else {}))  # Bridge's: not in the file
    back = job.plan
    assert _effective(back) == _effective(plan)
    again = estimate(job.model, job.cluster, back, job.settings)
    assert again.time.step_time_s == pytest.approx(est.time.step_time_s, rel=1e-9)
    assert again.memory.total == pytest.approx(est.memory.total, rel=1e-9)
    default = _plan(engine, **({name: None} if name in ("fp8_recipe", "recompute_modules", "cp_comm_type",
                                                       "fp8_attention", "fp8_output_proj", *MOE_SETTINGS) else {}))
    if name == "cuda_graph_scope":  # against the same graphs over the whole layer
        default = plan.with_(cuda_graph_scope=None)
    if _effective(default) != _effective(plan):  # a setting other than the engine's default: the estimate moves
        before = estimate(model, cluster, default)
        assert (before.time.step_time_s, before.memory.total) != pytest.approx(
            (est.time.step_time_s, est.memory.total), rel=1e-6)
        assert getattr(back, name) == value  # and the plan read back says it
    else:  # what the engine does anyway reads back unset: the plan the files were written for
        assert getattr(back, name) is None
    assert name not in ParallelPlan().to_dict() and plan.to_dict()[name] == value


@pytest.mark.parametrize("engine", [e for e in ENGINES if e not in READ_BACK])
def test_engines_without_a_choice_refuse_each_setting_with_its_rule(engine):
    for name, value in (("fp8_recipe", "te-current"), ("tp_overlap", "userbuffers"), ("torch_compile", True),
                        ("loss_chunks", 8), ("recompute_modules", ("mlp",)), ("cuda_graph", "transformer_engine"),
                        ("ep_overlap", "a2a"), ("moe_dispatcher", "flex-deepep"), ("cp_comm_type", "a2a"),
                        ("activation_offload_layers", 4), ("mtp_layers", 1), ("moe_capacity_factor", 1.0),
                        ("fp8_attention", True), ("fp8_output_proj", True)):
        mxfp8 = {"fp8_recipe": "te-mxfp8"} if name == "fp8_output_proj" else {}
        plan = ParallelPlan(engine=engine, dp=16, global_batch_size=64, grad_accum_steps=4, seq_len=4096, **mxfp8,
                            precision="fp8" if name in ("fp8_recipe", "fp8_attention", "fp8_output_proj") else "bf16",
                            **{name: value},
                            recompute="selective" if name == "recompute_modules" else "none")
        rules = [rule for rule, _ in plan_problems(MODEL, CLUSTER, plan)]
        assert f"{engine}:{name}" in rules, rules


def test_layout_rules_of_the_overlaps():
    def refused(match: str, **kw) -> None:
        with pytest.raises(InputError, match=match):  # make_plan lists every rule the plan breaks
            make_plan(MODEL, CLUSTER, global_batch_size=64, seq_len=4096, **kw)

    refused("no async-tp TP communication overlap", engine="megatron", tp=2, sequence_parallel=True, zero_stage=1,
            tp_overlap="async-tp")  # torchtitan's, not Megatron's
    refused("--tp-comm-overlap needs sequence parallelism", engine="megatron", tp=2, sequence_parallel=False,
            zero_stage=1, tp_overlap="userbuffers")
    refused("async TP needs torch.compile", engine="fsdp", tp=2, zero_stage=3, tp_overlap="async-tp",
            torch_compile=False)
    refused("tp=1 has none", engine="megatron", tp=1, zero_stage=1, tp_overlap="userbuffers")


def test_a_recipe_on_a_16_bit_plan_and_unknown_values_are_refused():
    with pytest.raises(InputError, match="fp8_recipe .* is for fp8 plans"):
        ParallelPlan(fp8_recipe="te-current")
    with pytest.raises(InputError, match="tp_overlap must be one of"):
        ParallelPlan(tp_overlap="nccl")
    with pytest.raises(InputError, match="torch_compile must be"):
        ParallelPlan(torch_compile="yes")


def test_rowwise_float8_gathers_16_bit_weights_and_torchtitan_says_so():
    tensorwise = _plan("fsdp", fp8_recipe="torchao-tensorwise")
    rowwise = _plan("fsdp", fp8_recipe="torchao-rowwise")
    fsdp = engine_for(tensorwise)
    assert fsdp.fp8_param_gather(tensorwise) and not fsdp.fp8_param_gather(rowwise)
    a, b = estimate(MODEL, CLUSTER, tensorwise), estimate(MODEL, CLUSTER, rowwise)
    assert b.memory.buffer_parts["unsharded_params"] > a.memory.buffer_parts["unsharded_params"]
    toml = render_bundle(b, EmitOptions(torchtitan_version="0.2")).files["torchtitan_job.toml"]
    assert 'recipe_name = "rowwise"' in toml and "enable_fsdp_float8_all_gather = false" in toml


def test_torchtitan_03_refuses_what_it_cannot_run_and_writes_rowwise():
    async_tp = estimate(MODEL, CLUSTER, _plan("fsdp", tp_overlap="async-tp"))
    files = render_bundle(async_tp, EmitOptions(torchtitan_version="0.3")).files
    assert "torchtitan_plan.py" not in files and "no async tensor parallelism" in files["plan.md"]
    rowwise = render_bundle(estimate(MODEL, CLUSTER, _plan("fsdp", fp8_recipe="torchao-rowwise")),
                            EmitOptions(torchtitan_version="0.3")).files["torchtitan_plan.py"]
    assert "recipe_name='rowwise'" in rowwise


def _cli(argv, capsys):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


EST = ["estimate", "--model", "llama3-8b", "--gpu", GPU, "--num-gpus", "16", "--global-batch", "64", "--tp", "2"]


def test_cli_flags_reach_the_plan_the_estimate_and_the_files(tmp_path, capsys):
    flags = ["--engine", "megatron", "--precision", "fp8", "--fp8-recipe", "te-current", "--tp-overlap", "userbuffers"]
    code, out, err = _cli([*EST, *flags, "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["plan"]["fp8_recipe"] == "te-current" and data["plan"]["tp_overlap"] == "userbuffers"
    assert any("FP8 recipe te-current (--fp8-recipe)" in s for s in data["assumed_settings"])
    code, _, err = _cli(["emit", *EST[1:], *flags, "--out", tmp_path / "job"], capsys)
    assert code == 0, err
    args = (tmp_path / "job" / "megatron_args.sh").read_text()
    assert "--fp8-recipe tensorwise" in args and "--tp-comm-overlap" in args
    code, back, err = _cli(["estimate", "--from", tmp_path / "job" / "megatron_args.sh",
                            tmp_path / "job" / "launch_torchrun.sh", "--gpu", GPU, "--json"], capsys)
    assert code == 0, err
    assert json.loads(back)["time"]["step_time_s"] == pytest.approx(data["time"]["step_time_s"], rel=1e-9)


def test_cli_refuses_a_setting_the_engine_does_not_run_with_exit_2(capsys):
    code, _, err = _cli([*EST, "--engine", "deepspeed", "--compile"], capsys)
    assert code == 2 and "torch.compile" in err and "Traceback" not in err
    code, _, err = _cli([*EST, "--fp8-recipe", "te-current"], capsys)  # a bf16 plan
    assert code == 2 and "is for fp8 plans" in err


def test_plan_searches_with_the_settings_on_the_engines_that_run_them(capsys):
    code, out, err = _cli(["plan", "--model", "llama3-8b", "--gpu", GPU, "--num-gpus", "16", "--global-batch", "64",
                           "--seq-len", "4096", "--tp-overlap", "async-tp", "--top-k", "3", "--json"], capsys)
    assert code == 0, err
    plans = [p["plan"] for p in json.loads(out)["candidates"]]
    assert plans and all(p["engine"] == "fsdp" for p in plans)
    assert all(p.get("tp_overlap") == ("async-tp" if p["tp"] > 1 else None) for p in plans)


def test_notation_names_each_setting_and_the_legend_explains_it():
    from autotune.legend import plan_legend

    plan = _plan("fsdp", fp8_recipe="torchao-rowwise").with_(tp_overlap="async-tp", torch_compile=True)
    words = plan_notation(plan).split()
    assert {"torchao-rowwise", "async-tp", "compiled"} <= set(words)
    legend = " ".join(plan_legend([plan]).split())
    assert "FP8 scaling recipe" in legend and "torch async TP" in legend and "torch.compile" in legend


def test_chunked_loss_keeps_one_chunk_of_logits_and_torchtitan_03_says_it():
    unchunked, chunked = _plan("fsdp"), _plan("fsdp", loss_chunks=8)
    a, b = estimate(MODEL, CLUSTER, unchunked).memory, estimate(MODEL, CLUSTER, chunked).memory
    # fp32 logits of one micro-batch: 4 B x 4096 tokens x 128,256 vocabulary / tp 2 = 1.05 GB; 7/8 of it goes, an fp32
    # gradient buffer of the output layer's input comes (4 B x 4096 x 4096: torchtitan's output layer takes the
    # sequence gathered, ColwiseParallel after Replicate)
    logits = 4 * 4096 * MODEL.vocab_size / 2
    saved = a.activation_parts["output_and_loss"] - b.activation_parts["output_and_loss"]
    assert saved == pytest.approx(logits * 7 / 8 - 4 * 4096 * 4096, rel=1e-9)
    module = render_bundle(estimate(MODEL, CLUSTER, chunked), EmitOptions(torchtitan_version="0.3")).files
    assert "loss=replace(base.loss, num_chunks=8)" in module["torchtitan_plan.py"]
    plain = render_bundle(estimate(MODEL, CLUSTER, unchunked), EmitOptions(torchtitan_version="0.3")).files
    assert "loss=base.loss.loss_fn" in plain["torchtitan_plan.py"]  # the recipe's 8 chunks undone: as estimated
    toml = render_bundle(estimate(MODEL, CLUSTER, chunked), EmitOptions(torchtitan_version="0.2")).files
    assert "torchtitan_job.toml" not in toml and "ChunkedLossWrapper came with 0.3" in toml["plan.md"]


def test_a_module_that_keeps_its_recipes_loss_reads_as_8_chunks(tmp_path):
    path = tmp_path / "torchtitan_plan.py"
    text = render_bundle(estimate(MODEL, CLUSTER, _plan("fsdp")), EmitOptions(torchtitan_version="0.3")).files[path.name]
    path.write_text(text.replace("        loss=base.loss.loss_fn,\n", ""))  # as a hand-written module would
    assert read_job([str(path)], gpu=GPU).plan.loss_chunks == 8


def test_accelerate_compiles_what_the_estimate_compiles_and_its_loader_reads_it(tmp_path):
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    for compiled in (True, False):
        plan = _plan("fsdp", torch_compile=compiled).with_(sequence_parallel=False)  # accelerate's TP has no sp
        est = estimate(MODEL, CLUSTER, plan)
        path = tmp_path / f"accelerate_fsdp_{compiled}.yaml"
        path.write_text(render_bundle(est).files["accelerate_fsdp.yaml"])
        loaded = config_args.load_config_from_file(str(path))  # accelerate 1.16's own loader
        assert loaded.dynamo_config.get("dynamo_backend") == ("INDUCTOR" if compiled else None)
        back = read_job([str(path)], model="llama3-8b", gpu=GPU, global_batch=64, seq_len=4096)
        assert run_settings.compiled(back.plan, None, engine_for(back.plan)) is compiled


EST_FSDP = ["estimate", "--model", "llama3-8b", "--gpu", GPU, "--num-gpus", "8", "--engine", "fsdp", "--zero", "3",
            "--global-batch", "8", "--seq-len", "8192", "--precision", "fp8"]


def test_the_torchtitan_release_sets_its_own_defaults_and_the_files_match(tmp_path, capsys):
    """torchtitan 0.3 chunks the loss 8 ways and has only rowwise Float8: a plan the command line builds for 0.3
    takes both unless told otherwise (and says so), and the module written for it is what was estimated."""
    code, out, err = _cli([*EST_FSDP, "--engine-version", "fsdp=0.3", "--json"], capsys)
    assert code == 0, err
    v03 = json.loads(out)
    assert v03["plan"]["loss_chunks"] == 8 and v03["plan"]["fp8_recipe"] == "torchao-rowwise"
    code, out, err = _cli([*EST_FSDP, "--engine-version", "fsdp=0.2", "--json"], capsys)
    v02 = json.loads(out)
    assert code == 0 and "loss_chunks" not in v02["plan"] and "fp8_recipe" not in v02["plan"]
    # 1/8 of the fp32 logits and loss buffers (the layers differ too: 0.3's SelectiveAC keeps the Float8 GEMMs' outputs)
    loss = [sum(v["memory"]["activation_parts"].get(k, 0) for k in ("output_and_loss", "loss_backward"))
            for v in (v03, v02)]
    assert loss[0] < loss[1] - 8 * 2**30
    code, out, err = _cli([*EST_FSDP, "--engine-version", "fsdp=0.3", "--loss-chunks", "2"], capsys)
    assert code == 0 and "runs --fp8-recipe torchao-rowwise unless told otherwise" in err
    assert "--loss-chunks 8" not in err  # the flag given wins and is not said as a default
    code, _, err = _cli(["emit", *EST_FSDP[1:], "--engine-version", "fsdp=0.3", "--out", tmp_path / "job"], capsys)
    assert code == 0, err
    written = json.loads((tmp_path / "job" / "plan.json").read_text())
    assert written["plan"] == v03["plan"]
    assert written["time"]["step_time_s"] == pytest.approx(v03["time"]["step_time_s"], rel=1e-9)
    module = (tmp_path / "job" / "torchtitan_plan.py").read_text()
    assert "num_chunks=8" in module and "recipe_name='rowwise'" in module
    assert read_job([str(tmp_path / "job" / "torchtitan_plan.py")], gpu=GPU).plan == ParallelPlan(**v03["plan"])


PLAN_BOTH = ["plan", "--model", "llama3-8b", "--gpu", GPU, "--num-gpus", "8", "--global-batch", "8", "--seq-len", "8192",
             "--precision", "fp8", "--engine", "fsdp,megatron", "--engine-version", "fsdp=0.3,megatron=0.19"]


def test_a_ranking_across_engines_runs_each_engines_release_defaults_and_the_files_match(tmp_path, capsys):
    """A plan across engines gives torchtitan 0.3's defaults to the fsdp plans only (the Megatron plans keep their
    own), says so, lets a flag given win; the fsdp plan it ranks, emitted from the plan JSON (which records the
    releases: no flag needed), is the plan estimated, in the 0.3 module."""
    code, text, err = _cli([*PLAN_BOTH, "--top-k", "400", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(text)
    fsdp = [(i, c) for i, c in enumerate(doc["candidates"], 1) if c["plan"]["engine"] == "fsdp"]
    megatron = [c for c in doc["candidates"] if c["plan"]["engine"] == "megatron"]
    assert fsdp and megatron
    assert all(c["plan"]["loss_chunks"] == 8 and c["plan"]["fp8_recipe"] == "torchao-rowwise" for _, c in fsdp)
    assert all("loss_chunks" not in c["plan"] and "fp8_recipe" not in c["plan"] for c in megatron)
    assert doc["release_defaults"] == {"fsdp": {"release": "0.3",
                                                "settings": {"loss_chunks": 8, "fp8_recipe": "torchao-rowwise"}}}
    assert doc["engine_versions"] == {"fsdp": "0.3", "megatron": "0.19"}
    code, table, _ = _cli([*PLAN_BOTH, "--top-k", "3"], capsys)
    assert code == 0 and "fsdp (torchtitan 0.3): --loss-chunks 8, --fp8-recipe torchao-rowwise" in table
    code, told, _ = _cli([*PLAN_BOTH, "--top-k", "400", "--loss-chunks", "1", "--json"], capsys)
    told = json.loads(told)
    assert {c["plan"].get("loss_chunks") for c in told["candidates"] if c["plan"]["engine"] == "fsdp"} == {1}
    assert told["release_defaults"]["fsdp"]["settings"] == {"fp8_recipe": "torchao-rowwise"}
    index, chosen = fsdp[0]
    (tmp_path / "plan.json").write_text(text)
    code, _, err = _cli(["emit", "--plan-json", tmp_path / "plan.json", "--candidate", index, "--out", tmp_path / "job"],
                        capsys)
    assert code == 0 and "torchtitan 0.3 (as the plan JSON records)" in err, err
    written = json.loads((tmp_path / "job" / "plan.json").read_text())
    assert written["plan"] == chosen["plan"] and written["engine_version"]["release"] == "0.3"
    assert written["time"]["step_time_s"] == pytest.approx(chosen["time"]["step_time_s"], rel=1e-9)
    assert written["memory"]["total"] == pytest.approx(chosen["memory"]["total"], rel=1e-9)
    module = tmp_path / "job" / "torchtitan_plan.py"
    assert "num_chunks=8" in module.read_text() and "recipe_name='rowwise'" in module.read_text()
    assert read_job([str(module)], gpu=GPU).plan == ParallelPlan(**chosen["plan"])
