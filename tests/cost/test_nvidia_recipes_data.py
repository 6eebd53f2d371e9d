"""bench/data/nvidia_recipes_blackwell.csv (NVIDIA's Megatron-Bridge performance summary on Blackwell) is well formed,
and bench/accuracy_nvidia_recipes.py estimates what it can express and gives a reason for the rest."""

from __future__ import annotations

import math
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from autotune.specs.presets import gpu_preset_names, load_gpu_preset

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import accuracy_nvidia_recipes as bench

ROWS = bench.load_rows()
SOURCE = re.compile(r"^NVIDIA-NeMo/Megatron-Bridge@[0-9a-f]{12}:docs/performance-summary(-archive)?\.md#L\d+$")
COUNTS = ("gpus", "gbs", "mbs", "seq", "tp", "pp", "cp", "vp", "ep")


def test_the_file_says_where_it_came_from_and_every_row_has_a_source():
    head = bench.DATA.read_text(encoding="utf-8").splitlines()[:3]
    assert all(line.startswith("#") for line in head) and "Megatron-Bridge" in head[1]
    assert len(ROWS) == 240
    assert all(SOURCE.match(r["source"]) for r in ROWS), [r["source"] for r in ROWS if not SOURCE.match(r["source"])]
    assert len({r["source"] for r in ROWS}) == len(ROWS)  # one table line per row


