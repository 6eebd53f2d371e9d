"""The caching allocator's reserve with and without expandable segments (``MemorySettings.expandable_segments``)."""

import pytest

from autotune.cost.memory import estimate_memory, states_floor
from autotune.specs.plan import ParallelPlan
from autotune.specs.settings import MemorySettings

from tests.cost.test_memory import CLUSTER, LLAMA70

PLAN = ParallelPlan(tp=8, pp=2, dp=4, zero_stage=1, seq_len=8192, global_batch_size=512, grad_accum_steps=128,
                    sequence_parallel=True, recompute="selective")


def test_expandable_segments_leave_the_reserve_out_of_the_device_total():
    cached = estimate_memory(LLAMA70, CLUSTER, PLAN, MemorySettings(fragmentation_fraction=0.1))
    unmapped = estimate_memory(LLAMA70, CLUSTER, PLAN, MemorySettings(fragmentation_fraction=0.1,
                                                                      expandable_segments=True))
    # The same tensors and the same allocator reserve (what max_memory_reserved shows when nothing presses)...
    assert unmapped.allocated == pytest.approx(cached.allocated)
    assert unmapped.reserved == pytest.approx(cached.reserved)
    assert cached.reserve == pytest.approx(0.1 * cached.allocated)
    # ...but the device total the fit is judged on drops by the reserve: the allocator hands the free pages back.
    assert cached.total - unmapped.total == pytest.approx(cached.reserve)
    assert unmapped.total == pytest.approx(sum(unmapped.terms().values()))
    assert unmapped.headroom > cached.headroom


def test_expandable_segments_decide_a_plan_at_the_edge():
    tight = estimate_memory(LLAMA70, CLUSTER, PLAN, MemorySettings(fragmentation_fraction=0.0))
    # a reserve that takes the plan just over capacity when it is counted
    fraction = (tight.capacity - tight.total) / tight.allocated + 0.01
    assert not estimate_memory(LLAMA70, CLUSTER, PLAN, MemorySettings(fragmentation_fraction=fraction)).fits
    assert estimate_memory(LLAMA70, CLUSTER, PLAN, MemorySettings(fragmentation_fraction=fraction,
                                                                  expandable_segments=True)).fits


@pytest.mark.parametrize("expandable", [False, True])
def test_states_floor_stays_below_the_total(expandable):
    settings = MemorySettings(fragmentation_fraction=0.2, expandable_segments=expandable)
    est = estimate_memory(LLAMA70, CLUSTER, PLAN, settings)
    floor = states_floor(est, settings)
    assert 0 < floor <= est.total
    # without the reserve the floor is the bare states plus the bytes outside the allocator
    states = est.offloaded
    bare = states.weights + states.gradients + states.optimizer_states + states.step_transient
    assert floor == pytest.approx(bare * (1.0 if expandable else 1.2) + (est.total - est.reserved
                                                                         if not expandable else est.overhead))


def test_the_estimate_flag_sets_it():
    from autotune.cli import build_parser
    from autotune.commands.estimate import estimate_from_flags

    argv = ["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--engine", "megatron",
            "--tp", "2", "--seq-len", "8192", "--recompute", "none"]
    plain = estimate_from_flags(build_parser().parse_args(argv))
    expandable = estimate_from_flags(build_parser().parse_args([*argv, "--expandable-segments"]))
    assert plain.memory.total - expandable.memory.total == pytest.approx(plain.memory.reserve)
    assert expandable.memory.reserved == pytest.approx(plain.memory.reserved)


def test_the_plan_flag_lets_the_search_use_the_reserve(capsys):
    """`plan --expandable-segments` searches with the reserve left out: plans the reserve kept out now fit, and the
    plans that fitted before still do."""
    import json

    from autotune.cli import main

    argv = ["plan", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--seq-len", "8192",
            "--global-batch", "64", "--engine", "megatron", "--json", "--top-k", "1"]
    found = []
    for extra in ([], ["--expandable-segments"]):
        assert main([*argv, *extra]) == 0
        found.append(json.loads(capsys.readouterr().out))
    assert found[1]["num_feasible"] > found[0]["num_feasible"]
    assert found[1]["rejections"].get("gpu_memory", 0) < found[0]["rejections"].get("gpu_memory", 0)
