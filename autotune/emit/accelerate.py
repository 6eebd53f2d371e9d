"""accelerate 1.16 config files for a plan: DeepSpeed (with its own concrete JSON) and FSDP2.

``accelerate launch --config_file FILE script.py``. What accelerate 1.16.0 itself imposes (its code, file:line
in the 1.16.0 wheel):

- With ``deepspeed_config_file``, the DeepSpeed block may hold nothing the JSON also says, and the file no
  ``mixed_precision`` (``utils/dataclasses.py:1386`` ``DeepSpeedPlugin._deepspeed_config_checks`` raises
  ValueError; ``commands/launch.py:1421-1423`` lists the block's keys plus ``mixed_precision``): precision,
  ZeRO, offload, clipping and accumulation live in the JSON.
- accelerate fills only batch sizes, clipping and bf16/fp16 "auto" values; optimizer and scheduler values
  are the HF Trainer's to fill, so the JSON written for accelerate has every value concrete. A config with
  an ``optimizer``/``scheduler`` block needs ``accelerate.utils.DummyOptim`` / ``DummyScheduler`` in the
  script (``accelerator.py:2214`` in ``Accelerator._prepare_deepspeed``).
- ``parallelism_config`` is accepted only with FSDP2 (``commands/launch.py:1261``: "You cannot use
  --use_parallelism_config without --use_fsdp and --fsdp_version=2"); its sizes multiply to the world size
  (``parallelism_config.py:368`` in ``ParallelismConfig._validate_accelerator``), and FSDP2 needs dp_shard or
  cp above 1 to shard over (``parallelism_config.py:377``); CP with pure replication is refused
  (``parallelism_config.py:332`` in ``__post_init__``; 1.16 no longer refuses TP with pure replication, but
  under FSDP2 that layout still has nothing to shard over).
"""

from __future__ import annotations

import yaml

from autotune.emit.deepspeed import deepspeed_config
from autotune.emit.options import EmitOptions
from autotune.emit.torchtitan import torchtitan_compiles
from autotune.errors import InputError
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["ACCELERATE_VERSION", "ACCELERATE_RELEASE", "ACCELERATE_DS_CONFIG", "CPU_FSDP_PROBLEM", "DEFAULT_LAYER_CLS",
           "HF_DECODER_LAYERS", "accelerate_config_yaml", "accelerate_deepspeed_config", "accelerate_deepspeed_yaml",
           "accelerate_fsdp_yaml", "hf_decoder_layer"]

ACCELERATE_VERSION = "1.16.0"
ACCELERATE_RELEASE = ".".join(ACCELERATE_VERSION.split(".")[:2])
"""The release the files are written for, as the engines name their companion packages (``"1.16"``)."""
ACCELERATE_DS_CONFIG = "ds_config_accelerate.json"
DEFAULT_LAYER_CLS = "Block"
"""The decoder block of autotune's built-in model (``autotune/workloads/transformer.py``); for a Hugging Face
model pass its decoder layer class (``LlamaDecoderLayer``, ``Qwen2DecoderLayer``, ...)."""

