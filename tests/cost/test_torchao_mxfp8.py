"""torchao's MX linear on FSDP2 / torchtitan (``torchao-mxfp8``): the GPU generation it runs on, and what it costs —
casts along both axes with E8M0 scales, 16-bit saved inputs and 16-bit weight all-gathers."""

from __future__ import annotations

import pytest

from autotune.api import estimate
from autotune.cli import main
from autotune.cost.kernels import FP8_CAST_BYTES
from autotune.engines import engine_for
from autotune.rules import plan_problems
from autotune.specs.loading import load_cluster
from autotune.specs.plan import FP8_BLOCK_SCALE_BYTES, ParallelPlan
from autotune.specs.presets import load_model_preset

MODEL = load_model_preset("llama3-8b")


def _plan(recipe: str | None, precision: str = "fp8", **kw) -> ParallelPlan:
    return ParallelPlan(engine="fsdp", dp=16 // kw.get("tp", 1), zero_stage=3, global_batch_size=64,
                        grad_accum_steps=4 * kw.get("tp", 1), seq_len=4096, precision=precision, fp8_recipe=recipe,
                        sequence_parallel=kw.get("tp", 1) > 1, **kw)


@pytest.mark.parametrize(("gpu", "runs"), [("h100-sxm-80gb", False), ("h200", False), ("l40s", False),
                                           ("b200", True), ("gb200", True), ("b300", True)])
def test_it_runs_where_torchtitan_finds_sm100_or_later(gpu, runs):
    rules = dict(plan_problems(MODEL, load_cluster(gpu=gpu, num_gpus=16), _plan("torchao-mxfp8")))
    assert ("fp8_recipe_gpu" not in rules) is runs, rules
    if not runs:
        assert "SM100" in rules["fp8_recipe_gpu"] and "torchao-rowwise" in rules["fp8_recipe_gpu"]


def test_cli_refuses_it_on_hopper_with_exit_2(capsys):
    code = main(["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "16", "--global-batch",
                 "64", "--engine", "fsdp", "--zero", "3", "--precision", "fp8", "--fp8-recipe", "torchao-mxfp8"])
    err = capsys.readouterr().err
    assert code == 2 and "compute capability 10.0" in err and "Traceback" not in err


def test_its_casts_read_the_16_bit_source_once_per_axis():
    # dim-0 and dim-1 casts, each a 16-bit read and an E4M3 write with one E8M0 byte per 32 elements
    assert FP8_BLOCK_SCALE_BYTES["torchao-mxfp8"] == (1 / 32, 1 / 32)
    assert FP8_CAST_BYTES["torchao-mxfp8"] == pytest.approx(2 * (2 + 1 + 1 / 32))
    assert FP8_CAST_BYTES["torchao-mxfp8"] > FP8_CAST_BYTES["torchao-rowwise"] > FP8_CAST_BYTES["te-mxfp8"]


def test_memory_is_the_16_bit_memory_of_torchao_recipes_without_fp8_all_gather():
    """torchao's MX linear saves its 16-bit input and weight for backward and quantises inside the GEMM: the saved
    activations are those of rowwise Float8; its weights are gathered in bf16 (no FP8 all-gather, as rowwise)."""
    cluster = load_cluster(gpu="b200", num_gpus=16)
    mx, rowwise, tensorwise = (estimate(MODEL, cluster, _plan(r)) for r in ("torchao-mxfp8", "torchao-rowwise",
                                                                              "torchao-tensorwise"))
    assert not engine_for("fsdp").fp8_param_gather(_plan("torchao-mxfp8"))
    assert mx.memory.activations == pytest.approx(rowwise.memory.activations, rel=1e-12)
    assert mx.memory.buffer_parts["unsharded_params"] == pytest.approx(
        rowwise.memory.buffer_parts["unsharded_params"], rel=1e-12)
    assert mx.memory.buffer_parts["unsharded_params"] > tensorwise.memory.buffer_parts["unsharded_params"]


def test_it_is_faster_than_bf16_on_blackwell_and_eager_with_tp():
    cluster = load_cluster(gpu="b200", num_gpus=16)
    bf16 = estimate(MODEL, cluster, _plan(None, precision="bf16", torch_compile=True))
    mx = estimate(MODEL, cluster, _plan("torchao-mxfp8"))
    assert mx.time.step_time_s < bf16.time.step_time_s
    fsdp = engine_for("fsdp")
    assert fsdp.compiles(_plan("torchao-mxfp8")) and not fsdp.compiles(_plan("torchao-mxfp8", tp=2))
    assert fsdp.compiles(_plan("torchao-mxfp8", tp=2, torch_compile=True))  # asked for: the 0.3 module writes it
