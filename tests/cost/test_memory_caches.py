"""What the ledger's and the step time's caches rest on: each is keyed on the plan fields its part reads, so a plan's
estimate is the same whichever plans were estimated before it (the planner asks for ~10^4 plans that share most
fields), and no engine's buffers read the recompute settings (``memory._BUFFER_FIELDS``)."""

import dataclasses
import itertools

import pytest

from autotune.cost import activations, memory, step_terms, step_time
from autotune.cost.memory import _common_buffer_bytes, estimate_memory
from autotune.cost.step_time import TimeSettings, estimate_step_time
from autotune.engines import ENGINES, engine_for
from autotune.rules import plan_problems
from autotune.specs import layout
from autotune.specs.layout import stage_param_groups
from autotune.specs.stage_mix import representative_stages
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.plan import ParallelPlan
from autotune.specs.settings import MemorySettings

CASES = [("llama3-70b", "h100-sxm-80gb", 64, 512), ("mixtral-8x7b", "h100-sxm-80gb", 32, 256)]


def _plans(engine: str, num_gpus: int, gb: int, model, cluster):
    """Valid plans of ``engine`` over the dimensions the caches split on (two global batches, so that a micro-batch
    size does not follow from the rest), recompute innermost."""
    for tp, pp, vpp, cp, zero, offloads, mb, precision, graphs, batch in itertools.product(
            (1, 8), (1, 4), (1, 2), (1, 2), (0, 1, 2, 3), (("none", "none"), ("cpu", "none"), ("cpu", "cpu")), (1, 2),
            ("bf16", "fp8"), (None, "local"), (gb, 2 * gb)):
        dp = num_gpus // (tp * pp * cp)
        if dp < 1 or batch % (mb * dp):
            continue
        base = dict(engine=engine, tp=tp, pp=pp, vpp=vpp, cp=cp, dp=dp, zero_stage=zero, offload_optimizer=offloads[0],
                    offload_param=offloads[1], micro_batch_size=mb, grad_accum_steps=batch // (mb * dp),
                    global_batch_size=batch, seq_len=4096, precision=precision, sequence_parallel=tp > 1,
                    cuda_graph=graphs, dp_replicate=2 if zero >= 2 and dp >= 4 else 1)
        plans = [ParallelPlan(recompute=r, **base) for r in ("none", "selective", "full")]
        plans.append(ParallelPlan(recompute="full", recompute_num_layers=1, **base))
        plans = [p for p in plans if not plan_problems(model, cluster, p)]
        if len(plans) > 1:
            yield plans


def _clear_caches():
    for module in (memory, step_time, step_terms, activations, layout):
        for name, value in vars(module).items():
            if name.endswith("_cache") and isinstance(value, dict):
                value.clear()


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("model_name,gpu,num_gpus,gb", CASES)
def test_buffers_do_not_read_the_recompute_settings(engine, model_name, gpu, num_gpus, gb):
    model, cluster = load_model(model_name), load_cluster(gpu=gpu, num_gpus=num_gpus)
    eng, settings, checked = engine_for(engine), MemorySettings(), 0
    for plans in _plans(engine, num_gpus, gb, model, cluster):
        for stage in representative_stages(model.num_layers, plans[0].pp, eng.support.layer_split):
            buffers = [eng.buffers(model, p, stage_param_groups(model, p, stage, eng.support.layer_split), settings)
                       | _common_buffer_bytes(eng, model, p, stage,
                                              stage_param_groups(model, p, stage, eng.support.layer_split), settings)
                       for p in plans]
            assert all(b == buffers[0] for b in buffers), plans[0]
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("model_name,gpu,num_gpus,gb", CASES)
def test_estimates_do_not_depend_on_what_was_estimated_before(model_name, gpu, num_gpus, gb):
    """Each plan's ledger and step time, with every cache empty, equal those of the same plan estimated after all
    the others (in reverse order): no cache key misses a field its part reads."""
    model, cluster = load_model(model_name), load_cluster(gpu=gpu, num_gpus=num_gpus)
    plans = [p for engine in sorted(ENGINES) for group in _plans(engine, num_gpus, gb, model, cluster) for p in group]
    assert len(plans) > 100
    ms, ts = MemorySettings(), TimeSettings()  # one of each, as the planner passes them (the caches key on their ids)
    alone = []
    for plan in plans:
        _clear_caches()
        alone.append((dataclasses.asdict(estimate_memory(model, cluster, plan, ms)),
                      estimate_step_time(model, cluster, plan, ts).to_dict()))
    _clear_caches()
    for plan, want in reversed(list(zip(plans, alone))):
        assert (dataclasses.asdict(estimate_memory(model, cluster, plan, ms)),
                estimate_step_time(model, cluster, plan, ts).to_dict()) == want, plan
