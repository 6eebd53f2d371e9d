"""FP8 attention (``ParallelPlan.fp8_attention``, --fp8-attention: Megatron-core's fp8_dot_product_attention): the plan
checks, the engines and rules that take or refuse it, what it costs (autotune.cost.fp8_attention), the Megatron-Bridge
files that carry it (Megatron-LM has no flag for it) and their read-back."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.cli import main
from autotune.cost import step_time
from autotune.cost.fp8_attention import FP8_ATTENTION_SPEEDUP
from autotune.cost.layer_time import LayerTime, attention_bwd_s
from autotune.cost.time_settings import TimeSettings
from autotune.emit.megatron import megatron_args
from autotune.errors import InputError
from autotune.job_files import read_job
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset
from autotune.specs.settings import MemorySettings

GPU = "gb200"


def _layer(monkeypatch, model: str, layers: int | None = None, **kw) -> tuple[LayerTime, ParallelPlan]:
    """The first layer's forward parts the step time is built from, and the plan."""
    seen: list[LayerTime] = []
    real = step_time.layer_time

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append(out)
        return out

    m, cluster = load_model_preset(model), load_cluster(gpu=GPU, num_gpus=8)
    m = dataclasses.replace(m, num_layers=layers) if layers else m
    plan = make_plan(m, cluster, engine="megatron", zero_stage=1, global_batch_size=64, seq_len=8192,
                     micro_batch_size=1, recompute="none", precision="fp8", **kw)
    monkeypatch.setattr(step_time, "layer_time", spy)
    step_time._stage_time_cache.clear()
    estimate(m, cluster, plan)
    return seen[-1], plan


def _bwd(lt: LayerTime, plan: ParallelPlan) -> float:
    return attention_bwd_s(lt.attention_s, lt.attention_exp_delta_s, plan, lt.attention_bwd_scale)


def test_the_plan_checks_the_value_and_the_precision():
    assert ParallelPlan(precision="fp8", fp8_attention=True).to_dict()["fp8_attention"] is True
    assert "fp8_attention" not in ParallelPlan(precision="fp8").to_dict()  # the engine's default: left out
    with pytest.raises(InputError, match="fp8_attention must be true, false or absent"):
        ParallelPlan(precision="fp8", fp8_attention="yes")
    with pytest.raises(InputError, match="this plan trains in bf16: use --precision fp8, or drop --fp8-attention"):
        ParallelPlan(precision="bf16", fp8_attention=True)


