"""Megatron-FSDP on the Megatron engine (zero_stage 2: optim_grads, 3: optim_grads_params): its rules, what the ledger
holds for it, its gathers in the step time, and the files that ask for it (the flags themselves are checked against
Megatron-LM's own parser in tests/emit/test_megatron_oracle.py)."""

from __future__ import annotations

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.emit.megatron_lint import megatron_args_problems
from autotune.emit.shell_args import parse_shell_args_with_lines
from autotune.engines import engine_for
from autotune.engines.megatron_fsdp import UNIT_BUFFERS
from autotune.errors import InputError
from autotune.specs.layout import largest_layer
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

MODEL = load_model_preset("llama3-70b")


def _est(num_gpus=64, gpu="gb300", **kw):
    cluster = load_cluster(gpu=gpu, num_gpus=num_gpus)
    base = dict(global_batch_size=256, micro_batch_size=1, seq_len=8192, engine="megatron", recompute="full",
                precision="bf16")
    return estimate(MODEL, cluster, make_plan(MODEL, cluster, **(base | kw)))


def test_zero3_shards_weights_grads_and_optimizer_over_the_data_parallel_ranks():
    small, large = _est(num_gpus=16, zero_stage=3), _est(num_gpus=64, zero_stage=3)
    for term in ("weights", "gradients", "optimizer_states"):
        assert getattr(large.memory, term) == pytest.approx(getattr(small.memory, term) / 4, rel=1e-6), term
    # optim_grads keeps the 16-bit weights whole: the same on 16 or 64 GPUs, and more than the shard
    whole16, whole64 = _est(num_gpus=16, zero_stage=2), _est(num_gpus=64, zero_stage=2)
    assert whole16.memory.weights == pytest.approx(whole64.memory.weights)
    assert whole64.memory.weights > 10 * large.memory.weights
    assert whole64.memory.gradients == pytest.approx(large.memory.gradients)


def test_zero3_holds_its_double_buffers_and_less_than_the_distributed_optimizer():
    fsdp, distopt = _est(zero_stage=3), _est(zero_stage=1)
    buffers = engine_for(fsdp.plan).buffers(MODEL, fsdp.plan, None, None)
    assert set(buffers) == {"fsdp_unsharded_params", "fsdp_unsharded_grads"} and all(v > 0 for v in buffers.values())
    assert fsdp.memory.weights + fsdp.memory.gradients < distopt.memory.weights + distopt.memory.gradients


def test_zero3_gathers_cost_time_that_overlap_hides():
    hidden, waited = _est(zero_stage=3), _est(zero_stage=3, overlap_comm=False)
    assert waited.time.step_time_s > hidden.time.step_time_s


def test_refusals_name_the_rule_and_the_nearest_plan():
    with pytest.raises(InputError) as err:
        _est(zero_stage=3, optimizer="adafactor")
    assert "Megatron-FSDP does not support the adafactor optimizer" in str(err.value) and "--zero 1" in str(err.value)


def test_emitted_files_ask_megatron_for_fsdp_and_pass_the_linter():
    est = _est(zero_stage=3, tp=2, sequence_parallel=True)
    files = render_bundle(est).files
    argv, lines, env = parse_shell_args_with_lines(files["megatron_args.sh"])
    i = argv.index("--data-parallel-sharding-strategy")
    assert "--use-megatron-fsdp" in argv and argv[i + 1] == "optim_grads_params"
    assert argv[argv.index("--ckpt-format") + 1] == "fsdp_dtensor"
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in env  # Megatron-FSDP asserts it is not 1
    assert [p for p in megatron_args_problems(argv, 64, env=env, lines=lines) if p.severity == "error"] == []
    # the linter refuses what Megatron-LM refuses of it
    bad = argv[:]
    bad[bad.index("--ckpt-format") + 1] = "torch_dist"
    assert any(p.path == "--ckpt-format" for p in megatron_args_problems(bad, 64))
    assert any(p.path == "CUDA_DEVICE_MAX_CONNECTIONS"
               for p in megatron_args_problems(argv, 64, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}))


def test_bridge_overrides_carry_the_same_sharding():
    files = render_bundle(_est(zero_stage=2)).files
    text = files["bridge_overrides.yaml"]
    assert "use_megatron_fsdp: true" in text and "data_parallel_sharding_strategy: optim_grads" in text
    assert "ckpt_format: fsdp_dtensor" in text


