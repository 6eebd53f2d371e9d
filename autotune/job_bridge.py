"""The plan a Megatron-Bridge override file states (``bridge_overrides.yaml``, or Hydra-style ``key=value`` lines),
or a complete Bridge config (the ``run_config.yaml`` of a Bridge checkpoint), for ``estimate --from`` /
``plan --from`` (``autotune.job_files``).

Overrides sit on a base recipe (a ``ConfigContainer`` function): the parallel sizes, batch, sequence, recompute,
distributed optimizer, precision and run settings are read from the ``model``, ``train``, ``dataset``, ``ddp``,
``comm_overlap`` and ``mixed_precision`` sections. The base recipe is the one a "# Base recipe: NAME" line names
(autotune writes it at the top of its files), or the one a launch script's run_recipe.py line loads, whose
arguments are the overrides (``autotune.emit.bridge_launch``). What the file leaves unsaid is that recipe's where
autotune holds its values (``autotune.emit.bridge_recipe_bases``: run_recipe.py merges the file onto it), else
Megatron-core's default (tp 1, no recompute, ...). The model is the base recipe's where it is a library recipe
autotune knows, else the model section's own shape where it states one (a complete config:
``autotune.job_bridge_model``), else ``--model``. The world size is a run_recipe.py launch line's, else
``--num-gpus`` or a launch script beside the file.
"""

from __future__ import annotations

from autotune.emit.bridge_peft import LORA_TARGET
from autotune.emit.bridge_recipe_bases import load_bases, recipe_base
from autotune.emit.megatron_bridge_lint import base_recipe, on_base, read_bridge_overrides
from autotune.emit.megatron_bridge_recipes import RECIPES
from autotune.emit.precision import MEGATRON_FP8_RECIPES
from autotune.errors import InputError
from autotune.job_bridge_model import bridge_model
from autotune.specs.plan import CP_COMM_TYPES, MOE_DISPATCHERS
from autotune.specs.presets import load_model_preset

__all__ = ["bridge_fields", "cp_comm_type_of", "lora_of", "megatron_dispatcher"]

# Bridge's registered precision names (training/mixed_precision.py @register) -> (precision, fp8_recipe).
_NAMED = {"bf16_mixed": ("bf16", None), "fp16_mixed": ("fp16", None),
          "bf16_with_fp8_delayed_scaling_mixed": ("fp8", "te-delayed"),
          "bf16_with_fp8_current_scaling_mixed": ("fp8", "te-current"),
          "bf16_with_fp8_subchannel_scaling_mixed": ("fp8", "te-blockwise"),
          "bf16_with_mxfp8_mixed": ("fp8", "te-mxfp8"), "bf16_with_nvfp4_mixed": ("fp4", None)}


_NOTED = [("model", k) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                  "virtual_pipeline_model_parallel_size", "context_parallel_size",
                                  "expert_model_parallel_size", "sequence_parallel", "recompute_granularity")] + [
    ("train", "micro_batch_size"), ("train", "global_batch_size"), ("dataset", "seq_length")]
"""The recipe's values a note names where the file leaves them to it: those that shape the plan."""
_LAYOUT_LETTERS = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}


def layout_text(layout: object) -> str | None:
    """A pipeline layout as Megatron's string ("Et*8|t*8|...|tmL"): given so, or as the list of stages' layer names
    a recipe sets (``[["embedding", "decoder", ...], ...]``, pipeline_parallel_layer_layout.py of core 0.19)."""
    if isinstance(layout, str):
        return layout
    if isinstance(layout, list) and all(isinstance(stage, list) for stage in layout):
        try:
            return "|".join("".join(_LAYOUT_LETTERS[str(name)] for name in stage) for stage in layout)
        except KeyError:
            return None
    return None


def _section(data: dict, name: str) -> dict:
    value = data.get(name)
    return value if isinstance(value, dict) else {}


def _size(section: dict, key: str, path: str, default: int | None = 1) -> int | None:
    value = section.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError([f"{path}: {key} must be a positive integer, got {value!r}"], subject="job files")
    return value


def _precision(mp: object, path: str, notes: list[str]) -> tuple[str, str | None]:
    if isinstance(mp, str):
        if mp in _NAMED:
            return _NAMED[mp]
        notes.append(f"{path}: mixed_precision {mp!r} is not modelled: estimated as bf16")
        return "bf16", None
    if not isinstance(mp, dict):
        return "bf16", None
    if mp.get("fp4"):  # NVFP4 (fp4 "e2m1", fp4_recipe "nvfp4": MixedPrecisionConfig's fp4 fields)
        if mp.get("fp4_recipe", "nvfp4") != "nvfp4":
            notes.append(f"{path}: fp4_recipe {mp.get('fp4_recipe')!r} is not modelled: estimated as NVFP4")
        return "fp4", None
    if mp.get("fp8"):
        recipe = mp.get("fp8_recipe")
        ours = {name: plan_name for plan_name, name in MEGATRON_FP8_RECIPES.items()}
        if recipe is not None and recipe not in ours:
            notes.append(f"{path}: fp8_recipe {recipe!r} is not modelled: estimated as delayed scaling")
        return "fp8", ours.get(recipe)
    return ("fp16", None) if mp.get("fp16") else ("bf16", None)


