"""The MXFP8 output layer (``ParallelPlan.fp8_output_proj``, --fp8-output-proj: Megatron-core's fp8_output_proj,
NVIDIA/Megatron-LM 3f6a2ed844, core 0.18+): the plan checks (fp8 and the MXFP8 recipe alone, transformer_config.py:
1569-1575), the engines and releases that take or refuse it, what it costs (autotune.cost.fp8_head: the head's GEMMs
at the FP8 linear rate with the MXFP8 casts) and saves (the head's input as a TE linear's MXFP8 copy), the
Megatron-LM arguments and Megatron-Bridge overrides that carry it and their read-back."""

from __future__ import annotations

import pytest
import yaml

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.cli import main
from autotune.cost import step_time
from autotune.cost.activations import linear_input_bytes, stage_activation_bytes
from autotune.cost.kernels import FP8_CAST_BYTES
from autotune.cost.mtp import mtp_head_s
from autotune.emit.megatron import megatron_args
from autotune.emit.options import EmitOptions
from autotune.engines import engine_for
from autotune.errors import InputError
from autotune.job_files import read_job
from autotune.report import assumed_settings
from autotune.specs.loading import load_cluster
from autotune.specs.notation import plan_notation
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset
from autotune.cost.step_time import TimeSettings
from autotune.specs.settings import MemorySettings

GPU = "b200"  # MXFP8 runs on Blackwell only
MODEL = load_model_preset("llama3-8b")
CLUSTER = load_cluster(gpu=GPU, num_gpus=8)
MXFP8 = dict(precision="fp8", fp8_recipe="te-mxfp8")
ESTIMATE = ["estimate", "--model", "llama3-8b", "--gpu", GPU, "--num-gpus", "8", "--engine", "megatron"]


def _plan(**kw) -> ParallelPlan:
    return make_plan(MODEL, CLUSTER, engine="megatron", zero_stage=1, global_batch_size=64, seq_len=8192,
                     micro_batch_size=1, recompute="none", **(MXFP8 | kw))


def test_the_plan_checks_the_value_the_precision_and_the_recipe():
    assert ParallelPlan(**MXFP8, fp8_output_proj=True).to_dict()["fp8_output_proj"] is True
    assert "fp8_output_proj" not in ParallelPlan(**MXFP8).to_dict()  # the engine's default: left out
    with pytest.raises(InputError, match="fp8_output_proj must be true, false or absent"):
        ParallelPlan(**MXFP8, fp8_output_proj=1)
    way = "use --precision fp8 --fp8-recipe te-mxfp8, or drop --fp8-output-proj"
    for kw, now in ((dict(precision="bf16"), "trains in bf16"), (dict(precision="fp8"), "the engine default"),
                    (dict(precision="fp8", fp8_recipe="te-current"), "runs the FP8 recipe te-current")):
        with pytest.raises(InputError, match="transformer_config.py:1569-1575") as err:
            ParallelPlan(**kw, fp8_output_proj=True)
        assert now in str(err.value) and way in str(err.value)
    plan = ParallelPlan(**MXFP8, dp=8, global_batch_size=8, fp8_output_proj=True)
    with pytest.raises(InputError, match="mxfp8 recipe alone"):  # the planner's variants check it too
        plan.with_sharding(1, 1, "none", "none", "fp8", "te-current")
    assert ParallelPlan(**MXFP8, fp8_output_proj=False).fp8_output_proj is False  # off: any recipe's plan may say so


