"""Token dropping (``ParallelPlan.moe_capacity_factor`` / ``moe_pad_to_capacity``: Megatron
--moe-expert-capacity-factor / --moe-pad-expert-input-to-capacity): the plan checks, the engines and rules that take
or refuse it, what it costs (autotune.cost.moe_time.routed_share, static_dispatch), the files that carry it and the
files that read it back. Megatron-core 0.19.2's own verdict on the written flags: tests/emit/
test_megatron_core_run_settings.py (qwen-token-drop-*, pad-without-capacity, deepep-padded)."""

from __future__ import annotations

import re

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.cli import main
from autotune.cost import step_time
from autotune.cost.layer_time import LayerTime
from autotune.errors import InputError
from autotune.job_files import read_job
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset

GPU = "b200"
MOE = "qwen3-30b-a3b"


def _estimate(**kw):
    model, cluster = load_model_preset(MOE), load_cluster(gpu=GPU, num_gpus=8)
    plan = make_plan(model, cluster, engine="megatron", ep=8, zero_stage=1, global_batch_size=64, seq_len=4096,
                     micro_batch_size=1, recompute="none", **kw)
    return estimate(model, cluster, plan)


def _moe_layer(monkeypatch, **kw) -> LayerTime:
    """The MoE layer's forward parts the step time is built from."""
    seen: list[LayerTime] = []
    real = step_time.layer_time

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        if args[3]:  # moe_layer
            seen.append(out)
        return out

    monkeypatch.setattr(step_time, "layer_time", spy)
    step_time._stage_time_cache.clear()
    _estimate(**kw)
    return seen[-1]


def test_plan_checks_the_values_and_reads_json_integers_as_floats():
    plan = ParallelPlan(ep=8, dp=8, global_batch_size=8, moe_capacity_factor=1, moe_pad_to_capacity=True)
    assert plan.moe_capacity_factor == 1.0 and isinstance(plan.moe_capacity_factor, float)
    assert plan.to_dict()["moe_capacity_factor"] == 1.0 and plan.to_dict()["moe_pad_to_capacity"] is True
    assert "moe_capacity_factor" not in ParallelPlan().to_dict()  # dropless: left out, the engines' default
    for bad in (0, -1.0, float("nan"), float("inf"), True, "1.0"):
        with pytest.raises(InputError, match="moe_capacity_factor must be a positive number"):
            ParallelPlan(moe_capacity_factor=bad)
    with pytest.raises(InputError, match="moe_pad_to_capacity must be true, false or absent"):
        ParallelPlan(moe_capacity_factor=1.0, moe_pad_to_capacity="yes")


