"""``--from plan.json``: autotune's own plan file states the whole job (model, cluster, plan, sequence, batch), so a
flag that says otherwise about the model or the cluster is a conflict the command names, not a value it drops in
silence (``--gpu b200`` on a plan for H100s estimated the H100 job). ``--seq-len`` and ``--global-batch`` are what-ifs
over it, as over every other job file (``estimate --from megatron_args.sh --seq-len 2048``): the same plan at that
sequence, its accumulation steps derived again for that batch, judged by the rules. ``--num-gpus N`` other than the
plan's world size stays the rescale that ``plan --from`` / ``emit --from --best`` / ``tune --from`` make of it
(``commands.from_job.job_and_search_cluster`` reads the job without it first)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from autotune.api import make_plan
from autotune.cost.estimate import estimate_from_dict
from autotune.emit.job_args import FROM_SUBJECT
from autotune.errors import InputError
from autotune.inputs import read_json
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.settings import MemorySettings

__all__ = ["PlanJsonJob", "plan_json_job", "release_memory_settings"]

# The plan's fields make_plan derives (dp, accumulation) or takes apart (the batch and sequence of a what-if).
_DERIVED = ("dp", "grad_accum_steps", "global_batch_size", "seq_len")


@dataclass(frozen=True)
class PlanJsonJob:
    """The job a plan.json states, with the what-ifs applied (``notes`` say which)."""

    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    notes: tuple[str, ...]
    settings: MemorySettings | None = None  # the ledger settings of the engine release it was written for


def plan_json_job(path: str, *, model: str | None = None, gpu: str | None = None, num_gpus: int | None = None,
                  gpus_per_node: int | None = None, cluster_path: str | None = None, seq_len: int | None = None,
                  global_batch: int | None = None):
    """The job ``path`` (an autotune plan.json) states, at ``seq_len`` / ``global_batch`` where given; InputError
    naming each flag that disagrees with the model or cluster it states, or the rules' problems with the what-if."""
    doc = read_json(path, subject="plan JSON")
    est = estimate_from_dict(doc)
    c, p = est.cluster, est.plan
    given = {"--gpu": (gpu, c.gpu.name), "--gpus-per-node": (gpus_per_node, c.gpus_per_node)}
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
    if any(not p.startswith("the world size") for p in problems):  # another model or GPU: another job
        problems.append("to plan a model on another GPU, give the flags without --from (`autotune plan --model ...`)")
    if problems:
        raise InputError(problems, subject=FROM_SUBJECT)
    job = _what_if(est.model, c, p, path, seq_len, global_batch)
    return replace(job, settings=_release_settings(doc, job.plan))


def _release_settings(doc: dict, plan: ParallelPlan) -> MemorySettings | None:
    """The cost settings of the release the file was written for (a bundle's ``engine_version``, ``plan --json``'s
    ``engine_versions``), as ``estimate --engine-version`` models them: torchtitan 0.3's per-op SAC save set
    (FSDP engine ``release_cost_settings``); estimated without them, a 0.3 bundle's FP8 plan read back as 0.2's."""
    one = doc.get("engine_version")
    releases = dict(doc.get("engine_versions") or {}) if isinstance(doc.get("engine_versions"), dict) else {}
    if isinstance(one, dict) and isinstance(one.get("engine"), str):
        releases[one["engine"]] = one.get("release")
    release = releases.get(plan.engine)
    return release_memory_settings(plan, release) if isinstance(release, str) else None


def release_memory_settings(plan: ParallelPlan, release: str) -> MemorySettings | None:
    """The ledger settings of what ``release`` of the plan's engine runs that the plan does not say (its
    ``release_cost_settings``: torchtitan 0.3's SAC save set); None where it has none."""
    from autotune.engines import engine_for

    cost = engine_for(plan).release_cost_settings(release)
    return MemorySettings(**cost) if cost else None


def _what_if(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, path: str, seq_len: int | None,
             global_batch: int | None) -> PlanJsonJob:
    """The plan at another sequence or batch (the same splits and settings; dp and accumulation derived again)."""
    seq = seq_len if seq_len not in (None, plan.seq_len) else None
    batch = global_batch if global_batch not in (None, plan.global_batch_size) else None
    if seq is None and batch is None:
        return PlanJsonJob(model, cluster, plan, ())
    fields = {k: getattr(plan, k) for k in ParallelPlan.__dataclass_fields__ if k not in _DERIVED}
    try:
        plan = make_plan(model, cluster, global_batch_size=batch or plan.global_batch_size, seq_len=seq or plan.seq_len,
                         **fields)
    except InputError as err:
        raise InputError([f"{path}'s plan at {_what(seq, batch)}: {m}" for m in err.problems],
                         subject=FROM_SUBJECT) from None
    return PlanJsonJob(model, cluster, plan, (f"{path}'s plan at {_what(seq, batch)} (a what-if over the file's "
                                              f"job)",))


def _what(seq: int | None, batch: int | None) -> str:
    return " and ".join(([f"--seq-len {seq:,}"] if seq else []) + ([f"--global-batch {batch:,}"] if batch else []))