@pytest.mark.parametrize("flags, words", [
    ([], "this plan trains in bf16: use --precision fp8 --fp8-recipe te-mxfp8, or drop --fp8-output-proj"),
    (["--precision", "fp8"], "runs the FP8 recipe (the engine default)"),
    (["--precision", "fp8", "--fp8-recipe", "te-blockwise"], "runs the FP8 recipe te-blockwise"),
    (["--precision", "fp8", "--fp8-recipe", "te-mxfp8", "--engine", "fsdp", "--zero", "3"],
     "its output layer runs in 16 bits (no FP8 LM head): use --engine megatron"),
    (["--precision", "fp8", "--fp8-recipe", "te-mxfp8", "--engine-version", "megatron=0.17"],
     "Megatron-core 0.17 has no fp8_output_proj (its arguments.py has no --fp8-output-proj; Megatron-core 0.18-0.19 "
     "has it): use --engine-version megatron=0.19, or drop --fp8-output-proj"),
])
def test_the_cli_refuses_it_where_it_cannot_run(capsys, flags, words):
    assert main([*ESTIMATE, "--fp8-output-proj", *flags]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_release_0_18_takes_it(capsys):
    assert main([*ESTIMATE, "--fp8-output-proj", "--precision", "fp8", "--fp8-recipe", "te-mxfp8",
                 "--engine-version", "megatron=0.18"]) == 0
    assert "output layer in MXFP8 (--fp8-output-proj" in capsys.readouterr().out


def test_the_search_takes_it_with_fp8_under_mxfp8_alone(capsys):
    argv = ["plan", "--model", "llama3-8b", "--gpu", GPU, "--num-gpus", "8", "--engine", "megatron",
            "--fp8-output-proj", "--top", "1"]
    assert main(argv + ["--precision", "fp8"]) == 2
    assert "search --precision fp8 --fp8-recipe te-mxfp8, or drop --fp8-output-proj" in capsys.readouterr().err
    assert main(argv + ["--precision", "fp8", "--fp8-recipe", "te-mxfp8", "--engine-version", "0.17"]) == 2
    assert "Megatron-core 0.17 has no fp8_output_proj" in capsys.readouterr().err
    assert main(argv + ["--precision", "fp8", "--fp8-recipe", "te-mxfp8"]) == 0
    assert "fp8-head" in capsys.readouterr().out


def _head(monkeypatch, plan: ParallelPlan) -> tuple[tuple, tuple[float, float]]:
    """(the arguments step_time gave autotune.cost.fp8_head.output_layer_s, its answer) for ``plan``."""
    seen = []
    real = step_time.output_layer_s

    def spy(*args):
        out = real(*args)
        seen.append((args, out))
        return out

    monkeypatch.setattr(step_time, "output_layer_s", spy)
    step_time._stage_time_cache.clear()
    estimate(MODEL, CLUSTER, plan)
    monkeypatch.undo()
    return seen[-1]


def test_the_head_gemms_run_at_the_fp8_linear_rate_with_the_mxfp8_casts(monkeypatch):
    (_, off_plan, r, tokens, hbm), (off_gemm, off_cast) = _head(monkeypatch, _plan())
    (_, on_plan, r_on, tokens_on, _), (on_gemm, on_cast) = _head(monkeypatch, _plan(fp8_output_proj=True))
    assert r_on is r and tokens_on == tokens and not off_plan.fp8_output_proj and on_plan.fp8_output_proj
    h, v, t = MODEL.hidden_size, MODEL.vocab_size, off_plan.tp
    flops = 2 * h * v * tokens / t
    assert off_cast == 0.0 and off_gemm == pytest.approx(r.bf16_s(flops, tokens, h, v / t), rel=1e-12)
    # the FP8 over the 16-bit rate (each with its GEMM shape's efficiency)
    rate_ratio = (r.linear_peak * r.shape(r.linear_half, tokens, h, v / t)) / (
        r.bf16_peak * r.shape(r.bf16_half, tokens, h, v / t))
    assert r.linear_peak > 1.5 * r.bf16_peak  # B200: FP8 twice BF16's peak
    assert off_gemm / on_gemm == pytest.approx(rate_ratio, rel=1e-9)
    # the casts a linear layer pays (layer_time): the input and output widths at MXFP8's bytes, each pass
    assert r.cast_bytes == FP8_CAST_BYTES["te-mxfp8"]
    assert on_cast == pytest.approx(tokens * (h + v) / t * r.cast_bytes / 2 / hbm, rel=1e-12)
    # one forward and two backward GEMMs, the casts in each pass: the step's compute moves by that per micro-batch
    before, after = estimate(MODEL, CLUSTER, off_plan).time, estimate(MODEL, CLUSTER, on_plan).time
    per_mb = 3 * (on_gemm - off_gemm) + 2 * on_cast
    assert per_mb < 0 and after.step_time_s < before.step_time_s
    assert after.compute_s - before.compute_s == pytest.approx(off_plan.grad_accum_steps * per_mb, rel=1e-6)


def test_the_mtp_modules_call_the_same_head():
    m = load_model_preset("deepseek-v3")
    cluster = load_cluster(gpu=GPU, num_gpus=8)
    plan = ParallelPlan(**MXFP8, dp=8, global_batch_size=8, mtp_layers=2, fp8_output_proj=True)
    from autotune.cost.efficiency import Efficiency
    from autotune.cost.kernels import rates

    r = rates(cluster, "fp8", Efficiency(), "fa3", "te-mxfp8")
    fwd, bwd = mtp_head_s(m, plan, r, 1.0, 0.5)
    fwd_c, bwd_c = mtp_head_s(m, plan, r, 1.0, 0.5, 0.25)
    assert (fwd_c - fwd, bwd_c - bwd) == pytest.approx((2 * 0.25, 2 * 0.25))  # each module: once per pass


def test_only_the_heads_saved_input_changes():
    plan = _plan(tp=2, sequence_parallel=True)
    on = plan.with_(fp8_output_proj=True)
    facts = engine_for(plan).activation_facts(plan)
    assert engine_for(on).activation_facts(on) is facts
    off_parts = stage_activation_bytes(MODEL, plan, 0, facts)
    on_parts = stage_activation_bytes(MODEL, on, 0, facts)  # one process, one cache: the field is in its key
    assert set(on_parts) == set(off_parts)
    changed = {k for k in on_parts if on_parts[k] != off_parts[k]}
    assert changed == {"output_and_loss"}
    sb = plan.seq_len * plan.micro_batch_size  # the column-parallel input split over tp with Megatron SP
    lin = linear_input_bytes(plan, facts)
    assert 1 < lin < 2  # MXFP8's column-wise copy and its scales
    assert off_parts["output_and_loss"] - on_parts["output_and_loss"] == pytest.approx(
        (2 - lin) * sb * MODEL.hidden_size / plan.tp, rel=1e-12)


def test_the_same_plan_with_and_without_it_in_one_process():
    # shared settings objects: step_time's stage cache and the activations' cache are keyed by their ids
    ms, ts = MemorySettings(), TimeSettings()
    plan = _plan()
    off = estimate(MODEL, CLUSTER, plan, ms, ts)
    on = estimate(MODEL, CLUSTER, plan.with_(fp8_output_proj=True), ms, ts)
    again = estimate(MODEL, CLUSTER, plan, ms, ts)
    assert on.time.step_time_s < off.time.step_time_s and on.memory.activations < off.memory.activations
    # the output layer becomes a TE linear built under fp8_model_init: MXFP8 row- and column-wise data with their
    # scales, 2 x (1 + 1/32) bytes a weight, where the 16-bit ColumnParallelLinear held 2 (specs/quantized_gemms)
    states = [e.memory.weights + sum(e.memory.buffer_parts.values()) for e in (off, on)]
    table = MODEL.vocab_size * MODEL.hidden_size / plan.tp
    assert states[1] - states[0] == pytest.approx((2 * (1 + 1 / 32) - 2) * table, rel=1e-9)
    assert (again.time.step_time_s, again.memory.total) == (off.time.step_time_s, off.memory.total)


def test_notation_and_report():
    plan = _plan(fp8_output_proj=True)
    assert plan_notation(plan).endswith("fp8-head") and "fp8-head" not in plan_notation(_plan())
    assert "output layer in MXFP8 (--fp8-output-proj: Megatron-core fp8_output_proj)" in assumed_settings(plan, TimeSettings())
    assert not any("MXFP8" in s for s in assumed_settings(_plan(), TimeSettings()))


def test_megatron_args_and_bridge_overrides_carry_it_and_read_back(tmp_path):
    m, cluster = load_model_preset("llama3-70b"), load_cluster(gpu=GPU, num_gpus=64)
    plan = make_plan(m, cluster, engine="megatron", tp=8, pp=2, sequence_parallel=True, zero_stage=1,
                     global_batch_size=64, seq_len=4096, fp8_output_proj=True, **MXFP8)
    est = estimate(m, cluster, plan)
    files = render_bundle(est).files
    assert "--fp8-output-proj" in files["megatron_args.sh"].split()
    assert yaml.safe_load(files["bridge_overrides.yaml"])["model"]["fp8_output_proj"] is True
    assert "model.fp8_output_proj=true" in files["bridge_overrides.args"].splitlines()
    off = render_bundle(estimate(m, cluster, plan.with_(fp8_output_proj=None))).files
    assert "--fp8-output-proj" not in off["megatron_args.sh"] and "fp8_output_proj" not in off["bridge_overrides.yaml"]
    for name in ("megatron_args.sh", "bridge_overrides.yaml", "bridge_overrides.args"):
        path = tmp_path / name
        path.write_text(files[name])
        job = read_job([str(path)], gpu=GPU, num_gpus=64)
        assert job.plan == est.plan and job.plan.fp8_output_proj is True, name
        assert estimate(job.model, job.cluster, job.plan, job.settings).time.step_time_s == pytest.approx(
            est.time.step_time_s, rel=1e-9)


def test_megatron_core_0_17_has_no_flag_for_it(tmp_path, capsys):
    plan = _plan(fp8_output_proj=True)
    with pytest.raises(InputError, match="--fp8-output-proj: the plan needs it, but Megatron-core 0.17's parser has "
                                         "no such flag"):
        megatron_args(MODEL, CLUSTER, plan, options=EmitOptions(megatron_version="0.17"))
    assert "--fp8-output-proj" in megatron_args(MODEL, CLUSTER, plan, options=EmitOptions(megatron_version="0.18"))
    out = tmp_path / "job"
    assert main(["emit", *ESTIMATE[1:], "--fp8-output-proj", "--precision", "fp8", "--fp8-recipe", "te-mxfp8",
                 "--engine-version", "megatron=0.17", "--out", str(out)]) == 2
    assert "Megatron-core 0.17 has no fp8_output_proj" in capsys.readouterr().err and not out.exists()
