"""Pipeline sends on the critical path: blocking 1F1B waits for every micro-batch's; Megatron's interleaved schedule
with overlap_p2p_comm only for its warmup and cooldown chunks (autotune.cost.pp_sends)."""

import dataclasses

import pytest

from autotune.cost.pp_sends import exposed_pp_sends
from autotune.cost.step_time import estimate_step_time
from autotune.engines import engine_for
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset


def test_blocking_schedules_wait_for_every_microbatch():
    assert exposed_pp_sends(32, 8, 1, True) == (32 + 7) * 2  # no interleaving: batch_p2p_comm, all wait
    assert exposed_pp_sends(32, 8, 4, False) == (32 + 7) * 2  # an engine that does not overlap them
    assert exposed_pp_sends(32, 1, 1, True) == 0


def test_interleaved_waits_for_warmup_and_cooldown_only():
    # Megatron's warmup count on rank 0: (pp - 1) x 2 + (vpp - 1) x pp chunks; as many in the cooldown.
    assert exposed_pp_sends(256, 8, 3, True) == 2 * (7 * 2 + 2 * 8)
    # every micro-batch in the warmup: each chunk's send waits (never more than the blocking schedule's count)
    assert exposed_pp_sends(2, 8, 4, True) == 2 * 2 * 4


def test_megatron_overlaps_interleaved_sends_and_the_step_shows_it(monkeypatch):
    assert engine_for(ParallelPlan(engine="megatron")).comm.pp_overlap_interleaved
    assert not engine_for(ParallelPlan(engine="deepspeed")).comm.pp_overlap_interleaved
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=256, gpus_per_node=None, cluster_path=None)
    model = load_model_preset("llama3-70b")
    plan = ParallelPlan(tp=4, pp=8, vpp=5, dp=8, seq_len=4096, micro_batch_size=1, global_batch_size=512,
                        grad_accum_steps=64, sequence_parallel=True, engine="megatron", zero_stage=1)
    interleaved = estimate_step_time(model, cluster, plan)
    engine = type(engine_for(plan))
    monkeypatch.setattr(engine, "comm", dataclasses.replace(engine.comm, pp_overlap_interleaved=False))
    blocking = estimate_step_time(model, cluster, plan)
    # 64 micro-batches: 2 x (7 x 2 + 4 x 8) sends wait of the blocking schedule's (64 + 7) x 2
    assert interleaved.comm_parts_s["pp"] == pytest.approx(blocking.comm_parts_s["pp"] * 92 / 142)
    assert interleaved.compute_s == pytest.approx(blocking.compute_s)  # the hidden sends cost no compute
    assert interleaved.step_time_s < blocking.step_time_s