@pytest.mark.parametrize("flags, words", [
    (["--moe-capacity-factor", "0"], "--moe-capacity-factor must be > 0"),
    (["--moe-capacity-factor", "nan"], "--moe-capacity-factor must be a finite number"),
    (["--moe-pad-to-capacity"], "moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity"),
    (["--moe-capacity-factor", "1", "--moe-pad-to-capacity", "--moe-dispatcher", "flex-deepep"],
     "deepep backend does not support moe_pad_expert_input_to_capacity"),
    (["--moe-capacity-factor", "1", "--engine", "fsdp", "--zero", "3"], "its MoE layers are dropless"),
])
def test_the_cli_refuses_what_megatron_or_the_engine_refuses(capsys, flags, words):
    argv = ["estimate", "--model", MOE, "--gpu", GPU, "--num-gpus", "8", "--ep", "8", "--engine", "megatron", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_a_dense_model_has_no_experts_to_cap(capsys):
    argv = ["estimate", "--model", "llama3-8b", "--gpu", GPU, "--num-gpus", "8", "--engine", "megatron",
            "--moe-capacity-factor", "1.0"]
    assert main(argv) == 2
    assert "has no MoE layers: there are no experts to cap" in capsys.readouterr().err


def test_padding_runs_the_capacity_and_dropping_caps_the_experts_rows(monkeypatch):
    dropless = _moe_layer(monkeypatch)
    padded = _moe_layer(monkeypatch, moe_capacity_factor=1.5, moe_pad_to_capacity=True)
    dropped = _moe_layer(monkeypatch, moe_capacity_factor=0.5)
    # the routed experts' GEMMs (experts_s[0]) and the all-to-all bytes scale with the rows run: padded to 1.5 x the
    # balanced share, capped at 0.5 x without padding (the dropless busiest rank is ~1.0x: thousands of tokens)
    assert padded.experts_s[0] / dropless.experts_s[0] == pytest.approx(1.5, rel=0.08)
    assert dropped.experts_s[0] / dropless.experts_s[0] == pytest.approx(0.5, rel=0.08)
    assert padded.moe_comm_s / dropless.moe_comm_s == pytest.approx(1.5, rel=0.05)
    assert dropped.moe_comm_s < dropless.moe_comm_s
    assert padded.attention_s == dropless.attention_s  # the attention side is untouched


def test_fp8_casts_the_rows_the_experts_run(monkeypatch):
    # every routed row an expert runs is quantized before its GEMMs, the padding rows too (Megatron's grouped
    # linears cast their whole input): the layer's FP8 cast time grows with the padded capacity
    fp8 = dict(precision="fp8", fp8_recipe="te-mxfp8")
    dropless = _moe_layer(monkeypatch, **fp8)
    padded = _moe_layer(monkeypatch, moe_capacity_factor=2.0, moe_pad_to_capacity=True, **fp8)
    bf16 = _moe_layer(monkeypatch, moe_capacity_factor=2.0, moe_pad_to_capacity=True)
    bf16_dropless = _moe_layer(monkeypatch)
    cast_growth = (padded.elementwise_s - dropless.elementwise_s) - (bf16.elementwise_s - bf16_dropless.elementwise_s)
    assert cast_growth > 0


def test_padded_capacity_leaves_no_host_sync_so_the_experts_calls_are_issued_ahead():
    # at one 4,096-token micro-batch on 8 B200s the 16 local experts' cuBLASLt calls outlast their GPU work: the
    # dropless dispatcher's host sync makes the GPU wait for all of them (autotune.cost.expert_host); padded to
    # capacity 1.0 the rows are the same but the host keeps the lead it had over the GPU's attention-side work
    # (token_dispatcher.py:505-531 returns before any sync point), which hides part of the experts' issue time
    dropless, padded = _estimate(), _estimate(moe_capacity_factor=1.0, moe_pad_to_capacity=True)
    capped = _estimate(moe_capacity_factor=1.0)  # dynamic shapes: still synced, and nothing dropped on average
    gain = padded.time.tokens_per_s / dropless.time.tokens_per_s - 1
    assert 0.03 < gain < 0.25, gain  # the lead: less than the layer's non-expert forward GPU time
    assert capped.time.tokens_per_s == pytest.approx(dropless.time.tokens_per_s, rel=0.01)


def test_padded_rows_take_memory_and_dropped_ones_free_it():
    base = _estimate().memory.activations
    assert _estimate(moe_capacity_factor=1.5, moe_pad_to_capacity=True).memory.activations > base
    assert _estimate(moe_capacity_factor=0.5).memory.activations < base
    assert _estimate(moe_capacity_factor=1.0, moe_pad_to_capacity=True).memory.activations == pytest.approx(base)


@pytest.mark.parametrize("name", ["megatron_args.sh", "bridge_overrides.yaml"])
def test_the_written_files_carry_it_and_read_back_to_the_same_plan_and_estimate(tmp_path, name):
    est = _estimate(moe_capacity_factor=1.25, moe_pad_to_capacity=True)
    files = render_bundle(est).files
    assert "--moe-expert-capacity-factor 1.25" in files["megatron_args.sh"]
    assert "--moe-pad-expert-input-to-capacity" in files["megatron_args.sh"]
    assert "moe_expert_capacity_factor: 1.25" in files["bridge_overrides.yaml"]
    assert "moe_pad_expert_input_to_capacity: true" in files["bridge_overrides.yaml"]
    assert "MoE capacity" in files["plan.md"]
    path = tmp_path / name
    path.write_text(files[name])
    job = read_job([str(path)], gpu=GPU, num_gpus=8, **({"model": MOE} if name.endswith(".sh") else {}))
    assert (job.plan.moe_capacity_factor, job.plan.moe_pad_to_capacity) == (1.25, True)
    again = estimate(job.model, job.cluster, job.plan, job.settings)
    assert again.time.step_time_s == pytest.approx(est.time.step_time_s, rel=1e-9)


def test_dropless_files_say_nothing_of_capacity():
    files = render_bundle(_estimate()).files
    assert "capacity-factor" not in files["megatron_args.sh"]
    assert "moe_expert_capacity_factor" not in files["bridge_overrides.yaml"]


def test_the_planner_runs_every_plan_at_the_asked_capacity(capsys):
    argv = ["plan", "--model", MOE, "--gpu", GPU, "--num-gpus", "16", "--engine", "megatron", "--global-batch", "64",
            "--moe-capacity-factor", "1.0", "--moe-pad-to-capacity", "--top", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    listed = [line for line in out.splitlines() if re.match(r"\s+\d+=?\s+megatron\s", line)]
    assert len(listed) == 3 and all("cap1-pad" in line for line in listed), out
