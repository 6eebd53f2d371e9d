"""Multi-token prediction as a plan run setting (``ParallelPlan.mtp_layers``, Megatron-core ``--mtp-num-layers``):
the flag, the engines that refuse it, Megatron's own rules, the files that state it and the files that read it back.
What it costs is ``autotune.cost.mtp``'s (tests/cost); here the estimate is not asked to move.

Megatron-LM judges what we write where its oracle is beside the checkout (``../shared/oracles/megatron-lm``, as
tests/emit/test_megatron_oracle.py uses it); those tests skip, saying so, where it is absent.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.cli import main
from autotune.emit.shell_args import parse_shell_args_with_lines
from autotune.engines import ENGINES, engine_for
from autotune.errors import InputError
from autotune.job_bridge import bridge_fields
from autotune.rules import plan_problems
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset

REPO = Path(__file__).resolve().parents[2]
ORACLE = REPO.parent / "shared" / "oracles" / "megatron-lm" / "megatron_args_check.py"
WORKER = REPO / "tests" / "emit" / "fixtures" / "megatron_oracle_worker.py"
needs_oracle = pytest.mark.skipif(not ORACLE.is_file(), reason=f"Megatron-LM oracle not found at {ORACLE} "
                                                                "(../shared is beside the checkout in CI only)")
GPU = "h100-sxm-80gb"
QWEN = load_model_preset("qwen3-30b-a3b")  # MoE, RoPE: what DeepSeek-V3-style MTP is trained on
LLAMA = ["--model", "llama3-8b", "--gpu", GPU, "--num-gpus", "8", "--zero", "1"]


def _run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own refusal
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def _qwen_plan(num_gpus: int = 16, **kw) -> tuple:
    cluster = load_cluster(gpu=GPU, num_gpus=num_gpus)
    kw = {"tp": 2, "ep": 4, "zero_stage": 1, "seq_len": 4096, "global_batch_size": 64, "recompute": "full",
          "mtp_layers": 1} | kw
    return cluster, make_plan(QWEN, cluster, engine="megatron", **kw)


def _files(cluster, plan, model=QWEN) -> dict[str, str]:
    return render_bundle(estimate(model, cluster, plan)).files


@pytest.fixture(scope="module")
def oracle():
    proc = subprocess.Popen([sys.executable, str(WORKER), str(ORACLE)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=str(REPO))

    def verdict(world_size: int, *, args_file=None, argv=None, env=None) -> dict:
        request = {"world_size": world_size} | ({"args_file": str(args_file)} if args_file else {"argv": argv})
        proc.stdin.write(json.dumps(request | ({"env": env} if env else {})) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, "the oracle worker died"
        return json.loads(line)

    yield verdict
    proc.stdin.close()
    proc.wait(timeout=60)


# ---- the engines ---------------------------------------------------------------------------------------------------
def test_only_the_megatron_engine_runs_mtp():
    assert {name for name, engine in ENGINES.items() if engine.support.runs("mtp_layers", 1)} == {"megatron"}
    assert not engine_for(ParallelPlan(engine="megatron-deepspeed")).support.mtp  # Megatron-DeepSpeed has none
    assert all(engine.support.runs("mtp_layers", None) for engine in ENGINES.values())  # none asked: every engine


@pytest.mark.parametrize("engine", [e for e in ENGINES if e != "megatron"])
def test_other_engines_refuse_mtp_naming_the_way_out(engine):
    cluster = load_cluster(gpu=GPU, num_gpus=16)
    plan = ParallelPlan(engine=engine, dp=16, global_batch_size=64, grad_accum_steps=4, seq_len=4096, mtp_layers=1)
    problems = dict(plan_problems(load_model_preset("llama3-8b"), cluster, plan))
    assert f"{engine}:mtp_layers" in problems, problems
    assert "--engine megatron" in problems[f"{engine}:mtp_layers"] and "--mtp-layers" in problems[
        f"{engine}:mtp_layers"]
    assert f"{engine}:mtp_layers" not in dict(plan_problems(load_model_preset("llama3-8b"), cluster,
                                                            plan.with_(mtp_layers=None)))


# ---- Megatron's own rules ------------------------------------------------------------------------------------------
def test_ep_overlap_takes_one_mtp_layer_at_most():
    """transformer_config.py:2709-2713 (megatron-core 0.19.2): the plan's MTP layers, not the checkpoint's."""
    cluster = load_cluster(gpu=GPU, num_gpus=64)
    plan = ParallelPlan(engine="megatron", tp=2, dp=32, ep=8, sequence_parallel=True, zero_stage=1,
                        global_batch_size=256, grad_accum_steps=8, seq_len=4096, ep_overlap="a2a", mtp_layers=2)
    rules = plan_problems(QWEN, cluster, plan)
    assert any(r == "megatron:ep_overlap" and "MTP supports at most one layer" in t for r, t in rules), rules
    assert not any(r == "megatron:ep_overlap" for r, _ in plan_problems(QWEN, cluster, plan.with_(mtp_layers=1)))
    # DeepSeek-V3's checkpoint has one MTP module; two asked of a model with none are refused all the same
    assert QWEN.num_mtp_layers == 0


@pytest.mark.parametrize(("model", "kind"), [("gpt-oss-20b", "yarn"), ("megatron-gpt-1.7b", "learned_absolute"),
                                             ("bloom-176b", "alibi")])
def test_mtp_needs_rope_or_no_position_embedding(model, kind):
    """validate_args at d98e8a6: rope or none (arguments.py:881-886), then learned_absolute, rope, mrope or none
    (:1942-1948); both must pass."""
    m = load_model_preset(model)
    cluster = load_cluster(gpu=GPU, num_gpus=8)
    plan = ParallelPlan(engine="megatron", dp=8, zero_stage=1, global_batch_size=64, grad_accum_steps=8,
                        seq_len=2048, mtp_layers=1)
    found = [t for r, t in plan_problems(m, cluster, plan) if r == "megatron:mtp"]
    assert found and kind in found[0] and "drop --mtp-layers" in found[0], found
    assert not any(r == "megatron:mtp" for r, _ in plan_problems(m, cluster, plan.with_(mtp_layers=None)))


def test_rope_models_take_mtp():
    for name in ("qwen3-30b-a3b", "deepseek-v3", "llama3-8b"):
        plan = ParallelPlan(engine="megatron", dp=8, zero_stage=1, global_batch_size=64, grad_accum_steps=8,
                            seq_len=2048, mtp_layers=1)
        assert not any(r == "megatron:mtp" for r, _ in plan_problems(load_model_preset(name),
                                                                     load_cluster(gpu=GPU, num_gpus=8), plan))


# ---- the command line ----------------------------------------------------------------------------------------------
def test_estimate_on_an_engine_without_mtp_exits_2_naming_megatron(capsys):
    code, out, err = _run(["estimate", *LLAMA, "--engine", "fsdp", "--zero", "3", "--mtp-layers", "1"], capsys)
    assert code == 2 and out == "", err
    assert "--engine megatron" in err and "--mtp-layers" in err and "Traceback" not in err, err


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_count_below_one_names_the_flag_and_the_way_out(capsys, value):
    code, out, err = _run(["estimate", *LLAMA, "--engine", "megatron", "--mtp-layers", value], capsys)
    assert code == 2 and out == "", err
    assert "--mtp-layers must be >= 1" in err and "leave --mtp-layers out" in err, err
    assert "mtp_layers" not in err, err  # the flag, not the plan field behind it


def test_estimate_with_mtp_labels_the_plan(capsys):
    code, out, err = _run(["estimate", *LLAMA, "--engine", "megatron", "--mtp-layers", "1", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["plan"]["mtp_layers"] == 1, data["plan"]


def test_plan_with_the_default_engines_keeps_those_that_run_mtp():
    """``autotune plan --mtp-layers 1``: the engines left to the default narrow to Megatron (not every plan of the
    others refused); an engine named that cannot run it stays, refused plan by plan with the rule's reason."""
    from autotune.commands.plan import run_setting_engines
    from autotune.specs.plan import ENGINE_NAMES

    assert run_setting_engines(argparse.Namespace(engine=list(ENGINE_NAMES), mtp_layers=1)) == ("megatron",)
    assert run_setting_engines(argparse.Namespace(engine=list(ENGINE_NAMES), mtp_layers=None)) == tuple(ENGINE_NAMES)
    assert run_setting_engines(argparse.Namespace(engine=["fsdp", "megatron"], mtp_layers=1)) == ("fsdp", "megatron")


