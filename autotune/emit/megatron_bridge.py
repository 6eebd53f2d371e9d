"""Megatron-Bridge overrides for a plan: ``bridge_overrides.yaml`` and ``bridge_overrides.args``.

Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge 0.6, with megatron-core 0.19) configures a run as a recipe function
that returns a ``ConfigContainer``, then overrides it. Both files here override the same keys with the same values:

- ``bridge_overrides.yaml`` is merged as a YAML file: ``process_config_with_overrides(cfg, config_filepath=...)``
  (``src/megatron/bridge/training/utils/omegaconf_utils.py``: ``OmegaConf.merge`` of the file over the container
  turned into a DictConfig, then written back field by field), as the ``--config-file`` of Bridge's tutorial
  scripts (``tutorials/recipes/llama/02_pretrain_with_yaml.py``) does;
- ``bridge_overrides.args`` lists the same settings as Hydra-style ``key=value`` overrides, one a line: the
  trailing arguments of ``scripts/training/run_recipe.py`` (0.6 has no ``--config-file`` there; its
  ``recipe_runner.apply_cli_overrides`` hands them to the same ``process_config_with_overrides``).

Sources (every key is a field of these dataclasses; tests/emit/test_megatron_bridge_applied.py applies both files with
Bridge's own helpers and runs its ``runtime_config_update``/``validate``):
NVIDIA-NeMo/Megatron-Bridge@51885cf132b2814188b6855c25a8588254274c2a (v0.6.0) ``scripts/training/run_recipe.py``,
``scripts/training/recipe_runner.py``; r0.6.0@6124fbe38a68eea9c4f4be3aa5e084bd5d461d98
``src/megatron/bridge/training/config.py`` (ConfigContainer, CheckpointConfig, TrainingConfig),
``training/comm_overlap.py`` (CommOverlapConfig), ``training/mixed_precision.py`` (MixedPrecisionConfig),
``recipes/llama/h100/llama3.py``, ``recipes/llama/h100/llama2.py``, ``recipes/gpt/h100/vanilla_gpt.py``;
megatron-core 0.19 ``OptimizerConfig``, ``DistributedDataParallelConfig``, ``TransformerConfig``.

What depends on the plan is reset, not left to the recipe: the 70B recipe's ``comm_overlap`` carries a
TP-4-tuned userbuffers layout (``userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192``); Bridge 0.6 has none for
other layouts of that width, so ``tp_comm_overlap`` is off and its layout null unless the plan asks for userbuffers
(``ParallelPlan.tp_overlap``, as ``megatron_args.sh`` then writes ``--tp-comm-overlap``): on, with TE's default
layout (comm_overlap.py: "No overlap config provided"). VPP is null without interleaving, the
recompute fields null without recompute, the pipeline layout and uneven-stage counts set from the plan.
"""

from __future__ import annotations

import yaml

from autotune.emit.bridge_hydra import bridge_hydra_args
from autotune.emit.bridge_peft import peft_overrides, peft_problems
from autotune.emit.megatron_fsdp import FSDP_CKPT_FORMAT, megatron_fsdp_ddp_fields, sharding_strategy
from autotune.emit.checkpoint import CheckpointSettings
from autotune.emit.megatron_bridge_recipes import (
    BridgeRecipe,
    bridge_model_problems,
    bridge_recipe,
    generic_model_fields,
)
from autotune.emit.megatron_layout import cp_comm_setting, megatron_split
from autotune.emit.megatron_model_flags import fp32_routing
from autotune.emit.megatron_moe_graph import sync_free_moe_config
from autotune.emit.options import EmitOptions
from autotune.emit.precision import (
    FP4_FORMAT,
    FP4_RECIPE,
    FP8_AMAX_COMPUTE_ALGO,
    FP8_AMAX_HISTORY_LEN,
    fp8_format,
    FP16_HYSTERESIS,
    FP16_INITIAL_LOSS_SCALE,
    FP16_LOSS_SCALE_WINDOW,
    FP16_MIN_LOSS_SCALE,
    MEGATRON_FP8_RECIPES,
)
from autotune.errors import InputError
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.nvfp4 import FP4_PRECISION
from autotune.specs.plan import FULL_ITERATION_GRAPH, ParallelPlan

