"""Plans from the files of a job a user already runs: ``autotune estimate --from`` / ``plan --from``.

Each file's kind is told as ``autotune validate`` tells it (:func:`autotune.emit.validate_files.file_kind`); the
readers below turn what the files state into the model, cluster and :class:`ParallelPlan` of the job:

- ``deepspeed`` (ds_config.json): ZeRO stage, batch sizes, offload, precision (via
  :func:`autotune.api.plan_from_deepspeed_config`); the model, tp/pp/cp and seq_len come from flags, the world size
  from its complete batch triple (``batch_triple_world``), else from --num-gpus.
- ``megatron`` / ``megatron-deepspeed`` (argument scripts: ``megatron_args.sh``, a ``torchrun ... pretrain_gpt.py
  --flag ...`` command line): the model shape, parallel sizes, batch, seq_len, precision, recompute and the
  distributed optimizer; the world size from ``--nnodes`` x ``--nproc-per-node`` of the launch line.
- ``torchtitan`` (a 0.2 TOML job config): [parallelism] degrees, [training] batch and seq_len,
  [activation_checkpoint] mode, the model from its [model] name and flavor.
- ``accelerate`` (an accelerate YAML): num_processes, FSDP (reshard, offload, checkpointing) or the DeepSpeed
  config it names.
- ``plan`` (autotune's own plan.json), ``hostfile`` and ``launch`` (a launch script: the world size only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from autotune.api import make_plan, plan_from_deepspeed_config
from autotune.cost.run_settings import without_defaults
from autotune.emit.job_args import FROM_SUBJECT as _SUBJECT
from autotune.emit.job_args import flags_of as _flags
from autotune.emit.job_args import launch_sizes as _launch_sizes
from autotune.emit.job_args import whole as _int
from autotune.emit.megatron_deepspeed_model import experts_whole_per_tp_rank
from autotune.emit.megatron_layout import expanded_layout
from autotune.emit.validate import batch_triple_problem, batch_triple_world, resolved_config
from autotune.emit.shell_args import SHELL_SUFFIXES, read_megatron_args_file
from autotune.emit.validate_files import FILE_KINDS, file_kind, megatron_file_kind
from autotune.errors import InputError
from autotune.job_checkpoint import checkpoint_folder, inspect_path, read_checkpoint
from autotune.job_fsdp import accelerate_fields as _accelerate
from autotune.job_fsdp import accelerate_refusals
from autotune.job_megatron_deepspeed import megatron_deepspeed_fields, read_deepspeed_file
from autotune.job_megatron_model import megatron_model, refuse_unmodelled, shape_differs
from autotune.job_plan_json import plan_json_job, release_memory_settings
from autotune.job_fsdp import torchtitan_fields as _torchtitan
from autotune.job_te_fp8 import is_te_fp8_recipe, with_te_fp8_recipe
from autotune.specs.hardware import ClusterSpec
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.settings import MemorySettings

__all__ = ["JobFiles", "READABLE_KINDS", "read_job"]

READABLE_KINDS = ("deepspeed", "megatron", "megatron-deepspeed", "megatron-bridge", "torchtitan", "torchtitan-module",
                  "accelerate", "plan", "hostfile", "launch", "checkpoint")
_MAX_TOKENS = 2**24  # sequences or tokens: the longest contexts and largest batches trained are below


@dataclass(frozen=True)
class JobFiles:
    """The job the files state: its model, cluster, plan and ledger settings, and what was read from where."""

    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    settings: MemorySettings | None = None
    kinds: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = field(default=())


# ---- the model --------------------------------------------------------------------------
def _megatron(path: str, kind: str, ds: dict | None, model: ModelSpec | None, notes: list[str],
              argv: list[str] | None = None) -> dict:
    """The plan fields (and the model) a Megatron-LM / Megatron-DeepSpeed argument file (or ``argv``) states."""
    argv = read_megatron_args_file(path) if argv is None else argv
    f = _flags(argv)

    def n(flag: str) -> int | None:
        return _int(f.get(flag), flag, path)

    # an unstated load-balancing weight: Megatron-LM's --moe-aux-loss-coeff 0, Megatron-DeepSpeed's --moe-loss-coeff 0.1
    mds = kind == "megatron-deepspeed"
    if model is not None:  # --model: still the file's kind of job, and its shape said where it differs
        refuse_unmodelled(path)
        notes += [differs] if (differs := shape_differs(model, f, path)) else []
    model = model or megatron_model(f, path, notes, aux_default=0.1 if mds else 0.0,
                                    deepspeed_experts=(_values(argv, "--num-experts") or ["1"]) if mds else None)
    out: dict = {"model": model, "tp": n("--tensor-model-parallel-size") or 1,
                 "pp": n("--pipeline-model-parallel-size") or 1, "cp": n("--context-parallel-size") or 1,
                 # Megatron-DeepSpeed's DeepSpeed-MoE names it --moe-expert-parallel-size (megatron/arguments.py)
                 "ep": n("--expert-model-parallel-size") or n("--moe-expert-parallel-size") or 1,
                 "micro_batch_size": n("--micro-batch-size") or 1,
                 "global_batch_size": n("--global-batch-size"), "seq_len": n("--seq-length"),
                 "sequence_parallel": "--sequence-parallel" in f}
    if out["sequence_parallel"] and out["tp"] == 1:  # validate_args turns it off (arguments.py:1433-1439 at d98e8a64)
        out["sequence_parallel"] = False
        notes.append(f"{path}: --sequence-parallel at tensor-parallel size 1: Megatron turns it off, read so")
    vpp = n("--num-virtual-stages-per-pipeline-rank")
    per_chunk = n("--num-layers-per-virtual-pipeline-stage")
    if vpp is None and per_chunk and model is not None:
        # The embedding / loss take a layer's slot each in the split (arguments.py:962-967).
        slots = (model.num_layers + ("--account-for-embedding-in-pipeline-split" in f)
                 + ("--account-for-loss-in-pipeline-split" in f))
        vpp = max(1, slots // out["pp"] // per_chunk)
    layout = f.get("--pipeline-model-parallel-layout")
    if vpp is None and isinstance(layout, str):  # its stages / pp (arguments.py:941-950)
        vpp = max(1, (expanded_layout(layout).count("|") + 1) // out["pp"])  # "|" separates its stages
    out["vpp"] = vpp or 1
    if kind == "megatron":  # the split it states (_read_job: the plan's loss_slots, read_loss_slots)
        out["split_flags"] = {"first": n("--decoder-first-pipeline-num-layers"),
                              "last": n("--decoder-last-pipeline-num-layers"), "layout": layout}
    if n("--expert-tensor-parallel-size") is not None:  # parallel folding; unset: etp = tp (arguments.py:587)
        out["etp"] = n("--expert-tensor-parallel-size")
    fp8 = "--fp8-format" in f or "--fp8" in f or "--fp8-hybrid" in f or "--fp8-e4m3" in f  # the last two: the fork's
    out["precision"] = "fp4" if "--fp4-format" in f else "fp8" if fp8 else "fp16" if "--fp16" in f else "bf16"
    experts = n("--num-experts") if kind == "megatron-deepspeed" else None
    if whole := experts_whole_per_tp_rank(experts, out["tp"], "--enable-expert-tensor-parallelism" in f):
        notes.append(f"{path}: {whole}; estimated with them split, as the flag does: add it, or expect more memory "
                     "and expert time")
    if out["precision"] == "fp4" and f.get("--fp4-recipe", "nvfp4") != "nvfp4":
        notes.append(f"{path}: --fp4-recipe {f.get('--fp4-recipe')} is not modelled: estimated as NVFP4")
    recipe = f.get("--fp8-recipe")
    if out["precision"] == "fp8" and isinstance(recipe, str):
        from autotune.emit.precision import MEGATRON_FP8_RECIPES

        ours = {name: plan_name for plan_name, name in MEGATRON_FP8_RECIPES.items()}
        if recipe in ours:
            out["fp8_recipe"] = ours[recipe]
        else:
            notes.append(f"{path}: --fp8-recipe {recipe} is not modelled: estimated as the engine's default "
                         f"(delayed scaling)")
    if "--tp-comm-overlap" in f:
        out["tp_overlap"] = "userbuffers"
    if "--fp16" not in f and "--bf16" not in f and out["precision"] == "bf16":
        notes.append(f"{path}: neither --bf16 nor --fp16 (Megatron trains in fp32): estimated as bf16")
    granularity = f.get("--recompute-granularity") or ("selective" if "--recompute-activations" in f else None)
    out["recompute"] = granularity or "none"
    if granularity == "full" and f.get("--recompute-method") == "block":
        out["recompute_num_layers"] = n("--recompute-num-layers")
    modules = _values(argv, "--recompute-modules")  # nargs "+"; unset: ["core_attn"] (TransformerConfig)
    if granularity == "selective" and modules:
        out["recompute_modules"] = tuple(modules)
    if (offloaded := n("--cpu-offloading-num-layers")):  # > 0 turns cpu_offloading on (arguments.py:1950-1951)
        out["activation_offload_layers"] = offloaded
    if (mtp := n("--mtp-num-layers")):  # None / 0: no MTP block (TransformerConfig mtp_num_layers)
        out["mtp_layers"] = mtp
    if "--fp8-output-proj" in f:  # TransformerConfig.fp8_output_proj (the plan refuses it off MXFP8, as Megatron)
        out["fp8_output_proj"] = True
    out |= _cuda_graph(f, argv, path, notes)
    out["optimizer"] = "sgd" if f.get("--optimizer") == "sgd" else "adamw"
    out["flash_attention"] = f.get("--attention-backend") != "unfused"
    if kind == "megatron":
        out["engine"] = "megatron"
        out["zero_stage"] = 1 if "--use-distributed-optimizer" in f else 0
        if "--use-megatron-fsdp" in f:  # Megatron-FSDP: its sharding strategy (default optim_grads_params,
            # arguments.py:3190); no_shard / optim are Megatron's DDP / distributed optimizer as sharded
            strategy = f.get("--data-parallel-sharding-strategy") or "optim_grads_params"
            out["zero_stage"] = {"no_shard": 0, "optim": 1, "optim_grads": 2}.get(strategy, 3)
        out["overlap_comm"] = "--overlap-grad-reduce" in f
        if "--grad-reduce-in-bf16" in f and out["precision"] != "fp16":  # bf16 main_grad (arguments.py)
            out["grad_dtype"] = "bf16"
        if "--overlap-moe-expert-parallel-comm" in f:  # --delay-wgrad-compute needs it (transformer_config.py:2749)
            out["ep_overlap"] = "a2a-delay-wgrad" if "--delay-wgrad-compute" in f else "a2a"
        from autotune.job_bridge import cp_comm_type_of, megatron_dispatcher, token_drop_of

        out |= megatron_dispatcher(f, out["ep"], path, notes)
        out |= token_drop_of(f.get("--moe-expert-capacity-factor"), "--moe-pad-expert-input-to-capacity" in f or None)
        out |= cp_comm_type_of(_values(argv, "--cp-comm-type") if out["cp"] > 1 else None, path, notes)
    else:
        out |= megatron_deepspeed_fields(f, n, ds, path, notes, out)
    return out


def _cuda_graph(f: dict, argv: list[str], path: str, notes: list[str]) -> dict:
    """cuda_graph (and its scope) of Megatron arguments: --cuda-graph-impl, or the deprecated --enable-cuda-graph /
    --external-cuda-graph (arguments.py:593-613 of megatron-core 0.19.2: local / transformer_engine); a whole-iteration
    graph: --cuda-graph-impl full_iteration (core 0.18 on), or local with the full_iteration scope (0.16, 0.17)."""
    from autotune.specs.plan import CUDA_GRAPH_SCOPES

    impl = f.get("--cuda-graph-impl") or ("local" if "--enable-cuda-graph" in f else
                                          "transformer_engine" if "--external-cuda-graph" in f else None)
    scope = [s for s in _values(argv, "--cuda-graph-modules") or _values(argv, "--cuda-graph-scope") if s != "full"]
    if impl in (None, "none"):
        return {}
    if impl == "full_iteration" or (impl == "local" and "full_iteration" in scope):  # from core 0.18 / before
        return {"cuda_graph": "full-iteration"}
    if impl not in ("local", "transformer_engine"):
        notes.append(f"{path}: --cuda-graph-impl {impl} is not modelled: estimated without CUDA graphs")
        return {}
    other = [s for s in scope if s not in CUDA_GRAPH_SCOPES]
    if other:
        notes.append(f"{path}: CUDA graph parts {' '.join(other)} are not modelled: estimated without them")
    kept = tuple(s for s in scope if s in CUDA_GRAPH_SCOPES)
    return {"cuda_graph": impl, **({"cuda_graph_scope": kept} if kept else {})}


def _values(argv: list[str], flag: str) -> list[str]:
    """The values of the last ``flag`` of an ``nargs="+"`` option: the words up to the next ``--flag``."""
    where = [i for i, a in enumerate(argv) if a == flag or a.startswith(flag + "=")]
    if not where:
        return []
    i = where[-1]
    head = argv[i].partition("=")[2]
    rest = []
    for a in argv[i + 1:]:
        if a.startswith("--"):
            break
        rest.append(a)
    return ([head] if head else []) + rest


def _read_job(paths: list[str], *, model: str | None = None, gpu: str | None = None, num_gpus: int | None = None,
             gpus_per_node: int | None = None, cluster_path: str | None = None, seq_len: int | None = None,
             global_batch: int | None = None, tp: int = 1, pp: int = 1, cp: int = 1,
             recompute: str | None = None, check: bool = True, micro_batch: int | None = None,
             precision: str | None = None) -> JobFiles:
    """The job ``paths`` state; flags fill what the files do not (and say the model, GPU and world size where
    the files do not; ``tp``/``pp``/``cp`` and ``recompute``, None: from its activation_checkpointing block, for a
    DeepSpeed config, which does not hold them; ``check=False``: the Megatron / torchtitan plan as the files state
    it, unjudged by the rules, as ``make_plan``). InputError names every missing field with the flag that supplies it."""
    paths = [checkpoint_folder(str(p)) for p in paths]  # a checkpoint's file given alone: its folder
    found = {p: inspect_path(p) for p in paths}  # each checkpoint folder's layout, found once
    missing = [f"{p}: {why}" for p, (why, _) in found.items() if why]
    if missing:
        raise InputError(missing, subject=_SUBJECT)
    kinds, unread = [], []
    for p, (_, layout) in found.items():
        try:  # a Bridge save reads as its run_config.yaml; a Megatron-LM, DeepSpeed or Trainer one as a checkpoint
            kinds.append((str(layout.run_config), "megatron-bridge") if layout and layout.run_config else
                         (p, "checkpoint") if layout else (p, file_kind(p)))
        except InputError:
            unread.append(f"{p}: cannot tell its kind from its name; --from {supported_kinds()}")
    unread += [f"{p}: a {k} file; --from {supported_kinds()}" for p, k in kinds if k not in READABLE_KINDS]
    if unread:
        raise InputError(unread, subject=_SUBJECT)
    notes: list[str] = []
    if any(k == "plan" for _, k in kinds):  # it states the whole job: a flag that disagrees is named (job_plan_json)
        got = plan_json_job(next(p for p, k in kinds if k == "plan"), model=model, gpu=gpu, num_gpus=num_gpus,
                            gpus_per_node=gpus_per_node, cluster_path=cluster_path, seq_len=seq_len,
                            global_batch=global_batch)
        return JobFiles(got.model, got.cluster, got.plan, got.settings, tuple(kinds), got.notes)
    model_spec = load_model(model) if model else None
    world = per_node = None
    problems: list[str] = []
    ds: dict | None = None
    fields: dict = {}
    saved = {p: read_checkpoint(found[p][1]) for p, k in kinds if k == "checkpoint"}  # Megatron / DeepSpeed / Trainer
    ds_run: dict = {}
    for path, kind in kinds:
        if kind == "checkpoint":
            ck = saved[path]
            notes += ck.notes
            world, ds = world or ck.world_size, ck.ds_config or ds
            model_spec = model_spec or (load_model(ck.model_config) if ck.model_config and not ck.argv else None)
            fields |= ck.fields  # a Trainer's FSDP / DDP plan
            ds_run = ck.deepspeed_run or ds_run  # a Trainer's DeepSpeed: its engine and recompute
        elif kind == "deepspeed":
            ds = read_deepspeed_file(path, kinds)  # a template a Megatron-DeepSpeed script fills: its path
        elif kind == "accelerate":
            got, w, ds_doc = _accelerate(path, notes, recompute, micro_batch, precision)  # its world, its plan
            if gpu and got.get("gpu", gpu) != gpu:  # a SageMaker instance's GPU
                notes.append(f"{path}: --gpu {gpu} taken, not its instance's {got['gpu']}")
            per_node, gpu = per_node or got.pop("gpus_per_node", None), gpu or got.pop("gpu", None)
            fields = fields | {k: v for k, v in got.items() if k not in ("gpus_per_node", "gpu")}
            world, ds = world or w, ds_doc or ds
        elif kind == "hostfile":
            from autotune.emit.launch_lint import hostfile_job_sizes

            world = world or hostfile_job_sizes(path).world_size
    for path, kind in kinds:
        bridge_launch = kind == "megatron-bridge" and path.lower().endswith(SHELL_SUFFIXES)  # run_recipe.py
        if kind in ("megatron", "megatron-deepspeed", "launch") or bridge_launch:
            nodes, procs, default = _launch_sizes(path)
            if procs and default and num_gpus:  # NNODES=${SLURM_NNODES:-1}: the run's environment says it, the flag here
                nodes = None
                notes.append(f"{path}: its nodes are {default} at run time: --num-gpus {num_gpus} taken")
            if procs:
                world, per_node = world or (nodes * procs if nodes else None), per_node or procs
        if kind in ("megatron", "megatron-deepspeed") or (kind == "checkpoint" and saved[path].argv):
            argv = saved[path].argv if kind == "checkpoint" else None
            try:
                fields |= _megatron(path, megatron_file_kind(argv) if argv else kind, ds, model_spec, notes, argv)
            except InputError as err:  # reported with the missing world size and GPU, all at once
                problems += err.problems
        elif kind == "megatron-bridge":
            from autotune.job_bridge import bridge_fields

            got = bridge_fields(path, notes)
            fields |= {k: v for k, v in got.items() if not (k == "model" and model_spec)}
        elif kind in ("torchtitan", "torchtitan-module"):
            got, w = _torchtitan(path, notes)
            fields |= {k: v for k, v in got.items() if not (k == "model" and model_spec)}
            world = world or w
    model_spec = model_spec or fields.pop("model", None)
    fields.pop("model", None)
    split = fields.pop("split_flags", None)
    if split and model_spec is not None:
        fields |= _loss_slots(model_spec, fields, split, notes)
    named = ", ".join(p for p, _ in kinds) + (" does" if len(kinds) == 1 else " do")
    if model_spec is None and not problems:  # a model the files name that no preset is, else none named
        problems += [n for n in notes if "is not a preset autotune knows" in n] or [
            f"the model: {named} not state it: give --model (a preset, a config.json or a model YAML)"]
    if world is None and ds is not None and {k for _, k in kinds} == {"deepspeed"}:  # a DeepSpeed config alone (a
        sp = ds.get("sequence_parallel_size")  # launch line leaves it to run time): the size its batch triple admits
        world = batch_triple_world(ds, tp, pp, sp if cp == 1 and isinstance(sp, int) and sp > 1 else cp)
        notes += [f"the world size: {world} GPUs, the only one its batch triple admits (train_batch_size / (micro "
                  "x accumulation) x tp*pp*cp), as DeepSpeed asserts it"] if world else []
    if num_gpus is not None and world is not None and num_gpus != world:
        problems.append(f"the world size: --num-gpus {num_gpus} but the files state {world} GPUs: drop --num-gpus or "
                        "make them agree (`plan --from`, `emit --from --best` and `tune --from` with --num-gpus "
                        "plan the job on that many)")
    num_gpus = num_gpus or world
    problems += [why for path, kind in kinds if kind == "accelerate" and num_gpus
                 for why in accelerate_refusals(path, num_gpus)]
    if cluster_path is None and (gpu is None or num_gpus is None):
        problems += (["the GPU: give --gpu (a GPU preset) or --cluster FILE"] if gpu is None else []) + (
            [f"the world size: {named} not state it (no launch line with numeric --nnodes / "
             f"--nproc-per-node): give --num-gpus N or --cluster FILE"] if num_gpus is None else [])
    if problems:
        raise InputError(problems, subject=_SUBJECT)
    cluster = load_cluster(gpu=gpu, num_gpus=num_gpus, gpus_per_node=gpus_per_node or per_node,
                           cluster_path=cluster_path)
    seq = seq_len or fields.pop("seq_len", None) or 4096
    fields.pop("seq_len", None)
    batch = global_batch or fields.pop("global_batch_size", None)
    fields.pop("global_batch_size", None)
    settings = None
    if "engine" not in fields:  # DeepSpeed alone (or accelerate + DeepSpeed)
        if ds is None:
            raise InputError(["the plan: the files hold no DeepSpeed config, Megatron arguments or torchtitan "
                              "config: add one to --from"], subject=_SUBJECT)
        if any(v == "auto" for v in json.dumps(ds).split('"')):  # the Trainer / accelerate fill them from the script
            ds = resolved_config(ds, world_size=cluster.num_gpus, tp=tp, pp=pp, cp=cp)
            notes.append('the DeepSpeed config\'s "auto" values read as the Trainer fills them: the batch --global-batch '
                         'gives (else a micro-batch of 1 a rank, no accumulation), bf16 unless it enables fp16')
        sp = ds.get("sequence_parallel_size")  # Ulysses: DeepSpeed's dp is world / it (runtime/config.py:468-469)
        cp = sp if cp == 1 and isinstance(sp, int) and not isinstance(sp, bool) and sp > 1 else cp
        if (why := batch_triple_problem(ds, cluster.num_gpus, tp * pp * cp)):
            raise InputError([why], subject=_SUBJECT)
        plan, settings = plan_from_deepspeed_config(ds, model_spec, cluster, tp=tp, pp=pp, cp=cp, seq_len=seq,
                                                    recompute=recompute or ds_run.get("recompute"),
                                                    engine=ds_run.get("engine", "deepspeed"), notes=notes)
        if global_batch:
            plan = make_plan(model_spec, cluster, global_batch_size=global_batch, tp=plan.tp, pp=plan.pp, cp=plan.cp,
                             **{k: getattr(plan, k) for k in ("micro_batch_size", "zero_stage", "offload_optimizer",
                                                              "offload_param", "nvme_path", "seq_len", "recompute",
                                                              "precision", "optimizer", "engine", "overlap_comm")})
    else:
        plan = make_plan(model_spec, cluster, global_batch_size=batch, seq_len=seq, check=check, **fields)
        if any(kind == "torchtitan-module" for _, kind in kinds):  # a torchtitan 0.3 module: that release's code
            settings = release_memory_settings(plan, "0.3")
    return JobFiles(model_spec, cluster, plan, settings, tuple(kinds), tuple(notes))


def _loss_slots(model: ModelSpec, fields: dict, split: dict, notes: list[str]) -> dict:
    """The plan's loss_slots for the pipeline split a Megatron job's files state (``read_loss_slots``): {} for the
    engine's own split, with a note where autotune models no such split (the engine's own estimated instead)."""
    from autotune.emit.megatron_layout import rank_loads_loss_slots, read_loss_slots

    pp, vpp = fields.get("pp") or 1, fields.get("vpp") or 1
    if pp == 1:
        return {}
    modelled, k = read_loss_slots(model.num_layers, pp, vpp, fields.get("mtp_layers"), **split)
    if not modelled and isinstance(split.get("layout"), str):
        k = rank_loads_loss_slots(split["layout"], model.num_layers, pp, vpp, fields.get("mtp_layers"))
        if k is not None:
            notes.append(f"the pipeline layout the files state ({split['layout']}) is estimated as --loss-slots {k}: "
                         f"the same layers on every pipeline rank (which middle rank holds an extra layer may differ)")
            return {"loss_slots": k}
    if not modelled:
        notes.append(f"the pipeline split the files state ({split}) is not one autotune models (the engine's own, or "
                     f"the output layer and loss as K layer slots, --loss-slots): estimated with the engine's own")
    return {"loss_slots": k} if k else {}


def read_job(paths: list[str], **flags) -> JobFiles:
    """The job the files ``paths`` state (flags: :func:`_read_job`'s). InputError names every missing field with the
    flag that supplies it, and a file whose values are not what its kind holds."""
    te = [str(p) for p in paths if is_te_fp8_recipe(p)]  # te_fp8_recipe.py: the FP8 a DeepSpeed config cannot say
    try:
        job = _read_job([p for p in paths if str(p) not in te], **flags)
        job = with_te_fp8_recipe(job, te[0]) if te else job
        job = replace(job, plan=without_defaults(job.plan))  # settings the files state that the engine has anyway
    except InputError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ZeroDivisionError, OverflowError) as err:
        raise InputError([f"{', '.join(map(str, paths))}: a value is not what this kind of file holds ({err}); "
                          f"`autotune validate FILE` names each problem"], subject=_SUBJECT) from None
    p = job.plan
    problems = [f"{name} {value:,} (from the files) is beyond {limit:,}, {why}" for name, value, limit, why in (
        ("seq_len", p.seq_len, _MAX_TOKENS, "longer than any context trained"),
        ("global batch", p.global_batch_size, _MAX_TOKENS, "larger than any batch trained"),
        ("micro-batch", p.micro_batch_size, _MAX_TOKENS, "larger than any batch trained")) if value > limit]
    if problems:
        raise InputError(problems, subject=_SUBJECT)
    return job


def supported_kinds() -> str:
    """The kinds ``--from`` reads (and what tells them), and the ones ``validate`` knows that it does not."""
    return (f"reads {', '.join(READABLE_KINDS)} files (ds_config *.json, Megatron argument *.sh / *.args, torchtitan "
            f"*.toml or *.py (one config of several: FILE.py:NAME), accelerate *.yaml, Megatron-Bridge bridge_overrides.yaml / .args or run_config.yaml, plan.json, "
            f"hostfile, a Megatron-LM, Megatron-Bridge, DeepSpeed or Trainer checkpoint folder); not "
            f"{', '.join(k for k in FILE_KINDS if k not in READABLE_KINDS)}")
