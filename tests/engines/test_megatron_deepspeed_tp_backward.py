"""Megatron-DeepSpeed under --deepspeed waits for the backward's TP all-reduce (the fork's validate_args turns
async_tensor_model_parallel_allreduce off, megatron/arguments.py:396-399 at 4efb479d) unless the plan is
sequence-parallel, whose reduce-scatter is issued before the weight-gradient GEMM (layers.py:348-356)."""

import pytest

from autotune.api import make_plan
from autotune.cost.step_time import estimate_step_time
from autotune.cost.time_settings import TimeSettings
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset


@pytest.mark.parametrize("sp, overlapped", [(False, False), (True, True)])
def test_the_backward_tp_collective_hides_only_with_sequence_parallelism(sp, overlapped):
    model = load_model_preset("llama3-8b")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=16)
    plan = make_plan(model, cluster, global_batch_size=64, seq_len=4096, tp=4, zero_stage=1,
                     engine="megatron-deepspeed", sequence_parallel=sp)
    step = estimate_step_time(model, cluster, plan).step_time_s
    stated = {flag: estimate_step_time(model, cluster, plan, TimeSettings(tp_backward_overlap=flag)).step_time_s
              for flag in (True, False)}
    assert step == pytest.approx(stated[overlapped], rel=1e-12)
    assert stated[False] > stated[True] * 1.01  # the all-reduce waited for costs time at tp 4
