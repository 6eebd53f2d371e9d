"""Megatron-core's uneven pipeline layouts and MoE parallel folding (issue 17, item 2): NVIDIA's own Megatron-Bridge
layouts are accepted on the Megatron engine, with their per-stage layer counts in the ledger and the step time,
and emitted as the flags that make Megatron-LM build the same split; other engines keep their refusals.

The Megatron-LM oracle (``../shared/oracles/megatron-lm``) judges the emitted arguments (parse_args +
validate_args) and, through Megatron-core's own ``get_num_layers_to_build`` / ``PipelineParallelLayerLayout``,
the layers each virtual stage builds; those tests skip where ../shared is absent (CI has it beside the checkout).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.cli import main
from autotune.emit.megatron_layout import megatron_split
from autotune.emit.shell_args import parse_shell_args
from autotune.errors import InputError
from autotune.rules import plan_problems
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.layout import (
    classic_megatron_split,
    layer_counts,
    stage_layers,
    virtual_layout,
)
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

REPO = Path(__file__).resolve().parents[2]
ORACLE_DIR = REPO.parent / "shared" / "oracles" / "megatron-lm"
ORACLE = ORACLE_DIR / "megatron_args_check.py"
WORKER = REPO / "tests" / "emit" / "fixtures" / "megatron_oracle_worker.py"
needs_oracle = pytest.mark.skipif(not ORACLE.is_file(), reason=f"Megatron-LM oracle not found at {ORACLE} "
                                                                "(../shared is beside the checkout in CI only)")

# NVIDIA's layouts (bench/data/nvidia_recipes_blackwell.csv, Megatron-Bridge performance summary) that were refused.
NVIDIA = {
    "llama405b-tp8-pp8-vpp8-cp2": ("llama3-405b", "gb200", 256, dict(tp=8, pp=8, vpp=8, cp=2, seq_len=8192,
                                                                      micro_batch_size=1), 1536, "bf16"),
    "deepseek-v3-pp8-vpp4-ep32": ("deepseek-v3", "gb300", 256, dict(tp=1, pp=8, vpp=4, ep=32, seq_len=4096,
                                                                     micro_batch_size=1), 4096, "fp8"),
    "deepseek-v3-pp16-ep16": ("deepseek-v3", "gb300", 256, dict(tp=1, pp=16, ep=16, seq_len=4096,
                                                                 micro_batch_size=1), 4096, "fp8"),
    "qwen3-235b-tp2-pp8-vpp4-ep32-etp1": ("qwen3-235b-a22b", "gb200", 256, dict(tp=2, pp=8, vpp=4, ep=32, etp=1,
                                                                                 seq_len=4096, micro_batch_size=1),
                                          2048, "fp8"),
}


def _estimate(name):
    preset, gpu, n, kw, gbs, precision = NVIDIA[name]
    model, cluster = load_model_preset(preset), load_cluster(gpu=gpu, num_gpus=n, gpus_per_node=64)
    plan = make_plan(model, cluster, global_batch_size=gbs, engine="megatron", zero_stage=1, precision=precision,
                     **kw)
    return estimate(model, cluster, plan)


# ---- per-stage layer counts, by hand ---------------------------------------------------------------------------

def test_stage_layer_counts_by_hand():
    # 405B: 126 layers + embedding + loss = 128 slots, 16 a stage: 15, 16 x 6, 15; two slots a virtual stage.
    assert layer_counts(126, 8) == (15, 16, 16, 16, 16, 16, 16, 15)
    assert virtual_layout(126, 8, 8) == (1,) + (2,) * 62 + (1,)
    # DeepSeek-V3: 61 layers, 63 slots. pp16: 3 + 14 x 4 + 2; pp8: 7 + 6 x 8 + 6, and with vpp 4 NVIDIA's
    # "Et|(tt|)*30L": the embedding with one layer, 30 chunks of two, the loss alone.
    assert layer_counts(61, 16) == (3,) + (4,) * 14 + (2,)
    assert layer_counts(61, 8) == (7, 8, 8, 8, 8, 8, 8, 6)
    assert virtual_layout(61, 8, 4) == (1,) + (2,) * 30 + (0,)
    # Qwen3-235B: 94 layers + 2 = 96 slots: 11, 12 x 6, 11; three slots a virtual stage at vpp 4.
    assert layer_counts(94, 8) == (11,) + (12,) * 6 + (11,)
    assert virtual_layout(94, 8, 4) == (2,) + (3,) * 30 + (2,)
    # A stage's layers are contiguous in the ledger: DeepSeek pp16 stage 0 holds layers 0-2 (its 3 dense layers).
    assert stage_layers(61, 16, 0) == (0, 3) and stage_layers(61, 16, 15) == (59, 2)
    # The classic splits (the planner's default space) are unchanged: even, halved first/last, L % (pp x vpp).
    assert layer_counts(126, 16) == (7,) + (8,) * 14 + (7,)
    assert classic_megatron_split(126, 16) and not classic_megatron_split(126, 8, 8)
    assert not classic_megatron_split(61, 16) and classic_megatron_split(64, 8, 4)


def test_flags_chosen_for_each_split():
    assert megatron_split(64, 8, 4).kind == "even" and megatron_split(64, 8, 4).layers_per_virtual_stage == 2
    s = megatron_split(126, 8, 8)
    assert (s.kind, s.account_embedding, s.account_loss, s.layers_per_virtual_stage) == ("account", True, True, 2)
    s = megatron_split(126, 16, 1)  # the halved split stays --decoder-first/last (as before)
    assert (s.kind, s.first, s.last) == ("first_last", 7, 7)
    s = megatron_split(61, 16, 1)
    assert (s.kind, s.first, s.last) == ("first_last", 3, 2)
    s = megatron_split(61, 8, 4)
    assert s.kind == "layout" and s.layout == "Et|" + "tt|" * 30 + "L"
    assert megatron_split(4, 2, 4) is None  # 4 layers + 2 slots cannot fill 8 virtual stages


# ---- the NVIDIA layouts estimate, fit and emit -----------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(NVIDIA))
def test_nvidia_layouts_estimate_and_fit(name):
    est = _estimate(name)
    assert est.memory.fits, (name, est.memory.total / 2**30)
    assert 0.15 < est.time.mfu < 0.8, (name, est.time.mfu)
    assert est.time.bubble_s < 0.2 * est.time.step_time_s


def test_ledger_and_step_time_follow_the_stage_layer_counts():
    """405B pp8: the most loaded stage is a 16-layer middle one, not the 15-layer first or last (which also hold
    the embedding / output layer); DeepSeek-V3 pp16: the 2-layer last stage holds fewer layers than a middle one."""
    est = _estimate("llama405b-tp8-pp8-vpp8-cp2")
    assert 0 < est.memory.stage < 7
    from autotune.cost.step_time import _stage_layer_counts

    model, plan = est.model, est.plan
    assert sum(_stage_layer_counts(model, plan, 0, "megatron")) == 15
    assert sum(_stage_layer_counts(model, plan, 3, "megatron")) == 16
    ds = _estimate("deepseek-v3-pp16-ep16")
    assert _stage_layer_counts(ds.model, ds.plan, 0, "megatron") == (3, 0)  # DeepSeek-V3's three dense layers
    assert _stage_layer_counts(ds.model, ds.plan, 15, "megatron") == (0, 2)


def _argv(est) -> list[str]:
    parsed = parse_shell_args(render_bundle(est).files["megatron_args.sh"])
    return list(parsed[0] if isinstance(parsed, tuple) else parsed)


def test_emitted_flags():
    argv = _argv(_estimate("llama405b-tp8-pp8-vpp8-cp2"))
    assert "--account-for-embedding-in-pipeline-split" in argv and "--account-for-loss-in-pipeline-split" in argv
    assert argv[argv.index("--num-layers-per-virtual-pipeline-stage") + 1] == "2"
    argv = _argv(_estimate("deepseek-v3-pp16-ep16"))
    assert argv[argv.index("--decoder-first-pipeline-num-layers") + 1] == "3"
    assert argv[argv.index("--decoder-last-pipeline-num-layers") + 1] == "2"
    argv = _argv(_estimate("deepseek-v3-pp8-vpp4-ep32"))
    assert argv[argv.index("--pipeline-model-parallel-layout") + 1] == "Et|" + "tt|" * 30 + "L"
    assert "--num-layers-per-virtual-pipeline-stage" not in argv  # the layout sets vpp (arguments.py:929)
    argv = _argv(_estimate("qwen3-235b-tp2-pp8-vpp4-ep32-etp1"))
    assert argv[argv.index("--expert-tensor-parallel-size") + 1] == "1"
    assert "--account-for-embedding-in-pipeline-split" in argv


def test_parallel_folding_shards_experts_over_ep_x_etp():
    est = _estimate("qwen3-235b-tp2-pp8-vpp4-ep32-etp1")
    folded, model, cluster = est.plan, est.model, est.cluster
    assert folded.expert_zero_partitions == 16 * 2 // 32  # world / (etp x ep x pp) = 256 / (1 x 32 x 8)
    # Without folding (etp = tp = 2) the same ep is refused, the fix named.
    problems = dict(plan_problems(model, cluster, folded.with_(etp=None)))
    assert "parallel_state.py:881" in problems["ep_dp"] and "use etp=1" in problems["ep_dp"]


# ---- other engines keep their rules ----------------------------------------------------------------------------

def test_other_engines_still_refuse_with_their_reasons():
    est = _estimate("llama405b-tp8-pp8-vpp8-cp2")
    model, cluster = est.model, est.cluster
    ds = dict(plan_problems(model, cluster, est.plan.with_(engine="deepspeed", zero_stage=1)))
    assert "deepspeed:vpp" in ds and "pp x vpp (8 x 8 = 64)" in ds["layers_vpp"]
    qwen = _estimate("qwen3-235b-tp2-pp8-vpp4-ep32-etp1")
    for engine in ("deepspeed", "fsdp"):
        rules = dict(plan_problems(qwen.model, qwen.cluster, qwen.plan.with_(engine=engine, vpp=1)))
        assert f"{engine}:etp" in rules and "parallel folding is Megatron-core's" in rules[f"{engine}:etp"]


# ---- bad layouts exit 2 with the rule named --------------------------------------------------------------------

def _cli(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_bad_layouts_exit_2_naming_the_rule(capsys):
    base = ["estimate", "--model", "tiny-llama", "--gpu", "h100-sxm-80gb", "--engine", "megatron",
            "--global-batch", "64"]
    code, out, err = _cli([*base, "--num-gpus", "4", "--pp", "4", "--vpp", "4"], capsys)
    assert code == 2 and out == ""
    assert "pp x vpp = 4 x 4 = 16 virtual stages" in err and "transformer_block.py" in err and "vpp=" in err
    code, out, err = _cli(["estimate", "--model", "qwen3-235b-a22b", "--gpu", "b200", "--num-gpus", "256",
                           "--engine", "megatron", "--tp", "2", "--pp", "8", "--ep", "32", "--global-batch", "2048"],
                          capsys)
    assert code == 2 and "etp x ep (2 x 32) must divide tp x dp x cp (32)" in err and "--etp" in err
    assert "parallel_state.py:881" in err
    code, out, err = _cli(["estimate", "--model", "qwen3-235b-a22b", "--gpu", "b200", "--num-gpus", "256",
                           "--engine", "megatron", "--tp", "2", "--pp", "8", "--ep", "32", "--etp", "1",
                           "--global-batch", "2048"], capsys)
    assert code == 0, err


def test_make_plan_refuses_an_empty_virtual_stage():
    model, cluster = load_model_preset("tiny-llama"), load_cluster(gpu="h100-sxm-80gb", num_gpus=4)
    with pytest.raises(InputError, match="pp x vpp"):
        estimate(model, cluster, make_plan(model, cluster, pp=4, vpp=4, engine="megatron", global_batch_size=16))


# ---- the planner: default space unchanged, uneven layouts opt-in -----------------------------------------------

def test_uneven_layouts_are_opt_in_in_the_search():
    model, cluster = load_model_preset("deepseek-v3"), load_cluster(gpu="gb300", num_gpus=256, gpus_per_node=64)
    common = dict(engines=("megatron",), tp=1, ep=32, pp=8, precisions=("fp8",), recompute=("selective",),
                  micro_batch_size=1, zero_stages=(1,))
    default = search_plans(model, cluster, seq_len=4096, global_batch_size=4096, top_k=50, ties=False,
                           constraints=SearchConstraints(**common))
    assert default.num_feasible == 0 and default.rejections  # 61 layers: no classic split over pp 8
    opened = search_plans(model, cluster, seq_len=4096, global_batch_size=4096, top_k=50, ties=False,
                          constraints=SearchConstraints(**common, uneven_layouts=True))
    assert opened.num_feasible > 0
    assert {e.plan.vpp for e in opened.ranked} >= {1, 4}


# ---- Megatron-LM itself ---------------------------------------------------------------------------------------

@needs_oracle
@pytest.mark.slow
def test_megatron_lm_accepts_the_emitted_arguments():
    proc = subprocess.Popen([sys.executable, str(WORKER), str(ORACLE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=str(REPO))
    try:
        for name in sorted(NVIDIA):
            est = _estimate(name)
            # argv, not the file: the oracle's file reader stops at the first ")" (DeepSeek's --moe-layer-freq).
            proc.stdin.write(json.dumps({"world_size": est.cluster.num_gpus, "argv": _argv(est)}) + "\n")
            proc.stdin.flush()
            verdict = json.loads(proc.stdout.readline())
            assert verdict["ok"], (name, verdict)
            assert verdict["data_parallel_size"] == est.plan.dp
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


_PLACEMENT = r"""
import json, sys, types
sys.path.insert(0, sys.argv[1])
from megatron.core.transformer.transformer_block import get_num_layers_to_build
from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
from megatron.core.transformer.enums import LayerType
out = []
for c in json.loads(sys.argv[2]):
    pp, vpp = c["pp"], c["vpp"]
    if c["layout"]:
        lay = PipelineParallelLayerLayout(c["layout"], pp)
        lay.validate_layer_layout(num_layers=c["num_layers"], mtp_num_layers=None)
        got = [lay.layout[s][v].count(LayerType.decoder) for v in range(vpp) for s in range(pp)]
    else:
        cfg = types.SimpleNamespace(
            pipeline_model_parallel_layout=None, num_layers=c["num_layers"], pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
            num_layers_in_first_pipeline_stage=c["first"], num_layers_in_last_pipeline_stage=c["last"],
            account_for_embedding_in_pipeline_split=c["emb"], account_for_loss_in_pipeline_split=c["loss"])
        got = [get_num_layers_to_build(cfg, vp_stage=v if vpp > 1 else None, pp_rank=s)
               for v in range(vpp) for s in range(pp)]
    out.append(got)
