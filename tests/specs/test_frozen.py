"""The planner's fast instances of frozen dataclasses (autotune.specs.frozen) are the constructor's: equal, hashed,
frozen, pickled alike; a builder refuses a call that leaves a field out."""

import dataclasses
import pickle

import pytest

from autotune.cost.estimate import Estimate
from autotune.cost.memory import MemoryEstimate
from autotune.cost.step_time import StepTimeEstimate
from autotune.specs.frozen import builder, copier
from autotune.specs.plan import ParallelPlan


def _values(cls) -> dict:
    """A distinct value for every field of ``cls``."""
    return {f.name: float(i) + 0.5 if f.name not in ("activation_parts", "buffer_parts", "comm_parts_s")
            else {"x": float(i)} for i, f in enumerate(dataclasses.fields(cls))}


@pytest.mark.parametrize("cls", [MemoryEstimate, StepTimeEstimate])
def test_builder_makes_what_the_constructor_makes(cls):
    values = _values(cls)
    built, made = builder(cls)(*values.values()), cls(**values)
    assert type(built) is cls
    assert built == made
    assert all(getattr(built, name) == value for name, value in values.items())
    assert pickle.loads(pickle.dumps(built)) == made
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, dataclasses.fields(cls)[0].name, 1.0)


def test_builder_refuses_a_missing_field():
    values = list(_values(MemoryEstimate).values())
    with pytest.raises(TypeError):
        builder(MemoryEstimate)(*values[:-1])


def test_built_estimate_hashes_as_constructed():
    plan = ParallelPlan(tp=2, dp=4, global_batch_size=8)
    assert hash(builder(ParallelPlan)(*dataclasses.astuple(plan))) == hash(plan)
    assert builder(Estimate)(None, None, plan, None, None) == Estimate(model=None, cluster=None, plan=plan,
                                                                      memory=None, time=None)


def test_copier_changes_only_the_fields_named():
    plan = ParallelPlan(engine="fsdp", tp=2, pp=2, dp=8, zero_stage=3, dp_replicate=2, global_batch_size=64,
                        micro_batch_size=2, grad_accum_steps=4, recompute="full", tp_overlap="async-tp")
    copy = copier(ParallelPlan, ("micro_batch_size", "grad_accum_steps", "recompute"))(plan, 4, 2, "selective")
    assert type(copy) is ParallelPlan
    assert copy == dataclasses.replace(plan, micro_batch_size=4, grad_accum_steps=2, recompute="selective")
    assert hash(copy) == hash(dataclasses.replace(plan, micro_batch_size=4, grad_accum_steps=2, recompute="selective"))


def test_with_sharding_checks_what_it_changes():
    plan = ParallelPlan(engine="fsdp", tp=2, dp=8, global_batch_size=64)
    assert plan.with_sharding(3, 2, "cpu", "cpu", "fp8", "torchao-tensorwise") == dataclasses.replace(
        plan, zero_stage=3, dp_replicate=2, offload_optimizer="cpu", offload_param="cpu", precision="fp8",
        fp8_recipe="torchao-tensorwise")
    for bad in ((4, 1, "none", "none", "bf16", None), (3, 3, "none", "none", "bf16", None),
                (3, 1, "disk", "none", "bf16", None), (3, 1, "none", "none", "bf16", "torchao-tensorwise")):
        with pytest.raises(Exception) as raised:
            plan.with_sharding(*bad)
        with pytest.raises(type(raised.value)):
            dataclasses.replace(plan, **dict(zip(("zero_stage", "dp_replicate", "offload_optimizer", "offload_param",
                                                  "precision", "fp8_recipe"), bad)))
