"""The plan fields the FSDP2 front ends' files state, for ``autotune.job_files`` (``estimate --from``): a torchtitan
0.2 TOML job config or 0.3 config module (read as the TOML's sections, ``autotune.emit.torchtitan_module_read``),
and an accelerate config (FSDP2, or DeepSpeed with its JSON beside it).
"""

from __future__ import annotations

from pathlib import Path

from autotune.emit.accelerate_sagemaker import is_sagemaker, sagemaker_world_size
from autotune.emit.job_args import FROM_SUBJECT as _SUBJECT
from autotune.emit.torchtitan import TORCHTITAN_FLAVORS
from autotune.emit.torchtitan_models import expert_mesh_problems_02, experts_without_tp_03
from autotune.emit.validate_files import file_kind
from autotune.errors import InputError
from autotune.inputs import read_json
from autotune.specs.loading import load_model

__all__ = ["torchtitan_fields", "accelerate_fields", "accelerate_refusals"]


def torchtitan_fields(path: str, notes: list[str]) -> tuple[dict, int | None]:
    """The plan fields a torchtitan 0.2 TOML or 0.3 config module states (the module read as the TOML's sections)."""
    from autotune.emit.torchtitan_lint import (
        read_torchtitan_config,
        torchtitan_job_sizes,
    )

    if file_kind(path) == "torchtitan-module":
        from autotune.emit.torchtitan_module import TORCHTITAN_03_RECIPES
        from autotune.emit.torchtitan_module_read import (
            read_torchtitan_module,
            torchtitan_module_sizes,
        )

        data = read_torchtitan_module(path)
        preset = next((n for n, r in TORCHTITAN_03_RECIPES.items() if r[1] == data["recipe"]), None) or next(
            (n for n, r in TORCHTITAN_03_RECIPES.items() if (r[0], r[2]) == (data["family"], data["flavor"])), None)
        if preset in TORCHTITAN_FLAVORS:
            data["model"]["name"], data["model"]["flavor"] = TORCHTITAN_FLAVORS[preset]
        world = torchtitan_module_sizes(path).world_size
        if data["unread"]:
            notes.append(f"{path}: not literal values, left at torchtitan's defaults (give them as numbers, or flags): "
                         f"{', '.join(data['unread'])}")
    else:
        data, _ = read_torchtitan_config(path)
        world = torchtitan_job_sizes(path).world_size

    def section(name: str) -> dict:
        return data.get(name) if isinstance(data.get(name), dict) else {}

    p, t, m = section("parallelism"), section("training"), section("model")
    flavor = (m.get("name"), m.get("flavor"))
    preset = next((name for name, nf in TORCHTITAN_FLAVORS.items() if nf == flavor), None)
    replicate, shard = int(p.get("data_parallel_replicate_degree", 1)), int(p.get("data_parallel_shard_degree", -1))
    reshard = p.get("fsdp_reshard_after_forward", "default")
    stage = 0 if shard == 1 else 2 if reshard == "never" else 3
    local = int(t.get("local_batch_size", 8))
    pp = int(p.get("pipeline_parallel_degree", 1))
    micro = int(p.get("pipeline_parallel_microbatch_size", 1)) if pp > 1 else local
    mode = section("activation_checkpoint").get("mode", "selective")
    out = {"model": load_model(preset) if preset else None, "tp": int(p.get("tensor_parallel_degree", 1)), "pp": pp,
           "cp": int(p.get("context_parallel_degree", 1)), "ep": int(p.get("expert_parallel_degree", 1)),
           "micro_batch_size": micro, "global_batch_size": t.get("global_batch_size") if
           isinstance(t.get("global_batch_size"), int) and t.get("global_batch_size") > 0 else None,
           "seq_len": t.get("seq_len"), "recompute": mode if mode in ("none", "selective", "full") else "none",
           "zero_stage": stage, "dp_replicate": replicate if stage else 1, "engine": "fsdp",
           # CPUOffloadPolicy: parameters, gradients and optimizer states on the host together (fsdp2_fields)
           **{f: "cpu" if t.get("enable_cpu_offload") else "none" for f in ("offload_param",
                                                                                 "offload_optimizer")},
           "precision": "fp8" if _converter(m, ("float8", "quantize.linear.mx")) else "bf16"}
    compile_on, parts = section("compile").get("enable"), section("compile").get("components")
    if isinstance(compile_on, bool):  # the model compiled only where components keep it (default model and loss:
        # torchtitan 0.3.0 config/configs.py CompileConfig; DeepSeek-V3's 0.3 recipe compiles the loss alone)
        out["torch_compile"] = compile_on and (not isinstance(parts, list) or "model" in parts)
    # async TP: the 0.2 TOML's parallelism section, 0.3's CompileConfig (configs.py: it needs the model compiled)
    if (p.get("enable_async_tensor_parallel") is True or section("compile").get("enable_async_tensor_parallel") is True
            and out.get("torch_compile")) and out["tp"] > 1:
        out["tp_overlap"] = "async-tp"
    if out["tp"] > 1 and p.get("enable_sequence_parallel") is False:  # 0.3's ParallelismConfig (default True; 0.2's
        out["sequence_parallel"] = False  # TP always SequenceParallels the norms, llama3/infra/parallelize.py:181-233)
    linear = (section("quantize").get("linear") or {}) if out["precision"] == "fp8" else {}
    linear = linear if isinstance(linear, dict) else {}
    if _converter(m, ("quantize.linear.mx",)):
        mx = linear.get("mx") if isinstance(linear.get("mx"), dict) else {}
        recipe = mx.get("recipe_name", "mxfp8_cublas")  # job_config.py MXLinear.recipe_name default
        out["fp8_recipe"] = "torchao-mxfp8"
        if recipe not in ("mxfp8_cublas", "mxfp8_cublas_rceil"):  # torchao MXLinearRecipeName's MXFP8 GEMM recipes
            notes.append(f"{path}: mx recipe_name {recipe!r} is not modelled: estimated as mxfp8_cublas")
    else:
        float8 = linear.get("float8") if isinstance(linear.get("float8"), dict) else {}
        recipe = float8.get("recipe_name")
        if recipe == "rowwise":
            out["fp8_recipe"] = "torchao-rowwise"
        elif recipe is not None:
            notes.append(f"{path}: float8 recipe_name {recipe!r} is not modelled: estimated as tensorwise")
    parts, per_stage = data.get("model_parts"), p.get("pipeline_parallel_layers_per_stage")
    names = p.get("module_fqns_per_model_part")
    parts = len(names) if parts is None and isinstance(names, list) and names else parts
    weights, loss_slots = _stage_weights(path, p, pp, notes)
    if pp > 1 and isinstance(parts, int) and parts % pp == 0:  # stage lists: the 0.3 module's, or the TOML's
        out["vpp"] = parts // pp
    elif pp > 1 and isinstance(per_stage, int) and per_stage > 0 and out["model"] is not None:
        # torchtitan's stage count: ceil((L + first_less + last_less) / per) (v0.2.2 pipeline_parallel.py:75-77)
        stages = -(-(out["model"].num_layers + sum(weights)) // per_stage)
        out["vpp"] = max(1, stages // pp)
    if loss_slots is not None:
        out["loss_slots"] = loss_slots
    elif pp > 1 and weights == (0, 0) and out.get("vpp", 1) == 1 and parts is None:
        # 1F1B: the engine's own split is torchtitan's default 1 / 1 (layout.torchtitan_scheme); 0 / 0 is the even one
        notes.append(f"{path}: [parallelism] pipeline_parallel_first/last_stage_less_layers 0 / 0 with 1F1B (layers "
                     "even over the stages) is not modelled: estimated with torchtitan's default split (1 / 1)")
    if isinstance(data.get("loss_chunks"), int) and data["loss_chunks"] > 1:  # the 0.3 module's loss
        out["loss_chunks"] = data["loss_chunks"]
    if file_kind(path) != "torchtitan-module":  # 0.3 has no expert tensor parallelism of its own
        out |= _expert_tp(path, p, shard, out["tp"], out["cp"], out["ep"])
    elif out["ep"] > 1 and out["tp"] > 1:
        raise InputError([f"{path}: {experts_without_tp_03(out['tp'], out['ep'], 'engine models')}: set "
                          "tensor_parallel_degree = 1 (or expert_parallel_degree = 1) in the module's "
                          "ParallelismConfig, or write a torchtitan 0.2 TOML with expert_tensor_parallel_degree = tp"],
                         subject=_SUBJECT)
    if preset is None:
        named = (data.get("family"), data.get("flavor")) if data.get("flavor") is not None else flavor
        notes.append(f"{path}: torchtitan model {named[0]!r} flavor {named[1]!r} is not a preset autotune knows: "
                     f"give --model")
    return out, world


def _stage_weights(path: str, p: dict, pp: int, notes: list[str]) -> tuple[tuple[int, int], int | None]:
    """(``pipeline_parallel_first/last_stage_less_layers`` as given, (1, 1) where absent: torchtitan's defaults,
    v0.2.2 job_config.py:377-388; the plan's ``loss_slots``). The last is read as the loss_slots where not 1 (the
    output as that many layers of torchtitan's split, ``layout.split_scheme``); 0 / 0, which autotune writes for
    layers even over the stages, and 1 / 1 are the engine's own split (None). A first other than 1 is not modelled:
    said, and estimated as 1."""
    given = [p.get(f"pipeline_parallel_{end}_stage_less_layers", 1) for end in ("first", "last")]
    first, last = (v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 1 for v in given)
    if pp == 1 or (first, last) in ((0, 0), (1, 1)):
        return (first, last), None
    if first != 1:
        notes.append(f"{path}: [parallelism] pipeline_parallel_first_stage_less_layers {first} is not modelled "
                     "(autotune's split counts the embedding as 1 layer): estimated with 1")
    if last == 0:
        notes.append(f"{path}: [parallelism] pipeline_parallel_last_stage_less_layers 0 is not modelled (the output "
                     "as 1 layer or more, loss_slots): estimated with the engine's own split")
    return (first, last), (last if last > 1 else None)


def _expert_tp(path: str, p: dict, shard: int, tp: int, cp: int, ep: int) -> dict:
    """The plan's etp from ``[parallelism] expert_tensor_parallel_degree`` (absent: 1, torchtitan v0.2.2's default,
    config/job_config.py:464): InputError where torchtitan's ParallelDims refuses it, or where the FSDP engine cannot
    run it (its experts split tp x ep: etp = tp, left unset in the plan, as the engine has it anyway)."""
    etp = int(p.get("expert_tensor_parallel_degree", 1))
    keys = {"ep": "expert_parallel_degree", "etp": "expert_tensor_parallel_degree"}
    broken = expert_mesh_problems_02(shard if shard >= 1 else None, cp, tp, ep, etp, names=(keys["ep"], keys["etp"]),
                                     etp_one=False)
    if broken:
        raise InputError([f"{path}: [parallelism] {keys[k]}: {message}: {fix}" for k, message, fix in broken],
                         subject=_SUBJECT)
    if ep == 1 or etp == tp:  # torchtitan: no effect with ep 1
        return {}
    given = "" if "expert_tensor_parallel_degree" in p else " (absent: torchtitan 0.2.2's default, job_config.py:464)"
    keep = expert_mesh_problems_02(shard if shard >= 1 else None, cp, tp, ep, tp, names=(keys["ep"], keys["etp"]),
                                   etp_one=False)
    also = f", and {keep[0][2]}" if keep else ""
    raise InputError([f"{path}: [parallelism] expert_tensor_parallel_degree {etp}{given} with tensor_parallel_degree "
                      f"{tp} and expert_parallel_degree {ep}: torchtitan then runs the experts without tensor "
                      f"parallelism, EP taking the tp ranks too (distributed/parallel_dims.py:136-138); autotune's "
                      f"FSDP engine models experts split tp x ep only (etp = tp): set expert_tensor_parallel_degree = "
                      f"{tp} in [parallelism]{also}, or tensor_parallel_degree = 1"], subject=_SUBJECT)


def _converter(model: dict, names: tuple[str, ...]) -> bool:
    """Whether a converter of ``model.converters`` (a list, or torchtitan's comma-separated string form) contains one
    of ``names``."""
    given = model.get("converters", [])
    given = given.split(",") if isinstance(given, str) else given if isinstance(given, list) else []
    return any(name in str(c) for c in given for name in names)


def fsdp2_fields(reshard_after_forward: bool, cpu_offload: bool) -> dict:
    """The plan fields of FSDP2 as accelerate prepares a model (``fully_shard``), from an accelerate config or a
    Trainer's fsdp_config: resharding after forward is ZeRO-3, else ZeRO-2; CPU offload is ``CPUOffloadPolicy``,
    which keeps parameters, gradients and the optimizer step on the host together."""
    offload = "cpu" if cpu_offload else "none"
    return {"engine": "fsdp", "zero_stage": 3 if reshard_after_forward else 2, "offload_param": offload,
            "offload_optimizer": offload}


def accelerate_fields(path: str, notes: list[str], recompute: str | None = None, micro_batch: int | None = None,
                      precision: str | None = None) -> tuple[dict, int | None, dict | None]:
    """An accelerate config's plan fields, world size and DeepSpeed config (if any). ``recompute`` (--recompute): the
    training script's own activation checkpointing where the file leaves it to the script (FSDP2 without
    fsdp_activation_checkpointing), as autotune's FSDP bundle asks for torchtitan's selective AC; ``micro_batch``
    (--micro-batch): the script's batch, which an FSDP or DDP config does not hold (a DeepSpeed one does);
    ``precision`` fp8 (--precision): the script's FP8 linears over the config's bf16, as the FSDP bundle's file is
    written (autotune.emit.accelerate: the model code converts them, torchao's Float8 as torchtitan's converters)."""
    from autotune.emit.accelerate_lint import read_accelerate_config

    data, _ = read_accelerate_config(path)
    world = data.get("num_processes") if isinstance(data.get("num_processes"), int) else None
    kind = str(data.get("distributed_type", "")).upper()
    sagemaker = _sagemaker_fields(data, path, notes) if is_sagemaker(data) else None
    if sagemaker is not None:  # as a cluster config of the processes SageMaker starts
        data, kind, world = sagemaker
    mixed = str(data.get("mixed_precision", "bf16"))
    out: dict = {"precision": mixed if mixed in ("bf16", "fp16", "fp8") else "bf16",
                 **({"gpu": data["gpu"]} if data.get("gpu") else {})}
    script = {"micro_batch_size": micro_batch} if micro_batch else {}  # FSDP / DDP: the script's (not DeepSpeed's)
    if precision == "fp8" and out["precision"] == "bf16":
        script["precision"] = "fp8"
        notes.append(f"{path}: --precision fp8 taken as the script's FP8 linears over its mixed_precision bf16")
    if mixed == "no":
        notes.append(f"{path}: mixed_precision 'no' trains in fp32 unless the script asks for more (the Trainer's "
                     f"--bf16): estimated in bf16 (autotune models no fp32 training)")
    machines = data.get("num_machines")
    if isinstance(world, int) and isinstance(machines, int) and machines > 1 and world % machines == 0:
        out["gpus_per_node"] = world // machines  # the processes of each machine (commands/launch.py)
    if kind == "DEEPSPEED":
        block = data.get("deepspeed_config") if isinstance(data.get("deepspeed_config"), dict) else {}
        file = block.get("deepspeed_config_file")
        if not file:  # accelerate builds the DeepSpeed config from the block itself
            return out, world, _plugin_deepspeed_config(block, out["precision"])
        from autotune.emit.accelerate_lint import deepspeed_json_path

        ds_path = deepspeed_json_path(path, file) or Path(file)  # not found: the reader names it
        return out, world, read_json(ds_path, subject="DeepSpeed config")
    if kind in ("MULTI_GPU", "NO"):  # torch DDP (one process for NO): every rank holds the whole model and optimizer
        shown = f"SageMaker's {'DATA_PARALLEL' if kind == 'MULTI_GPU' else 'one process'}" if sagemaker else kind
        notes.append(f"{path}: distributed_type {shown}: DistributedDataParallel, estimated as unsharded data "
                     f"parallelism (FSDP2's replicate: the same bytes a rank, the gradients all-reduced)")
        notes.append(f"{path}: batch size and sequence length are the training script's: --global-batch, --seq-len")
        ddp = {"engine": "fsdp", "zero_stage": 0, "recompute": "none"}
        return out | script | ddp, world if kind != "NO" else 1, None
    if kind != "FSDP":
        raise InputError([f"{path}: distributed_type {kind or 'missing'}: autotune reads FSDP, DeepSpeed and "
                          f"multi-GPU (DDP) accelerate configs; {kind or 'this'} is not modelled"], subject=_SUBJECT)
    f = data.get("fsdp_config") if isinstance(data.get("fsdp_config"), dict) else {}
    par = data.get("parallelism_config") if isinstance(data.get("parallelism_config"), dict) else {}
    reshard = f.get("fsdp_reshard_after_forward", True)
    out |= fsdp2_fields(reshard in (True, "FULL_SHARD"), bool(f.get("fsdp_offload_params"))) | {
            # accelerate 1.16 checkpoints whole blocks only with fsdp_activation_checkpointing (accelerator.py:1668,
            # utils/fsdp_utils.py:690 fsdp2_apply_ac); without it, the script's own (the bundle's op-level SAC)
            "recompute": "full" if f.get("fsdp_activation_checkpointing") else (recompute or "none"),
            "tp": int(par.get("parallelism_config_tp_size", 1)), "cp": int(par.get("parallelism_config_cp_size", 1)),
            "dp_replicate": int(par.get("parallelism_config_dp_replicate_size", 1)),
            # accelerate's TP is the model's transformers TP plan: colwise / rowwise linears, no sequence-parallel
            # norms (transformers 5.25 LlamaConfig.base_model_tp_plan)
            "sequence_parallel": False}
    if str(f.get("fsdp_version", 1)) != "2":
        out |= _fsdp1_strategy(f, path, machines if isinstance(machines, int) else 1, notes)
    legacy = {"dynamo_backend": data["dynamo_backend"]} if "dynamo_backend" in data else {}  # config_args.py:117-119
    dynamo = data.get("dynamo_config") if isinstance(data.get("dynamo_config"), dict) else legacy
    if "dynamo_backend" in dynamo:  # accelerate compiles the prepared model unless the backend is NO
        out["torch_compile"] = str(dynamo["dynamo_backend"]).upper() != "NO"
    notes.append(f"{path}: batch size and sequence length are the training script's: --global-batch, --seq-len")
    return out | script, world, None


def accelerate_refusals(path: str, world_size: int) -> list[str]:
    """The errors ``validate`` finds in an accelerate config on ``world_size`` ranks (accelerate launch, its
    loader or the plugins it builds refuse such a file): estimating it would answer for a job that never starts."""
    from autotune.emit.accelerate_lint import accelerate_config_problems, accelerate_job_sizes

    sizes = accelerate_job_sizes(path)
    found = accelerate_config_problems(path, world_size=world_size, tp=sizes.tp or 1, cp=sizes.cp or 1)
    return [f"{path}: {p.render().removeprefix('error: ')} (accelerate launch refuses the file; "
            f"`autotune validate {path}` lists every problem)" for p in found if p.severity == "error"]


def _sagemaker_fields(data: dict, path: str, notes: list[str]) -> tuple[dict, str, int | None]:
    """(the config as the cluster config of what SageMaker starts, its distributed type, its ranks): DATA_PARALLEL
    is data parallelism over every GPU of num_machines instances (DDP's bytes and all-reduce), NO and MODEL_PARALLEL
    one process an instance (autotune.emit.accelerate_sagemaker); the instance's GPU preset where autotune has it."""
    world, preset = sagemaker_world_size(data)
    instance, machines = data.get("ec2_instance_type"), data.get("num_machines", 1)
    kind = "MULTI_GPU" if str(data.get("distributed_type")) == "DATA_PARALLEL" else "NO"
    notes.append(f"{path}: SageMaker, {machines} x {instance}: {world or 'an unknown number of'} rank(s)"
                 + (f" on {preset} GPUs" if preset else ""))
    view = {**data, "num_processes": world, "num_machines": machines if kind == "MULTI_GPU" else 1}
    return {**view, **({"gpu": preset} if preset else {})}, kind, world


_FSDP1_STRATEGIES = {"FULL_SHARD": (3, False), "SHARD_GRAD_OP": (2, False), "NO_SHARD": (0, False),
                     "HYBRID_SHARD": (3, True), "HYBRID_SHARD_ZERO2": (2, True)}
"""FSDP1's sharding strategies (accelerate's names of torch's ShardingStrategy 1-5, in this order) as (ZeRO stage, replicated across
machines): HYBRID_SHARD shards inside a machine and replicates across them."""


def _fsdp1_strategy(f: dict, path: str, machines: int, notes: list[str]) -> dict:
    """The plan fields of an FSDP1 accelerate config: launch exports fsdp_sharding_strategy (FULL_SHARD when
    absent, commands/launch.py:538, utils/launch.py:285) and the plugin takes it before fsdp_reshard_after_forward,
    which FSDP1 then ignores (utils/dataclasses.py:1715-1730, accelerate 1.16.0)."""
    given = str(f.get("fsdp_sharding_strategy", "FULL_SHARD")).upper()
    names = list(_FSDP1_STRATEGIES)
    name = names[int(given) - 1] if given.isdigit() and 1 <= int(given) <= len(names) else given
    name = "HYBRID_SHARD_ZERO2" if name == "_HYBRID_SHARD_ZERO2" else name  # torch's member name, taken too
    if name not in _FSDP1_STRATEGIES:
        raise InputError([f"{path}: fsdp_sharding_strategy {given!r} is none of {', '.join(names)} (or 1-5)"],
                         subject=_SUBJECT)
    if "fsdp_reshard_after_forward" in f:
        notes.append(f"{path}: FSDP1 shards by fsdp_sharding_strategy ({name}); accelerate ignores "
                     f"fsdp_reshard_after_forward there")
    stage, hybrid = _FSDP1_STRATEGIES[name]
    return {"zero_stage": stage, **({"dp_replicate": machines} if hybrid and machines > 1 else {})}


def _plugin_deepspeed_config(block: dict, precision: str) -> dict:
    """The DeepSpeed config accelerate 1.16.0's DeepSpeedPlugin builds from an accelerate config's deepspeed_config
    block (utils/dataclasses.py:1200-1222: batch sizes "auto", the script's; ZeRO stage, offload devices, accumulation,
    clipping from the block; precision from mixed_precision)."""
    zero = {"stage": block.get("zero_stage", 2)}
    for name in ("offload_optimizer", "offload_param"):
        device = block.get(f"{name}_device", "none")
        zero[name] = {"device": device, **({"nvme_path": block.get(f"{name}_nvme_path")} if device == "nvme" else {})}
    config = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "zero_optimization": zero,
              "gradient_accumulation_steps": block.get("gradient_accumulation_steps", 1),
              precision if precision in ("bf16", "fp16") else "bf16": {"enabled": True}}
    if block.get("gradient_clipping") is not None:
        config["gradient_clipping"] = block["gradient_clipping"]
    return config
