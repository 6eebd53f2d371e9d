"""The tuning study without real trials, shared by the test_study*.py modules: run_trial is replaced by a table
keyed by plan (FakeRunner), and ``run`` starts a study with it.

Space: tiny-gpt on 2 cpu ranks, seq 64, global batch 8, deepspeed, tp = pp = 1,
ZeRO 0-3 x micro-batch 1,2,4 x recompute none/full x offload (what the planner keeps).
"""

from __future__ import annotations

from pathlib import Path

from optuna.distributions import CategoricalDistribution

from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster, load_model
from autotune.tune import study as study_mod
from autotune.tune import trial as trial_mod
from autotune.tune.sampler import plan_key

MODEL = load_model("tiny-gpt")
CLUSTER = load_cluster(gpu="cpu", num_gpus=2)
CONSTRAINTS = SearchConstraints(tp=1, pp=1, cp=1, engines=("deepspeed",), recompute=("none", "full"),
                                max_micro_batch_size=4)
SEQ, GB = 64, 8
RANKED = search_plans(MODEL, CLUSTER, seq_len=SEQ, global_batch_size=GB, constraints=CONSTRAINTS, top_k=3).in_order
KEYS = [plan_key(e.plan) for e in RANKED]
DIST = CategoricalDistribution(sorted(KEYS))


def fake_step_time(plan) -> float:
    # Deterministic "measurement": bigger micro-batches amortise, recompute costs 30%, offload 20%.
    return 0.1 * (1 + 1 / plan.micro_batch_size) * (1.3 if plan.recompute == "full" else 1.0) * (
        1.2 if plan.offload_optimizer != "none" else 1.0) * (1 + 0.05 * plan.zero_stage)


class FakeRunner:
    """run_trial stand-in: outcome by (zero, micro-batch, recompute, offload); records each call."""

    def __init__(self, outcomes: dict | None = None, default: str = "completed") -> None:
        self.outcomes = outcomes or {}
        self.default = default
        self.calls: list[str] = []

    def __call__(self, spec, on_step=None, on_phase=None, on_launch=None):
        p = spec.plan
        self.calls.append(plan_key(p))
        status = self.outcomes.get((p.zero_stage, p.micro_batch_size, p.recompute, p.offload_optimizer), self.default)
        spec.workdir.mkdir(parents=True, exist_ok=True)
        log = spec.workdir / "trial.log"
        log.write_text(f"fake {status}\n")
        t = fake_step_time(p)
        if status == "pruned":
            t *= 10
        if on_step is not None:
            for i in range(1, spec.warmup_steps + spec.steps + 1):
                if on_step(i, t):
                    return trial_mod.TrialResult(status="pruned", reason="pruned at step %d" % i, log_path=log)
        if status == "completed" or status == "pruned":
            tokens = p.global_batch_size * p.seq_len / t
            return trial_mod.TrialResult(status="completed", reason="", log_path=log, step_time_s=t,
                                         tokens_per_s=tokens, tflops_per_gpu=0.01, peak_memory_bytes=10**8,
                                         step_times_s=(t,) * spec.steps, returncode=0)
        reason = {"oom": "host memory 1.2 GiB over the limit 1.0 GiB", "crashed": "exit code 1: RuntimeError: boom",
                  "hung": "no progress within the 1 s timeout; killed"}[status]
        return trial_mod.TrialResult(status=status, reason=reason, log_path=log, returncode=1)


def run(tmp_path: Path, monkeypatch, runner: FakeRunner, **kw):
    monkeypatch.setattr(trial_mod, "run_trial", runner)
    # The fake runner starts no DeepSpeed: no op to build (a fresh machine would JIT-build two for minutes).
    monkeypatch.setattr(study_mod.ops, "ensure_ops", lambda names, **_: {name: "cached" for name in names})
    args = dict(seq_len=SEQ, global_batch=GB, constraints=CONSTRAINTS, workload=trial_mod.Workload(kind="builtin"),
                out_dir=tmp_path / "out", trials=4, top_k=3, steps=2, warmup_steps=1, finalists=0)
    args.update(kw)
    return study_mod.tune(MODEL, CLUSTER, **args)
