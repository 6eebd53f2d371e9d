"""What the planner's replica shortcuts rest on (``autotune.search.planner._search_variants``): for an engine that
shards hybrid, a plan's rules read its replica count only as ``dp_replicate > 1``, and its memory grows with the
replica count, all else equal: the model states per GPU grow, activations, buffers and the bytes outside the
allocator do not change."""

import itertools

import pytest

from autotune.cost.memory import _outside_allocator_bytes, estimate_memory
from autotune.engines import ENGINES, engine_for
from autotune.rules import plan_problems
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.plan import ParallelPlan
from autotune.specs.settings import MemorySettings

HYBRID = [name for name in ENGINES if engine_for(name).support.hybrid_shard]
CASES = [("llama3-70b", 64, 512), ("mixtral-8x7b", 32, 256)]


def _plans(engine: str, num_gpus: int, gb: int):
    for tp, pp, cp, zero, offload, mb, recompute, precision in itertools.product(
            (1, 2, 8), (1, 2, 4), (1, 2), (2, 3), ("none", "cpu"), (1, 2), ("none", "selective", "full"),
            ("bf16", "fp8")):
        dp = num_gpus // (tp * pp * cp)
        if dp < 4 or gb % (mb * dp):
            continue
        base = dict(engine=engine, tp=tp, pp=pp, cp=cp, dp=dp, zero_stage=zero, offload_optimizer=offload,
                    offload_param=offload, micro_batch_size=mb, grad_accum_steps=gb // (mb * dp),
                    global_batch_size=gb, seq_len=4096, recompute=recompute, precision=precision,
                    sequence_parallel=tp > 1)
        yield [ParallelPlan(dp_replicate=r, **base) for r in (1, 2, 4) if dp % r == 0 and dp > r]


@pytest.mark.parametrize("engine", HYBRID)
@pytest.mark.parametrize("model_name,num_gpus,gb", CASES)
def test_memory_grows_with_replicas_and_rules_read_only_whether_there_are_any(engine, model_name, num_gpus, gb):
    model, cluster = load_model(model_name), load_cluster(gpu="h100-sxm-80gb", num_gpus=num_gpus)
    checked = 0
    for plans in _plans(engine, num_gpus, gb):
        rules = [[rule for rule, _ in plan_problems(model, cluster, p)] for p in plans]
        assert all(r == rules[1] for r in rules[1:]), plans[1]
        outside = {_outside_allocator_bytes(cluster, p, MemorySettings()) for p in plans}
        assert len(outside) == 1
        for small, large in itertools.pairwise(estimate_memory(model, cluster, p) for p in plans):
            if large.stage == small.stage:  # an uneven split's most loaded stage may move with the states
                assert large.activation_parts == small.activation_parts and large.buffer_parts == small.buffer_parts
            assert large.optimizer_step == small.optimizer_step
            assert large.weights >= small.weights and large.gradients >= small.gradients
            assert large.optimizer_states >= small.optimizer_states and large.total >= small.total
            checked += 1
    assert checked > 50