print(json.dumps(out))
"""


@needs_oracle
@pytest.mark.slow
def test_megatron_core_builds_the_split_the_ledger_assumed():
    """Megatron-core's get_num_layers_to_build / PipelineParallelLayerLayout, run on the flags we emit, place the
    layers on the virtual stages exactly as specs.layout.virtual_layout says (the cost model's split)."""
    cases = [(126, 8, 8), (126, 16, 1), (61, 16, 1), (61, 8, 4), (61, 4, 4), (94, 8, 4), (94, 4, 1), (64, 8, 4),
             (30, 4, 2), (15, 4, 1)]
    specs = []
    for layers, pp, vpp in cases:
        s = megatron_split(layers, pp, vpp)
        specs.append({"num_layers": layers, "pp": pp, "vpp": vpp, "layout": s.layout, "first": s.first,
                      "last": s.last, "emb": s.account_embedding, "loss": s.account_loss})
    run = subprocess.run([sys.executable, "-c", _PLACEMENT, str(ORACLE_DIR), json.dumps(specs)],
                         capture_output=True, check=False, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    for (layers, pp, vpp), placed in zip(cases, got, strict=True):
        assert tuple(placed) == virtual_layout(layers, pp, vpp), (layers, pp, vpp, placed)


@pytest.mark.parametrize("name", sorted(NVIDIA))
def test_emitted_arguments_read_back_as_the_same_plan(tmp_path, name):
    """`--from megatron_args.sh` reads vpp back from the account-for flags or the layout, and etp."""
    from autotune.job_files import read_job

    est = _estimate(name)
    path = tmp_path / "megatron_args.sh"
    path.write_text(render_bundle(est).files["megatron_args.sh"])
    job = read_job([str(path)], model=est.model.name, gpu=est.cluster.gpu.name, num_gpus=est.cluster.num_gpus,
                   gpus_per_node=64, cluster_path=None, seq_len=None, global_batch=None)
    got, want = job.plan, est.plan
    assert (got.tp, got.pp, got.vpp, got.cp, got.ep, got.etp) == (want.tp, want.pp, want.vpp, want.cp, want.ep,
                                                                   want.etp)