def _enum_name(value: object) -> str:
    """A CUDA-graph module as a file names it: "moe_router", "CudaGraphModule.moe_router", or the mapping a whole
    config's dump writes for the enum member (``{_target_: ...CudaGraphModule, _name_: moe_router, ...}``)."""
    if isinstance(value, dict) and isinstance(value.get("_name_"), str):
        return value["_name_"]
    return str(value).rsplit(".", 1)[-1]


def bridge_fields(path: str, notes: list[str]) -> dict:
    """The plan fields (and the model, where the base recipe names one) of a Bridge override file."""
    data, problems = read_bridge_overrides(path)
    if problems:
        raise InputError([f"{path}: {p.message}; {p.fix}" for p in problems], subject="job files")
    complete = "_target_" in data  # a run_config.yaml states every field; an override file only what it changes
    recipe = base_recipe(path)  # its "# Base recipe:" line, or the recipe its run_recipe.py line loads
    preset = next((name for name, r in RECIPES.items() if r.name == recipe), None)
    if recipe is not None and not complete and (base := recipe_base(recipe)) is not None:
        # run_recipe.py merges the file onto the recipe's ConfigContainer: what the file leaves unsaid is the recipe's
        taken = [f"{section}.{key} {base[section][key]}" for section, key in _NOTED
                 if isinstance(base.get(section), dict) and key in base[section]
                 and key not in _section(data, section)]
        if taken:
            notes.append(f"{path}: from its base recipe {recipe} (megatron-bridge 0.6.2), which the file leaves "
                         f"unsaid: {', '.join(taken)}")
        data, complete = on_base(path, data), True  # the one merge validate judges too
    elif recipe is not None and not complete:
        notes.append(f"{path}: its base recipe {recipe} is not one whose values autotune holds (megatron-bridge "
                     f"0.6.2's {', '.join(sorted(load_bases()))}): what it leaves unsaid is read as Megatron-core's "
                     "defaults (tp 1, no recompute, ...); state the recipe's parallel sizes, batch and precision")
    m, t, ddp = _section(data, "model"), _section(data, "train"), _section(data, "ddp")
    out: dict = {"engine": "megatron", "tp": _size(m, "tensor_model_parallel_size", path),
                 "pp": _size(m, "pipeline_model_parallel_size", path),
                 "vpp": _size(m, "virtual_pipeline_model_parallel_size", path),
                 "cp": _size(m, "context_parallel_size", path), "ep": _size(m, "expert_model_parallel_size", path),
                 "sequence_parallel": bool(m.get("sequence_parallel")),
                 "micro_batch_size": _size(t, "micro_batch_size", path),
                 "global_batch_size": _size(t, "global_batch_size", path, None),
                 "seq_len": _size(_section(data, "dataset"), "seq_length", path, None) or _size(m, "seq_length", path,
                                                                                                None),
                 "zero_stage": 1 if ddp.get("use_distributed_optimizer", not complete) else 0,
                 "overlap_comm": bool(ddp.get("overlap_grad_reduce", not complete)),
                 # OptimizerConfig.optimizer, 'adam' unsaid (megatron/core/optimizer/optimizer_config.py:209), as
                 # Megatron-LM's --optimizer reads (job_files)
                 "optimizer": "sgd" if _section(data, "optimizer").get("optimizer") == "sgd" else "adamw"}
    unsaid = [k for k in ("use_distributed_optimizer", "overlap_grad_reduce") if k not in ddp]
    if unsaid and not complete:
        notes.append(f"{path}: the base recipe's ddp {' and '.join(unsaid)} (true in every Megatron-Bridge library "
                     f"recipe, recipes/common.py _pretrain_common); give ddp.{unsaid[0]}: false where yours differs")
    # the split it states (job_files._read_job: the plan's loss_slots, emit.megatron_layout.read_loss_slots)
    layout = layout_text(m.get("pipeline_model_parallel_layout"))
    out["split_flags"] = {"first": _size(m, "num_layers_in_first_pipeline_stage", path, None),
                          "last": _size(m, "num_layers_in_last_pipeline_stage", path, None),
                          "layout": layout if isinstance(layout, str) else None}
    if ddp.get("use_megatron_fsdp"):  # Megatron-FSDP: its sharding strategy (default optim_grads_params)
        strategy = ddp.get("data_parallel_sharding_strategy") or "optim_grads_params"
        out["zero_stage"] = {"no_shard": 0, "optim": 1, "optim_grads": 2}.get(str(strategy), 3)
    # a full config of a dense model holds expert TP too (TransformerConfig fills it with tp): it splits no expert
    dense = "num_moe_experts" in m and not m["num_moe_experts"]
    if not dense and (etp := _size(m, "expert_tensor_parallel_size", path, None)) is not None:
        out["etp"] = etp
    granularity = m.get("recompute_granularity")
    out["recompute"] = granularity if granularity in ("selective", "full") else "none"
    if granularity == "full" and m.get("recompute_method") == "block":
        out["recompute_num_layers"] = _size(m, "recompute_num_layers", path, None)
    modules = m.get("recompute_modules")  # null: ["core_attn"] (TransformerConfig)
    if granularity == "selective" and isinstance(modules, list) and modules:
        out["recompute_modules"] = tuple(str(x) for x in modules)
    if m.get("cpu_offloading") and (offloaded := _size(m, "cpu_offloading_num_layers", path, None)):
        out["activation_offload_layers"] = offloaded  # TransformerConfig cpu_offloading / cpu_offloading_num_layers
    # TransformerConfig mtp_num_layers: null or 0 builds no MTP block (transformer_config.py:68 at d98e8a6)
    if m.get("mtp_num_layers") != 0 and (mtp := _size(m, "mtp_num_layers", path, None)):
        out["mtp_layers"] = mtp
    impl = m.get("cuda_graph_impl")
    # the deprecated cuda_graph_scope, where set, becomes cuda_graph_modules if that is still its default
    # (TransformerConfig.__post_init__, transformer_config.py:2383-2406 of core 0.19)
    scope, modules = m.get("cuda_graph_scope"), m.get("cuda_graph_modules")
    listed = (scope if scope is not None and modules in ("full", None, []) else modules) or []
    names = [_enum_name(x) for x in (listed if isinstance(listed, list) else [listed])]
    if impl == "full_iteration" or (impl == "local" and "full_iteration" in names):  # Bridge 0.6 utils/cuda_graph.py
        out["cuda_graph"] = "full-iteration"  # :121-131 is_full_iteration_cuda_graph
    elif impl in ("local", "transformer_engine"):  # cuda_graph_modules: [] or "full" = the whole layer
        out["cuda_graph"] = impl
        if names and "full" not in names:
            out["cuda_graph_scope"] = tuple(names)
    precision, recipe = _precision(data.get("mixed_precision"), path, notes)
    out["precision"] = precision
    if recipe is not None:
        out["fp8_recipe"] = recipe
    mp = _section(data, "mixed_precision")
    if precision != "fp16" and (ddp.get("grad_reduce_in_fp32") is False or mp.get("grad_reduce_in_fp32") is False):
        out["grad_dtype"] = "bf16"
    # FP8 attention: mixed_precision's field replaces the model's at setup (update_config_with_precision_overrides)
    if precision == "fp8" and mp.get("fp8_dot_product_attention", m.get("fp8_dot_product_attention")) is True:
        out["fp8_attention"] = True
    if m.get("fp8_output_proj") is True:  # TransformerConfig.fp8_output_proj: the LM head in MXFP8
        out["fp8_output_proj"] = True
    # With a CommOverlapConfig (the file's, or its recipe's) its values, False unless set, replace the model's at
    # setup (Bridge 0.6.2 training/comm_overlap.py:438-439, _override_user_cfgs)
    co = _section(data, "comm_overlap")
    ep = co if co or (preset is not None and RECIPES[preset].comm_overlap) else m
    if ep.get("tp_comm_overlap") is True:
        if out["tp"] >= 2 and out["sequence_parallel"]:  # else Bridge turns it off at setup (comm_overlap.py:442-451)
            out["tp_overlap"] = "userbuffers"
        else:
            notes.append(f"{path}: tp_comm_overlap without tp >= 2 and sequence parallelism: Megatron-Bridge turns "
                         "it off at setup")
    if ep.get("overlap_moe_expert_parallel_comm") is True:
        out["ep_overlap"] = "a2a-delay-wgrad" if ep.get("delay_wgrad_compute") is True else "a2a"
    # TransformerConfig (transformer_config.py:862-873 of core 0.19.2); a full config of a dense model holds its
    # default (allgather), which builds nothing without MoE layers
    kind = None if dense else m.get("moe_token_dispatcher_type")
    if kind == "allgather":
        out["moe_dispatcher"] = "allgather"
    elif kind == "flex" and (backend := m.get("moe_flex_dispatcher_backend") or "deepep") in ("deepep", "hybridep"):
        out["moe_dispatcher"] = f"flex-{backend}"  # ncclep: not modelled, estimated as alltoall
    out |= cp_comm_type_of(m.get("cp_comm_type") if (out["cp"] or 1) > 1 else None, path, notes)
    out |= token_drop_of(m.get("moe_expert_capacity_factor"), m.get("moe_pad_expert_input_to_capacity"))
    out |= lora_of(data.get("peft"), path, notes)
    if preset is not None:
        out["model"] = load_model_preset(preset)
    elif (model := bridge_model(m, _section(data, "tokenizer"), path, notes)) is not None:
        out["model"] = model  # a full config (a checkpoint's run_config.yaml) states the model too
    return out