HF_DECODER_LAYERS = {"llama": "LlamaDecoderLayer", "mistral": "MistralDecoderLayer", "mixtral": "MixtralDecoderLayer",
                     "qwen2": "Qwen2DecoderLayer", "gpt2": "GPT2Block", "gpt_neox": "GPTNeoXLayer",
                     "bloom": "BloomBlock", "falcon": "FalconDecoderLayer", "opt": "OPTDecoderLayer",
                     "deepseek_v3": "DeepseekV3DecoderLayer", "qwen3": "Qwen3DecoderLayer",
                     "qwen3_moe": "Qwen3MoeDecoderLayer", "gemma2": "Gemma2DecoderLayer",
                     "gemma3_text": "Gemma3DecoderLayer", "gemma3": "Gemma3DecoderLayer", "olmo2": "Olmo2DecoderLayer",
                     "phi3": "Phi3DecoderLayer", "gpt_oss": "GptOssDecoderLayer", "llama4_text": "Llama4TextDecoderLayer",
                     "llama4": "Llama4TextDecoderLayer", "glm4_moe": "Glm4MoeDecoderLayer",
                     "deepseek_v2": "DeepseekV2DecoderLayer", "olmoe": "OlmoeDecoderLayer",
                     "qwen2_moe": "Qwen2MoeDecoderLayer", "starcoder2": "Starcoder2DecoderLayer",
                     "smollm3": "SmolLM3DecoderLayer", "exaone4": "Exaone4DecoderLayer",
                     "ernie4_5": "Ernie4_5DecoderLayer", "ernie4_5_moe": "Ernie4_5_MoeDecoderLayer",
                     "seed_oss": "SeedOssDecoderLayer", "dots1": "Dots1DecoderLayer",
                     "minimax_m2": "MiniMaxM2DecoderLayer", "hunyuan_v1_moe": "HunYuanMoEV1DecoderLayer",
                     "hunyuan_v1_dense": "HunYuanDenseV1DecoderLayer"}
"""A Hugging Face config's ``model_type`` -> the decoder layer class transformers 5.25 builds for it (its
``*ForCausalLM._no_split_modules``, the class accelerate wraps when no class is named), for every model type whose
config.json autotune reads and transformers builds (kimi_k2 and Falcon's RefinedWeb* are remote code)."""


REMOTE_DECODER_LAYERS = {"DeepseekV3ForCausalLM": "DeepseekV3DecoderLayer"}
"""A remote-code model's ``architectures`` class -> its decoder layer class: Kimi-K2's config.json (model_type
kimi_k2, no transformers class) maps to its own modeling_deepseek.py, whose DeepseekV3ForCausalLM has
``_no_split_modules = ["DeepseekV3DecoderLayer"]``, the class name transformers' DeepSeek-V3 uses too."""


def hf_decoder_layer(config: dict) -> str | None:
    """The decoder layer class of a parsed Hugging Face ``config.json`` (:data:`HF_DECODER_LAYERS` by its
    ``model_type``, else :data:`REMOTE_DECODER_LAYERS` by its ``architectures``); None when neither knows it (name it
    with --wrap-class)."""
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in HF_DECODER_LAYERS:
        return HF_DECODER_LAYERS[model_type]
    names = config.get("architectures")
    return next((REMOTE_DECODER_LAYERS[n] for n in names if isinstance(n, str) and n in REMOTE_DECODER_LAYERS),
                None) if isinstance(names, list) else None


def _launch_shape(cluster: ClusterSpec, options: EmitOptions) -> dict:
    launch = options.launch
    data: dict = {"compute_environment": "LOCAL_MACHINE", "debug": False, "machine_rank": 0,
                  "main_training_function": "main", "num_machines": cluster.num_nodes,
                  "num_processes": cluster.num_gpus, "rdzv_backend": "static", "same_network": True,
                  "use_cpu": False}
    if cluster.num_nodes > 1:
        if launch.master_addr:
            data["main_process_ip"] = launch.master_addr
        data["main_process_port"] = launch.master_port
    return data


