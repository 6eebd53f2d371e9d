"""Lints that need the cost model, above the file-format linters of ``autotune.emit``: whether the plan a
DeepSpeed config implies fits the GPUs (:func:`memory_problems`), and :func:`lint_file`, which checks an
autotune ``plan.json`` by rebuilding its estimate and hands every other kind of file to
``autotune.emit.validate_files.validate_file``.
"""

from __future__ import annotations

from pathlib import Path

from autotune.api import estimate_from_dict, plan_from_deepspeed_config
from autotune.cost.memory import estimate_memory
from autotune.emit.problems import Problem
from autotune.emit.validate import read_deepspeed_config, resolved_config
from autotune.emit.validate_files import file_kind, validate_file
from autotune.errors import InputError
from autotune.inputs import read_json
from autotune.report import gib

__all__ = ["lint_file", "memory_problems", "job_memory_problems", "engine_rule_problems", "RULES_CHECK_GPU",
           "RULES_CHECKED_KINDS"]


def lint_file(path: str | Path, *, world_size: int, tp: int = 1, pp: int = 1, cp: int = 1,
              kind: str | None = None, hf: bool | None = None,
              engine_versions: dict[str, str] | None = None, client_optimizer: str | None = None,
              launch_options: frozenset[str] = frozenset()) -> list[Problem]:
    """Every problem of one file for a job of ``world_size`` ranks (InputError: the file is unusable); ``kind``,
    ``hf``, ``client_optimizer`` and ``launch_options`` as for ``autotune.emit.validate_files.validate_file``, plus
    "plan" (autotune's plan.json)."""
    kind = kind or file_kind(path)
    if kind == "plan":
        return _plan_problems(path, world_size)
    problems = validate_file(path, world_size=world_size, tp=tp, pp=pp, cp=cp, kind=kind, hf=hf,
                             engine_versions=engine_versions, client_optimizer=client_optimizer,
                             launch_options=launch_options)
    if kind in RULES_CHECKED_KINDS and not any(p.severity == "error" for p in problems):
        problems += engine_rule_problems(path, world_size)
    return problems


RULES_CHECK_GPU = "b200"
"""The GPU a file's plan is judged on by :func:`engine_rule_problems`: one that runs every precision, FP8 recipe
and token dispatcher the engines' rules know, so that only the model and the plan are judged."""

RULES_CHECKED_KINDS = ("megatron", "megatron-bridge", "megatron-deepspeed", "torchtitan", "torchtitan-module")
"""The kinds of file whose model and plan ``autotune estimate --from`` reads, so that the engine's rules judge
them (a DeepSpeed or accelerate config alone states no model)."""

_RULES_SOURCE = {"megatron": "megatron-core", "megatron-deepspeed": "Megatron-DeepSpeed", "fsdp": "torchtitan"}
"""Whose code enforces each engine's rules, as the problem's source (Bridge overrides build megatron-core's
TransformerConfig too)."""


def engine_rule_problems(path: str | Path, world_size: int) -> list[Problem]:
    """What the engine refuses of the model and plan a file states beyond its own argument checks, as the engine's
    rules word them (``Engine.extra_problems``), each citing the engine's line, with the nearest plan that passes
    as the fix. Megatron-LM arguments and Megatron-Bridge overrides: megatron-core's TransformerConfig checks
    (biased experts split by expert TP, per-layer CUDA graphs beside full recompute, the EP overlap's needs, ...);
    Megatron-DeepSpeed: what its DeepSpeed-MoE cannot build or run (MoE under ZeRO-3); torchtitan: its model
    code's. The plan is the one ``autotune estimate --from`` reads from the file, unjudged; a file the reader
    cannot read is left to the format checks."""
    from autotune.engines import engine_for
    from autotune.job_files import read_job
    from autotune.rules import engines_that_run
    from autotune.search.nearest_plan import nearest_valid_plan

    try:
        job = read_job([str(path)], num_gpus=world_size, gpu=RULES_CHECK_GPU, check=False)
    except InputError:
        return []
    refused = engine_for(job.plan).extra_problems(job.model, job.cluster, job.plan)
    if not refused:
        return []
    nearest = nearest_valid_plan(job.model, job.cluster, job.plan)
    engine = job.plan.engine
    fix = (f"{nearest.describe()} (the flags of `autotune estimate`)" if nearest is not None else
           f"as the message says; `autotune plan --engine {engine}` lists plans this engine runs")
    others = [e for e in engines_that_run(job.model, job.cluster, job.plan) if e != engine]
    if others:
        fix += f"; engines that run this plan as it is: {', '.join(others)}"
    source = _RULES_SOURCE.get(engine, engine)
    return [Problem(path="(the plan)", severity="error", source=source, message=rule.render(), fix=fix)
            for rule in refused]


