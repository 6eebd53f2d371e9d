"""Megatron-LM arguments for a plan, the Megatron-DeepSpeed form, and a linter for users' argument lists.

Sources (``../shared/reference/deepspeed-megatron-surface.md``): Megatron-LM ``NVIDIA/Megatron-LM@d98e8a6``
``megatron/training/arguments.py`` (its argparse flags are ``megatron_flags.json``, the source of truth
for which flags exist; "validate_args N" below is that file's line N); Megatron-DeepSpeed
``deepspeedai/Megatron-DeepSpeed`` ``megatron/arguments.py`` (read at 207b2d5).

Every flag :func:`megatron_args` writes exists in ``megatron_flags.json`` (tests/emit/test_megatron.py).
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import functools
import importlib.resources
import io
import json
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.emit.options import EmitOptions
from autotune.emit.precision import megatron_precision_flags
from autotune.emit.problems import Problem, Severity
from autotune.errors import InputError
from autotune.specs.hardware import ClusterSpec
from autotune.specs.layout import pipeline_split
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = [
    "FlagSpec", "megatron_flag_table", "megatron_args", "megatron_env", "megatron_deepspeed_args",
    "MEGATRON_DEEPSPEED_FLAGS", "MEGATRON_NCCL_DEFAULTS", "megatron_args_problems", "read_megatron_args_file",
    "read_megatron_args_file_with_env", "parse_shell_args",
]

# ---------------------------------------------------------------------------------------------
# The flag table (megatron_flags.json)
# ---------------------------------------------------------------------------------------------
_FLAGS_FILE = "megatron_flags.json"
_CHECKOUT_REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / _FLAGS_FILE


@dataclass(frozen=True, slots=True)
class FlagSpec:
    """One Megatron-LM argparse option, as ``megatron_flags.json`` records it."""

    names: tuple[str, ...]
    dest: str
    default: str
    type: str
    choices: tuple[str, ...] | None
    action: str
    nargs: str | None

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def is_switch(self) -> bool:
        """Takes no value (store_true / store_false / BooleanOptionalAction)."""
        return self.action != "_StoreAction"

    def value_problem(self, value: str) -> str | None:
        """Why ``value`` is not accepted by this flag, or None."""
        if self.type == "int":
            try:
                as_int = int(value)
            except ValueError:
                return f"expects an integer, got {value!r}"
            if self.choices and str(as_int) not in self.choices:
                return f"expects one of {', '.join(self.choices)}, got {value!r}"
            return None
        if self.type == "float":
            try:
                float(value)
            except ValueError:
                return f"expects a number, got {value!r}"
            return None
        if self.type == "moe_freq_type":
            return None if _moe_freq_ok(value) else (
                f"expects an integer N or a layer pattern such as '([0]*3+[1]*58)', got {value!r}")
        if self.type == "enum_type_handler" and self.choices:
            # Megatron parses these with Enum[name]; the table lists members as 'AttnBackend.flash'.
            names = [c.rsplit(".", 1)[-1] for c in self.choices if "." in c]
            if names and value not in names:
                return f"expects one of {', '.join(names)}, got {value!r}"
            return None
        if self.choices and value not in self.choices:
            return f"expects one of {', '.join(self.choices)}, got {value!r}"
        return None


def _moe_freq_ok(text: str) -> bool:
    """Megatron's moe_freq_type: an int, or a list expression of 0/1 built with [], +, * and ints."""
    try:
        int(text)
        return True
    except ValueError:
        pass

    def ok(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, int) and not isinstance(node.value, bool)
        if isinstance(node, ast.List):
            return all(ok(e) for e in node.elts)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            return ok(node.left) and ok(node.right)
        return False

    try:
        return "[" in text and ok(ast.parse(text, mode="eval").body)
    except SyntaxError:
        return False


def _read_flags_json() -> dict:
    """The flag table: a copy shipped in this package, else the checkout's ``../shared/reference``."""
    packaged = importlib.resources.files("autotune.emit") / _FLAGS_FILE
    if packaged.is_file():
        return json.loads(packaged.read_text(encoding="utf-8"))
    if _CHECKOUT_REFERENCE.is_file():
        return json.loads(_CHECKOUT_REFERENCE.read_text(encoding="utf-8"))
    raise FileNotFoundError(f"Megatron-LM flag table {_FLAGS_FILE} not found in autotune.emit nor at "
                            f"{_CHECKOUT_REFERENCE}")


@functools.cache
def megatron_flag_table() -> dict[str, FlagSpec]:
    """Every Megatron-LM option string (aliases included) -> its :class:`FlagSpec`."""
    table: dict[str, FlagSpec] = {}
    for entry in _read_flags_json()["flags"]:
        spec = FlagSpec(names=tuple(entry["flags"]), dest=entry["dest"], default=str(entry["default"]),
                        type=str(entry["type"]), choices=tuple(entry["choices"]) if entry["choices"] else None,
                        action=entry["action"], nargs=None if entry["nargs"] is None else str(entry["nargs"]))
        for name in spec.names:
            table[name] = spec
    return table