def _header(cluster: ClusterSpec, options: EmitOptions, what: str, ds_config_filename: str | None = None) -> str:
    script = options.launch.script or "train.py"
    if ds_config_filename is None or ds_config_filename.startswith("/"):  # an absolute JSON path: any folder
        how = f"#   accelerate launch --config_file THIS_FILE {script}\n"
    else:
        # accelerate 1.16 copies deepspeed_config_file unchanged into ACCELERATE_DEEPSPEED_CONFIG_FILE
        # (utils/launch.py:541-542) and the ranks open it from their working folder (utils/deepspeed.py:141,
        # HfDeepSpeedConfig: os.path.exists): the path is not resolved from this file's folder.
        how = (f"#   from this file's folder: accelerate launch --config_file THIS_FILE {script}\n"
               f"#   from any folder: accelerate launch --config_file DIR/THIS_FILE --deepspeed_config_file "
               f"DIR/{ds_config_filename} {script}\n"
               f"#   (deepspeed_config_file below is opened from the folder accelerate runs in, not from this "
               f"file's; launch_accelerate.sh passes both paths)\n")
    nodes = f"# {cluster.num_nodes} machine(s) x {cluster.gpus_per_node} GPUs; set machine_rank per node.\n"
    if cluster.num_nodes > 1 and not options.launch.master_addr:  # the launch line must say where rank 0 is
        nodes = (f"# {cluster.num_nodes} machine(s) x {cluster.gpus_per_node} GPUs: on machine i add --machine_rank i "
                 "--main_process_ip <machine 0's address> (this file names no main_process_ip).\n")
    return f"# accelerate {ACCELERATE_VERSION} config ({what}) written by autotune:\n" + how + nodes


def _deepspeed_block(plan: ParallelPlan, cluster: ClusterSpec, ds_config_filename: str) -> dict:
    ds: dict = {"deepspeed_config_file": ds_config_filename, "zero3_init_flag": plan.zero_stage == 3}
    if cluster.num_nodes > 1:
        ds["deepspeed_multinode_launcher"] = "standard"
    return ds


def _require_no_cp(plan: ParallelPlan) -> None:
    # DeepSpeed's Ulysses comes in as ParallelismConfig sp_size with sp_backend "deepspeed" (parallelism_config.py:57,
    # 366); a YAML's parallelism_config without FSDP2 is refused by the launcher (commands/launch.py:1261).
    if plan.cp > 1:
        raise InputError([f"cp={plan.cp}: accelerate {ACCELERATE_VERSION} takes Ulysses sequence parallelism only "
                          "from a ParallelismConfig built in the script (its launcher refuses parallelism_config "
                          "without FSDP2): use cp=1 for an accelerate DeepSpeed config"],
                         subject="accelerate DeepSpeed config")


def accelerate_config_yaml(plan: ParallelPlan, cluster: ClusterSpec, ds_config_filename: str, *,
                           options: EmitOptions | None = None) -> str:
    """accelerate's config running DeepSpeed with the JSON ``ds_config_filename`` (which must be concrete, e.g.
    :func:`accelerate_deepspeed_config`): the launch shape only; no ``mixed_precision`` (see the module doc)."""
    options = options or EmitOptions()
    data = {**_launch_shape(cluster, options), "distributed_type": "DEEPSPEED",
            "deepspeed_config": _deepspeed_block(plan, cluster, ds_config_filename)}
    return _header(cluster, options, "DeepSpeed", ds_config_filename) + yaml.safe_dump(data, sort_keys=False)


def accelerate_deepspeed_config(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                                options: EmitOptions | None = None) -> dict:
    """The DeepSpeed JSON for accelerate: the plan's DeepSpeed config with every value concrete (batch triple,
    precision, optimizer lr/betas/eps, scheduler steps): accelerate fills none of the optimizer's "auto"s."""
    _require_no_cp(plan)
    return deepspeed_config(model, cluster, plan, options)


def accelerate_deepspeed_yaml(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                              options: EmitOptions | None = None, *,
                              ds_config_filename: str = ACCELERATE_DS_CONFIG) -> str:
    """accelerate's DeepSpeed config, pointing at ``ds_config_filename`` (write
    :func:`accelerate_deepspeed_config` there)."""
    del model
    _require_no_cp(plan)
    return accelerate_config_yaml(plan, cluster, ds_config_filename, options=options)


def _mixed_precision(plan: ParallelPlan) -> str:
    # FP8 GEMMs come from the model code (torchao / TE); accelerate's fp8 needs its own fp8_config recipe.
    return "fp16" if plan.precision == "fp16" else "bf16"


