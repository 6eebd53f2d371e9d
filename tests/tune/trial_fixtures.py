"""The trial tests' shared plan and trial spec: tiny-gpt on 2 CPU ranks (tests/tune/test_trial.py,
tests/tune/test_command_trial.py)."""

from __future__ import annotations

import pytest

from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset
from autotune.tune.trial import TrialSpec

SEQ = 64


@pytest.fixture(scope="module")
def model():
    return load_model_preset("tiny-gpt")


@pytest.fixture(scope="module")
def cluster():
    return load_cluster(gpu="cpu", num_gpus=2)


def plan(**kw) -> ParallelPlan:
    kw.setdefault("zero_stage", 1)
    dp = 2 // (kw.get("tp", 1) * kw.get("pp", 1) * kw.get("cp", 1))
    return ParallelPlan(dp=dp, global_batch_size=4, micro_batch_size=1, grad_accum_steps=4 // dp, seq_len=SEQ, **kw)


def spec(model, cluster, tmp_path, workload, **kw) -> TrialSpec:
    kw.setdefault("steps", 3)
    kw.setdefault("warmup_steps", 1)
    kw.setdefault("timeout_s", 180.0)
    return TrialSpec(model=model, cluster=cluster, plan=kw.pop("plan", None) or plan(), workload=workload,
                     workdir=tmp_path / "trial", **kw)
