"""What a study measures, held by the study (user attribute ``job``, set by its first tuner): a ``--resume`` or
``--worker`` asking for another model, cluster, shape, search space or workload would put measurements of two jobs
in one table (the winner's "measured" figure and the calibration then come from the other job), or trip on trials
whose plans this search does not have."""

from __future__ import annotations

import optuna

from autotune.errors import InputError
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec

__all__ = ["study_job", "same_job"]


def study_job(model: ModelSpec, cluster: ClusterSpec, *, seq_len: int, global_batch: int, num_layers: int | None,
              constraints: object, workload: object, steps: int, warmup_steps: int) -> dict[str, str]:
    """The inputs that decide what a trial measures, as text (the study stores JSON)."""
    return {"model": f"{model.name} ({model.num_params:,} parameters)",
            "cluster": f"{cluster.num_gpus} x {cluster.gpu.name} ({cluster.gpus_per_node} a node)",
            "seq_len": str(seq_len), "global_batch": str(global_batch), "num_layers": str(num_layers),
            "search": repr(constraints), "workload": repr(workload), "steps": f"{warmup_steps} + {steps}"}


def same_job(study: optuna.Study, job: dict[str, str]) -> None:
    """InputError naming each input that differs from the study's (the first tuner records them)."""
    held = study.user_attrs.get("job")
    if held is None:
        study.set_user_attr("job", job)
        return
    changed = [f"{key}: {held.get(key)} in the study, {value} now" for key, value in job.items()
               if held.get(key) != value]
    if changed:
        raise InputError([f"study {study.study_name!r} measures another job ({'; '.join(changed)}): continue it "
                          "with the flags it was started with, or start another (--study-name / --out)"],
                         subject="--resume")