# accelerate 1.16 state.py:947-974: AcceleratorState sets DistributedType.FSDP only over a multi-accelerator type
# (MULTI_GPU, MULTI_NPU, MULTI_XPU, ...; state.py:747-758 picks one only where torch reports an accelerator with a
# distributed backend); on a CPU-only machine, use_cpu true or false, each launched process reports
# DistributedType.NO and num_processes 1 (measured here with 1.16.0 and 2 processes): same batches, nothing sharded.
CPU_FSDP_PROBLEM = (f"accelerate {ACCELERATE_VERSION} runs FSDP on GPUs (accelerators) only: on CPU every launched "
                    "process trains alone on the whole model (DistributedType.NO, num_processes 1, the same batches, "
                    "nothing sharded)")


def _fsdp_problems(plan: ParallelPlan, cluster: ClusterSpec) -> list[str]:
    problems = []
    if cluster.gpu.name == "cpu":
        problems.append(CPU_FSDP_PROBLEM + ": launch with launch_torchrun.sh (fully_shard in your script, as plan.md "
                        "says), or emit for the GPU cluster")
    if plan.world_size != cluster.num_gpus:
        problems.append(f"the plan spans {plan.world_size} GPUs (tp*pp*dp*cp) but the cluster has {cluster.num_gpus}")
    if plan.pp > 1:
        # ParallelismConfig's dimensions are dp_replicate, dp_shard, tp, cp, sp (parallelism_config.py:338-344)
        problems.append(f"pp={plan.pp}: accelerate {ACCELERATE_VERSION} has no pipeline parallelism for FSDP2: "
                        "use torchtitan (autotune.emit.torchtitan) or pp=1")
    if plan.ep > 1:
        # ParallelismConfig's sizes are dp_replicate, dp_shard, tp, cp, sp (parallelism_config.py:338-344): the
        # experts would be sharded by FSDP over all ranks, not split ep ways as the plan was estimated
        problems.append(f"ep={plan.ep}: accelerate {ACCELERATE_VERSION}'s ParallelismConfig has no expert parallelism "
                        "(dp_replicate, dp_shard, tp, cp, sp): use torchtitan's file, or ep=1")
    if plan.offload_optimizer != "none" and plan.offload_param == "none":
        problems.append("FSDP2 offloads parameters, gradients and optimizer states together (fsdp_offload_params): "
                        "set offload_param cpu as well, or no offload")
    if "nvme" in (plan.offload_param, plan.offload_optimizer):
        problems.append("FSDP2 offloads to CPU only (CPUOffloadPolicy): use cpu")
    if (plan.loss_chunks or 1) > 1:
        problems.append("the loss is the training script's own under accelerate: chunk it there, or drop "
                        "--loss-chunks")
    if plan.tp_overlap == "async-tp":
        # TorchTensorParallelConfig.enable_async_tp warns "currently not supported, ignoring" (dataclasses.py:2206)
        problems.append(f"accelerate {ACCELERATE_VERSION} has no async tensor parallelism: use torchtitan's file, or "
                        "drop --tp-overlap")
    if plan.precision == "fp8" and plan.fp8_recipe == "torchao-mxfp8":
        problems.append(f"accelerate {ACCELERATE_VERSION} cannot say torchao MXFP8: its torchao backend converts with "
                        "torchao.float8 (AORecipeKwargs.config is a Float8LinearConfig, utils/dataclasses.py:306; "
                        "utils/ao.py:143 convert_model_to_fp8_ao calls convert_to_float8_training) and its MXFP8 is "
                        "Transformer Engine's (TERecipeKwargs.use_mxfp8_block_scaling, utils/dataclasses.py:378; "
                        "--fp8-recipe te-mxfp8 on Megatron): use torchtitan's file, or --fp8-recipe torchao-rowwise / "
                        "torchao-tensorwise")
    if plan.tp > 1 and plan.sequence_parallel:
        # accelerate 1.16 tensor-parallelizes with the model's own tp_plan (accelerator.py:1876-1882); transformers
        # 5.25's are colwise / rowwise linears alone (models/llama/configuration_llama.py:48-56 base_model_tp_plan)
        problems.append(f"sequence parallelism with tp {plan.tp}: accelerate {ACCELERATE_VERSION}'s TP is the "
                        "model's transformers tp_plan (colwise / rowwise linears; norms and dropout replicated, no "
                        "SequenceParallel): use torchtitan's file, or --no-sequence-parallel")
    if plan.zero_stage not in (2, 3):
        problems.append(f"zero_stage {plan.zero_stage}: accelerate's FSDP2 shards parameters and gradients "
                        "(ZeRO-3: fsdp_reshard_after_forward true) or keeps the gathered parameters until backward "
                        "(ZeRO-2: false); for plain data parallelism (0) use a MULTI_GPU accelerate config: use 2 or 3")
    dp_shard = plan.dp // plan.dp_replicate
    if (plan.tp > 1 or plan.dp_replicate > 1) and dp_shard == 1 and plan.cp == 1:
        problems.append("FSDP2 under a parallelism_config shards over dp_shard x cp, here 1: accelerate raises "
                        "'FSDP is enabled but the parallelism config has no dimension for FSDP to shard across' "
                        "(ParallelismConfig._validate_accelerator, parallelism_config.py:377): give FSDP dp ranks to "
                        "shard over")
    if plan.cp > 1 and plan.dp_replicate > 1 and dp_shard == 1:
        problems.append(f"accelerate {ACCELERATE_VERSION}'s ParallelismConfig refuses CP with pure replication "
                        "(dp_replicate > 1, dp_shard 1; parallelism_config.py:332): shard over dp instead")
    return problems