# ---------------------------------------------------------------------------------------------
# Emitting
# ---------------------------------------------------------------------------------------------
# Megatron-LM examples' NCCL settings (reference §3 "Environment"), offered, not imposed.
MEGATRON_NCCL_DEFAULTS: dict[str, str] = {
    "NCCL_IB_SL": "1", "NCCL_IB_TIMEOUT": "19", "NCCL_P2P_NET_CHUNKSIZE": "2097152",
    "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _moe_layer_pattern(model: ModelSpec) -> str:
    """Megatron's --moe-layer-freq list expression: leading dense layers, then MoE layers."""
    assert model.moe is not None
    dense, moe = model.moe.num_dense_layers, model.num_moe_layers
    return f"([0]*{dense}+[1]*{moe})"


def _unsupported(model: ModelSpec) -> list[str]:
    out = []
    if model.position_embedding == "alibi":
        out.append(f"{model.name} uses ALiBi, which Megatron's GPT model does not implement (position embeddings: "
                   f"learned_absolute, rope, yarn, mrope, relative, none): train it with a DeepSpeed script")
    if model.norms_per_layer != 2:
        out.append(f"{model.name} has {model.norms_per_layer} norm(s) per layer (a parallel block); Megatron-LM's "
                   f"GPT layer is pre-norm with two")
    if model.embedding_norm:
        out.append(f"{model.name} normalises the embeddings (BLOOM); Megatron-LM's GPT has no embedding norm")
    return out


def _shape_flags(model: ModelSpec, plan: ParallelPlan, problems: list[str]) -> list[str]:
    """Model shape for Megatron-LM (core_v0.16 pretrain_gpt.py)."""
    problems += _unsupported(model)
    max_pos = model.max_position_embeddings
    if model.position_embedding == "learned" and plan.seq_len > max_pos:
        problems.append(f"seq_len {plan.seq_len} exceeds the learned position table ({max_pos} rows): "
                        f"Megatron needs --max-position-embeddings >= --seq-length")
    args = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
            "--num-attention-heads", str(model.num_attention_heads), "--ffn-hidden-size", str(model.ffn_hidden_size),
            "--seq-length", str(plan.seq_len), "--max-position-embeddings", str(max(max_pos, plan.seq_len))]
    explicit_head_dim = model.head_dim is not None and model.head_dim * model.num_attention_heads != model.hidden_size
    if explicit_head_dim and model.mla is None:
        args += ["--kv-channels", str(model.head_dim)]
    if model.mla is None and model.kv_heads < model.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.kv_heads)]
    if model.mla is not None:
        m = model.mla
        args += ["--multi-latent-attention", "--kv-lora-rank", str(m.kv_lora_rank), "--qk-head-dim",
                 str(m.qk_nope_head_dim), "--qk-pos-emb-head-dim", str(m.qk_rope_head_dim), "--v-head-dim",
                 str(m.v_head_dim)]
        if m.q_lora_rank is not None:
            args += ["--q-lora-rank", str(m.q_lora_rank)]
    if model.activation == "swiglu":
        args.append("--swiglu")
    args += ["--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"]
    args += ["--position-embedding-type", "rope" if model.position_embedding == "rope" else "learned_absolute"]
    if model.position_embedding == "rope":
        args += ["--rotary-base", _num(model.rope_theta)]
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not model.linear_bias:
        args.append("--disable-bias-linear")
        if model.qkv_bias:
            args.append("--add-qkv-bias")
    args += ["--attention-dropout", _num(model.dropout), "--hidden-dropout", _num(model.dropout)]
    if model.moe is not None:
        moe = model.moe
        args += ["--num-experts", str(moe.num_experts), "--moe-router-topk", str(moe.top_k),
                 "--moe-ffn-hidden-size", str(moe.expert_ffn_hidden_size), "--moe-grouped-gemm"]
        if moe.num_shared_experts:
            args += ["--moe-shared-expert-intermediate-size", str(moe.num_shared_experts * moe.shared_width)]
        if moe.num_dense_layers:
            args += ["--moe-layer-freq", _moe_layer_pattern(model)]
        if moe.router_bias:
            # Aux-loss-free balancing (DeepSeek-V3, arXiv:2412.19437 §2.1.2) scores experts with a sigmoid.
            args += ["--moe-router-enable-expert-bias", "--moe-router-score-function", "sigmoid"]
    return args


