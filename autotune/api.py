"""The library API the CLI (and users' pipelines) call: build a plan, estimate it, and DeepSpeed configs for
existing pipelines (the best plan's, or the plan a config implies). The facade over the layers below it."""

from __future__ import annotations

from autotune.cost.estimate import Estimate, cluster_spec_dict, estimate, estimate_from_dict
from autotune.cost.memory import estimate_memory
from autotune.emit.deepspeed import PARAM_NVME_BUFFER_COUNT
from autotune.emit.options import EmitOptions
from autotune.engines import ENGINES, engine_for
from autotune.engines.common import engine_deepspeed_config
from autotune.errors import InputError, suggest_names
from autotune.rules import engines_that_run, plan_problems
from autotune.search.nearest_plan import nearest_on_other_engine, nearest_valid_plan
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.hardware import ClusterSpec
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.settings import MemorySettings

__all__ = ["Estimate", "make_plan", "estimate", "cluster_spec_dict", "estimate_from_dict", "deepspeed_config_for",
           "plan_from_deepspeed_config"]


def make_plan(model: ModelSpec, cluster: ClusterSpec, *, global_batch_size: int | None = None, tp: int = 1,
              pp: int = 1, cp: int = 1, micro_batch_size: int = 1, sequence_parallel: bool | None = None,
              check: bool = True, **rest) -> ParallelPlan:
    """A plan for ``cluster`` with dp and gradient accumulation derived; InputError lists every problem.
    ``check=False`` skips the rules (``autotune.rules.plan_problems``): the plan as stated, for a linter that asks
    them itself; a plan that cannot be built at all still raises.

    ``global_batch_size`` None means one micro-batch per data-parallel replica. ``sequence_parallel``
    None means on whenever tp > 1 and the engine has it (Megatron's recommended setting). ``zero_stage`` None or
    absent: the engine's default (``Engine.default_zero_stage``: 1, or 3 for FSDP2).
    """
    problems: list[str] = []
    mp = tp * pp * cp
    if mp >= 1 and cluster.num_gpus % mp == 0:
        dp = cluster.num_gpus // mp
    else:
        problems.append(f"num_gpus ({cluster.num_gpus}) is not divisible by tp*pp*cp ({tp}*{pp}*{cp}={mp}): "
                        f"choose tp, pp and cp whose product divides {cluster.num_gpus}")
        dp = 1
    if global_batch_size is None:
        global_batch_size = micro_batch_size * dp
    per_step = micro_batch_size * dp
    accum = max(1, global_batch_size // per_step) if per_step > 0 else 1
    if sequence_parallel is None:
        try:
            sequence_parallel = tp > 1 and engine_for(rest.get("engine", "deepspeed")).support.sequence_parallel
        except ValueError:
            sequence_parallel = tp > 1  # the plan's own check names the unknown engine
    if rest.get("zero_stage") is None:  # None or absent: the engine's own default (Engine.default_zero_stage)
        try:
            rest["zero_stage"] = engine_for(rest.get("engine", "deepspeed")).default_zero_stage
        except ValueError:
            rest.pop("zero_stage", None)  # the plan's own check names the unknown engine
    try:
        plan = ParallelPlan(tp=tp, pp=pp, cp=cp, dp=dp, micro_batch_size=micro_batch_size,
                            global_batch_size=global_batch_size, grad_accum_steps=accum,
                            sequence_parallel=sequence_parallel, **rest)
    except InputError as err:
        raise InputError(problems + list(err.problems), subject="plan") from None
    if not check:
        return plan
    found = [(rule, msg) for rule, msg in plan_problems(model, cluster, plan) if not (problems and rule == "world_size")]
    problems += [msg for _, msg in found]
    others: list[str] = []
    if any(":" in rule or rule.startswith(("offload_", "ep_tp_sp")) for rule, _ in found):
        others = [e for e in engines_that_run(model, cluster, plan) if e != plan.engine]
        problems.append(f"engines that can run this plan as it is: {', '.join(others)}" if others else
                        "no engine runs this plan as it is: change the plan as the messages say")
    if found:
        nearest = nearest_valid_plan(model, cluster, plan)
        if nearest is not None:
            problems.append(nearest.describe())
        if not others and any(rule.startswith(f"{plan.engine}:") for rule, _ in found):  # its engine refuses it
            elsewhere = nearest_on_other_engine(model, cluster, plan, list(ENGINES), nearest)
            if elsewhere is not None:
                problems.append(elsewhere.describe_on_engine())
    if problems:
        raise InputError(problems, subject="plan")
    return plan


# ---- DeepSpeed configs for existing pipelines -----------------------------------------------------
_DEEPSPEED = ENGINES["deepspeed"]
_PLAN_FLAG_ALIASES = {"zero": "zero_stage", "micro_batch": "micro_batch_size", "framework": "engine"}
_PLAN_FLAGS = frozenset(ParallelPlan.__dataclass_fields__) - {"dp", "grad_accum_steps", "global_batch_size", "seq_len"}


def deepspeed_config_for(model: str, gpu: str, num_gpus: int, seq_len: int = 4096, global_batch: int | None = None,
                         *, options: EmitOptions | None = None, **plan_flags) -> dict:
    """The DeepSpeed config for ``model`` on ``num_gpus`` x ``gpu``.

    No plan flags: the planner's best feasible DeepSpeed plan. With plan flags (``tp``, ``pp``,
    ``zero_stage``/``zero``, ``micro_batch_size``/``micro_batch``, ``offload_optimizer``, ...): that
    plan. ``global_batch`` None: one sequence per GPU (search) or micro-batch x dp (given plan).
    Raises InputError when the plan is invalid or nothing fits, saying why.

    The config is for ``deepspeed.initialize(model=..., model_parameters=..., config=cfg)`` (or, written to a
    file, for ``--deepspeed_config FILE`` read by ``deepspeed.add_config_arguments`` and
    ``deepspeed.initialize(args=args, ...)``: not both). It says nothing about how the model is built, so a
    plan with ``pp`` > 1 (the search may pick one) trains only when the model given to ``deepspeed.initialize``
    is a ``deepspeed.pipe.PipelineModule`` with ``num_stages=pp`` (then ``engine.train_batch()``); a plan with
    ``tp`` > 1 (``tensor_parallel.autotp_size``) needs a model DeepSpeed's AutoTP can shard (a transformers
    model, or one whose printed class names include ``...Model`` and whose blocks sit in an ``nn.ModuleList``
    with ``o_proj`` / ``out_proj`` / ``down_proj`` output projections; ``autotune emit`` writes the full list
    into plan.md). For a plain ``nn.Module`` give the plan yourself with ``tp=1, pp=1`` (plan flags turn the search
    off; ``zero_stage``, ``micro_batch_size``, ... as you choose).
    """
    model_spec = load_model(model)
    cluster = load_cluster(gpu=gpu, num_gpus=num_gpus)
    flags = {_PLAN_FLAG_ALIASES.get(k, k): v for k, v in plan_flags.items()}
    unknown = [k for k in flags if k not in _PLAN_FLAGS]
    if unknown:
        raise InputError([f"unknown plan flag {k!r}{suggest_names(k, _PLAN_FLAGS)}" for k in unknown], subject="plan")
    if not flags:
        batch = global_batch or cluster.num_gpus
        result = search_plans(model_spec, cluster, seq_len=seq_len, global_batch_size=batch,
                              constraints=SearchConstraints(engines=("deepspeed",)), top_k=1)
        if not result.num_feasible:
            reasons = ", ".join(f"{k} {v}" for k, v in result.rejections.items())
            raise InputError([f"no DeepSpeed plan for {model_spec.name} on {cluster.num_gpus} x {cluster.gpu.name} "
                              f"at seq_len {seq_len}, global batch {batch} is feasible (rejected: {reasons})"],
                             subject="request")
        return engine_deepspeed_config(_DEEPSPEED.support, model_spec, cluster, result.candidates[0].plan, options)
    flags.setdefault("engine", "deepspeed")
    plan = make_plan(model_spec, cluster, global_batch_size=global_batch, seq_len=seq_len, **flags)
    memory = estimate_memory(model_spec, cluster, plan)
    if not memory.fits:
        gib = 2**30
        why = (f"needs {memory.total / gib:.1f} GiB per GPU of {memory.capacity / gib:.1f} GiB" if not memory.fits_gpu
               else f"needs {memory.host_per_node / gib:.0f} GiB host memory per node of "
                    f"{memory.host_capacity_per_node / gib:.0f} GiB")
        raise InputError([f"the plan does not fit: {why}; raise zero_stage, offload, recompute='full' or lower "
                          f"micro_batch_size (or call without plan flags to search)"], subject="plan")
    return engine_deepspeed_config(engine_for(plan).support, model_spec, cluster, plan, options)


def plan_from_deepspeed_config(config: dict, model: ModelSpec, cluster: ClusterSpec, *, tp: int = 1, pp: int = 1,
                               cp: int = 1, seq_len: int = 4096, recompute: str | None = None,
                               engine: str = "deepspeed", notes: list[str] | None = None
                               ) -> tuple[ParallelPlan, MemorySettings]:
    """The plan and ledger settings a DeepSpeed config implies on ``cluster``: :func:`deepspeed_config` inverted.

    The config says ZeRO stage, batch sizes, offload, precision, optimizer and bucket sizes; the
    caller says tp/pp/cp and seq_len, which a DeepSpeed config does not hold (AutoTP's autotp_size
    is used when tp is 1). ``recompute`` None: full when the config configures activation
    checkpoints (number_checkpoints, partitioned activations or a pipeline checkpoint interval),
    else none. ``config`` must have no "auto" left. ``engine``: the one that runs the config (``hf``: the Trainer
    driving DeepSpeed). ``notes``, when given, gets what the plan reads differently from the config (fp32 training
    estimated in bf16). Raises InputError when the plan is invalid.
    """
    zero = config.get("zero_optimization")
    zero = {"stage": 1} if zero is True else (zero if isinstance(zero, dict) else {})
    stage = int(zero.get("stage", 0))
    autotp = (config.get("tensor_parallel") or {}).get("autotp_size") or 0
    tp = int(autotp) if tp == 1 and autotp > 1 else tp
    checkpointing = config.get("activation_checkpointing") or {}
    if recompute is None:
        recompute = "full" if (checkpointing.get("number_checkpoints") or checkpointing.get("partition_activations")
                               or (config.get("pipeline") or {}).get("activation_checkpoint_interval")) else "none"
    devices, nvme_path = {}, None
    for name, legacy in (("offload_optimizer", "cpu_offload"), ("offload_param", "cpu_offload_param")):
        block = zero.get(name) or {}
        # the deprecated cpu_offload / cpu_offload_param switches are these blocks at device cpu (zero/config.py
        # :188-218 of DeepSpeed 0.19.8)
        devices[name] = block.get("device") or ("cpu" if zero.get(legacy) is True else "none")
        nvme_path = nvme_path or block.get("nvme_path")
    if devices["offload_param"] != "none" and stage != 3:  # only the stage-3 optimizer reads it (engine.py:2731)
        devices["offload_param"] = "none"
        if notes is not None:
            notes.append(f"offload_param at ZeRO stage {stage}: DeepSpeed ignores it (stage 3 only), read so")
    micro = config.get("train_micro_batch_size_per_gpu")
    accum = config.get("gradient_accumulation_steps")
    batch = config.get("train_batch_size")
    dp = cluster.num_gpus // max(1, tp * pp * cp)
    if not micro and batch:  # DeepSpeed derives it: train_batch_size / accumulation / its data-parallel ranks, the
        # AutoTP ones included (runtime/config.py:466-471, 626-640 of 0.19.8)
        micro = max(1, int(batch) // int(accum or 1) // (dp * (tp if autotp > 1 and tp == int(autotp) else 1)))
    micro = int(micro or 1)
    batch = int(batch) if batch else micro * int(accum or 1) * dp
    if autotp > 1 and tp == int(autotp) and batch == micro * int(accum or 1) * dp * tp:
        batch //= tp  # written as DeepSpeed 0.19.8 counts it (TP ranks included); the sequences per step
    fp16 = (config.get("fp16") or {}).get("enabled") is True
    if notes is not None and not fp16 and not any((config.get(k) or {}).get("enabled") is True
                                                  for k in ("bf16", "bfloat16")):  # engine.py:2080-2088
        notes.append("the DeepSpeed config enables neither fp16 nor bf16, so DeepSpeed trains in fp32: estimated in "
                     "bf16 (autotune models no fp32 training; its weights, gradients and activations take twice the "
                     "bytes, its matmuls run at the TF32 / fp32 rate)")
    opt_type = str((config.get("optimizer") or {}).get("type", "adamw")).lower()
    param_block = zero.get("offload_param") or {}
    settings = MemorySettings(
        reduce_bucket_size=int(zero.get("reduce_bucket_size", 500_000_000)),
        allgather_bucket_size=int(zero.get("allgather_bucket_size", 500_000_000)),
        stage3_prefetch_bucket_size=int(zero.get("stage3_prefetch_bucket_size", zero.get("prefetch_bucket_size",
                                                                                         50_000_000))),
        stage3_max_live_parameters=int(zero.get("stage3_max_live_parameters", zero.get("max_live_parameters",
                                                                                       1_000_000_000))),
        offload_buffer_bytes=2 * int(param_block.get("buffer_count", PARAM_NVME_BUFFER_COUNT))
        * int(param_block.get("buffer_size", 100_000_000)),
    )
    overlap = zero.get("overlap_comm")
    plan = make_plan(model, cluster, global_batch_size=batch, tp=tp, pp=pp, cp=cp, micro_batch_size=micro,
                     zero_stage=stage, offload_optimizer=devices["offload_optimizer"],
                     offload_param=devices["offload_param"], nvme_path=nvme_path, seq_len=seq_len,
                     recompute=recompute, precision="fp16" if fp16 else "bf16",
                     optimizer="sgd" if opt_type == "sgd" else "adamw", engine=engine,
                     overlap_comm=stage == 3 if overlap is None else bool(overlap))
    return plan, settings
