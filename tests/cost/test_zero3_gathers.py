"""DeepSpeed ZeRO-3's exposed gathers (autotune.cost.zero3_gathers), derived by hand on small traces."""

import dataclasses

import pytest

from autotune.cost.published_runs import published_runs
from autotune.cost.step_time import TimeSettings, estimate_step_time
from autotune.cost.zero3_gathers import TraceEntry, deepspeed_trace, deepspeed_zero3_waits, trace_waits
from autotune.specs.model import ModelSpec

# One layer of a repeating trace: A (100 parameters), the attention core (none), C (200 parameters).
A = TraceEntry(numel=100, compute_s=1.0, gather_s=0.5)
CORE = TraceEntry(numel=0, compute_s=0.2)
C = TraceEntry(numel=200, compute_s=0.6, gather_s=1.5)
TRACE = [A, CORE, C]


def test_one_submodule_ahead():
    # Bucket 10 < every weight: each hook prefetches the next weight only. A's gather is issued at the previous
    # layer's C and hides behind C's 0.6 s (0.5 s: hidden); C's is issued at A and hides behind A + core, 1.2 s:
    # 0.3 s of its 1.5 s waits. Network 2.0 s against 1.8 s of compute: the floor, 0.2 s, is below.
    waits, network = trace_waits(TRACE, bucket=10, max_live=1000)
    assert network == pytest.approx(2.0)
    assert waits == pytest.approx(0.3)


def test_no_prefetch_past_max_live():
    # max_live 150: after C (200 parameters) is gathered nothing is prefetched, so A's 0.5 s waits in full; after A
    # (100 < 150) C is prefetched as before: 0.5 + 0.3.
    waits, _ = trace_waits(TRACE, bucket=10, max_live=150)
    assert waits == pytest.approx(0.8)


def test_bucket_reaches_two_ahead():
    # Bucket 150: A's hook prefetches C; the previous C's hook (100 of A gathered in between, below 150) reached C
    # too: C hides behind C + A + core = 1.8 s; A behind the previous C, 0.6 s. Nothing waits beyond the network
    # floor: 2.0 - 1.8 = 0.2 s.
    waits, _ = trace_waits(TRACE, bucket=150, max_live=1000)
    assert waits == pytest.approx(0.2)


def test_overlap_floor_when_network_exceeds_compute():
    slow = [dataclasses.replace(e, reduce_s=1.0 if e.numel else 0.0) for e in TRACE]
    waits, network = trace_waits(slow, bucket=10, max_live=1000)
    assert network == pytest.approx(4.0)
    assert waits == pytest.approx(4.0 - 1.8)  # the links carry 4 s of a 1.8 s layer


TINY = ModelSpec(name="tiny", num_layers=4, hidden_size=4, num_attention_heads=2, ffn_hidden_size=16, vocab_size=32)


def test_trace_pieces_and_reuse_distance():
    # QKV 4 x 12 = 48, core 0, output projection 16, fc1 64, fc2 64 parameters. Backward with activation
    # checkpointing: recomputed forward, then fc2, fc1, proj, QKV. The backward use of a weight follows its
    # recomputed use with the later weights twice in between: fc2 0, fc1 128, proj 256, QKV 288 parameters; with a
    # reuse distance of 200, fc2 and fc1 stay gathered, proj and QKV are gathered again.
    fwd = deepspeed_trace(TINY, 1, 8, fwd_s=1.0, bwd_s=0.0, rec_s=0.0, gather_bw_s=0.192, reduce_bw_s=0.0,
                          latency_s=0.01, backward=False, max_reuse=200)
    assert [e.numel for e in fwd] == [48, 0, 16, 64, 64]
    assert sum(e.compute_s for e in fwd) == pytest.approx(1.0)
    # gathers: bandwidth time by parameters (0.192 s over 192) plus one latency per collective
    assert [e.gather_s for e in fwd] == pytest.approx([0.058, 0.0, 0.026, 0.074, 0.074])
    bwd = deepspeed_trace(TINY, 1, 8, fwd_s=0.0, bwd_s=2.0, rec_s=1.0, gather_bw_s=0.192, reduce_bw_s=0.192,
                          latency_s=0.0, backward=True, max_reuse=200)
    assert [e.numel for e in bwd] == [48, 0, 16, 64, 64, 64, 64, 16, 0, 48]
    assert [e.gather_s > 0 for e in bwd[5:]] == [False, False, True, False, True]
    assert all(e.gather_s > 0 for e in bwd[:5] if e.numel)
    assert sum(e.compute_s for e in bwd[:5]) == pytest.approx(1.0)
    assert sum(e.compute_s for e in bwd[5:]) == pytest.approx(2.0)
    assert sum(e.reduce_s for e in bwd) == pytest.approx(0.192)