def test_numbers_parse_and_the_layout_divides_the_gpus_and_the_batch():
    for r in ROWS:
        n = {k: bench.count(r[k]) for k in COUNTS}
        assert all(v >= 1 for v in n.values()), r["source"]
        assert bench.count(r["fsdp"], 0) in (0, 64), r["source"]
        assert float(r["tokens_per_s_per_gpu"]) > 0 and float(r["model_tflops_per_gpu"]) > 0, r["source"]
        mp = n["tp"] * n["pp"] * n["cp"]
        assert n["gpus"] % mp == 0, r["source"]
        assert n["gbs"] % (n["mbs"] * (n["gpus"] // mp)) == 0, r["source"]
        assert n["seq"] in (4096, 8192), r["source"]


def test_throughput_and_tflops_columns_agree_row_by_row():
    # Model TFLOP/s over tokens/s is the FLOPs per token of one model at one sequence length: a typo in either
    # column shows as an outlier. NVIDIA's GPT-OSS FLOP count changed with container 26.06 (27.2 -> 32.6 GFLOP).
    per_token = defaultdict(list)
    for r in ROWS:
        era = r["container"] >= "26.06" if r["model"].startswith("GPT OSS") else True
        per_token[(r["model"], r["seq"], r["task"], era)].append(
            float(r["model_tflops_per_gpu"]) * 1e3 / float(r["tokens_per_s_per_gpu"]))
    for key, values in per_token.items():
        assert max(values) / min(values) < 1.04, (key, min(values), max(values))


def test_every_system_maps_to_a_gpu_preset_with_its_datasheet_peaks():
    assert {r["system"] for r in ROWS} == set(bench.SYSTEM_PRESETS)
    assert set(bench.SYSTEM_PRESETS.values()) <= set(gpu_preset_names())
    # Dense peaks of the datasheets (sparse figures halved): B200 / B300 2250 bf16, GB200 / GB300 2500.
    for name, bf16 in (("b200", 2250), ("b300", 2250), ("gb200", 2500), ("gb300", 2500)):
        gpu = load_gpu_preset(name)
        assert gpu.peak_tflops["bf16"] == bf16 and gpu.peak_tflops["fp8"] == 2 * bf16
        assert gpu.hbm_bandwidth_gb_per_s == 8000 and gpu.memory_gib > 170


@pytest.fixture(scope="module")
def cases():
    out = [bench.express(r) for r in ROWS]
    for c in out:
        if not c.reason:
            bench.estimate_case(c)
    return out


def _dense_llama(c) -> bool:
    r = c.row
    return (r["model"].startswith("LLAMA3") and not r["task"].startswith("LoRA")
            and bench.count(r["fsdp"], 0) == 0)


def test_each_expressible_llama3_row_gets_a_finite_estimate(cases):
    llama = [c for c in cases if _dense_llama(c)]
    assert len(llama) >= 20
    estimated = [c for c in llama if c.predicted is not None]
    for c in estimated:
        assert math.isfinite(c.predicted) and c.predicted > 0 and isinstance(c.fits, bool), c.row["source"]
        assert c.result.plan.engine == "megatron" and c.result.plan.zero_stage == 1
        assert (c.result.plan.tp, c.result.plan.pp, c.result.plan.micro_batch_size) == (
            bench.count(c.row["tp"]), bench.count(c.row["pp"]), bench.count(c.row["mbs"]))
        assert abs(c.error) < 1.0, (c.row["source"], c.error)  # within a factor of two of the measurement
    # Llama 3 8B and 70B are estimated on all three kinds of node; a dense Llama row the tool cannot express
    # is a layout it rejects, with its own message.
    assert {c.gpu for c in estimated} >= {"b200", "gb200", "gb300"}
    assert {c.row["model"] for c in estimated} >= {"LLAMA3_8B", "LLAMA3_70B"}
    for c in llama:
        assert c.predicted is not None or c.reason.startswith("autotune estimate: invalid plan"), c.reason


def test_every_row_not_estimated_carries_its_reason(cases):
    skipped = [c for c in cases if c.predicted is None]
    assert skipped and all(c.reason.strip() for c in skipped)
    by_model = {c.row["model"]: c.reason for c in skipped}
    assert "Mamba" in by_model["Nemotron_3_Super"]
    # NVFP4 rows of a modelled family are estimated as --precision fp4 (Transformer Engine NVFP4BlockScaling)
    nvfp4 = [c for c in cases if c.row["precision"] == "NVFP4" and c.row["model"].startswith("LLAMA3")]
    assert len(nvfp4) >= 18 and all(c.predicted is not None and c.result.plan.precision == "fp4" for c in nvfp4)
    # Megatron-FSDP rows are estimated as the Megatron engine's ZeRO-3 (optim_grads_params)
    fsdp = [c for c in cases if bench.count(c.row["fsdp"], 0) > 0]
    assert fsdp and all(c.predicted is not None and "--zero" in c.argv and c.argv[c.argv.index("--zero") + 1] == "3"
                        for c in fsdp)
    # Estimated rows carry no reason; every row is one or the other.
    assert all(not c.reason for c in cases if c.predicted is not None)


def test_nvl72_jobs_over_one_rack_are_read_as_64_gpu_nvlink_domains():
    row = next(r for r in ROWS if r["system"] == "DGX-GB200" and r["gpus"] == "256" and r["model"] == "DeepSeekV3")
    argv, notes = bench.estimate_argv(row, "deepseek-v3", "gb200", "fp8")
    assert argv[argv.index("--gpus-per-node") + 1] == "64" and notes
    small = next(r for r in ROWS if r["system"] == "DGX-GB200" and r["gpus"] == "64")
    assert "--gpus-per-node" not in bench.estimate_argv(small, "llama3-70b", "gb200", "fp8")[0]


def test_the_bench_prints_both_tables_on_a_subset(capsys):
    assert bench.main(["--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert "ACCURACY" in out and "of 5 rows" in out and "not expressible:" in out
    assert "PLAN QUALITY" in out and "top 10" in out and "median predicted gain" in out
    assert "PLAN CHANGES" in out  # bench/nvidia_plan_changes.py: tests/cost/test_nvidia_plan_changes.py


def test_plan_quality_ranks_the_llama3_8b_rows(capsys):
    rows = [r for r in ROWS if r["model"] == "LLAMA3_8B"]
    cases = [bench.express(r) for r in rows]
    for c in cases:
        bench.estimate_case(c)
    summary = bench.plan_quality_table(cases, True, bench.label)
    out = capsys.readouterr().out
    assert len(summary["ranks"]) == len(rows) == 5
    assert all(r is not None and r >= 1 and s >= 1 for r, s in zip(summary["ranks"], summary["speed_ranks"]))
    # The planner's first plan (ties simplest first) is never predicted slower than NVIDIA's by more than its interval
    assert all(g >= -u for g, u in zip(summary["gains"], summary["first_intervals"]))
    assert "LLAMA3_8B" in out


def test_a_miss_is_listed_where_nvidia_measured_another_plan_faster_on_the_same_workload():
    import nvidia_plan_quality as pq

    qwen = [r for r in ROWS if r["model"] == "Qwen3_30B_a3B" and r["system"] == "DGX-B200"]
    slow = next(r for r in qwen if r["container"] == "26.02" and r["mbs"] == "1")
    faster = pq.measured_faster(slow, ROWS)
    assert faster is not None and faster["mbs"] != "1"
    assert float(faster["tokens_per_s_per_gpu"]) > (1 + pq.MEASURED_MARGIN) * float(slow["tokens_per_s_per_gpu"])
    # "FP8-MX" (25.11) and "MXFP8" (26.x) are one recipe: the 25.11 mb1 row finds the mb4 rows too
    old = next(r for r in qwen if r["precision"] == "FP8-MX" and r["mbs"] == "1")
    assert pq.measured_faster(old, ROWS) is not None
    # the fastest plan of a workload has nothing faster; the same plan in another container does not count
    assert pq.measured_faster(faster, ROWS) is None
    same_plan = dict(slow, container="99.99", tokens_per_s_per_gpu=str(10 * float(slow["tokens_per_s_per_gpu"])))
    assert pq.measured_faster(slow, [slow, same_plan]) is None


# NVIDIA's run settings per row (bench/data/nvidia_recipe_settings.csv, bench/nvidia_recipe_settings.py).
import nvidia_recipe_settings as nrs  # noqa: E402

SETTINGS = nrs.load_settings()
WHERE = re.compile(r"^NVIDIA-NeMo/Megatron-Bridge@[0-9a-f]{12}:(src/megatron/bridge|scripts/performance/configs)/"
                   r"[\w/]+\.py#L\d+$")


def test_the_settings_file_covers_every_row_and_cites_a_line_for_each_setting():
    assert {r["source"] for r in ROWS} == set(SETTINGS)
    estimated_families = set(bench.MODEL_PRESETS)
    for r in ROWS:
        s = SETTINGS[r["source"]]
        assert bool(s.recipe) != bool(s.unmatched), r["source"]  # a recipe, or the reason there is none
        assert all(WHERE.match(where) for _, where in s.values.values()), (r["source"], s.values)
        if s.recipe:
            # the recipe (a flat function or a workload variant) is the row's system (the builder matched its plan)
            system = r["system"].removeprefix("DGX-")
            assert f"_{system.lower()}_" in s.recipe or f"_{system}_" in s.recipe, s.recipe
            assert bench.family_of(r["model"])[0] in estimated_families
            assert re.match(r"^v\d+\.\d+\.\d+$", s.read_at), s.read_at
    matched = [r for r in ROWS if SETTINGS[r["source"]].recipe]
    assert len(matched) >= 100


def test_of_workload_variants_running_the_same_plan_the_rows_global_batch_picks_one():
    # v0.5.0 GPT-OSS GB200: V1 (GBS 512) and V2 (GBS 1280, full-iteration graphs) both run ep64 mbs4; a GBS 1280 row
    # is V2's, whatever the names' order.
    import nvidia_recipe_settings_build as build

    plan = {"expert_model_parallel_size": build.Setting("64", "w.py#L1"),
            "micro_batch_size": build.Setting("4", "w.py#L2")}
    variants = {"GPT_OSS_120B_PRETRAIN_CONFIG_GB200_FP8_MX_V1": {**plan, "global_batch_size":
                                                                  build.Setting("512", "w.py#L3")},
                "GPT_OSS_120B_PRETRAIN_CONFIG_GB200_FP8_MX_V2": {**plan, "global_batch_size":
                                                                  build.Setting("1280", "w.py#L4"),
                                                                  "cuda_graph_impl":
                                                                  build.Setting("full_iteration", "w.py#L5")}}
    row = {"model": "GPT OSS 120B", "system": "DGX-GB200", "precision": "MXFP8", "gpus": "64", "gbs": "1280",
           "mbs": "4", "tp": "1", "pp": "1", "cp": "1", "vp": "n/a", "ep": "64"}
    name, got, why = build.legacy_match(row, {}, variants)
    assert (name, why) == ("GPT_OSS_120B_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "")
    assert got["model.cuda_graph_impl"].value == "full_iteration"
    assert build.legacy_match(dict(row, gbs="512"), {}, variants)[0].endswith("_V1")


def test_the_bench_estimates_matched_rows_with_their_recipe_settings(cases):
    with_recipe = [c for c in cases if c.predicted is not None and SETTINGS[c.row["source"]].recipe]
    assert len(with_recipe) >= 40
    applied = [c for c in with_recipe if c.flags.argv]
    assert len(applied) >= 0.9 * len(with_recipe)
    for c in applied:
        plan, s = c.result.plan, SETTINGS[c.row["source"]]
        if c.flags.recompute_set:
            assert plan.recompute == (s.get("recompute_granularity") or "none"), c.row["source"]
        if plan.tp > 1 and "tp_comm_overlap" in s.values:
            want = "userbuffers" if s.get("tp_comm_overlap") == "True" else "none"
            assert plan.tp_overlap == want, c.row["source"]
    # the rows whose recompute the file states are estimated at it, not at the fastest mode that fits
    assert sum(c.flags.recompute_set for c in applied) >= 0.6 * len(applied)


def test_rows_nvidia_footnotes_as_regressed_carry_the_note_and_stay_in_the_stats(capsys):
    marked = [r for r in ROWS if r["source"] in bench.TABLE_FOOTNOTES]
    # the footnoted cells are the 26.06.01 GPT-OSS rows; each footnote has its text
    assert {(r["container"], r["model"]) for r in marked} == {("26.06.01", "GPT OSS 120B")} and len(marked) == 2
    assert set(bench.TABLE_FOOTNOTES.values()) <= set(bench.FOOTNOTES)
    cases = [bench.express(r) for r in ROWS if r["model"] == "GPT OSS 120B"]
    for c in cases:
        bench.estimate_case(c)
    done = [c for c in cases if c.predicted is not None]
    noted = [c for c in done if bench.FOOTNOTES["gpt-oss-note"] in c.notes]
    assert {c.row["source"] for c in noted} == {r["source"] for r in marked}
    bench.accuracy_table(cases, show_rows=False)
    out = capsys.readouterr().out
    # the family line counts every estimated row, the footnoted ones too; the line without them is printed beside it
    family_line = next(ln for ln in out.splitlines() if ln.startswith("family GPT OSS 120B "))
    assert int(family_line.split()[4]) == len(done)
    without = bench.footnoted_summary(done)["GPT OSS 120B"]
    assert len(without) == len(done) - len(marked)
    assert "without them" in out


def test_lora_rows_are_estimated_as_their_recipes_fine_tune(cases):
    lora = [c for c in cases if c.row["task"].startswith("LoRA")]
    assert len(lora) == 4
    for c in lora:
        plan = c.result.plan
        assert (plan.peft, plan.lora_rank, plan.lora_targets, plan.recompute) == ("lora", 16, ("linear_qkv",), "none")
        assert c.fits and abs(c.error) < 0.5, (c.row["source"], c.error)
        # frozen base weights: the ledger holds no full-model gradients or optimizer states
        assert c.result.memory.optimizer_states < c.result.memory.weights / 100


def test_the_405b_gb200_fp8_rows_run_with_the_launchers_expandable_segments():
    from nvidia_allocator_env import expandable_segments_source

    flagged, plain = [], []
    for row in ROWS:
        family, _ = bench.family_of(row["model"])
        read = bench.SETTINGS.get(row["source"])
        where = expandable_segments_source(family, row["system"], row["precision"], read.read_at if read else "",
                                           read.recipe if read else "")
        (flagged if where else plain).append((family, row["system"], row["precision"], row["container"]))
        if where:
            assert re.match(r"^Megatron-Bridge@[0-9a-f]{12} \S+\.py:\d+", where)
            # v0.5.0's launcher sets it for every run; v0.4's for DeepSeek-V3 and Llama 3 70B MXFP8 on GB300 too;
            # else (and in v0.6's recipes) the 405B rule alone is read
            v04_family = read.read_at.startswith("v0.4") and family in ("DeepSeekV3", "LLAMA3_70B")
            assert family == "LLAMA3.1_405B" or read.read_at.startswith("v0.5") or v04_family, (family, read.read_at)
            if family == "LLAMA3_70B" and read.read_at.startswith("v0.4"):
                assert row["system"] == "DGX-GB300" and "MX" in (read.recipe or row["precision"]).upper()
    assert {f for f, *_ in flagged} > {"LLAMA3.1_405B"}  # the v0.5 rows of other families too
    # the rows the ledger had over capacity: FP8 (current scaling) on GB200, tp4 pp16 vp4, every container
    gb200_fp8 = [r for r in flagged if r[1] == "DGX-GB200" and r[2] in ("FP8", "FP8-CS")]
    assert {r[3] for r in gb200_fp8} >= {"26.06", "26.04.01", "26.04", "26.02.01", "26.02", "25.11"}
    # v0.2 / v0.3 launchers set it for fp8_cs / fp8_mx only: 26.02's NVFP4 row on GB200 keeps the reserve
    assert ("LLAMA3.1_405B", "DGX-GB200", "NVFP4", "26.02") in plain
    # the 25.09 table does not state the precision: no rule is claimed
    assert not any(r[3] == "25.09" for r in flagged)


def test_gpu_pairs_are_rows_that_differ_in_the_system_alone():
    from types import SimpleNamespace

    import nvidia_gpu_pairs as pairs

    base = {k: "1" for k in pairs.SAME} | {"container": "26.04", "model": "LLAMA3_70B"}

    def case(system, measured, predicted, **changes):
        return SimpleNamespace(row=base | {"system": system} | changes, measured=measured, predicted=predicted)

    gb300, gb200 = case("DGX-GB300", 120.0, 110.0), case("DGX-GB200", 100.0, 100.0)
    other_container = case("DGX-GB200", 90.0, 90.0, container="26.02")
    not_estimated = case("DGX-B300", 50.0, None)
    b200 = case("DGX-B200", 40.0, 40.0)
    found = pairs.gpu_pairs([gb300, gb200, other_container, not_estimated, b200])
    assert found == [(gb300, gb200)]
    assert pairs.ratio_errors(found) == [(1.2, 1.1)]


def test_the_shipped_rows_hold_gb300_gb200_pairs(cases):
    import nvidia_gpu_pairs as pairs

    found = pairs.gpu_pairs(cases)
    assert sum(a.row["system"] == "DGX-GB300" for a, _ in found) >= 10
    assert all(a.row["container"] == b.row["container"] and a.row["tp"] == b.row["tp"] for a, b in found)


def test_pretraining_rows_run_te_cross_entropy_as_their_launcher_or_recipe_sets_it():
    """bench/nvidia_loss_kernel.py: the v0.2-v0.5 launchers set cross_entropy_fusion_impl "te" for every run (over a
    recipe's own "native"); from v0.6 each recipe's _benchmark_common call decides, as the settings file records it.
    The bench estimates the pre-training rows so, the fine-tuning rows with the default."""
    from nvidia_loss_kernel import te_cross_entropy_source

    assert "overrides.py:67-68" in te_cross_entropy_source("Pre-Training Performance", "v0.4.2", "native", "x")
    assert te_cross_entropy_source("Pre-Training Performance", "v0.2.1").endswith("helpers.py:108")
    assert not te_cross_entropy_source("LoRA Performance", "v0.4.2")
    assert not te_cross_entropy_source("Pre-Training Performance", "v0.6.0")
    assert not te_cross_entropy_source("Pre-Training Performance", "v0.6.0", "native", "deepseek_v4.py#L61")
    assert te_cross_entropy_source("Pre-Training Performance", "v0.6.0", "te", "_common.py#L68") == "_common.py#L68"
    settings = bench.SETTINGS
    v06 = [r for r in ROWS if settings.get(r["source"]) and settings[r["source"]].read_at == "v0.6.0"
           and settings[r["source"]].recipe and r["task"].startswith("Pre-Training")]
    assert v06 and all(settings[r["source"]].get("cross_entropy_fusion_impl") == "te" for r in v06)
    assert all("--cross-entropy" in bench.express(r).argv for r in v06)
    fsdp = [bench.express(r) for r in ROWS if r["model"] == "LLAMA3_70B" and r["system"] == "DGX-GB200"
            and r["fsdp"] == "64"]
    assert fsdp and all(c.argv[c.argv.index("--cross-entropy") + 1] == "te" for c in fsdp if c.argv)
    lora = [bench.express(r) for r in ROWS if r["task"].startswith("LoRA")]
    assert lora and not any("--cross-entropy" in c.argv for c in lora)


def test_plain_fp8_rows_run_the_current_scaling_recipes_the_settings_file_matched(cases):
    # The 26.x tables write "FP8" where their recipes are the FP8 current-scaling functions (the settings file
    # matches *_FP8_CS_* configs for those rows, whose precision is Bridge's bf16_with_fp8_current_scaling_mixed):
    # the estimate must run that recipe, not the engine's delayed-scaling default.
    plain = [c for c in cases if c.row["precision"] == "FP8" and c.predicted is not None]
    assert len(plain) >= 20
    settings = nrs.load_settings()
    matched = [settings[c.row["source"]].recipe for c in plain if settings.get(c.row["source"]) is not None
               and settings[c.row["source"]].recipe]
    assert len(matched) >= 10 and all("FP8_CS" in name for name in matched), matched
    for c in plain:
        assert c.result.plan.fp8_recipe == "te-current", c.row["source"]
        assert "FP8 current scaling" in c.notes, c.row["source"]


def test_a_model_filter_that_matches_no_row_names_the_models_and_exits_2(capsys):
    assert bench.main(["--model", "GPT_OSS"]) == 2  # the file spells it "GPT OSS 120B"
    err = capsys.readouterr().err
    assert "no row's model name contains 'GPT_OSS'" in err and "GPT OSS 120B" in err