def test_the_search_gives_every_layout_the_mtp_modules():
    cluster = load_cluster(gpu=GPU, num_gpus=16)
    c = SearchConstraints(engines=("megatron",), tp=2, ep=4, zero_stages=(1,), recompute=("full",),
                          micro_batch_size=1, mtp_layers=1)
    result = search_plans(QWEN, cluster, seq_len=4096, global_batch_size=64, constraints=c, top_k=50)
    plans = [cand.plan for cand in result.candidates]
    assert plans and all(p.mtp_layers == 1 for p in plans)
    assert any(p.pp > 1 for p in plans), [p.pp for p in plans]  # MTP runs with a pipeline, unlike act. offload


# ---- the files -----------------------------------------------------------------------------------------------------
def test_megatron_args_and_bridge_overrides_state_mtp(tmp_path):
    cluster, plan = _qwen_plan()
    files = _files(cluster, plan)
    argv, _, _ = parse_shell_args_with_lines(files["megatron_args.sh"])
    assert argv[argv.index("--mtp-num-layers") + 1] == "1"
    assert "--mtp-loss-scaling-factor" not in argv  # Megatron's 0.1 stays
    assert "model.mtp_num_layers=1" in files["bridge_overrides.args"].split()
    assert "mtp_loss_scaling_factor" not in files["bridge_overrides.yaml"]
    path = tmp_path / "bridge_overrides.yaml"
    path.write_text(files["bridge_overrides.yaml"])
    assert bridge_fields(str(path), [])["mtp_layers"] == 1  # read back
    path.write_text(files["bridge_overrides.yaml"].replace("mtp_num_layers: 1", "mtp_num_layers: 0"))
    assert "mtp_layers" not in bridge_fields(str(path), [])  # 0: Megatron builds no MTP block
    plain = _files(cluster, plan.with_(mtp_layers=None))
    assert "mtp" not in plain["megatron_args.sh"] and "mtp_num_layers" not in plain["bridge_overrides.yaml"]