@pytest.mark.parametrize("flags, words", [
    ([], "this plan trains in bf16: use --precision fp8, or drop --fp8-attention"),
    (["--precision", "fp8", "--engine", "fsdp", "--zero", "3"], "its attention runs in 16 bits"),
    (["--precision", "fp8", "--fp8-recipe", "te-blockwise"], "takes no fp8_dpa"),
])
def test_the_cli_refuses_it_where_it_cannot_run(capsys, flags, words):
    argv = ["estimate", "--model", "llama3-8b", "--gpu", GPU, "--num-gpus", "8", "--engine", "megatron",
            "--fp8-attention", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_the_search_takes_it_with_fp8_alone(capsys):
    argv = ["plan", "--model", "llama3-8b", "--gpu", GPU, "--num-gpus", "8", "--engine", "megatron",
            "--fp8-attention", "--top", "1"]
    assert main(argv) == 2
    assert "search --precision fp8, or drop --fp8-attention" in capsys.readouterr().err
    assert main(argv + ["--precision", "fp8"]) == 0
    assert "fp8-attn" in capsys.readouterr().out


@pytest.mark.parametrize("recipe, rows", [("te-current", "fp8"), ("te-mxfp8", "mxfp8")])
def test_full_attention_runs_at_the_timed_speedups(monkeypatch, recipe, rows):
    base, plan = _layer(monkeypatch, "llama3-8b", fp8_recipe=recipe)
    fp8, plan8 = _layer(monkeypatch, "llama3-8b", fp8_recipe=recipe, fp8_attention=True)
    fwd_x, bwd_x = FP8_ATTENTION_SPEEDUP[(rows, 128)]  # Llama 3: 128-wide heads
    assert fp8.attention_s == pytest.approx(base.attention_s / fwd_x, rel=1e-9)
    assert _bwd(fp8, plan8) == pytest.approx(_bwd(base, plan) / bwd_x, rel=1e-9)
    assert fp8.gemm_s == base.gemm_s  # the linear layers are FP8 either way


def test_mla_heads_take_the_192_wide_rows(monkeypatch):
    base, plan = _layer(monkeypatch, "deepseek-v3", fp8_recipe="te-mxfp8", layers=4, ep=8)
    fp8, plan8 = _layer(monkeypatch, "deepseek-v3", fp8_recipe="te-mxfp8", layers=4, ep=8,
                         fp8_attention=True)
    fwd_x, bwd_x = FP8_ATTENTION_SPEEDUP[("mxfp8", 192)]
    assert fp8.attention_s == pytest.approx(base.attention_s / fwd_x, rel=1e-9)
    assert _bwd(fp8, plan8) == pytest.approx(_bwd(base, plan) / bwd_x, rel=1e-9)


def test_a_sliding_window_backward_runs_every_causal_tile(monkeypatch):
    # GPT-OSS: half its layers see 128 keys; cuDNN's FP8 backward skips none of their tiles outside the window
    base, plan = _layer(monkeypatch, "gpt-oss-120b", fp8_recipe="te-mxfp8", ep=8)
    fp8, plan8 = _layer(monkeypatch, "gpt-oss-120b", fp8_recipe="te-mxfp8", ep=8, fp8_attention=True)
    assert fp8.attention_s < base.attention_s  # the forward: faster
    assert _bwd(fp8, plan8) > 1.5 * _bwd(base, plan)  # the backward: the local layers' causal tiles, and slower
    # half the layers local: the backward runs 1 / share of the forward's tiles, at MXFP8's 128-wide speed
    fwd_x, bwd_x = FP8_ATTENTION_SPEEDUP[("mxfp8", 128)]
    assert fp8.attention_bwd_scale > fwd_x / bwd_x


def test_the_files_are_bridge_only_and_read_back(tmp_path):
    m, cluster = load_model_preset("llama3-70b"), load_cluster(gpu=GPU, num_gpus=64)
    plan = make_plan(m, cluster, engine="megatron", tp=8, pp=2, sequence_parallel=True, zero_stage=1,
                     global_batch_size=64, seq_len=4096, precision="fp8", fp8_recipe="te-mxfp8", fp8_attention=True)
    est = estimate(m, cluster, plan)
    files = render_bundle(est).files
    assert "megatron_args.sh" not in files  # Megatron-LM has no flag for it (arguments.py:2307-2333 at d98e8a6)
    assert yaml.safe_load(files["bridge_overrides.yaml"])["mixed_precision"]["fp8_dot_product_attention"] is True
    assert "mixed_precision.fp8_dot_product_attention=true" in files["bridge_overrides.args"]
    with pytest.raises(InputError, match="Megatron-LM has no flag for FP8 attention"):
        megatron_args(m, cluster, plan)
    for name in ("bridge_overrides.yaml", "bridge_overrides.args"):
        path = tmp_path / name
        path.write_text(files[name])
        job = read_job([str(path)], gpu=GPU, num_gpus=64)
        assert job.plan == est.plan and job.plan.fp8_attention is True
        assert estimate(job.model, job.cluster, job.plan, job.settings).time.step_time_s == pytest.approx(
            est.time.step_time_s, rel=1e-9)


def test_a_registered_precision_name_cannot_take_it():
    # Llama 3 8B's Bridge recipe holds a registered precision name: its MixedPrecisionConfig sets the field at setup
    m, cluster = load_model_preset("llama3-8b"), load_cluster(gpu=GPU, num_gpus=8)
    plan = make_plan(m, cluster, engine="megatron", zero_stage=1, global_batch_size=64, seq_len=4096,
                     precision="fp8", fp8_attention=True)
    with pytest.raises(InputError, match="fp8_dot_product_attention false at setup"):
        render_bundle(estimate(m, cluster, plan))


def test_the_same_plan_with_and_without_it():
    # one after the other in one process (step_time's stage key and layer_time's time_key hold the field)
    m, cluster = load_model_preset("llama3-8b"), load_cluster(gpu=GPU, num_gpus=8)
    plan = make_plan(m, cluster, engine="megatron", zero_stage=1, global_batch_size=64, seq_len=8192,
                     precision="fp8", fp8_recipe="te-current")
    # the same settings objects: the caches (keyed by their ids) are shared between the two estimates
    memory, timing = MemorySettings(), TimeSettings()
    off = estimate(m, cluster, plan, memory, timing).time.step_time_s
    on = estimate(m, cluster, plan.with_(fp8_attention=True), memory, timing).time.step_time_s
    assert on < off and estimate(m, cluster, plan, memory, timing).time.step_time_s == off


@pytest.mark.parametrize("recipe, qkv_bytes, out_bytes", [
    ("te-delayed", 1.0, 1.0),  # Q, K, V and the output in FP8 (backends.py:1587-1588)
    ("te-current", 1.0, 2.0),  # the output in 16 bits: NVTE_DPA_FP8CS_O_in_F16 defaults to 1
    ("te-mxfp8", 2 * (1 + 1 / 32), 2.0),  # row- and column-wise MXFP8 copies of Q, K, V (utils.py:2720-2722)
])
def test_the_ledger_saves_q_k_v_and_the_output_at_the_recipes_bytes(recipe, qkv_bytes, out_bytes):
    # What Transformer Engine's FusedAttnFunc keeps for backward, by recipe, against the 16-bit attention's 2 bytes
    # each: every layer's activations move by exactly that, nothing else in the ledger does.
    m, cluster = load_model_preset("qwen3-30b-a3b"), load_cluster(gpu=GPU, num_gpus=8)
    plan = make_plan(m, cluster, engine="megatron", zero_stage=1, global_batch_size=64, seq_len=4096, ep=8,
                     micro_batch_size=2, precision="fp8", fp8_recipe=recipe, recompute="none")
    memory = MemorySettings()
    off = estimate(m, cluster, plan, memory).memory
    on = estimate(m, cluster, plan.with_(fp8_attention=True), memory).memory
    tokens = plan.seq_len * plan.micro_batch_size  # one micro-batch in flight: pp 1, tp 1
    per_layer = tokens * ((qkv_bytes - 2) * (m.q_width + m.kv_width + m.v_width)
                          + (out_bytes - 2) * m.attention_output_width)
    assert on.activations - off.activations == pytest.approx(m.num_layers * per_layer, rel=1e-9)
    assert (on.weights, on.gradients, on.optimizer_states) == (off.weights, off.gradients, off.optimizer_states)
