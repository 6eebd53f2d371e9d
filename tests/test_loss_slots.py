"""The output layer and loss as K layer slots of the pipeline split (``ParallelPlan.loss_slots``, --loss-slots):
the split (``layout.split_scheme`` megatron+lossK: L + 1 + K slots over pp x vpp, the earlier virtual stages one
more; K = 1 Megatron-core's --account-for-embedding/loss-in-pipeline-split), the refusals, what it costs (the last
stage's fewer layers in its time and memory), the CLI, the opt-in search, the emitted files, their read-back and
Megatron-LM's own parser on them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.cli import build_parser, main
from autotune.commands.estimate import estimate_from_flags
from autotune.cost.activations import stage_activation_bytes
from autotune.emit.megatron_layout import megatron_split, read_loss_slots, split_flags
from autotune.engines import engine_for
from autotune.errors import InputError
from autotune.job_files import read_job
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints, dimension_values
from autotune.specs.layout import layer_counts, split_scheme, stage_param_groups, virtual_layout
from autotune.specs.loading import load_cluster
from autotune.specs.notation import plan_notation
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset

REPO = Path(__file__).resolve().parents[1]
ORACLE = REPO.parent / "shared" / "oracles" / "megatron-lm" / "megatron_args_check.py"
QWEN = ["--model", "qwen3-235b-a22b", "--gpu", "gb200", "--num-gpus", "256", "--gpus-per-node", "64",
        "--engine", "megatron", "--zero", "1", "--seq-len", "4096", "--global-batch", "8192", "--micro-batch", "1",
        "--ep", "32", "--precision", "fp8", "--fp8-recipe", "te-mxfp8", "--recompute", "none", "--pp", "8",
        "--vpp", "3"]


def _split(num_layers, pp, vpp, k, mtp=None):
    return virtual_layout(num_layers, pp, vpp, split_scheme("megatron", mtp, num_layers, pp, vpp, k))


def _spread(num_layers, pp, vpp, k):
    """The definition, written out: L + 1 + k slots over pp x vpp virtual stages, the earlier ones one more; the
    first gives one to the embedding, the last k to the output layer and loss."""
    base, rest = divmod(num_layers + 1 + k, pp * vpp)
    out = [base + (i < rest) for i in range(pp * vpp)]
    out[0] -= 1
    out[-1] -= k
    return tuple(out)


@pytest.mark.parametrize("num_layers, pp, vpp", [(94, 8, 3), (30, 2, 4), (62, 4, 4), (126, 16, 1), (46, 8, 1)])
def test_one_slot_is_the_account_for_split(num_layers, pp, vpp):
    # where (L + 2) divides over the virtual stages, Megatron-core's flags give L + 2 slots evenly (arguments.py:
    # 962-967, transformer_block.py:148-201): the same split, and the emitter writes those flags for it
    assert (num_layers + 2) % (pp * vpp) == 0
    per = (num_layers + 2) // (pp * vpp)
    assert _split(num_layers, pp, vpp, 1) == (per - 1, *[per] * (pp * vpp - 2), per - 1)
    if vpp > 1:
        flags = split_flags(megatron_split(num_layers, pp, vpp, loss_slots=1))
        assert flags == ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                         "--num-layers-per-virtual-pipeline-stage", str(per)]


@pytest.mark.parametrize("num_layers", [32, 61, 80, 94, 126])
@pytest.mark.parametrize("pp, vpp", [(2, 1), (4, 1), (4, 3), (8, 1), (8, 3), (16, 2)])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
def test_the_split_spreads_the_slots_over_the_virtual_stages(num_layers, pp, vpp, k):
    split = _split(num_layers, pp, vpp, k)
    spread = _spread(num_layers, pp, vpp, k)
    if min(spread[1:-1], default=1) < 1 or min(spread[0], spread[-1]) < 0:
        assert split is None  # a virtual stage with neither a layer, the embedding nor the loss
    else:
        assert split == spread and sum(split) == num_layers


def test_more_slots_move_layers_off_the_last_stage():
    # Qwen3-235B, 94 layers on pp 8: the engine's own split is 11 | 12 x 6 | 11
    assert layer_counts(94, 8) == (11, *[12] * 6, 11)
    lasts = [layer_counts(94, 8, split_scheme("megatron", None, 94, 8, 3, k))[-1] for k in (1, 2, 3, 4)]
    assert lasts == [11, 10, 9, 8]
    assert _split(94, 8, 3, 4)[-1] == 0  # the last virtual stage holds the loss alone ("L")
    assert _split(94, 8, 3, 5) is None  # 5 slots > the last virtual stage's 4: it would hold less than nothing
    assert split_scheme("megatron", None, 94, 8, 3) == "megatron"  # None: the engine's own, unchanged
    assert split_scheme("uniform", None, 94, 8, 1, 3) == "uniform"  # other engines' splits do not take it


def test_with_mtp_modules_the_slots_add_up():
    # DeepSeek-V3, 61 layers pp 16, one MTP module (2 slots) + 2 loss slots: 66 slots, the last stage "mL"
    split = _split(61, 16, 1, 2, mtp=1)
    assert split == (4, 5, *[4] * 13, 0) and sum(split) == 61
    assert megatron_split(61, 16, 1, 1, 2).layout.endswith("|mL")
    assert _split(61, 16, 1, 1, mtp=1) == (4, 4, *[4] * 13, 1) == virtual_layout(61, 16, 1, "megatron+mtp1")


def test_the_plan_checks_the_value():
    plan = ParallelPlan(pp=2, dp=1, global_batch_size=1, engine="megatron", loss_slots=3)
    assert plan.to_dict()["loss_slots"] == 3 and ParallelPlan(**plan.to_dict()) == plan
    assert "loss_slots" not in plan.with_(loss_slots=None).to_dict()
    for bad in (0, -1, True, "2", 1.5):
        with pytest.raises(InputError, match="loss_slots must be a positive integer or absent"):
            ParallelPlan(pp=2, loss_slots=bad)
    with pytest.raises(InputError, match=r"no pipeline \(pp=1\): use --pp 2 or more, or drop --loss-slots"):
        ParallelPlan(loss_slots=2)
    assert plan_notation(plan).startswith("tp1 pp2 loss-slots3 ") and "loss-slots" not in plan_notation(
        plan.with_(loss_slots=None))


def _time(*extra):
    return estimate_from_flags(build_parser().parse_args(["estimate", *QWEN, *extra])).time


def test_more_slots_speed_the_slowest_stage_of_qwen3_235b():
    # with the EP all-to-alls overlapped (as NVIDIA's recipes run it), the last stage's output layer and loss are
    # ~3 layers' time: 3 or 4 slots make the slowest stage faster than Megatron's account-for split (1) and the step
    # faster; 1 is the engine's own split for these 94 layers (11 | 12 x 6 | 11)
    overlap = ("--ep-overlap", "a2a")
    times = {k: _time(*overlap, "--loss-slots", str(k)) for k in (1, 3, 4)}
    own = _time(*overlap)
    slowest = {k: max(t for _, _, t in times[k].stage_times_s) for k in times}
    assert own.stage_times_s == times[1].stage_times_s
    assert max(own.stage_times_s, key=lambda s: s[2])[0] == 7  # the last stage, over the middle ones
    for k in (3, 4):
        assert slowest[k] < slowest[1] and times[k].tokens_per_s > times[1].tokens_per_s
        assert dict((s, n) for s, n, _ in times[k].stage_times_s)[7] == 12 - k
    # without the overlap the head is worth less than two layers: 2 slots (12 x 7 | 10) is the fastest
    plain = {k: _time("--loss-slots", str(k)) for k in (1, 2, 3)}
    assert plain[2].tokens_per_s > plain[1].tokens_per_s > plain[3].tokens_per_s


def test_memory_follows_the_stage_layers():
    model = load_model_preset("qwen3-235b-a22b")
    cluster = load_cluster(gpu="gb200", num_gpus=256, gpus_per_node=64)
    one = make_plan(model, cluster, engine="megatron", pp=8, vpp=3, ep=32, zero_stage=1, seq_len=4096,
                    global_batch_size=8192, recompute="none", loss_slots=1)
    four = one.with_(loss_slots=4)
    layer = model.layer_params(model.num_layers - 1).total
    engine = engine_for(one)
    facts = engine.activation_facts(one)
    for plan in (one, four):
        scheme = engine.layer_split_of(plan, model.num_layers)
        counts = layer_counts(model.num_layers, 8, scheme)
        params = [stage_param_groups(model, plan, s, scheme).total for s in range(8)]
        # the middle stages' parameters are their layers'; the ends' differ by the embedding / output layer only
        for s in range(1, 7):
            assert params[s] == pytest.approx(counts[s] * layer, rel=1e-9)
        assert params[7] - params[6] == pytest.approx((counts[7] - counts[6]) * layer + model.output_params().total,
                                                      rel=1e-9)
    # activations: without interleaving (the last stage's last chunk frees its own at once, so vp3's peak on the
    # last stage holds its first two chunks' alone, 4 + 4 layers either way) a stage's follow its layers
    flat = [p.with_(vpp=1) for p in (one, four)]
    schemes = [engine.layer_split_of(p, model.num_layers) for p in flat]
    acts = [[sum(stage_activation_bytes(model, p, s, facts, scheme).values()) for s in (1, 7)]
            for p, scheme in zip(flat, schemes)]
    assert [layer_counts(94, 8, scheme)[1::6] for scheme in schemes] == [(12, 11), (13, 8)]
    assert acts[1][1] < acts[0][1] and acts[1][0] > acts[0][0]
    ledger1, ledger4 = estimate(model, cluster, one).memory, estimate(model, cluster, four).memory
    assert ledger4.total > ledger1.total and ledger4.stage != 7  # a 13-layer stage now holds the most


@pytest.mark.parametrize("flags, words", [
    (["--engine", "deepspeed", "--zero", "1", "--pp", "2"], "its files cannot give the output layer and loss 2 layer "
                                                            "slots of the pipeline split (Megatron-core's --pipeline-"
                                                            "model-parallel-layout, torchtitan's pipeline_parallel_"
                                                            "last_stage_less_layers): use --engine megatron or fsdp, "
                                                            "or drop --loss-slots"),
    (["--engine", "megatron"], "no pipeline (pp=1): use --pp 2 or more, or drop --loss-slots"),
])
def test_the_cli_refuses_it_where_it_cannot_run(capsys, flags, words):
    argv = ["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", *flags,
            "--loss-slots", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_the_cli_refuses_a_k_that_empties_a_virtual_stage(capsys, tmp_path):
    assert main(["estimate", *QWEN, "--loss-slots", "5"]) == 2
    err = capsys.readouterr().err
    assert ("--loss-slots 5: 94 layers + the embedding's slot + 5 loss slots over pp x vpp = 8 x 3 virtual stages "
            "leave one with no layer, neither the embedding nor the loss: use --loss-slots 4 or less") in err
    assert main(["emit", *QWEN, "--loss-slots", "5", "--out", str(tmp_path / "job")]) == 2
    assert "--loss-slots 4 or less" in capsys.readouterr().err and not (tmp_path / "job").exists()
    assert main(["estimate", *QWEN, "--loss-slots", "0"]) == 2
    assert "leave --loss-slots out for the engine's own pipeline split" in capsys.readouterr().err


def test_the_search_takes_them_only_with_uneven_layouts():
    model = load_model_preset("llama3-70b")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=64)
    kw = dict(seq_len=8192, global_batch_size=256, top_k=10**6, ties=False)
    default = SearchConstraints(engines=("megatron",))
    assert dimension_values(model, cluster, 8192, 256, default).loss_slots == ()
    assert all(e.plan.loss_slots is None for e in search_plans(model, cluster, constraints=default, **kw).ranked)
    uneven = search_plans(model, cluster, constraints=SearchConstraints(engines=("megatron",), uneven_layouts=True),
                          **kw)
    slots = {e.plan.loss_slots for e in uneven.ranked}
    assert slots - {None} and slots <= {None, 2, 3, 4, 5, 6}
    assert all(e.plan.pp > 1 for e in uneven.ranked if e.plan.loss_slots)
    assert uneven.rejections.get("megatron:loss_slots", 0) > 0  # the ks that empty a virtual stage, counted
    # each k searched has its own split: the engine's own or a smaller k's are not searched twice
    for e in uneven.ranked:
        if e.plan.loss_slots:
            p = e.plan
            scheme = split_scheme("megatron", None, 80, p.pp, p.vpp, p.loss_slots)
            assert layer_counts(80, p.pp, scheme) != layer_counts(80, p.pp)


def test_emit_and_read_back(tmp_path, capsys):
    out = tmp_path / "job"
    assert main(["emit", *QWEN, "--loss-slots", "3", "--out", str(out)]) == 0
    capsys.readouterr()
    args = (out / "megatron_args.sh").read_text()
    layout = "Etttt|ttttt|" + "tttt|" * 21 + "tL"
    assert f"--pipeline-model-parallel-layout '{layout}'" in args
    assert f"pipeline_model_parallel_layout: {layout}" in (out / "bridge_overrides.yaml").read_text()
    assert main(["estimate", *QWEN, "--loss-slots", "3", "--json"]) == 0
    stated = json.loads(capsys.readouterr().out)
    for name in ("megatron_args.sh", "bridge_overrides.yaml", "bridge_overrides.args", "plan.json"):
        assert main(["estimate", "--from", str(out / name), "--gpu", "gb200", "--num-gpus", "256",
                     "--gpus-per-node", "64", "--json"]) == 0, name
        read = json.loads(capsys.readouterr().out)
        assert read["plan"] == stated["plan"] and read["plan"]["loss_slots"] == 3, name
        assert read["time"]["tokens_per_s"] == pytest.approx(stated["time"]["tokens_per_s"], rel=1e-9), name
        assert read["time"]["stage_times_s"] == stated["time"]["stage_times_s"], name


def test_read_back_of_the_other_split_flags(tmp_path):
    # vpp 1: K = 2 of 94 layers on pp 8 is 12 x 7 | 10, which the first / last flags give
    assert split_flags(megatron_split(94, 8, 1, loss_slots=2)) == [
        "--decoder-first-pipeline-num-layers", "12", "--decoder-last-pipeline-num-layers", "10"]
    assert read_loss_slots(94, 8, 1, first=12, last=10) == (True, 2)
    assert read_loss_slots(94, 8, 1, first=11, last=11) == (True, None)  # the engine's own split
    assert read_loss_slots(94, 8, 1, first=5, last=5) == (False, None)  # no even middle
    assert read_loss_slots(94, 8, 3) == (True, None)  # no split flags: the engine's own
    model = load_model_preset("qwen3-235b-a22b")
    cluster = load_cluster(gpu="gb200", num_gpus=256, gpus_per_node=64)
    plan = make_plan(model, cluster, engine="megatron", pp=8, ep=32, zero_stage=1, seq_len=4096,
                     global_batch_size=8192, recompute="none", loss_slots=2)
    path = tmp_path / "megatron_args.sh"
    path.write_text(render_bundle(estimate(model, cluster, plan)).files["megatron_args.sh"])
    assert read_job([str(path)], gpu="gb200", num_gpus=256, gpus_per_node=64).plan == plan


@pytest.mark.slow  # the Megatron-LM oracle is a process of its own (its imports take ~7 s)
@pytest.mark.skipif(not ORACLE.is_file(), reason=f"Megatron-LM oracle not found at {ORACLE}")
@pytest.mark.parametrize("flags", [["--loss-slots", "3"], ["--loss-slots", "4"], ["--loss-slots", "2", "--vpp", "1"]])
def test_megatron_lm_parses_the_emitted_split(tmp_path, capsys, flags):
    out = tmp_path / "job"
    assert main(["emit", *QWEN, *flags, "--out", str(out)]) == 0
    capsys.readouterr()
    run = subprocess.run(["bash", "-c", f'source megatron_args.sh && python "{ORACLE}" --world-size 256 -- '
                                        '"${MEGATRON_ARGS[@]}"'], cwd=out, capture_output=True, text=True, timeout=600)
    verdict = json.loads(run.stdout.strip().splitlines()[-1])
    assert verdict["ok"] is True, verdict
    assert verdict["pipeline_model_parallel_size"] == 8


def test_a_layout_autotune_cannot_write_reads_back_as_the_k_with_the_same_rank_loads(tmp_path):
    # NVIDIA's Llama-3 70B FP8 H100 recipe (Megatron-Bridge 067f987 perf_recipes/llama/h100/llama3.py) states
    # 'Et*2|(t*2|)*34,t*3|(t*2|)*3,tL' over pp 8 x vpp 5: ranks 10, 10, 10, 11, 10, 10, 10, 9 layers, the loss on the
    # last; --loss-slots 1 loads them alike (its extra layer on rank 1). A layout no K loads alike stays the engine's.
    model = load_model_preset("llama3-70b")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=64)
    plan = make_plan(model, cluster, engine="megatron", tp=4, pp=8, vpp=5, zero_stage=1, seq_len=8192,
                     global_batch_size=256, recompute="none", loss_slots=1)
    emitted = render_bundle(estimate(model, cluster, plan)).files["megatron_args.sh"]
    ours = megatron_split(80, 8, 5, loss_slots=1).layout
    assert f"'{ours}'" in emitted
    for layout, k, note in (("Et*2|(t*2|)*34,t*3|(t*2|)*3,tL", 1, "estimated as --loss-slots 1"),
                            ("Et*3|(t*2|)*37,t*2|tL", None, "not one autotune models")):  # rank 0: 11
        path = tmp_path / "megatron_args.sh"
        path.write_text(emitted.replace(f"'{ours}'", f"'{layout}'"))
        job = read_job([str(path)], gpu="h100-sxm-80gb", num_gpus=64)
        assert job.plan.loss_slots == k, layout
        assert any(note in n for n in job.notes), job.notes