def test_deepseek_v3s_bridge_recipe_is_told_the_plans_mtp_modules():
    """Bridge's DeepSeek-V3 recipe trains one MTP module unless told (mtp_num_layers = 1, recipes/deepseek/h100/
    deepseek_v3.py): a plan without MTP writes null, as its Megatron-LM arguments train none."""
    model = load_model_preset("deepseek-v3")
    cluster = load_cluster(gpu=GPU, num_gpus=256)
    plan = make_plan(model, cluster, engine="megatron", tp=2, pp=8, ep=32, etp=1, zero_stage=1, seq_len=4096,
                     global_batch_size=1024, recompute="full")
    files = _files(cluster, plan, model)
    assert "model.mtp_num_layers=null" in files["bridge_overrides.args"].split()
    assert "--mtp-num-layers" not in files["megatron_args.sh"]
    files = _files(cluster, plan.with_(mtp_layers=1), model)
    assert "model.mtp_num_layers=1" in files["bridge_overrides.args"].split()
    assert "--mtp-num-layers 1" in " ".join(parse_shell_args_with_lines(files["megatron_args.sh"])[0])


def test_a_spelled_out_pipeline_layout_places_the_mtp_modules_before_the_loss():
    """pipeline_parallel_layer_layout.py:111-137 at d98e8a6: the layout holds one "m" per MTP module, after every
    decoder layer, all in the last stage."""
    cluster, plan = _qwen_plan(24, pp=3, vpp=3, global_batch_size=96)
    argv, _, _ = parse_shell_args_with_lines(_files(cluster, plan)["megatron_args.sh"])
    layout = argv[argv.index("--pipeline-model-parallel-layout") + 1]
    assert layout.endswith("tmL") and layout.count("m") == 1 and layout.count("t") == QWEN.num_layers, layout
    plain, _, _ = parse_shell_args_with_lines(_files(cluster, plan.with_(mtp_layers=None))["megatron_args.sh"])
    assert "m" not in plain[plain.index("--pipeline-model-parallel-layout") + 1]