def lora_of(peft: object, path: str = "", notes: list[str] | None = None) -> dict:
    """The plan's LoRA fields from a file's ``peft`` override (a ``_target_`` mapping of Bridge's
    ``megatron.bridge.peft.lora.LoRA``: autotune.emit.bridge_peft); the fields it leaves out stay Bridge's defaults.
    A ``peft`` of LoRA fields without ``_target_`` sets them on the base recipe's own PEFT (an omegaconf merge:
    Bridge r0.6.0 tutorials/recipes/llama/03_finetune_with_yaml.py:89 builds llama32_1b_peft_config(peft_scheme=
    "lora") under its conf/llama32_1b_finetune.yaml): read as LoRA, said."""
    if not isinstance(peft, dict):
        return {}
    if peft.get("_target_") != LORA_TARGET:
        fields = sorted({"dim", "alpha", "target_modules"} & set(peft))
        if "_target_" in peft or not fields:
            return {}
        if notes is not None:
            notes.append(f"{path}: its peft block sets {', '.join(fields)} of the base recipe's PEFT: read as LoRA "
                         "(a DoRA recipe is estimated as LoRA)")
    out: dict = {"peft": "lora"}
    for key, name in (("dim", "lora_rank"), ("alpha", "lora_alpha"), ("target_modules", "lora_targets")):
        if peft.get(key) is not None:
            out[name] = tuple(peft[key]) if isinstance(peft[key], list) else peft[key]
    return out