@pytest.mark.parametrize("reduce_bucket, tail", [(10, 48), (100, 48), (200, 192), (1000, 768)])
def test_first_gather_and_last_reduce_wait(reduce_bucket, tail):
    # Compute far above the network: only the pass's first gather (QKV: 48 of 192 parameters, 0.048 s, nothing
    # before it to hide behind) and the last reduce bucket wait. Gradients arrive fc2 64, fc1 64, proj 16, QKV 48 per
    # layer, 4 layers; a bucket is reduced when the next gradient would take it past its size. 10: every gradient
    # alone, the last is QKV's 48. 100: 64 | 64 + 16 | 48 per layer, QKV's 48 last. 200: a layer a bucket
    # (64 + 64 + 16 + 48 = 192), the last layer's 192. 1000: all 768 wait at the end.
    held = 0
    for _ in range(4):
        for p in (64, 64, 16, 48):
            held = p if held and held + p > reduce_bucket else held + p
    assert held == tail
    w = deepspeed_zero3_waits(TINY, 1, 8, 4, fwd_s=40.0, bwd_s=80.0, rec_s=0.0, gather_bw_s=0.768,
                              reduce_bw_s=0.768, latency_s=0.0, bucket=10, max_live=1e9, max_reuse=0,
                              reduce_bucket=reduce_bucket)
    assert w.fwd_wait_s == pytest.approx(0.048)
    assert w.bwd_wait_s == pytest.approx(0.768 * tail / 768)
    assert w.network_s == pytest.approx(0.768 * 3)  # forward and backward gathers, one reduce-scatter


def _zero3_run(name):
    return next(r for r in published_runs() if r.run_id == name)


def test_max_live_parameters_exposes_530b_gathers():
    # A 530B layer's QKV (1.26B) and MLP weights (1.68B) reach the 1e9 that autotune writes: the gathers after them
    # are not prefetched. Raising the limit (a JSON setting) lets them hide again.
    run = _zero3_run("narayanan21-t2-zero3-530b-1120gpu")
    plan = run.candidates[0]
    emitted = estimate_step_time(run.model, run.cluster, plan, TimeSettings())
    raised = estimate_step_time(run.model, run.cluster, plan, TimeSettings(stage3_max_live_parameters=10**10))
    assert emitted.comm_parts_s["zero3"] > 2 * raised.comm_parts_s["zero3"]
    assert emitted.step_time_s > raised.step_time_s


def test_list_collectives_of_2021_cost_a_launch_per_rank_and_a_copy():
    # DeepSpeed v0.3.x gathered each parameter through a list of world_size tensors, which PyTorch's NCCL group copied
    # one by one after a device synchronize: the wait grows with the ranks; the coalesced collectives do not.
    run = _zero3_run("narayanan21-t2-zero3-175b-384gpu")
    plan = run.candidates[0]
    model = run.model
    kw = dict(fwd_s=16.0, bwd_s=32.0, rec_s=16.0, gather_bw_s=2.0, reduce_bw_s=2.0, latency_s=0.002, bucket=5e7,
              max_live=1e9, max_reuse=1e9, reduce_bucket=5e8)
    plain = deepspeed_zero3_waits(model, 1, 2048, model.num_layers, **kw)
    small = deepspeed_zero3_waits(model, 1, 2048, model.num_layers, **kw, list_collectives=(64, 1.6e12))
    large = deepspeed_zero3_waits(model, 1, 2048, model.num_layers, **kw, list_collectives=(1024, 1.6e12))
    assert plain.fwd_wait_s < small.fwd_wait_s < large.fwd_wait_s
    assert plain.bwd_wait_s < small.bwd_wait_s < large.bwd_wait_s
    assert small.network_s > plain.network_s  # the flattened copies lengthen every collective
    # at the 4 gathers of a layer's forward, each 1024 - 64 launches of 3.8 us more
    assert large.fwd_wait_s - small.fwd_wait_s == pytest.approx(model.num_layers * 4 * 960 * 3.8e-6, rel=1e-6)
    settings = dict(run.time_overrides)
    assert settings.pop("zero3_list_collectives") is True
    old = estimate_step_time(model, run.cluster, plan, TimeSettings(zero3_list_collectives=True, **settings))
    new = estimate_step_time(model, run.cluster, plan, TimeSettings(**settings))
    assert old.step_time_s > new.step_time_s