_VALIDATE_LAYOUT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
out = []
for layout, pp, layers, mtp in json.loads(sys.argv[2]):
    try:
        PipelineParallelLayerLayout(layout, pp).validate_layer_layout(num_layers=layers, mtp_num_layers=mtp)
        out.append("ok")
    except AssertionError as e:
        out.append(str(e) or "rejected")
print(json.dumps(out))
"""


@needs_oracle
@pytest.mark.slow
def test_megatron_core_validates_the_layout_with_its_mtp_modules():
    """Megatron-core's own PipelineParallelLayerLayout.validate_layer_layout (run by TransformerConfig, which the
    argument oracle does not build) takes the layout written for the MTP plan, and refuses it without the "m"."""
    cluster, plan = _qwen_plan(24, pp=3, vpp=3, global_batch_size=96)
    argv, _, _ = parse_shell_args_with_lines(_files(cluster, plan)["megatron_args.sh"])
    layout = argv[argv.index("--pipeline-model-parallel-layout") + 1]
    cases = [(layout, 3, QWEN.num_layers, 1), (layout.replace("m", ""), 3, QWEN.num_layers, 1)]
    proc = subprocess.run([sys.executable, "-c", _VALIDATE_LAYOUT, str(ORACLE.parent), json.dumps(cases)],
                          capture_output=True, text=True, timeout=300, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got[0] == "ok" and "mtp layers in layout must match" in got[1], got


@needs_oracle
@pytest.mark.slow
@pytest.mark.parametrize(("num_gpus", "kw"), [(16, {}), (24, {"pp": 3, "vpp": 3, "global_batch_size": 96})],
                         ids=["even", "layout"])
def test_megatron_lm_accepts_the_mtp_arguments(oracle, tmp_path, num_gpus, kw):
    """parse_args + validate_args at d98e8a6 take the arguments, an even split and a spelled-out layout alike (the
    layout's own MTP check is TransformerConfig's: the test above)."""
    cluster, plan = _qwen_plan(num_gpus, **kw)
    path = tmp_path / "megatron_args.sh"
    path.write_text(_files(cluster, plan)["megatron_args.sh"])
    argv, _, env = parse_shell_args_with_lines(path.read_text())
    assert "--mtp-num-layers 1" in " ".join(argv), argv
    verdict = oracle(num_gpus, args_file=path, env={"CUDA_DEVICE_MAX_CONNECTIONS": env.get(
        "CUDA_DEVICE_MAX_CONNECTIONS", "1")})
    assert verdict["ok"], f"Megatron-LM rejects the MTP plan's arguments: {verdict}\n{path.read_text()}"


@needs_oracle
@pytest.mark.slow
def test_megatron_lm_refuses_mtp_where_the_rule_does(oracle, tmp_path):
    """The position-embedding rule agrees with Megatron-LM: a learned-position model's arguments with
    --mtp-num-layers added are rejected by validate_args, as autotune refuses the plan."""
    model = load_model_preset("megatron-gpt-1.7b")
    cluster = load_cluster(gpu=GPU, num_gpus=8)
    plan = make_plan(model, cluster, engine="megatron", zero_stage=1, seq_len=2048, global_batch_size=64)
    argv, _, _ = parse_shell_args_with_lines(_files(cluster, plan, model)["megatron_args.sh"])
    assert oracle(8, argv=argv)["ok"]
    verdict = oracle(8, argv=[*argv, "--mtp-num-layers", "1"])
    assert not verdict["ok"] and "Multi-Token Prediction" in verdict.get("error", ""), verdict
    with pytest.raises(InputError, match="Multi-Token Prediction"):
        make_plan(model, cluster, engine="megatron", zero_stage=1, seq_len=2048, global_batch_size=64, mtp_layers=1)
