"""Megatron-LM arguments for a plan, and the Megatron-DeepSpeed form.

Sources: Megatron-LM ``NVIDIA/Megatron-LM@d98e8a6``
``megatron/training/arguments.py`` ("validate_args N" below is that file's line N); which flags exist is the
flag table of the Megatron-core release in use (``megatron_flags_core_v0.NN.json``, one per modelled release,
``options.megatron_version``); Megatron-DeepSpeed ``deepspeedai/Megatron-DeepSpeed`` ``megatron/arguments.py``
(its flags: ``megatron_deepspeed_flags.json``).

Every flag :func:`megatron_args` writes exists in the table of the release in use (else an InputError naming the
flag and the releases that have it), every flag of :func:`megatron_deepspeed_args` in
``megatron_deepspeed_flags.json`` (tests/emit/test_megatron.py).
The flag tables, the linters, the shell reader and the model's own flags (``emit.megatron_model_flags``) live in
their own modules and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autotune.emit.megatron_attention import flag_number as _num
from autotune.emit.megatron_model_flags import (architecture_problems, layer_norms_problem, norm_eps_flags, router_flags,
                                              shape_flags)
from autotune.emit.megatron_deepspeed_lint import megatron_deepspeed_args_problems
from autotune.emit.megatron_deepspeed_model import megatron_deepspeed_model_problems, rope_theta_flags
from autotune.emit.megatron_fsdp import FSDP_CKPT_FORMAT, megatron_fsdp_flags, sharding_strategy
from autotune.emit.megatron_flags import FlagSpec, megatron_deepspeed_flag_table, megatron_flag_table
from autotune.emit.megatron_layout import cp_comm_flags, megatron_split, split_flags
from autotune.emit.megatron_lint import megatron_args_problems
from autotune.emit.megatron_moe_graph import sync_free_moe_args, sync_free_moe_env
from autotune.emit.megatron_run_flags import (cuda_graph_flags, dispatcher_flags, ep_overlap_flags, recompute_flags,
                                              token_drop_flags)
from autotune.emit.megatron_versions import missing_flag_rules
from autotune.emit.options import EmitOptions
from autotune.emit.precision import megatron_precision_flags
from autotune.emit.shell_args import parse_shell_args, read_megatron_args_file, read_megatron_args_file_with_env
from autotune.errors import InputError
from autotune.specs.hardware import ClusterSpec
from autotune.specs.layout import layer_counts
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = [
    "FlagSpec", "megatron_flag_table", "megatron_deepspeed_flag_table", "megatron_args", "megatron_env",
    "megatron_deepspeed_args", "MEGATRON_DEEPSPEED_FLAGS", "MEGATRON_NCCL_DEFAULTS", "megatron_args_problems",
    "megatron_deepspeed_args_problems", "read_megatron_args_file", "read_megatron_args_file_with_env",
    "parse_shell_args", "architecture_problems", "layer_norms_problem", "router_flags", "deepspeed_moe_problems",
]

# ---------------------------------------------------------------------------------------------
# Emitting
# ---------------------------------------------------------------------------------------------
# Megatron-LM examples' NCCL settings (reference §3 "Environment"), offered, not imposed.
MEGATRON_NCCL_DEFAULTS: dict[str, str] = {
    "NCCL_IB_SL": "1", "NCCL_IB_TIMEOUT": "19", "NCCL_P2P_NET_CHUNKSIZE": "2097152",
    "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
}


def deepspeed_moe_problems(model: ModelSpec, plan: ParallelPlan) -> dict[str, str]:
    """What of a mixture of experts Megatron-DeepSpeed's DeepSpeed-MoE cannot build, by kind ("moe_form",
    "moe_zero3"; empty where it can): its MoE layers wrap the dense ``ParallelMLP`` (every expert as wide as
    --ffn-hidden-size, no shared expert; microsoft/Megatron-DeepSpeed megatron/model/transformer.py
    ParallelTransformerLayer), one every --expert-interval layers from the first (written as 1: no dense layers
    first), and DeepSpeed refuses its MoE under ZeRO-3 (0.19.8 runtime/engine.py:2214-2216 "Native DeepSpeed MoE is
    not supported with ZeRO Stage 3"). The megatron-deepspeed engine's rules ask it too, so the planner proposes no
    plan this writer refuses."""
    moe = model.moe
    if moe is None:
        return {}
    out = {}
    if moe.num_dense_layers or moe.num_shared_experts or moe.expert_ffn_hidden_size != model.ffn_hidden_size:
        out["moe_form"] = (f"{model.name}'s MoE (dense layers first, shared experts or experts narrower than the FFN) "
                           f"has no DeepSpeed-MoE form: use engine megatron or fsdp")
    if plan.zero_stage == 3:
        out["moe_zero3"] = "DeepSpeed-MoE does not run under ZeRO-3: use ZeRO-1/2"
    return out


def _parallel_flags(model: ModelSpec, plan: ParallelPlan, gpus_per_node: int, problems: list[str]) -> list[str]:
    args = ["--tensor-model-parallel-size", str(plan.tp), "--pipeline-model-parallel-size", str(plan.pp)]
    # The split the cost model assumed, in the flags that make Megatron-core build it (emit/megatron_layout.py).
    split = megatron_split(model.num_layers, plan.pp, plan.vpp, plan.mtp_layers, plan.loss_slots)
    if split is None:
        problems.append(f"{model.num_layers} layers cannot be split over pp x vpp = {plan.pp} x {plan.vpp} "
                        f"(virtual) stages without an empty one")
    else:
        args += split_flags(split)
    if plan.sequence_parallel and plan.tp > 1:  # Megatron silently drops it at tp=1 (validate_args 1436)
        args.append("--sequence-parallel")
    if plan.tp_overlap == "userbuffers":  # TE userbuffers; the support rules ask for tp > 1 and sequence parallel
        args.append("--tp-comm-overlap")
    if plan.cp > 1:
        args += ["--context-parallel-size", str(plan.cp)] + cp_comm_flags(plan, gpus_per_node)
    if plan.ep > 1:
        args += ["--expert-model-parallel-size", str(plan.ep)]
    if plan.etp is not None and model.moe is not None:  # parallel folding; default etp = tp (arguments.py:587)
        args += ["--expert-tensor-parallel-size", str(plan.etp)]
        if plan.tp > 1 and not plan.sequence_parallel:  # Megatron's ModelParallelConfig raises ValueError
            problems.append("expert parallelism with tp > 1 needs sequence parallelism in Megatron-LM: "
                            "set sequence_parallel")
    # ZeRO-2/3: Megatron-FSDP (emit/megatron_fsdp.py), whose v1 runs on the distributed optimizer
    # (arguments.py:1124-1135 turns it on where it is not given).
    distributed_optimizer = plan.zero_stage >= 1
    if distributed_optimizer:
        args.append("--use-distributed-optimizer")
    args += megatron_fsdp_flags(plan)
    if plan.grad_dtype == "bf16":  # arguments.py: turns accumulate_allreduce_grads_in_fp32 off (bf16 main_grad)
        args.append("--grad-reduce-in-bf16")
    if plan.overlap_comm:
        args.append("--overlap-grad-reduce")
        if distributed_optimizer:  # validate_args 1025: param gather with the distributed optimizer or Megatron-FSDP
            args.append("--overlap-param-gather")
    if plan.offload_optimizer != "none" or plan.offload_param != "none":
        problems.append("offload is DeepSpeed's (ZeRO-Offload/Infinity): use megatron_deepspeed_args")
    if plan.fp8_attention:  # arguments.py:2307-2333 at d98e8a6: no command-line argument sets it
        problems.append("Megatron-LM has no flag for FP8 attention (fp8_dot_product_attention): use the "
                        "Megatron-Bridge files (bridge_overrides.yaml), or drop --fp8-attention")
    return args


def _optimizer_flags(plan: ParallelPlan, options: EmitOptions, problems: list[str]) -> list[str]:
    o = options.optimizer
    if plan.optimizer == "adamw":
        # Megatron's "adam" is AdamW: decoupled weight decay (megatron/core/optimizer).
        args = ["--optimizer", "adam", "--adam-beta1", _num(o.betas[0]), "--adam-beta2", _num(o.betas[1]),
                "--adam-eps", _num(o.eps)]
    elif plan.optimizer == "sgd":
        args = ["--optimizer", "sgd"]
    else:
        problems.append(f"Megatron-LM has no {plan.optimizer} optimizer (adam, sgd, muon, lion, soap): "
                        f"use adamw or sgd")
        args = []
    return args + ["--lr", _num(o.lr), "--min-lr", _num(o.min_lr), "--lr-decay-style", "cosine",
                   "--lr-warmup-iters", str(o.warmup_steps), "--train-iters", str(o.train_steps),
                   "--weight-decay", _num(o.weight_decay), "--clip-grad", _num(o.grad_clip)]


def _mock_data_flags(model: ModelSpec) -> list[str]:
    # megatron-core's NullTokenizer holds exactly --vocab-size, its EOD the last id (core 0.19.2
    # megatron/core/tokenizers/text/libraries/null_tokenizer.py:16-19); the legacy one that added an EOD token runs
    # only under 0.16's --legacy-tokenizer (default off), and 0.17+ have no other.
    return ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(model.vocab_size)]


def megatron_args(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, options: EmitOptions | None = None,
                  checkpoint_flags: list[str] | None = None, *, data_args: Sequence[str] | None = None,
                  fp8_param_gather: bool = False) -> list[str]:
    """Megatron-LM ``pretrain_gpt.py`` arguments for the plan (InputError naming every mismatch).

    ``data_args`` default to synthetic data (``--mock-data`` with Megatron's NullTokenizer) so the
    job runs as is; pass ``--data-path ... --tokenizer-type ... --tokenizer-model ...`` for real data.
    ``checkpoint_flags`` (from the checkpoint policy) are appended as given. ``fp8_param_gather``: the engine
    gathers FP8 parameters (``--fp8-param-gather``, ``MegatronEngine.fp8_param_gather``).
    """
    options = options or EmitOptions()
    problems: list[str] = []
    if plan.world_size != cluster.num_gpus:
        problems.append(f"the plan spans {plan.world_size} GPUs (tp*pp*dp*cp) but the cluster has {cluster.num_gpus}")
    args = shape_flags(model, plan, problems)
    args += _parallel_flags(model, plan, cluster.gpus_per_node, problems)
    args += recompute_flags(plan)
    # activation offload: turns cpu_offloading on (arguments.py:1950-1951 at d98e8a6)
    if plan.activation_offload_layers:
        args += ["--cpu-offloading-num-layers", str(plan.activation_offload_layers)]
    # multi-token prediction: N modules after the last layer (arguments.py --mtp-num-layers, TransformerConfig
    # mtp_num_layers, transformer_config.py:68 at d98e8a6); --mtp-loss-scaling-factor stays Megatron's 0.1 (:75)
    if plan.mtp_layers:
        args += ["--mtp-num-layers", str(plan.mtp_layers)]
    args += cuda_graph_flags(plan, options.megatron_version)
    args += ep_overlap_flags(plan)
    args += dispatcher_flags(model, plan, options.megatron_version, problems)
    args += token_drop_flags(plan)
    args += sync_free_moe_args(model, plan, options.megatron_version, problems)
    args += ["--micro-batch-size", str(plan.micro_batch_size), "--global-batch-size", str(plan.global_batch_size)]
    args += megatron_precision_flags(plan, fp8_param_gather=fp8_param_gather)
    args += ["--transformer-impl", "transformer_engine",
             "--attention-backend", "flash" if plan.flash_attention else "unfused"]
    args += _optimizer_flags(plan, options, problems)
    args += ["--log-interval", str(options.steps_per_print)]
    args += list(_mock_data_flags(model) if data_args is None else data_args)
    checkpoint_flags = list(checkpoint_flags or ())
    if sharding_strategy(plan) is not None:  # asserted whether or not the run saves (arguments.py:1169-1170)
        if "--ckpt-format" in checkpoint_flags:
            checkpoint_flags[checkpoint_flags.index("--ckpt-format") + 1] = FSDP_CKPT_FORMAT
        else:
            checkpoint_flags += ["--ckpt-format", FSDP_CKPT_FORMAT]
    args += checkpoint_flags
    problems += missing_flag_rules(args, options.megatron_version)
    if problems:
        raise InputError(problems, subject=f"Megatron-LM arguments (Megatron-core {options.megatron_version})")
    return args


def megatron_env(plan: ParallelPlan, *, nccl_defaults: bool = False,
                 extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for the Megatron ranks.

    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` when tp > 1 or cp > 1 (validate_args 1478: TP/CP communication must
    be scheduled ahead of the compute it overlaps); on the sync-free MoE path the op fuser's switch
    (``autotune.emit.megatron_moe_graph.sync_free_moe_env``). ``nccl_defaults`` adds Megatron's example NCCL settings
    (:data:`MEGATRON_NCCL_DEFAULTS`); ``extra`` (e.g. ``LaunchOptions.nccl_env``) wins over both.
    """
    env: dict[str, str] = {}
    if plan.tp > 1 or plan.cp > 1:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    env.update(sync_free_moe_env(plan))
    if nccl_defaults:
        env.update(MEGATRON_NCCL_DEFAULTS)
    env.update(extra or {})
    return env


# Megatron-DeepSpeed's flags (deepspeedai/Megatron-DeepSpeed megatron/arguments.py at 4efb479, plus
# --deepspeed/--deepspeed_config from deepspeed.add_config_arguments): megatron_deepspeed_flags.json. Its parser
# predates the Megatron-core flags: GQA is --num-key-value-heads, RoPE --use-rotary-position-embeddings, norms
# lower case.
MEGATRON_DEEPSPEED_FLAGS = frozenset(megatron_deepspeed_flag_table())


def megatron_deepspeed_args(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, options: EmitOptions | None,
                            ds_config_path: str, *, data_args: Sequence[str] | None = None) -> list[str]:
    """Megatron-DeepSpeed ``pretrain_gpt.py`` arguments: DeepSpeed owns ZeRO, precision and the optimizer step.

    ZeRO-2/3 needs ``--no-pipeline-parallel`` (without it the model is a DeepSpeed PipelineModule, which caps
    ZeRO at 1; reference §4). Full recompute is DeepSpeed's activation checkpointing of every layer
    (``--checkpoint-activations --deepspeed-activation-checkpointing``, the form of Megatron-DeepSpeed's
    examples); a ``recompute_num_layers`` block setting has no counterpart there and recomputes every layer.
    Megatron-DeepSpeed MoE is DeepSpeed-MoE: every layer is an MoE layer and experts have the dense FFN width.
    """
    options = options or EmitOptions()
    problems: list[str] = architecture_problems(model, megatron_core=False)
    if plan.world_size != cluster.num_gpus:
        problems.append(f"the plan spans {plan.world_size} GPUs (tp*pp*dp*cp) but the cluster has {cluster.num_gpus}")
    if plan.zero_stage >= 2 and plan.pp > 1:
        problems.append(f"ZeRO-{plan.zero_stage} needs pp=1 (--no-pipeline-parallel), got pp={plan.pp}")
    if plan.vpp > 1:
        problems.append("DeepSpeed's pipeline engine has no interleaved schedule: use vpp=1")
    # GPTModelPipe's PipelineModule(partition_method='type:transformer') splits layers as partition_uniform does:
    # uneven counts are fine (BLOOM-176B: 70 layers on 12 stages).
    if layer_counts(model.num_layers, plan.pp, "uniform") is None:
        problems.append(f"{model.num_layers} layers cannot fill pp={plan.pp} stages: use pp <= {model.num_layers}")
    unbuilt = megatron_deepspeed_model_problems(model, plan.seq_len)
    if unbuilt:  # the way out once: which engines build the model depends on all of its parts together
        problems += [*unbuilt, f"another engine builds {model.name}: `autotune plan` with this model and cluster "
                               "lists the engines whose plans run it"]
    if model.position_embedding == "learned" and plan.seq_len > model.max_position_embeddings:
        problems.append(f"seq_len {plan.seq_len} exceeds the learned position table ({model.max_position_embeddings})")
    if plan.optimizer not in ("adamw", "sgd"):
        problems.append(f"Megatron-DeepSpeed's optimizers are adam and sgd, not {plan.optimizer}")

    args = ["--deepspeed", "--deepspeed_config", ds_config_path, "--zero-stage", str(plan.zero_stage)]
    if plan.zero_stage >= 2:
        args.append("--no-pipeline-parallel")
    if plan.zero_stage == 3 and plan.offload_param != "none":
        args += ["--remote-device", plan.offload_param, "--use-pin-memory"]
    if plan.offload_optimizer != "none":  # DeepSpeedCPUAdam, which ZeRO-Offload needs (engine.py:2342-2346)
        args.append("--cpu-optimizer")
    args += ["--tensor-model-parallel-size", str(plan.tp), "--pipeline-model-parallel-size", str(plan.pp)]
    if plan.cp > 1:  # Megatron-DeepSpeed's sequence parallelism is DeepSpeed-Ulysses (arguments.py)
        args += ["--ds-sequence-parallel-size", str(plan.cp)]
    if plan.sequence_parallel and plan.tp > 1:
        args.append("--sequence-parallel")
    args += ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
             "--num-attention-heads", str(model.num_attention_heads), "--ffn-hidden-size", str(model.ffn_hidden_size),
             "--seq-length", str(plan.seq_len),
             "--max-position-embeddings",  # the table's rows, an offset's (OPT's 2) included: the same parameters
             str(max(model.max_position_embeddings + model.position_offset, plan.seq_len))]
    if model.head_dim is not None and model.head_dim * model.num_attention_heads != model.hidden_size:
        args += ["--kv-channels", str(model.head_dim)]
    if model.kv_heads < model.num_attention_heads:
        args += ["--num-key-value-heads", str(model.kv_heads)]
    if model.activation == "swiglu":
        args.append("--swiglu")
    # ParallelMLP (megatron/model/transformer.py:129-147): --openai-gelu is the tanh form, --squared-relu; F.gelu
    # (exact) otherwise, fused with the bias as the tanh form unless --no-bias-gelu-fusion
    args += {"squared_relu": ["--squared-relu"], "gelu_tanh": [] if model.linear_bias else ["--openai-gelu"],
             "gelu": ["--no-bias-gelu-fusion"] if model.linear_bias else []}.get(model.activation, [])
    args += ["--normalization", model.norm]
    args += norm_eps_flags(model, "--layernorm-epsilon")  # the fork's name for it (its arguments.py), default 1e-5
    args += rope_theta_flags(model)
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not model.linear_bias:
        args.append("--disable-bias-linear")
    args += ["--attention-dropout", _num(model.dropout), "--hidden-dropout", _num(model.dropout)]
    if model.moe is not None:
        moe = model.moe
        problems += deepspeed_moe_problems(model, plan).values()
        # dropless, as planned: DeepSpeed-MoE drops tokens over capacity factor 1.0 unless told (the fork's
        # --disable-moe-token-dropping, arguments.py:910-912; sharded_moe.py drop_tokens)
        args += ["--num-experts", str(moe.num_experts), "--topk", str(moe.top_k), "--expert-interval", "1",
                 "--moe-expert-parallel-size", str(plan.ep), "--create-moe-param-group", "--disable-moe-token-dropping"]
        if moe.aux_loss_coeff is not None:  # DeepSpeed-MoE's l_aux weight (the fork's --moe-loss-coeff, default 0.1)
            args += ["--moe-loss-coeff", _num(moe.aux_loss_coeff)]
        if plan.tp > 1:
            # The plan splits each expert tp ways (etp = tp, the engine has no etp of its own); without this flag the
            # fork builds every expert whole on each TP rank (microsoft/Megatron-DeepSpeed@f4157bea
            # megatron/core/tensor_parallel/layers.py:529-531: moe and not enable_expert_tensor_parallelism ->
            # world_size 1; megatron/model/transformer.py:1068-1082).
            args.append("--enable-expert-tensor-parallelism")
    if plan.recompute == "full":
        args += ["--checkpoint-activations", "--checkpoint-num-layers", "1", "--deepspeed-activation-checkpointing"]
    elif plan.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    args += ["--micro-batch-size", str(plan.micro_batch_size), "--global-batch-size", str(plan.global_batch_size)]
    if plan.precision == "fp8":
        args += ["--bf16", "--fp8-hybrid", "--transformer-impl", "transformer_engine"]
    else:
        args.append(f"--{plan.precision}")
    if plan.flash_attention:
        args.append("--use-flash-attn-v2")
    o = options.optimizer
    args += ["--optimizer", "sgd" if plan.optimizer == "sgd" else "adam"]
    if plan.optimizer == "adamw":
        args += ["--adam-beta1", _num(o.betas[0]), "--adam-beta2", _num(o.betas[1]), "--adam-eps", _num(o.eps)]
    args += ["--lr", _num(o.lr), "--min-lr", _num(o.min_lr), "--lr-decay-style", "cosine",
             "--lr-warmup-iters", str(o.warmup_steps), "--train-iters", str(o.train_steps),
             "--weight-decay", _num(o.weight_decay), "--clip-grad", _num(o.grad_clip),
             "--log-interval", str(options.steps_per_print)]
    args += list(data_args or ())
    if problems:
        raise InputError(problems, subject="Megatron-DeepSpeed arguments")
    return args