def accelerate_fsdp_yaml(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                         options: EmitOptions | None = None, *, layer_cls: str | None = None) -> str:
    """accelerate's FSDP2 config for the plan: ``fully_shard`` per ``layer_cls`` block (None:
    ``options.launch.wrap_class``, else the built-in model's :data:`DEFAULT_LAYER_CLS`), reshard after forward at
    ZeRO-3 (not at ZeRO-2), CPU offload, sharded checkpoints, activation checkpointing for full recompute,
    the plan's precision; ``parallelism_config`` (dp replicate x dp shard x tp x cp) when tp, cp or hybrid
    sharding is used. InputError for what accelerate's FSDP2 path cannot express (pp, optimizer-only offload)."""
    options = options or EmitOptions()
    problems = _fsdp_problems(plan, cluster)
    if problems:
        raise InputError(problems, subject="accelerate FSDP2 config")
    del model
    layer_cls = layer_cls or options.launch.wrap_class or DEFAULT_LAYER_CLS
    fsdp = {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": layer_cls,
            "fsdp_reshard_after_forward": plan.zero_stage == 3,
            "fsdp_offload_params": plan.offload_param == "cpu",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_activation_checkpointing": plan.recompute == "full",
            "fsdp_cpu_ram_efficient_loading": True}
    data = {**_launch_shape(cluster, options), "distributed_type": "FSDP", "mixed_precision": _mixed_precision(plan),
            "fsdp_config": fsdp}
    if torchtitan_compiles(plan):  # as the FSDP engine's files compile (the cost model asks the same function)
        data["dynamo_config"] = {"dynamo_backend": "INDUCTOR"}
    if plan.tp > 1 or plan.cp > 1 or plan.dp_replicate > 1:
        data["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": plan.dp_replicate,
            "parallelism_config_dp_shard_size": plan.dp // plan.dp_replicate,
            "parallelism_config_tp_size": plan.tp,
            "parallelism_config_cp_size": plan.cp,
        }
    note = ""
    if layer_cls == DEFAULT_LAYER_CLS and options.launch.script:
        note = (f"# fsdp_transformer_layer_cls_to_wrap {DEFAULT_LAYER_CLS} is autotune's built-in model's block: name "
                f"your model's block class here (or emit with --wrap-class YourBlock)\n")
    return _header(cluster, options, "FSDP2") + note + yaml.safe_dump(data, sort_keys=False)

