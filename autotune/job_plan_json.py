"""``--from plan.json``: autotune's own plan file states the whole job (model, cluster, plan, sequence, batch), so a
flag that says otherwise is a conflict the command names, not a value it drops in silence (``--gpu b200`` on a plan
for H100s estimated the H100 job). ``--num-gpus N`` other than the plan's world size stays the rescale that
``plan --from`` / ``emit --from --best`` / ``tune --from`` make of it (``commands.from_job.job_and_search_cluster``
reads the job without it first)."""

from __future__ import annotations

from autotune.cost.estimate import estimate_from_dict
from autotune.emit.job_args import FROM_SUBJECT
from autotune.errors import InputError
from autotune.inputs import read_json

__all__ = ["plan_json_job"]


def plan_json_job(path: str, *, model: str | None = None, gpu: str | None = None, num_gpus: int | None = None,
                  gpus_per_node: int | None = None, cluster_path: str | None = None, seq_len: int | None = None,
                  global_batch: int | None = None):
    """The Estimate ``path`` (an autotune plan.json) rebuilds; InputError naming each flag that disagrees with it."""
    est = estimate_from_dict(read_json(path, subject="plan JSON"))
    c, p = est.cluster, est.plan
    given = {"--gpu": (gpu, c.gpu.name), "--gpus-per-node": (gpus_per_node, c.gpus_per_node),
             "--seq-len": (seq_len, p.seq_len), "--global-batch": (global_batch, p.global_batch_size)}
    problems = [f"{flag} {value} but {path} states {stated}: drop {flag} (the plan file states its job)"
                for flag, (value, stated) in given.items() if value is not None and value != stated]
    if num_gpus is not None and num_gpus != c.num_gpus:  # worded as for the other files (job_files._read_job)
        problems.append(f"the world size: --num-gpus {num_gpus} but {path} states {c.num_gpus} GPUs: drop --num-gpus "
                        f"or make them agree (`plan --from`, `emit --from --best` and `tune --from` with --num-gpus "
                        f"plan the job on that many)")
    if model is not None:
        from autotune.specs.loading import load_model

        if load_model(model).name != est.model.name:
            problems.append(f"--model {model} but {path} states {est.model.name}: drop --model (the plan file states "
                            f"its job)")
    if cluster_path is not None:
        problems.append(f"--cluster {cluster_path} but {path} states its cluster ({c.num_gpus} x {c.gpu.name}): drop "
                        f"--cluster")
    if any(not p.startswith("the world size") for p in problems):  # another model, GPU, batch: another job
        problems.append("to plan a model on another GPU, batch or sequence, give the flags without --from (`autotune "
                        "plan --model ...`)")
    if problems:
        raise InputError(problems, subject=FROM_SUBJECT)
    return est