def _plan(num_gpus=64, gpu="gb300", **kw):
    cluster = load_cluster(gpu=gpu, num_gpus=num_gpus)
    base = dict(global_batch_size=256, micro_batch_size=1, seq_len=8192, engine="megatron", recompute="full",
                precision="bf16")
    return cluster, make_plan(MODEL, cluster, **(base | kw))


def test_only_mxfp8_units_under_full_recompute_regather_for_the_recomputed_forward():
    from autotune.engines.megatron_fsdp import recompute_row_gathers

    _, mx = _plan(zero_stage=3, precision="fp8", fp8_recipe="te-mxfp8")
    assert recompute_row_gathers(mx, "te-mxfp8", True) == 1
    assert recompute_row_gathers(mx, "te-mxfp8", False) == 0  # no FP8 parameters: one 16-bit buffer
    assert recompute_row_gathers(mx, "te-blockwise", True) == 0  # no transpose buffer (MXFP8 tensors only)
    assert recompute_row_gathers(mx.with_(recompute="selective"), "te-mxfp8", True) == 0
    assert recompute_row_gathers(mx.with_(zero_stage=2), "te-mxfp8", True) == 0  # optim_grads: weights whole


def test_mxfp8_full_recompute_waits_for_one_more_gather_per_layer(monkeypatch):
    from autotune.cost import step_time

    cluster, plan = _plan(zero_stage=3, precision="fp8", fp8_recipe="te-mxfp8")
    real = step_time.estimate_step_time(MODEL, cluster, plan)
    monkeypatch.setattr(step_time, "recompute_row_gathers", lambda *a: 0)
    without = step_time.estimate_step_time(MODEL, cluster, plan)
    extra = real.comm_parts_s["zero3"] - without.comm_parts_s["zero3"]
    # one gather per layer and micro-batch, waited: the same seconds as step time, none of it hidden compute
    assert extra > 0
    assert real.step_time_s - without.step_time_s == pytest.approx(extra, rel=1e-6)
    assert real.compute_s == pytest.approx(without.compute_s, rel=1e-9)


def test_optim_grads_hidden_reduce_scatters_cost_overlap_every_micro_batch():
    from dataclasses import replace

    from autotune.cost.efficiency import DEFAULT_EFFICIENCY
    from autotune.cost.step_time import TimeSettings, estimate_step_time

    free = TimeSettings(efficiency=replace(DEFAULT_EFFICIENCY, overlap_cost=0.0))

    def contention(m):
        cluster, plan = _plan(zero_stage=2, global_batch_size=64 * m)
        return estimate_step_time(MODEL, cluster, plan).compute_s - estimate_step_time(MODEL, cluster, plan,
                                                                                        free).compute_s

    # tp 1: the hidden collectives are each micro-batch's gradient reduce-scatter (megatron_fsdp.py:761-786) and
    # the updated weights' all-gather once per step: each added micro-batch adds one reduce-scatter's contention
    one, two, eight = contention(1), contention(2), contention(8)
    per_reduce = two - one
    assert per_reduce > 0
    assert eight - one == pytest.approx(7 * per_reduce, rel=0.02)


def test_per_tensor_fp8_units_gather_one_copy_where_the_fp8_gemms_take_either_layout():
    # Per-tensor FP8 (te-delayed): Hopper's unit buffers hold the gathered data and its transpose, Blackwell's the
    # data alone (fp8_copies); MXFP8 units hold both scaling directions.
    def unit_params(gpu, fp8_recipe):
        est = _est(gpu=gpu, zero_stage=3, precision="fp8", fp8_recipe=fp8_recipe)
        return est.memory.buffer_parts["fsdp_unsharded_params"], est

    hopper, h200 = unit_params("h200", "te-delayed")
    blackwell, gb300 = unit_params("gb300", "te-delayed")
    assert not h200.cluster.gpu.fp8_gemm_any_layout and gb300.cluster.gpu.fp8_gemm_any_layout
    # the transpose Hopper adds: one byte per element of each of the two unit buffers' layers
    assert hopper - blackwell == pytest.approx(UNIT_BUFFERS * largest_layer(MODEL).per_gpu(1, 1))
    mxfp8, _ = unit_params("gb300", "te-mxfp8")  # both directions and their block scales, on Blackwell too
    assert mxfp8 > hopper > blackwell