__all__ = [
    "BRIDGE_ARGS",
    "BRIDGE_VERSION",
    "BRIDGE_YAML",
    "BridgeRecipe",
    "bridge_plan_problems",
    "bridge_files",
    "bridge_hydra_args",
    "bridge_model_problems",
    "bridge_overrides",
    "bridge_recipe",
]

BRIDGE_VERSION = "Megatron-Bridge 0.6 (megatron-bridge 0.6.2, megatron-core 0.19.2)"
BRIDGE_YAML = "bridge_overrides.yaml"
BRIDGE_ARGS = "bridge_overrides.args"


def _recompute(plan: ParallelPlan) -> dict:
    # TransformerConfig: granularity "full"/"selective", method "uniform"/"block"; the same choices as
    # megatron_args' --recompute-* flags (autotune.emit.megatron_run_flags.recompute_flags).
    off = {"recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None,
           "recompute_modules": None}
    if plan.recompute == "selective":
        return off | {"recompute_granularity": "selective",
                      "recompute_modules": list(plan.recompute_modules or ("core_attn",))}
    if plan.recompute == "full":
        if plan.recompute_num_layers is None:
            return off | {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
        return off | {"recompute_granularity": "full", "recompute_method": "block",
                      "recompute_num_layers": plan.recompute_num_layers}
    return off


def _cuda_graph(plan: ParallelPlan) -> dict:
    """TransformerConfig cuda_graph_impl / cuda_graph_modules (megatron-core 0.19.2; an empty list: the whole layer),
    with the deprecated cuda_graph_scope the recipes set ("full") cleared, as both may not be set
    (transformer_config.py:2380); graphs need Transformer Engine's RNG tracker (Bridge models/gpt_provider.py:233,
    training/config.py:1276 sets rng.te_rng_tracker from it). Without graphs in the plan (None: Megatron's none) a
    library recipe's own go: Qwen3-30B-A3B's 16-GPU one captures moe_router, moe_preprocess (v0.6.0 recipes/qwen/
    h100/qwen3_moe.py:213-214), uncounted and refused beside full recompute (core 0.19.2 transformer_config.py:2524)."""
    if plan.cuda_graph in (None, "none"):
        return {"cuda_graph_impl": "none", "cuda_graph_scope": None, "cuda_graph_modules": []}
    if plan.cuda_graph == FULL_ITERATION_GRAPH:  # Bridge 0.6 utils/cuda_graph.py:95-102 set_full_iteration_cuda_graph
        return {"cuda_graph_impl": "full_iteration", "cuda_graph_scope": None, "cuda_graph_modules": [],
                "use_te_rng_tracker": True}
    return {"cuda_graph_impl": plan.cuda_graph, "cuda_graph_scope": None,
            "cuda_graph_modules": list(plan.cuda_graph_scope or ()), "use_te_rng_tracker": True}


def _ep_overlap(plan: ParallelPlan) -> dict:
    """TransformerConfig overlap_moe_expert_parallel_comm / delay_wgrad_compute (model_parallel_config.py:343-349 of
    megatron-core 0.19.2); a recipe's CommOverlapConfig writes its own values (False unless set) over them at setup
    (Bridge 0.6.2 training/comm_overlap.py:438-439, _override_user_cfgs), so they go there too."""
    if plan.ep_overlap is None:
        return {}
    return {"overlap_moe_expert_parallel_comm": plan.ep_overlapped,
            "delay_wgrad_compute": plan.ep_overlap == "a2a-delay-wgrad"}


def _parallel(model: ModelSpec, plan: ParallelPlan, gpus_per_node: int, problems: list[str]) -> dict:
    out: dict = {"tensor_model_parallel_size": plan.tp, "pipeline_model_parallel_size": plan.pp,
                 "virtual_pipeline_model_parallel_size": plan.vpp if plan.interleaved else None,
                 "context_parallel_size": plan.cp, "sequence_parallel": plan.sequence_parallel and plan.tp > 1,
                 "expert_model_parallel_size": plan.ep, "expert_tensor_parallel_size": None,
                 "pipeline_model_parallel_layout": None, "account_for_embedding_in_pipeline_split": False,
                 "account_for_loss_in_pipeline_split": False,
                 "num_layers_in_first_pipeline_stage": None, "num_layers_in_last_pipeline_stage": None}
    # The split megatron_args writes, as TransformerConfig fields (emit/megatron_layout.py; the layout as its string,
    # which TransformerConfig parses, transformer_config.py:2262).
    split = megatron_split(model.num_layers, plan.pp, plan.vpp, plan.mtp_layers, plan.loss_slots)
    if split is None:
        problems.append(f"model.pipeline_model_parallel_size: {model.num_layers} layers cannot be split over pp x vpp "
                        f"= {plan.pp} x {plan.vpp} (virtual) stages without an empty one")
    else:
        out |= {"num_layers_in_first_pipeline_stage": split.first, "num_layers_in_last_pipeline_stage": split.last,
                "account_for_embedding_in_pipeline_split": split.account_embedding,
                "account_for_loss_in_pipeline_split": split.account_loss, "pipeline_model_parallel_layout": split.layout}
    if model.moe is not None and plan.etp is not None:
        out["expert_tensor_parallel_size"] = plan.etp
    setting = cp_comm_setting(plan, gpus_per_node) if plan.cp > 1 else None  # what --cp-comm-type writes
    if setting is not None:
        value, sizes = setting  # ModelParallelConfig / TransformerConfig fields; Bridge checks them together
        out["cp_comm_type"] = value  # (training/config.py:1665-1695)
        out["hierarchical_context_parallel_sizes"] = list(sizes) if sizes else None
    if model.moe is not None:  # TransformerConfig moe_token_dispatcher_type / moe_flex_dispatcher_backend
        kind, _, backend = (plan.moe_dispatcher or "alltoall").partition("-")  # (transformer_config.py:862-873)
        # the backend always: a recipe's own (DeepSeek-V3's hybridep) would stay, and Bridge's perf scripts read a
        # backend as flex (Megatron-Bridge 067f987 scripts/performance/utils/utils.py:415-421); None as Bridge's own
        # fallback to alltoall writes it (training/flex_dispatcher_backend.py:26-29); the flex backends' own SM count,
        # as Megatron-LM's arguments leave it (library recipes set 16-32: recipes/qwen/h100/qwen3_moe.py:69)
        out |= {"moe_token_dispatcher_type": kind, "moe_flex_dispatcher_backend": backend or None} | dict.fromkeys(
            ("moe_flex_dispatcher_num_sms", "moe_deepep_num_sms", "moe_hybridep_num_sms"))
    if model.moe is not None and plan.moe_capacity_factor is not None:  # no Bridge recipe of a modelled MoE sets one
        out |= {"moe_expert_capacity_factor": plan.moe_capacity_factor,
                "moe_pad_expert_input_to_capacity": bool(plan.moe_pad_to_capacity)}
    return out


def bridge_plan_problems(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    """What of ``plan`` the overrides of ``model``'s recipe cannot express (the Megatron engine then writes
    megatron_args.sh alone, with these as its note)."""
    if lora := peft_problems(plan):
        return lora
    recipe = bridge_recipe(model)
    if (plan.grad_dtype == "bf16" or plan.fp8_attention) and recipe.precision_is_named:
        field, way = (("ddp.grad_reduce_in_fp32 true", "bf16 gradients need megatron_args.sh, or drop --grad-dtype")
                      if plan.grad_dtype == "bf16" else ("fp8_dot_product_attention false", "drop --fp8-attention"))
        return [f"mixed_precision: {recipe.name} holds a registered precision name, whose MixedPrecisionConfig "
                f"sets {field} at setup (training/mixed_precision.py update_config_with_precision_overrides) and "
                f"which only another name replaces: {way}"]
    if plan.precision == "fp8" and plan.fp8_recipe == "te-blockwise" and plan.zero_stage >= 1 \
            and recipe.precision_is_named:
        return [f"mixed_precision: {recipe.name} holds a registered precision name, and blockwise FP8's "
                "(bf16_with_fp8_subchannel_scaling_mixed, training/mixed_precision.py) gathers 16-bit parameters "
                "(fp8_param_gather false) where the distributed optimizer's plan holds FP8 ones: blockwise FP8 with "
                "the distributed optimizer needs megatron_args.sh (--fp8-param-gather), or use --zero 0"]
    if plan.cuda_graph == "local":
        return ["model.cuda_graph_impl: Megatron-Bridge 0.6 runs local CUDA graphs for full iterations only "
                "(utils/cuda_graph.py validate_cuda_graph_configuration): per-layer local graphs need "
                "megatron_args.sh, or use --cuda-graph transformer_engine"]
    if plan.tp_overlap == "userbuffers" and not recipe.comm_overlap:
        return [f"comm_overlap: {recipe.name} sets no CommOverlapConfig, and TP userbuffers are turned on there "
                "(comm_overlap.tp_comm_overlap): --tp-overlap userbuffers needs megatron_args.sh "
                "(--tp-comm-overlap), or drop --tp-overlap"]
    return []


# The registered precision name of each FP8 recipe (Megatron-Bridge 0.6.2 training/mixed_precision.py @register:
# bf16_with_fp8_delayed_scaling_mixed, bf16_with_fp8_current_scaling_mixed, bf16_with_fp8_subchannel_scaling_mixed
# = fp8_recipe "blockwise" with fp8_param_gather False, bf16_with_mxfp8_mixed = "mxfp8" with fp8_param_gather True).
BRIDGE_FP8_NAMES = {"te-delayed": "bf16_with_fp8_delayed_scaling_mixed",
                    "te-current": "bf16_with_fp8_current_scaling_mixed",
                    "te-blockwise": "bf16_with_fp8_subchannel_scaling_mixed", "te-mxfp8": "bf16_with_mxfp8_mixed"}


# NVFP4's registered name (Megatron-Bridge 067f987 src/megatron/bridge/training/mixed_precision.py:404-418
# bf16_with_nvfp4_mixed: fp4 "e2m1", fp4_recipe "nvfp4", fp4_param_gather True), the one its Llama-3 NVFP4
# performance recipes run (perf_recipes/llama/*/llama3.py ``_perf_precision("nvfp4")``).
BRIDGE_NVFP4_NAME = "bf16_with_nvfp4_mixed"


def _precision(plan: ParallelPlan, recipe: BridgeRecipe, fp8_param_gather: bool):
    """``mixed_precision``: field by field over the recipe's MixedPrecisionConfig; the generic recipe holds a
    registered name, which only another name replaces (training/mixed_precision.py ``@register``)."""
    if recipe.precision_is_named:
        # bf16_with_fp8_delayed_scaling_mixed (hybrid, delayed, amax history 1024, max: autotune's FP8 recipe) also
        # gathers FP8 parameters; Bridge 0.6 accepts that without the distributed optimizer too (fewer weight bytes
        # than a DDP plan's estimate assumes, not more).
        fp8 = BRIDGE_FP8_NAMES[plan.fp8_recipe or "te-delayed"]
        return {"bf16": "bf16_mixed", "fp16": "fp16_mixed", "fp8": fp8,
                FP4_PRECISION: BRIDGE_NVFP4_NAME}[plan.precision]
    fp16 = plan.precision == "fp16"
    dtype = "torch.float16" if fp16 else "torch.bfloat16"  # how omegaconf_utils writes torch.dtype values
    out: dict = {"bf16": not fp16, "fp16": fp16, "params_dtype": dtype, "pipeline_dtype": dtype,
                 # Megatron's fp32 main_grad with bf16 unless the plan reduces in bf16 (engines.states)
                 "grad_reduce_in_fp32": not fp16 and plan.grad_dtype != "bf16",
                 "fp8": None, "fp8_param_gather": False, "first_last_layers_bf16": False,
                 "fp8_dot_product_attention": bool(plan.fp8_attention), "fp8_multi_head_attention": False, "fp4": None}
    if fp16:
        out |= {"initial_loss_scale": FP16_INITIAL_LOSS_SCALE, "min_loss_scale": FP16_MIN_LOSS_SCALE,
                "loss_scale_window": FP16_LOSS_SCALE_WINDOW, "hysteresis": FP16_HYSTERESIS}
    if plan.precision == FP4_PRECISION:  # MixedPrecisionConfig's fp4 fields (mixed_precision.py:62-66)
        out |= {"fp4": FP4_FORMAT, "fp4_recipe": FP4_RECIPE, "fp4_param_gather": fp8_param_gather}
    if plan.precision == "fp8":
        recipe_name = MEGATRON_FP8_RECIPES[plan.fp8_recipe or "te-delayed"]
        out |= {"fp8": fp8_format(plan.fp8_recipe), "fp8_recipe": recipe_name, "fp8_margin": 0,
                "fp8_param_gather": fp8_param_gather}
        if recipe_name == "mxfp8" and fp8_param_gather:
            # Bridge 0.6.2 ConfigContainer.validate (training/config.py): "When fp8_param_gather=True and
            # fp8_recipe='mxfp8', reuse_grad_buf_for_mxfp8_param_ag must be set to True" (as bf16_with_mxfp8_mixed)
            out["reuse_grad_buf_for_mxfp8_param_ag"] = True
        if recipe_name == "delayed":
            out |= {"fp8_amax_history_len": FP8_AMAX_HISTORY_LEN, "fp8_amax_compute_algo": FP8_AMAX_COMPUTE_ALGO}
    return out


def _optimizer(plan: ParallelPlan, options: EmitOptions, problems: list[str]) -> tuple[dict, dict]:
    o = options.optimizer
    distributed = plan.zero_stage >= 1  # Megatron-FSDP v1 always uses it (Bridge config.py:1081-1085)
    opt: dict = {"lr": o.lr, "min_lr": o.min_lr, "weight_decay": o.weight_decay, "clip_grad": o.grad_clip,
                 "use_distributed_optimizer": distributed,
                 # Bridge syncs it with ddp.overlap_param_gather (utils/common_utils.py), set both alike
                 "overlap_param_gather": distributed and plan.overlap_comm}
    if plan.optimizer == "adamw":  # megatron-core's "adam" is AdamW (decoupled weight decay)
        opt |= {"optimizer": "adam", "adam_beta1": o.betas[0], "adam_beta2": o.betas[1], "adam_eps": o.eps}
    elif plan.optimizer == "sgd":
        opt |= {"optimizer": "sgd"}
    else:
        problems.append(f"optimizer.optimizer: megatron-core has no {plan.optimizer} optimizer (adam, sgd, muon, "
                        f"lion, soap): use adamw or sgd")
    sched = {"lr_decay_style": "cosine", "lr_warmup_iters": o.warmup_steps, "lr_warmup_fraction": None,
             "lr_decay_iters": o.train_steps}
    return opt, sched


def _checkpoint(ckpt: CheckpointSettings, plan: ParallelPlan) -> dict:
    # Bridge's CheckpointConfig spells Megatron-LM's --save/--load/--save-interval/--ckpt-format/--async-save;
    # Megatron-FSDP saves fsdp_dtensor (Bridge 067f987 training/config.py:1104-1109).
    fmt = FSDP_CKPT_FORMAT if sharding_strategy(plan) else "torch_dist"
    out: dict = {"save": ckpt.save_dir, "load": ckpt.save_dir, "save_interval": ckpt.interval_steps,
                 "ckpt_format": fmt, "async_save": ckpt.async_save,
                 "use_persistent_ckpt_worker": ckpt.async_save}
    if ckpt.local_interval_steps is not None:
        out |= {"non_persistent_ckpt_type": "local", "non_persistent_local_ckpt_dir": ckpt.local_dir,
                "non_persistent_save_interval": ckpt.local_interval_steps, "replication": True,
                "replication_jump": ckpt.local_replication_jump, "replication_factor": 2}
    return out


def bridge_overrides(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, options: EmitOptions | None,
                     checkpoint: CheckpointSettings, *, fp8_param_gather: bool = False) -> dict:
    """The ConfigContainer overrides for the plan, section by section (InputError naming every setting Bridge
    cannot take). ``fp8_param_gather``: the engine's choice (as for megatron_args)."""
    options = options or EmitOptions()
    recipe = bridge_recipe(model)
    problems: list[str] = []
    if plan.world_size != cluster.num_gpus:
        problems.append(f"the plan spans {plan.world_size} GPUs (tp*pp*dp*cp) but the cluster has {cluster.num_gpus}")
    problems += bridge_model_problems(model)
    if plan.offload_optimizer != "none" or plan.offload_param != "none":
        problems.append("ddp.use_distributed_optimizer: offload has no Bridge setting (ZeRO-2/3 are Megatron-FSDP's "
                        "ddp.use_megatron_fsdp)")
    if plan.ep > 1 and plan.tp > 1 and not plan.sequence_parallel:
        problems.append("model.sequence_parallel: expert parallelism with tp > 1 needs sequence parallelism")
    model_keys = ((generic_model_fields(model) if recipe.hf_model is None else {})
                  | _parallel(model, plan, cluster.gpus_per_node, problems))
    model_keys |= {"seq_length": plan.seq_len} | _recompute(plan) | _cuda_graph(plan) | _ep_overlap(plan)
    model_keys |= sync_free_moe_config(model, plan)
    if model_keys.get("moe_paged_stash"):  # megatron-core's paged-stash check iterates offload_modules (core 0.19.2
        # transformer_config.py:1912-1914), which the library recipes set to None (v0.6.0 recipes/gpt_oss/h100/
        # gpt_oss.py:239, qwen/h100/qwen3_moe.py:97): Bridge's validate() raised TypeError. [] is its default (:1234)
        model_keys["offload_modules"] = []
    if recipe.hf_model is not None and model.moe is not None:
        # no shared experts beside the dispatch, as the Megatron-LM arguments run the plan (engines/megatron_rules.py
        # ep_overlap_rules): DeepSeek-V3's bridge turns them on (v0.6.0 models/deepseek/deepseek_v3_bridge.py:72), as
        # does Kimi-K2's recipe (recipes/kimi/h100/kimi_k2.py:192), and Bridge refuses that beside the EP overlap
        # (0.6.2 training/comm_overlap.py:513-515; megatron-core 0.19.2 transformer_config.py:2706-2708)
        model_keys["moe_shared_expert_overlap"] = False
        if fp32_routing(model.moe):  # the router in fp32 as the Megatron-LM arguments run it (megatron_model_flags.
            # ROUTER_FP32_EXPERTS): the library recipes' bridges set it for DeepSeek-V3 / Kimi-K2 only (Qwen3-MoE's and
            # GPT-OSS's keep the model's dtype: v0.6.0 models/qwen/qwen3_moe_bridge.py, gpt_oss/gpt_oss_bridge.py)
            model_keys["moe_router_dtype"] = "fp32"
    if plan.activation_offload_layers:  # as Bridge's perf scripts set it (utils/overrides.py:170-173 at 067f987)
        model_keys |= {"cpu_offloading": True, "cpu_offloading_weights": False,
                       "cpu_offloading_num_layers": plan.activation_offload_layers}
    if plan.fp8_output_proj:  # TransformerConfig.fp8_output_proj, as Bridge's perf recipes set it (cfg.model.
        # fp8_output_proj = True: perf_recipes/gpt_oss/common.py:28 at 067f987); written only when on (core 0.18+)
        model_keys["fp8_output_proj"] = True
    if plan.mtp_layers:  # TransformerConfig mtp_num_layers (Megatron-LM's --mtp-num-layers); the loss scale stays 0.1
        model_keys["mtp_num_layers"] = plan.mtp_layers
    elif model.num_mtp_layers and recipe.hf_model is not None:  # the library recipe of a checkpoint with MTP modules
        # trains them unless told (DeepSeek-V3's sets mtp_num_layers = 1, "0 or None to disable": Megatron-Bridge
        # @067f987 recipes/deepseek/h100/deepseek_v3.py:137); the plan trains none, as its Megatron-LM arguments do
        model_keys["mtp_num_layers"] = None
    learned = model.position_embedding == "learned"
    if recipe.hf_model is None and learned and plan.seq_len > model.max_position_embeddings:
        problems.append(f"model.seq_length: {plan.seq_len} exceeds the learned position table "
                        f"({model.max_position_embeddings} rows)")
    optimizer, scheduler = _optimizer(plan, options, problems)
    precision = _precision(plan, recipe, fp8_param_gather)
    overlap = plan.overlap_comm
    # Megatron: param gather overlap needs the distributed optimizer or Megatron-FSDP (arguments.py:1025)
    param_gather = overlap and plan.zero_stage >= 1
    out = {
        "model": model_keys,
        "train": {"micro_batch_size": plan.micro_batch_size, "global_batch_size": plan.global_batch_size,
                  "train_iters": options.optimizer.train_steps},
        "dataset": {"seq_length": plan.seq_len},
        "optimizer": optimizer,
        "scheduler": scheduler,
        "ddp": {"use_distributed_optimizer": plan.zero_stage >= 1, "overlap_grad_reduce": overlap,
                "overlap_param_gather": param_gather,
                "grad_reduce_in_fp32": plan.precision != "fp16" and plan.grad_dtype != "bf16",
                "use_megatron_fsdp": False} | megatron_fsdp_ddp_fields(plan),
        # CommOverlapConfig's own values win over ddp/optimizer at setup (comm_overlap.py _override_user_cfgs).
        "comm_overlap": {"tp_comm_overlap": plan.tp_overlap == "userbuffers", "tp_comm_overlap_cfg": None,
                         "overlap_grad_reduce": overlap, "overlap_param_gather": param_gather} | _ep_overlap(plan)
        if recipe.comm_overlap else None,
        "mixed_precision": precision,
        "checkpoint": _checkpoint(checkpoint, plan),
        "logger": {"log_interval": options.steps_per_print},
    }
    lora = peft_overrides(plan, options, problems)  # LoRA: the recipe's LoRA fields and the model it fine-tunes
    out |= {"peft": lora["peft"], "checkpoint": out["checkpoint"] | lora["checkpoint"]} if lora else {}
    if plan.cuda_graph == FULL_ITERATION_GRAPH:  # asserted off with it (Bridge v0.6.0 training/config.py:1364-1368)
        out["rerun_state_machine"] = {"check_for_nan_in_loss": False}
    if out["comm_overlap"] is None:  # the recipe has none: no TP userbuffers; ddp's own overlap flags apply
        del out["comm_overlap"]
    if recipe.precision_is_named:
        out["ddp"].pop("grad_reduce_in_fp32")  # the named precision recipe sets it
        problems += [p for p in bridge_plan_problems(model, plan) if p not in problems]
    if problems:
        raise InputError(problems, subject="Megatron-Bridge overrides")
    return out


def _launch_line(cluster: ClusterSpec, recipe: BridgeRecipe, port: int) -> str:
    nodes, per_node = cluster.num_nodes, cluster.gpus_per_node
    rdzv = ("" if nodes == 1 else
            f" --rdzv-backend c10d --rdzv-endpoint \"$MASTER_ADDR:{port}\" --node-rank \"$NODE_RANK\"")
    return (f"torchrun --nnodes {nodes} --nproc-per-node {per_node}{rdzv} scripts/training/run_recipe.py "
            f"--recipe {recipe.name} --mode pretrain \"${{BRIDGE_ARGS[@]}}\"")


def bridge_files(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, options: EmitOptions | None,
                 checkpoint: CheckpointSettings, *, fp8_param_gather: bool = False) -> dict[str, str]:
    """``bridge_overrides.yaml`` and ``bridge_overrides.args`` for the plan."""
    overrides = bridge_overrides(model, cluster, plan, options, checkpoint, fp8_param_gather=fp8_param_gather)
    recipe = bridge_recipe(model)
    base = (f"{recipe.name} ({recipe.module}; its model is the Hugging Face config {recipe.hf_model})"
            if recipe.hf_model else
            f"{recipe.name} ({recipe.module}; Bridge 0.6 has no {model.name} recipe: the generic GPT recipe, "
            f"with the model shape set below)")
    launch = _launch_line(cluster, recipe, (options or EmitOptions()).launch.master_port)
    head = [f"Megatron-Bridge ConfigContainer overrides written by autotune for {BRIDGE_VERSION}.",
            f"Base recipe: {base}.",
            ("Every value that depends on the plan is set here, including what the recipe tuned for its own "
             "layout (TP comm-overlap userbuffers, VPP, recompute).")]
    yaml_head = head + [
        "Apply it over the recipe with Bridge's helper (what --config-file does in its tutorial scripts):",
        "  from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides",
        f"  cfg = process_config_with_overrides({recipe.name}(), config_filepath=\"{BRIDGE_YAML}\")",
        f"or launch run_recipe.py with the same settings as arguments ({BRIDGE_ARGS})."]
    yaml_text = "".join(f"# {line}\n" for line in yaml_head)
    yaml_text += yaml.safe_dump(overrides, sort_keys=False, default_flow_style=False, width=1000)
    args_head = head + [
        "One Hydra-style override a line: the trailing KEY=VALUE arguments of Bridge's scripts/training/run_recipe.py",
        "(the same settings as bridge_overrides.yaml). From a Megatron-Bridge 0.6 checkout, on every node:",
        f"  mapfile -t BRIDGE_ARGS < <(grep -v '^#' /path/to/this/folder/{BRIDGE_ARGS})",
        f"  {launch}"]
    args_text = "".join(f"# {line}\n" for line in args_head) + "".join(f"{a}\n" for a in bridge_hydra_args(overrides))
    return {BRIDGE_YAML: yaml_text, BRIDGE_ARGS: args_text}