def megatron_dispatcher(f: dict, ep: int, path: str, notes: list[str]) -> dict:
    """A Megatron-LM argument file's ``moe_dispatcher`` (``f``: its flags) from --moe-token-dispatcher-type (argparse default allgather: megatron_flags_core_v0.*.json)
    and --moe-flex-dispatcher-backend (default deepep; the deprecated --moe-enable-deepep means deepep,
    transformer_config.py:1589-1598 of 0.19.2); alltoall, autotune's default, reads back unset."""
    kind = f.get("--moe-token-dispatcher-type")
    if kind is None and ep <= 1:  # nothing dispatched across ranks: the default
        return {}
    kind = kind if isinstance(kind, str) else "allgather"
    backend = f.get("--moe-flex-dispatcher-backend")
    backend = backend if isinstance(backend, str) else "deepep"
    name = f"flex-{backend}" if kind == "flex" else kind
    if name not in MOE_DISPATCHERS:
        notes.append(f"{path}: the {name} token dispatcher is not modelled: estimated as alltoall")
        return {}
    return {} if name == "alltoall" else {"moe_dispatcher": name}


def token_drop_of(factor: object, pad: object) -> dict:
    """The plan's token dropping from Megatron's --moe-expert-capacity-factor / --moe-pad-expert-input-to-capacity or
    Bridge's TransformerConfig fields of the same names; a negative factor means dropless (transformer_config.py
    :1660-1662 of core 0.19.2), and so does none."""
    try:
        value = float(factor) if factor is not None and not isinstance(factor, bool) else None
    except (TypeError, ValueError):
        value = None
    if value is None or not 0 < value < float("inf"):
        return {}
    return {"moe_capacity_factor": value} | ({"moe_pad_to_capacity": True} if pad is True else {})


def cp_comm_type_of(value: object, path: str, notes: list[str]) -> dict:
    """A file's ``cp_comm_type`` from Megatron's --cp-comm-type (a list, one per layer or one for all: arguments.py:3221)
    or Bridge's ``model.cp_comm_type``; TE's ``all_gather`` is autotune's allgather; p2p, the default, reads back
    unset. Different types per layer are not modelled: the most common one is estimated, with a note."""
    values = [value] if isinstance(value, str) else [str(v) for v in value] if isinstance(value, list) else []
    if not values:
        return {}
    names = ["allgather" if v.replace("_", "").lower() == "allgather" else v for v in values]
    name = max(dict.fromkeys(names), key=names.count)
    if len(set(names)) > 1:
        notes.append(f"{path}: a context-parallel exchange per layer ({' '.join(values)}) is not modelled: estimated "
                     f"as {name} in every layer")
    if name not in CP_COMM_TYPES:
        notes.append(f"{path}: the {name} context-parallel exchange is not modelled: estimated as p2p")
        return {}
    return {} if name == "p2p" else {"cp_comm_type": name}