def memory_problems(config: dict | str | Path, *, model, cluster, tp: int = 1, pp: int = 1, cp: int = 1,
                    seq_len: int = 4096, recompute: str | None = None) -> list[Problem]:
    """Whether the plan the config implies fits ``cluster``'s GPUs (and hosts), by the memory ledger.

    The world size is the cluster's GPU count. Call it on a config without errors (see
    :func:`validate_deepspeed_config`); "auto" values are resolved as for ``hf=True``.
    """
    data, _, read_problems = read_deepspeed_config(config)
    if data is None:
        return read_problems
    data = resolved_config(data, world_size=cluster.num_gpus, tp=tp, pp=pp, cp=cp)
    try:
        plan, settings = plan_from_deepspeed_config(data, model, cluster, tp=tp, pp=pp, cp=cp, seq_len=seq_len,
                                                    recompute=recompute)
    except InputError as err:
        return [Problem(path="$", severity="error", source="memory", message=f"the plan this config implies for "
                        f"{model.name} is invalid: {p}",
                        fix="change the config, or the --tp/--pp/--cp/--gpu it is checked for") for p in err.problems]
    where = f"{model.name} on {cluster.num_gpus} x {cluster.gpu.name}, seq_len {seq_len}, recompute {plan.recompute}"
    return _fit_problems(estimate_memory(model, cluster, plan, settings), where, "$.zero_optimization",
                         "raise the ZeRO stage, offload the optimizer (or parameters), recompute activations "
                         "(--recompute full), or lower train_micro_batch_size_per_gpu; `autotune plan` searches them "
                         "all")


def _fit_problems(mem, where: str, at: str, fix: str) -> list[Problem]:
    """The ledger ``mem``'s verdict as problems at ``at``: over the GPU's memory (``fix``, and the allocator's way out
    where only its reserve is over), over the hosts' (offloaded states)."""
    out = []
    if not mem.fits_gpu:
        terms = ", ".join(f"{k} {gib(v)}" for k, v in mem.terms().items() if v)
        reserve = (f"; or export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (only the caching allocator's "
                   f"{gib(mem.reserve)} GiB reserve is over)") if mem.cache_bound else ""
        out.append(Problem(path=at, severity="error", source="memory",
                           message=f"does not fit in GPU memory: {where} needs {gib(mem.total)} GiB per GPU (pipeline "
                                   f"stage {mem.stage}: {terms}) of {gib(mem.capacity)} GiB", fix=fix + reserve))
    if not mem.fits_host:
        out.append(Problem(path=at, severity="error", source="memory",
                           message=f"offloaded states need {gib(mem.host_per_node)} GiB of host memory per node, the "
                                   f"nodes have {gib(mem.host_capacity_per_node)} GiB ({where})",
                           fix="offload to nvme, or spread over more nodes"))
    return out


def job_memory_problems(path: str | Path, *, gpu: str, world_size: int, model: str | None = None,
                        gpus_per_node: int | None = None, seq_len: int | None = None, **sizes) -> list[Problem]:
    """Whether the job a file states (Megatron-LM / Megatron-DeepSpeed arguments, Bridge overrides, a torchtitan
    config, a checkpoint folder: the kinds of :data:`RULES_CHECKED_KINDS`; an accelerate config with ``model`` and
    ``seq_len``, which it does not state) fits ``gpu``'s memory by the ledger, read as ``autotune estimate --from PATH
    --gpu GPU`` reads it (``sizes``: its tp / pp / cp / recompute flags, for a DeepSpeed config, which states none).
    Call it on a file without errors; InputError where its job does not read."""
    from autotune.job_files import read_job

    job = read_job([str(path)], model=model, gpu=gpu, num_gpus=world_size, gpus_per_node=gpus_per_node,
                   seq_len=seq_len, **sizes)
    flags = f"{f' --model {model}' if model else ''}{f' --seq-len {seq_len}' if seq_len else ''}"
    return _fit_problems(estimate_memory(job.model, job.cluster, job.plan, job.settings),
                         f"{job.model.name} on {world_size} x {job.cluster.gpu.name}", "(the plan)",
                         f"`autotune plan --from {path}{flags} --gpu {gpu}` ranks the plans of this job that fit "
                         f"(recompute, a lower micro-batch, more tensor or pipeline parallelism)")


def _plan_problems(path: str | Path, world_size: int) -> list[Problem]:
    """autotune's ``plan.json``: it rebuilds its estimate (InputError naming what is wrong otherwise)."""
    doc = read_json(path, subject="plan JSON")
    if not isinstance(doc, dict):
        raise InputError(["not an autotune plan JSON: expected an object with model, cluster and plan"],
                         subject=f"plan JSON {str(path)!r}")
    est = estimate_from_dict(doc)
    if est.plan.world_size != world_size:
        return [Problem(path="$.plan", severity="error", source="rules",
                        message=f"the plan spans {est.plan.world_size} ranks, the job {world_size}",
                        fix=f"validate with --world-size {est.plan.world_size}, or emit a plan for {world_size}")]
    return []