def _parallel_flags(model: ModelSpec, plan: ParallelPlan, problems: list[str]) -> list[str]:
    args = ["--tensor-model-parallel-size", str(plan.tp), "--pipeline-model-parallel-size", str(plan.pp)]
    split = pipeline_split(model.num_layers, plan.pp)
    if split is None:
        problems.append(f"{model.num_layers} layers cannot be split over pp={plan.pp} stages")
    elif split[0] != split[1] or split[2] != split[1]:
        args += ["--decoder-first-pipeline-num-layers", str(split[0]),
                 "--decoder-last-pipeline-num-layers", str(split[2])]
    if plan.vpp > 1:
        per_stage = model.num_layers // plan.pp
        if model.num_layers % plan.pp or per_stage % plan.vpp:
            problems.append(f"vpp={plan.vpp} needs layers per stage ({model.num_layers}/{plan.pp}) divisible by vpp")
        args += ["--num-layers-per-virtual-pipeline-stage", str(max(1, per_stage // plan.vpp))]
    if plan.sequence_parallel and plan.tp > 1:  # Megatron silently drops it at tp=1 (validate_args 1436)
        args.append("--sequence-parallel")
    if plan.cp > 1:
        args += ["--context-parallel-size", str(plan.cp)]
    if plan.ep > 1:
        args += ["--expert-model-parallel-size", str(plan.ep), "--moe-token-dispatcher-type", "alltoall"]
        if plan.tp > 1 and not plan.sequence_parallel:  # Megatron's ModelParallelConfig raises ValueError
            problems.append("expert parallelism with tp > 1 needs sequence parallelism in Megatron-LM: "
                            "set sequence_parallel")
    if plan.zero_stage >= 2:
        problems.append(f"Megatron-LM shards optimizer states only (--use-distributed-optimizer = ZeRO-1); "
                        f"ZeRO-{plan.zero_stage} needs DeepSpeed: use megatron_deepspeed_args")
    distributed_optimizer = plan.zero_stage == 1
    if distributed_optimizer:
        args.append("--use-distributed-optimizer")
    if plan.overlap_comm:
        args.append("--overlap-grad-reduce")
        if distributed_optimizer:  # validate_args 1027: param gather only with the distributed optimizer
            args.append("--overlap-param-gather")
    if plan.offload_optimizer != "none" or plan.offload_param != "none":
        problems.append("offload is DeepSpeed's (ZeRO-Offload/Infinity): use megatron_deepspeed_args")
    return args


def _recompute_flags(plan: ParallelPlan) -> list[str]:
    if plan.recompute == "selective":
        return ["--recompute-granularity", "selective"]
    if plan.recompute == "full":
        if plan.recompute_num_layers is None:  # every layer: uniform chunks of one layer
            return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
        return ["--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", str(plan.recompute_num_layers)]
    return []


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
    # Megatron's NullTokenizer adds one EOD token to --vocab-size, hence V - 1.
    return ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(model.vocab_size - 1)]


def megatron_args(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, options: EmitOptions | None = None,
                  checkpoint_flags: list[str] | None = None, *, data_args: Sequence[str] | None = None) -> list[str]:
    """Megatron-LM ``pretrain_gpt.py`` arguments for the plan (InputError naming every mismatch).

    ``data_args`` default to synthetic data (``--mock-data`` with Megatron's NullTokenizer) so the
    job runs as is; pass ``--data-path ... --tokenizer-type ... --tokenizer-model ...`` for real data.
    ``checkpoint_flags`` (from the checkpoint policy) are appended as given.
    """
    options = options or EmitOptions()
    problems: list[str] = []
    if plan.world_size != cluster.num_gpus:
        problems.append(f"the plan spans {plan.world_size} GPUs (tp*pp*dp*cp) but the cluster has {cluster.num_gpus}")
    args = _shape_flags(model, plan, problems)
    args += _parallel_flags(model, plan, problems)
    args += _recompute_flags(plan)
    args += ["--micro-batch-size", str(plan.micro_batch_size), "--global-batch-size", str(plan.global_batch_size)]
    args += megatron_precision_flags(plan)
    args += ["--transformer-impl", "transformer_engine",
             "--attention-backend", "flash" if plan.flash_attention else "unfused"]
    args += _optimizer_flags(plan, options, problems)
    args += ["--log-interval", str(options.steps_per_print)]
    args += list(_mock_data_flags(model) if data_args is None else data_args)
    args += list(checkpoint_flags or ())
    if problems:
        raise InputError(problems, subject="Megatron-LM arguments")
    return args


def megatron_env(plan: ParallelPlan, *, nccl_defaults: bool = False,
                 extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for the Megatron ranks.

    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` when tp > 1 or cp > 1 (validate_args 1478: TP/CP communication must
    be scheduled ahead of the compute it overlaps). ``nccl_defaults`` adds Megatron's example NCCL settings
    (:data:`MEGATRON_NCCL_DEFAULTS`); ``extra`` (e.g. ``LaunchOptions.nccl_env``) wins over both.
    """
    env: dict[str, str] = {}
    if plan.tp > 1 or plan.cp > 1:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    if nccl_defaults:
        env.update(MEGATRON_NCCL_DEFAULTS)
    env.update(extra or {})
    return env


# Megatron-DeepSpeed's own options used below (megatron/arguments.py, deepspeedai/Megatron-DeepSpeed@207b2d5,
# plus --deepspeed/--deepspeed_config from deepspeed.add_config_arguments). Its parser predates the
# Megatron-core flags: GQA is --num-key-value-heads, RoPE --use-rotary-position-embeddings, norms lower case.
MEGATRON_DEEPSPEED_FLAGS = frozenset("""
--deepspeed --deepspeed_config --zero-stage --no-pipeline-parallel --remote-device --use-pin-memory
--deepspeed-activation-checkpointing --checkpoint-activations --checkpoint-num-layers --recompute-granularity
--num-layers --hidden-size --num-attention-heads --ffn-hidden-size --num-key-value-heads --kv-channels
--seq-length --max-position-embeddings --swiglu --normalization --use-rotary-position-embeddings
--no-position-embedding --untie-embeddings-and-output-weights --disable-bias-linear --attention-dropout
--hidden-dropout --num-experts --topk --expert-interval --moe-expert-parallel-size --create-moe-param-group
--tensor-model-parallel-size --pipeline-model-parallel-size --sequence-parallel --micro-batch-size
--global-batch-size --bf16 --fp16 --fp8-hybrid --transformer-impl --use-flash-attn-v2 --optimizer --lr --min-lr
--lr-decay-style --lr-warmup-iters --train-iters --weight-decay --adam-beta1 --adam-beta2 --adam-eps --clip-grad
--log-interval --vocab-size --tokenizer-type --data-path
""".split())


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
    problems: list[str] = _unsupported(model)
    if plan.world_size != cluster.num_gpus:
        problems.append(f"the plan spans {plan.world_size} GPUs (tp*pp*dp*cp) but the cluster has {cluster.num_gpus}")
    if plan.zero_stage >= 2 and plan.pp > 1:
        problems.append(f"ZeRO-{plan.zero_stage} needs pp=1 (--no-pipeline-parallel), got pp={plan.pp}")
    if plan.cp > 1:
        problems.append("Megatron-DeepSpeed has no ring context parallelism (its --ds-sequence-parallel-size is "
                        "Ulysses): use cp=1")
    if plan.vpp > 1:
        problems.append("DeepSpeed's pipeline engine has no interleaved schedule: use vpp=1")
    split = pipeline_split(model.num_layers, plan.pp)
    if split is None or split[0] != split[1]:
        problems.append(f"{model.num_layers} layers do not split evenly over pp={plan.pp} stages")
    if model.mla is not None:
        problems.append(f"{model.name} uses multi-latent attention, which Megatron-DeepSpeed does not implement")
    if model.position_embedding == "learned" and plan.seq_len > model.max_position_embeddings:
        problems.append(f"seq_len {plan.seq_len} exceeds the learned position table ({model.max_position_embeddings})")
    if plan.optimizer not in ("adamw", "sgd"):
        problems.append(f"Megatron-DeepSpeed's optimizers are adam and sgd, not {plan.optimizer}")

    args = ["--deepspeed", "--deepspeed_config", ds_config_path, "--zero-stage", str(plan.zero_stage)]
    if plan.zero_stage >= 2:
        args.append("--no-pipeline-parallel")
    if plan.zero_stage == 3 and plan.offload_param != "none":
        args += ["--remote-device", plan.offload_param, "--use-pin-memory"]
    args += ["--tensor-model-parallel-size", str(plan.tp), "--pipeline-model-parallel-size", str(plan.pp)]
    if plan.sequence_parallel and plan.tp > 1:
        args.append("--sequence-parallel")
    args += ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
             "--num-attention-heads", str(model.num_attention_heads), "--ffn-hidden-size", str(model.ffn_hidden_size),
             "--seq-length", str(plan.seq_len),
             "--max-position-embeddings", str(max(model.max_position_embeddings, plan.seq_len))]
    if model.head_dim is not None and model.head_dim * model.num_attention_heads != model.hidden_size:
        args += ["--kv-channels", str(model.head_dim)]
    if model.kv_heads < model.num_attention_heads:
        args += ["--num-key-value-heads", str(model.kv_heads)]
    if model.activation == "swiglu":
        args.append("--swiglu")
    args += ["--normalization", model.norm]
    if model.position_embedding == "rope":
        args += ["--use-rotary-position-embeddings", "--no-position-embedding"]
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not model.linear_bias:
        args.append("--disable-bias-linear")
    args += ["--attention-dropout", _num(model.dropout), "--hidden-dropout", _num(model.dropout)]
    if model.moe is not None:
        moe = model.moe
        if moe.num_dense_layers or moe.num_shared_experts or moe.expert_ffn_hidden_size != model.ffn_hidden_size:
            problems.append(f"{model.name}'s MoE (dense layers, shared experts or expert width != FFN width) has no "
                            f"DeepSpeed-MoE form in Megatron-DeepSpeed")
        if plan.zero_stage == 3:  # DeepSpeed runtime/engine.py:2218 "MoE not supported with Stage 3"
            problems.append("DeepSpeed-MoE does not run under ZeRO-3: use ZeRO-1/2")
        args += ["--num-experts", str(moe.num_experts), "--topk", str(moe.top_k), "--expert-interval", "1",
                 "--moe-expert-parallel-size", str(plan.ep), "--create-moe-param-group"]
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


# ---------------------------------------------------------------------------------------------
# Linting a user's argument list
# ---------------------------------------------------------------------------------------------
_NUMBER = re.compile(r"^-\d|^-\.\d")


def _is_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not _NUMBER.match(token)


@dataclass(frozen=True, slots=True)
class _Given:
    flag: str
    """Canonical name (first alias)."""
    written: str
    values: tuple[str, ...]


def _tokenize(argv: Sequence[str], table: Mapping[str, FlagSpec]) -> tuple[list[_Given], list[Problem]]:
    """Split argv into flags with their values as argparse would (allow_abbrev=False)."""
    given: list[_Given] = []
    problems: list[Problem] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not _is_flag(token):
            problems.append(Problem(path=token, severity="error", message=f"unexpected argument {token!r}",
                                    fix="remove it, or put it after the flag it belongs to", source="rules"))
            continue
        name, eq, inline = token.partition("=")
        spec = table.get(name)
        values: list[str] = [inline] if eq else []
        if spec is None:
            while not eq and i < len(argv) and not _is_flag(argv[i]):
                values.append(argv[i])
                i += 1
            close = difflib.get_close_matches(name, [k for k in table if k.startswith("--")], n=3, cutoff=0.75)
            hint = f"did you mean {', '.join(close)}?" if close else "see megatron_flags.json for the flags that exist"
            problems.append(Problem(path=name, severity="error",
                                    message=f"unrecognized argument {name} (Megatron-LM's parser exits here)",
                                    fix=hint, source="rules"))
            continue
        if spec.is_switch:
            if eq:
                problems.append(Problem(path=name, severity="error", message=f"{name} takes no value",
                                        fix=f"write {name} alone", source="rules"))
            given.append(_Given(spec.name, name, ()))
            continue
        nargs = spec.nargs
        if not eq:
            limit = 1 if nargs is None else (int(nargs) if nargs.isdigit() else len(argv))
            while len(values) < limit and i < len(argv) and not _is_flag(argv[i]):
                values.append(argv[i])
                i += 1
        need = 1 if nargs in (None, "+") else (int(nargs) if nargs.isdigit() else 0)
        if len(values) < need:
            problems.append(Problem(path=name, severity="error",
                                    message=f"{name} expects {'at least ' if nargs == '+' else ''}{need} "
                                            f"value{'s' if need > 1 else ''}",
                                    fix=f"give {name} its value", source="rules"))
            continue
        for value in values:
            why = spec.value_problem(value)
            if why:
                problems.append(Problem(path=name, severity="error", message=f"{name} {why}",
                                        fix=f"use a value {name} accepts", source="rules"))
        given.append(_Given(spec.name, name, tuple(values)))
    return given, problems


class _Args:
    """The last value of each flag given (argparse keeps the last), with the table's defaults."""

    def __init__(self, given: list[_Given], table: Mapping[str, FlagSpec]) -> None:
        self._last = {g.flag: g for g in given}
        self._table = table

    def has(self, flag: str) -> bool:
        return flag in self._last

    def value(self, flag: str) -> str | None:
        g = self._last.get(flag)
        if g is not None:
            return g.values[-1] if g.values else None
        default = self._table[flag].default
        return None if default == "None" else default.strip("'")

    def integer(self, flag: str) -> int | None:
        try:
            return int(self.value(flag))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None


def _rule_problems(a: _Args, world_size: int, env: Mapping[str, str] | None) -> list[Problem]:
    out: list[Problem] = []

    def err(path: str, message: str, fix: str, severity: Severity = "error") -> None:
        out.append(Problem(path=path, severity=severity, message=message, fix=fix, source="rules"))

    tp = a.integer("--tensor-model-parallel-size") or 1
    pp = a.integer("--pipeline-model-parallel-size") or 1
    cp = a.integer("--context-parallel-size") or 1
    ep = a.integer("--expert-model-parallel-size") or 1
    mp = tp * pp * cp
    dp = world_size // mp if world_size % mp == 0 else None
    if dp is None:  # validate_args 433
        err("--tensor-model-parallel-size", f"world size ({world_size}) is not divisible by total_model_size "
            f"tp*pp*cp = {tp}*{pp}*{cp} = {mp}", f"choose tp, pp and cp whose product divides {world_size}")
    heads = a.integer("--num-attention-heads")
    if heads is not None and heads % tp:  # TransformerConfig
        err("--num-attention-heads", f"num_attention_heads ({heads}) must be a multiple of "
            f"tensor_model_parallel_size ({tp})", f"use a tp that divides {heads}")
    groups = a.integer("--num-query-groups")
    if a.has("--group-query-attention") and groups and groups % tp and tp % groups:
        err("--num-query-groups", f"num_query_groups ({groups}) must be a multiple or a divisor of tp ({tp})",
            "change tp or the query groups")
    layers = a.integer("--num-layers")
    first, last = a.integer("--decoder-first-pipeline-num-layers"), a.integer("--decoder-last-pipeline-num-layers")
    per_stage = None
    if layers is not None:
        if first is None and last is None:
            if layers % pp:  # validate_args 969
                err("--pipeline-model-parallel-size", f"Number of layers should be divisible by the "
                    f"pipeline-model-parallel size ({layers} layers, pp={pp})",
                    "choose pp dividing the layers, or give --decoder-first/last-pipeline-num-layers")
            else:
                per_stage = layers // pp
        else:
            middle = pp - (first is not None) - (last is not None)
            rest = layers - (first or 0) - (last or 0)
            if rest < 0 or (middle > 0 and rest % middle) or (middle == 0 and rest):
                err("--decoder-first-pipeline-num-layers", f"{layers} layers minus the first/last stage layers "
                    f"({first}, {last}) do not split evenly over the other {middle} stage(s)",
                    "adjust the first/last stage layer counts")
    vpp_layers = a.integer("--num-layers-per-virtual-pipeline-stage")
    vpp_stages = a.integer("--num-virtual-stages-per-pipeline-rank")
    if sum(x is not None for x in (vpp_layers, vpp_stages, a.value("--pipeline-model-parallel-layout"))) > 1:
        err("--num-layers-per-virtual-pipeline-stage", "give at most one of --num-layers-per-virtual-pipeline-stage, "
            "--num-virtual-stages-per-pipeline-rank and --pipeline-model-parallel-layout (validate_args 933)",
            "keep one")
    if vpp_layers is not None or vpp_stages is not None:
        flag = ("--num-layers-per-virtual-pipeline-stage" if vpp_layers is not None
                else "--num-virtual-stages-per-pipeline-rank")
        if per_stage is not None and (vpp_layers or vpp_stages) and per_stage % (vpp_layers or vpp_stages):  # 973/998
            err(flag, f"number of layers per pipeline stage ({per_stage}) must be divisible by {flag[2:]} "
                f"({vpp_layers or vpp_stages})", "pick a divisor of the layers per stage")
        need = 2 if a.has("--no-overlap-p2p-communication") else 1
        if pp <= need:  # 1003/1007
            err(flag, f"the interleaved schedule needs pipeline-model-parallel size > {need} (got {pp})",
                "raise pp or drop the virtual-pipeline flag")
    mbs, gbs = a.integer("--micro-batch-size"), a.integer("--global-batch-size")
    if mbs is None or mbs <= 0:  # 693
        err("--micro-batch-size", "--micro-batch-size is required and must be > 0", "give --micro-batch-size N")
    elif gbs is not None and dp and gbs % (mbs * dp):  # num_microbatches_calculator.py:381
        err("--global-batch-size", f"global batch size ({gbs}) is not divisible by micro batch size ({mbs}) times "
            f"data parallel size ({dp})", f"use a multiple of {mbs * dp}")
    if a.has("--step-batch-size-schedule") and a.has("--global-batch-size"):  # 700
        err("--step-batch-size-schedule", "Cannot specify both --step-batch-size-schedule and --global-batch-size",
            "drop one")
    seq = a.integer("--seq-length")
    if cp > 1 and seq is not None and seq % (2 * cp):  # 1337
        err("--seq-length", f"seq-length ({seq}) should be a multiple of 2 * context-parallel-size ({2 * cp})",
            f"use a multiple of {2 * cp}")
    dist_opt = a.has("--use-distributed-optimizer")
    if a.has("--overlap-param-gather"):  # 1027/1029
        if not dist_opt:
            err("--overlap-param-gather", "--overlap-param-gather only supported with distributed optimizer",
                "add --use-distributed-optimizer or drop --overlap-param-gather")
        if not a.has("--overlap-grad-reduce"):
            err("--overlap-param-gather", "Must use --overlap-param-gather with --overlap-grad-reduce",
                "add --overlap-grad-reduce")
    if a.has("--fp8-param-gather") and not (dist_opt or a.has("--use-torch-fsdp2") or a.has("--use-megatron-fsdp")):
        err("--fp8-param-gather", "--fp8-param-gather only supported with distributed optimizer, torch fsdp2, "
            "megatron fsdp (validate_args 1097)", "add --use-distributed-optimizer")
    if a.has("--bf16") and a.has("--fp16"):  # 1196
        err("--fp16", "--fp16 and --bf16 are both given (Megatron fails a bare assert)", "keep one")
    if a.has("--save") and not (a.integer("--save-interval") or 0) > 0:  # 1362
        err("--save", "--save requires --save-interval > 0", "add --save-interval N")
    granularity = a.value("--recompute-granularity")
    if granularity == "selective" and a.has("--recompute-method"):  # 1427
        err("--recompute-method", "recompute method is not yet supported for selective recomputing granularity",
            "drop --recompute-method (and --recompute-num-layers) with selective recompute")
    if granularity == "full" and (not a.has("--recompute-method") or a.integer("--recompute-num-layers") is None):
        err("--recompute-granularity", "full recompute needs --recompute-method (uniform|block) and "
            "--recompute-num-layers (TransformerConfig)", "add --recompute-method block --recompute-num-layers N")
    if granularity is None and (a.has("--recompute-method") or a.has("--recompute-num-layers")):
        err("--recompute-method", "--recompute-method/--recompute-num-layers without --recompute-granularity do "
            "nothing", "add --recompute-granularity full", "warning")
    if a.has("--sequence-parallel") and tp == 1:  # 1436
        err("--sequence-parallel", "sequence parallelism with tensor-model-parallel size 1: Megatron silently "
            "disables it", "drop --sequence-parallel or raise tp", "warning")
    if a.has("--tp-comm-overlap") and not (a.has("--sequence-parallel") and tp > 1):  # 1442
        err("--tp-comm-overlap", "Tensor parallel communication/GEMM overlap can happen only when sequence "
            "parallelism is enabled", "add --sequence-parallel (with tp > 1)")
    experts = a.integer("--num-experts")
    if ep > 1:  # 1656/1658
        if experts is None:
            err("--expert-model-parallel-size", f"expert parallelism ({ep}) without --num-experts",
                "give --num-experts")
        elif experts % ep:
            err("--expert-model-parallel-size", f"--num-experts ({experts}) must be divisible by "
                f"expert-model-parallel size ({ep})", "pick an ep dividing the expert count")
        if tp > 1 and not a.has("--sequence-parallel"):  # ModelParallelConfig.__post_init__ raises
            err("--expert-model-parallel-size", "When using expert parallelism and tensor parallelism, sequence "
                "parallelism must be used", "add --sequence-parallel")
        etp = a.integer("--expert-tensor-parallel-size") or tp
        if world_size % (etp * ep * pp):
            err("--expert-model-parallel-size", f"world size ({world_size}) is not divisible by expert tensor x expert "
                f"x pipeline parallel ({etp}*{ep}*{pp})", "choose ep so that etp*ep*pp divides the world size")
    if a.has("--async-save") and not a.has("--use-persistent-ckpt-worker"):  # 1817
        err("--async-save", "--async-save without --use-persistent-ckpt-worker: Megatron silently drops it and "
            "every save blocks training", "add --use-persistent-ckpt-worker")
    if env is not None and (tp > 1 or cp > 1) and env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":  # 1478
        err("CUDA_DEVICE_MAX_CONNECTIONS", "tp or cp > 1 needs CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell "
            "(Megatron raises on Ampere/Hopper)", "export CUDA_DEVICE_MAX_CONNECTIONS=1", "warning")
    return out


def _megatron_own_problems(argv: Sequence[str], world_size: int) -> list[Problem]:
    """Megatron's own parse_args + validate_args, when ``megatron.training`` is importable.

    Not exercised by this project's tests (Megatron-LM is not installed here). Megatron reads the
    world size from ``WORLD_SIZE``; its assertions, argparse exits and errors become Problems.
    """
    try:
        from megatron.training import arguments as mt  # type: ignore[import-not-found]
    except ImportError:
        return []
    saved_argv, saved_env = sys.argv, {k: os.environ.get(k) for k in ("WORLD_SIZE", "RANK")}
    sys.argv = ["pretrain_gpt.py", *argv]
    os.environ.update(WORLD_SIZE=str(world_size), RANK="0")
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            mt.validate_args(mt.parse_args())
        return []
    except SystemExit:
        message = stderr.getvalue().strip().splitlines()[-1:] or ["Megatron's parser exited"]
        return [Problem(path="argv", severity="error", message=message[0], fix="fix the arguments", source="megatron")]
    except (AssertionError, ValueError, RuntimeError, TypeError) as exc:
        return [Problem(path="argv", severity="error", message=f"Megatron validate_args: {exc}",
                        fix="fix the arguments", source="megatron")]
    finally:
        sys.argv = saved_argv
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def megatron_args_problems(argv: Sequence[str], world_size: int, *,
                           env: Mapping[str, str] | None = None) -> list[Problem]:
    """Every problem in a Megatron-LM argument list for ``world_size`` GPUs: unknown flags (nearest flag
    suggested), values outside a flag's type or choices, and the validate_args rules. ``env`` (the job's
    exported variables), when given, is checked for CUDA_DEVICE_MAX_CONNECTIONS."""
    table = megatron_flag_table()
    given, problems = _tokenize(list(argv), table)
    counts: dict[str, int] = {}
    for g in given:
        counts[g.flag] = counts.get(g.flag, 0) + 1
    for flag, n in counts.items():
        if n > 1 and not table[flag].is_switch:
            problems.append(Problem(path=flag, severity="warning", message=f"{flag} is given {n} times; the last wins",
                                    fix="keep one", source="rules"))
    problems += _rule_problems(_Args(given, table), world_size, env)
    problems += _megatron_own_problems(argv, world_size)
    return problems


# ---------------------------------------------------------------------------------------------
# Reading a shell file of arguments
# ---------------------------------------------------------------------------------------------
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_ARRAY_REF = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\])?\}?$")
_LAUNCHERS = ("torchrun", "python", "python3", "deepspeed", "srun")


_SHELL_CONTROL = re.compile(r"^(\|\|?|&&?|;|\d*[<>].*)$")


def _is_array_ref(token: str, arrays: set[str]) -> bool:
    if token in ("$@", "$*"):
        return True
    m = _ARRAY_REF.match(token)
    return bool(m) and (m.group(2) is not None or m.group(1) in arrays)


def _until_control(tokens: list[str]) -> list[str]:
    """Tokens up to the first pipe, list operator or redirection (``| tee log``, ``2>&1``, ``&& echo``)."""
    for i, token in enumerate(tokens):
        if _SHELL_CONTROL.match(token):
            return tokens[:i]
    return tokens


def _logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        if raw.endswith("\\") and not raw.lstrip().startswith("#"):
            current += raw[:-1] + " "
            continue
        lines.append(current + raw)
        current = ""
    if current:
        lines.append(current)
    return lines


def parse_shell_args(text: str) -> tuple[list[str], dict[str, str]]:
    """Arguments and exported variables of a shell file of Megatron arguments (no shell is run).

    Understood: ``--flag value`` lines with ``\\`` continuations; bash arrays ``ARGS=( ... )`` as in
    Megatron's examples; a launch line (``torchrun ... pretrain_gpt.py ARGS``: the tokens after the
    ``.py``); ``export X=Y``. Plain ``X=Y`` assignments substitute ``$X``/``${X}`` in later tokens;
    array references (``${ARGS[@]}``) are skipped (their contents were read where defined). Comments and
    other commands are ignored.
    """
    argv: list[str] = []
    env: dict[str, str] = {}
    variables: dict[str, str] = {}
    arrays: set[str] = set()
    in_array = False

    def expand(token: str) -> str:
        return _VAR.sub(lambda m: variables.get(m.group(1) or m.group(2), m.group(0)), token)

    for line in _logical_lines(text):
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            tokens = line.split()
        if not tokens:
            continue
        if in_array:
            if ")" in tokens:
                argv += [expand(t) for t in tokens[:tokens.index(")")]]
                in_array = False
            else:
                argv += [expand(t) for t in tokens]
            continue
        if tokens[0] == "export":
            for item in tokens[1:]:
                m = _ASSIGN.match(item)
                if m:
                    env[m.group(1)] = variables[m.group(1)] = expand(m.group(2))
            continue
        m = _ASSIGN.match(tokens[0])
        if m and m.group(2).startswith("("):
            arrays.add(m.group(1))
            body = [m.group(2)[1:]] + tokens[1:] if m.group(2) != "(" else tokens[1:]
            body = [t for t in body if t]
            if body and body[-1].endswith(")"):
                body[-1] = body[-1][:-1]
                argv += [expand(t) for t in body if t]
            else:
                argv += [expand(t) for t in body]
                in_array = True
            continue
        if m and len(tokens) == 1:
            variables[m.group(1)] = expand(m.group(2))
            continue
        if _is_flag(tokens[0]):
            rest = tokens
        elif tokens[0].rsplit("/", 1)[-1] in _LAUNCHERS:
            scripts = [i for i, t in enumerate(tokens) if t.endswith(".py")]
            if not scripts:
                continue
            rest = tokens[scripts[0] + 1:]
        else:
            continue
        argv += [expand(t) for t in _until_control(rest) if not _is_array_ref(t, arrays)]
    return argv, env


def read_megatron_args_file_with_env(path: str | Path) -> tuple[list[str], dict[str, str]]:
    """(arguments, exported variables) of a shell file: see :func:`parse_shell_args`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError([f"cannot read {str(path)!r}: {exc.strerror}"], subject="Megatron arguments file") from None
    return parse_shell_args(text)


def read_megatron_args_file(path: str | Path) -> list[str]:
    """The Megatron arguments in a shell file (exports: :func:`read_megatron_args_file_with_env`)."""
    return read_megatron_args_file_with_env(path)[0]
