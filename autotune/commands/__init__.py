"""The subcommands of ``autotune``, one module each, and what they share.

Each module has ``register(subparsers)`` (its flags, every one with help) and ``run(args)``;
``autotune.cli`` only assembles them. Shared here: the common flags (model and cluster, plan),
reading the model and cluster they name, and the checks below. Nothing here imports ``autotune.cli``.

Every number a flag takes is checked here for finiteness and range before anything uses it
(:func:`flag_problems`), each bound named in the message; every problem is reported at once.
"""

from __future__ import annotations

import argparse

from autotune.errors import InputError
from autotune.specs.limits import MAX_GPUS, MAX_GPUS_PER_NODE, MODEL_LIMITS
from autotune.specs.plan import (
    CP_COMM_TYPES,
    CUDA_GRAPH_SCOPES,
    CUDA_GRAPHS,
    ENGINE_NAMES,
    EP_OVERLAPS,
    FP8_RECIPES,
    MOE_DISPATCHERS,
    RECOMPUTE_MODULES,
    RUN_SETTINGS,
    TP_OVERLAPS,
)
from autotune.specs.peft import LORA_DEFAULT_ALPHA, LORA_DEFAULT_RANK, LORA_TARGETS, PEFT_METHODS, PEFT_SETTINGS
from autotune.specs.settings import MemorySettings
from autotune.commands.arg_types import (
    HelpParser,
    LazyChoices,
    int_list,
    json_text,
    positive_int,
    preset_epilog,
    str_list,
)
from autotune.commands.run_code_flags import add_run_code_flags, run_code_problems
from autotune.commands.goodput_flags import add_goodput, add_reliability_flags, goodput_inputs, reliability_flags

__all__ = ["EXIT_OK", "EXIT_PROBLEMS", "EXIT_BAD_INPUT", "EXIT_INTERRUPTED", "INT_RANGES", "FLOAT_RANGES", "LEAVE_OUT",
           "positive_int", "flag_problems", "HelpParser", "LazyChoices", "json_text", "int_list", "str_list",
           "preset_epilog", "add_common", "add_plan_flags", "run_code_problems", "add_expandable_segments",
           "add_run_settings", "run_setting_args", "add_peft_flags", "peft_args", "add_calibration", "load_inputs", "time_settings",
           "add_goodput", "add_reliability_flags", "reliability_flags", "goodput_inputs"]

EXIT_OK, EXIT_PROBLEMS, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130

MAX_SEQ_LEN = 2**24  # 16M tokens: the longest contexts trained are ~10M (Llama 4 Scout)
MAX_BATCH = 2**24  # sequences per step: Llama 3 405B used 16M tokens = 2,048 x 8k
MAX_STEPS = 10**10

# flag (argparse dest) -> (smallest, largest, why the largest).
INT_RANGES: dict[str, tuple[int, int, str]] = {
    "num_gpus": (1, MAX_GPUS, "no cluster has more"),
    "gpus_per_node": (1, MAX_GPUS_PER_NODE, "an NVL576 rack holds 576"),
    "seq_len": (1, MAX_SEQ_LEN, "longer than any context trained"),
    "global_batch": (1, MAX_BATCH, "larger than any batch trained"),
    "tp": (1, MAX_GPUS, "the largest cluster"), "pp": (1, MODEL_LIMITS["num_layers"], "the most layers accepted"),
    "cp": (1, MAX_GPUS, "the largest cluster"), "ep": (1, MODEL_LIMITS["moe.num_experts"], "the most experts"),
    "vpp": (1, MODEL_LIMITS["num_layers"], "the most layers accepted"),
    "micro_batch": (1, MAX_BATCH, "the largest batch accepted"),
    "recompute_num_layers": (1, MODEL_LIMITS["num_layers"], "the most layers accepted"),
    "top_k": (1, 10_000, "more than a table shows"),
    "max_tp": (1, MAX_GPUS, "the largest cluster"), "max_pp": (1, MODEL_LIMITS["num_layers"], "the most layers"),
    "candidate": (1, 10**6, "more than any plan --json holds"),
    "train_steps": (1, MAX_STEPS, ""), "warmup_steps": (0, MAX_STEPS, ""),
    "keep_last": (1, 10**6, ""), "save_interval": (1, MAX_STEPS, ""), "lost_gpus": (0, MAX_GPUS, "the largest cluster"),
    "master_port": (1, 65535, "the largest TCP port"),
    # the plan's optional counts: out of range here names the flag (the plan's own check names its field)
    "activation_offload_layers": (1, MODEL_LIMITS["num_layers"], "the most layers accepted"),
    "mtp_layers": (1, MODEL_LIMITS["num_layers"], "the most layers accepted"),
    "loss_slots": (1, MODEL_LIMITS["num_layers"], "the most layers accepted"),
    "etp": (1, MAX_GPUS, "the largest cluster"), "dp_replicate": (1, MAX_GPUS, "the largest cluster"),
    "loss_chunks": (1, MAX_SEQ_LEN, "longer than any context trained"),
    "lora_rank": (1, MODEL_LIMITS["hidden_size"], "the largest hidden size accepted"),
}
# flag -> what leaving it out gives, said after a value below its smallest (0 reads as "none", and is not how).
LEAVE_OUT: dict[str, str] = {
    "activation_offload_layers": "leave --activation-offload-layers out to offload no layer",
    "mtp_layers": "leave --mtp-layers out to train no multi-token-prediction module",
    "etp": "leave --etp out for etp = tp",
    "loss_slots": "leave --loss-slots out for the engine's own pipeline split",
    "loss_chunks": "leave --loss-chunks out for the engine's default (an unchunked loss)",
    "lora_rank": f"leave --lora-rank out for Bridge's {LORA_DEFAULT_RANK}",
    "lora_alpha": f"leave --lora-alpha out for Bridge's {LORA_DEFAULT_ALPHA:g}",
    "moe_capacity_factor": "leave --moe-capacity-factor out for dropless MoE layers",
}
# flag -> (smallest, largest, smallest excluded, why the largest).
FLOAT_RANGES: dict[str, tuple[float, float, bool, str]] = {
    "overhead_gib": (0.0, 1024.0, False, "more than any GPU holds"),
    "fragmentation": (0.0, 0.9, False, "a fraction of the allocation; PyTorch's allocator wastes 5-30%"),
    "min_headroom_gib": (0.0, 1024.0, False, "more than any GPU holds"),
    "min_mfu": (0.0, 1.0, False, "a fraction of peak"),
    "lr": (0.0, 10.0, True, "far above any stable learning rate"),
    "storage_gb_per_s": (0.0, 1e6, True, "1 PB/s"),
    "gpu_mtbf_hours": (0.0, 1e8, True, "11,000 years"),
    "restart_s": (0.0, 604_800.0, False, "a week"),
    "local_storage_gb_per_s": (0.0, 1e5, True, "100 TB/s per node"),
    "lora_alpha": (0.0, 1e6, True, "far above any adapter scale: Bridge's default is 32"),
    "moe_capacity_factor": (0.0, 1e3, True, "far above any expert capacity: 1.0-2.0 is usual"),
}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def flag_problems(args: argparse.Namespace) -> list[str]:
    """Every numeric flag given that is not finite or out of its range, one line each."""
    from autotune.inputs import range_problem

    problems = []
    for dest, (lo, hi, why) in INT_RANGES.items():
        value = getattr(args, dest, None)
        if isinstance(value, int) and not isinstance(value, bool):
            problem = range_problem(_flag(dest), value, lo=lo, hi=hi, why_hi=why)
            if problem:
                problems.append(_with_way_out(problem, dest, value < lo))
    for dest, (lo, hi, lo_open, why) in FLOAT_RANGES.items():
        value = getattr(args, dest, None)
        if value is not None:
            problem = range_problem(_flag(dest), value, lo=lo, hi=hi, lo_open=lo_open, why_hi=why)
            if problem:
                problems.append(_with_way_out(problem, dest, not value > lo))  # NaN too: not above lo
    return problems


def _with_way_out(problem: str, dest: str, too_low: bool) -> str:
    return f"{problem}: {LEAVE_OUT[dest]}" if too_low and dest in LEAVE_OUT else problem


# ---- flags shared by several subcommands ------------------------------------------------

def add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and cluster")
    g.add_argument("--model", help="preset name, Hugging Face config.json, or model YAML (required)")
    g.add_argument("--gpu", help="GPU preset name (see the list below)")
    g.add_argument("--num-gpus", type=positive_int, help="total GPUs")
    g.add_argument("--gpus-per-node", type=positive_int, help="GPUs per node (default: the GPU preset's)")
    g.add_argument("--cluster", help="cluster YAML (schemas/cluster.schema.json) instead of --gpu/--num-gpus")
    g.add_argument("--seq-len", type=positive_int, default=4096, help="sequence length in tokens (default 4096)")
    g.add_argument("--global-batch", type=positive_int, help="sequences per optimizer step (default: micro x dp)")
    p.add_argument("--json", action="store_true", help="print the machine-readable result only")


def add_plan_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("plan")
    g.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size (default 1)")
    g.add_argument("--pp", type=positive_int, default=1, help="pipeline-parallel stages (default 1)")
    g.add_argument("--vpp", type=positive_int, default=1, help="virtual stages per pipeline rank (interleaved)")
    g.add_argument("--cp", type=positive_int, default=1, help="context-parallel size: the sequence split (default 1)")
    g.add_argument("--ep", type=positive_int, default=1, help="expert-parallel size, MoE models (default 1)")
    g.add_argument("--etp", type=positive_int, default=None,
                   help="expert-tensor-parallel size, Megatron parallel folding (default: tp)")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None,
                   help="ZeRO stage (default: the engine's: 1 = DeepSpeed ZeRO-1, Megatron's distributed optimizer; "
                        "fsdp: 3 = FULL_SHARD)")
    g.add_argument("--micro-batch", type=positive_int, default=1, help="sequences per GPU per forward pass (default 1)")
    g.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                   help="Megatron sequence parallelism (default: on when tp > 1)")
    g.add_argument("--recompute", choices=("none", "selective", "full"), default="selective",
                   help="activation recompute: none, selective (Megatron: the attention core or "
                        "--recompute-modules; FSDP2: torchtitan's op-level SAC) or full (default selective)")
    g.add_argument("--recompute-num-layers", type=positive_int, help="full recompute: layers per stage to recompute")
    g.add_argument("--precision", choices=("bf16", "fp16", "fp8", "fp4"), default="bf16",
                   help="training precision (default bf16); fp4: NVFP4 (Transformer Engine NVFP4BlockScaling, "
                        "Megatron --fp4-format e2m1 --fp4-recipe nvfp4; Blackwell)")
    g.add_argument("--optimizer", choices=("adamw", "sgd", "adafactor", "adamw8bit"), default="adamw",
                   help="optimizer, which sets the optimizer-state bytes (default adamw)")
    g.add_argument("--offload-optimizer", choices=("none", "cpu", "nvme"), default="none",
                   help="ZeRO offload of the optimizer states (default none)")
    g.add_argument("--offload-param", choices=("none", "cpu", "nvme"), default="none",
                   help="ZeRO-3 offload of the parameters (default none)")
    g.add_argument("--nvme-path", help="local NVMe folder for nvme offload")
    g.add_argument("--engine", "--framework", dest="engine", choices=ENGINE_NAMES, default="deepspeed",
                   help="the engine that trains the plan (default deepspeed; --framework is an alias)")
    g.add_argument("--dp-replicate", type=positive_int, default=1,
                   help="hybrid sharding (FSDP2 HSDP): replica groups of the dp ranks (default 1: shard over all)")
    g.add_argument("--loss-slots", type=int, default=None, metavar="K",
                   help="Megatron with --pp > 1: split the layers counting the embedding as one layer slot on the "
                        "first virtual stage and the output layer + loss as K slots on the last (L + 1 + K slots over "
                        "pp x vpp, the earlier virtual stages one more; K = 1 is --account-for-embedding/loss-in-"
                        "pipeline-split), written as --pipeline-model-parallel-layout where no other flags give it; "
                        "fsdp (torchtitan) with --pp > 1: torchtitan's split with pipeline_parallel_last_stage_less_"
                        "layers = K; default: the engine's own split")
    add_run_settings(g)
    add_peft_flags(g)
    g.add_argument("--flash-attention", action=argparse.BooleanOptionalAction, default=True,
                   help="flash attention: no seq x seq score matrix kept (default on)")
    g.add_argument("--overlap-comm", action=argparse.BooleanOptionalAction, default=True,
                   help="gradient reduction (and parameter gathers) overlapped with backward: DeepSpeed overlap_comm, "
                        "Megatron --overlap-grad-reduce --overlap-param-gather (default on)")
    m = p.add_argument_group("memory settings")
    m.add_argument("--overhead-gib", type=float, help="CUDA context + NCCL buffers per GPU, 0-1024 (default 1 GiB; "
                   "0 on cpu)")
    m.add_argument("--fragmentation", type=float, help="caching-allocator reserve beyond the allocated peak, a "
                   f"fraction 0-0.9 (default {MemorySettings().fragmentation_fraction:g}, fitted by "
                   "bench/fit_fragmentation.py)")
    add_expandable_segments(m)
    add_run_code_flags(m)
    add_calibration(p)


def add_expandable_segments(g) -> None:
    """--expandable-segments, for one plan (``estimate``, ``emit``) and for the planner's search (``plan``) alike."""
    g.add_argument("--expandable-segments", action=argparse.BooleanOptionalAction, default=None,
                   help="the run sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (emit's launch scripts export "
                        "it): the allocator hands its free pages back before it runs out of memory, so the fit test "
                        "leaves the fragmentation reserve out; default: as the engine's own launcher does (fsdp: "
                        "torchtitan's run_train.sh sets it; the others do not)")


def add_run_settings(g) -> None:
    """The run settings of ``ParallelPlan.RUN_SETTINGS`` (--grad-dtype, --fp8-recipe, --tp-overlap, --compile), for
    one plan and for the planner's search alike; each defaults to the engine's own (None)."""
    g.add_argument("--grad-dtype", choices=("bf16",), default=None,
                   help="dtype gradients are accumulated and reduced in: bf16 = Megatron --grad-reduce-in-bf16, as NVIDIA's Megatron-Bridge benchmark recipes run (half the gradient buffer and reduction bytes); default: the engine's own (Megatron: fp32 main grads with bf16 / fp8)")
    g.add_argument("--fp8-recipe", choices=FP8_RECIPES, default=None,
                   help="FP8 scaling recipe of fp8 plans: te-delayed / te-current / te-blockwise / te-mxfp8 = "
                        "Megatron --fp8-recipe delayed / tensorwise / blockwise (Hopper or later) / mxfp8 (Blackwell); "
                        "torchao-tensorwise / torchao-rowwise = torchtitan quantize.linear.float8 (rowwise: no FP8 "
                        "all-gather); torchao-mxfp8 = torchtitan quantize.linear.mx / MXFP8LinearConverter (Blackwell; "
                        "bf16 all-gather); default: the engine's own (Megatron te-delayed, torchtitan torchao-tensorwise)")
    g.add_argument("--tp-overlap", choices=TP_OVERLAPS, default=None,
                   help="TP communication overlap where tp > 1: userbuffers = Megatron --tp-comm-overlap (needs "
                        "sequence parallelism), async-tp = torchtitan enable_async_tensor_parallel (compiles); "
                        "default: the engine's own (none)")
    g.add_argument("--loss-chunks", type=positive_int, default=None, metavar="N",
                   help="compute the output layer and loss in N chunks of the sequence, each chunk's backward at once "
                        "(torchtitan 0.3 ChunkedLossWrapper; its recipes use 8): 1/N of the fp32 logits in memory; "
                        "default: the engine's own (unchunked)")
    g.add_argument("--recompute-modules", nargs="+", choices=RECOMPUTE_MODULES, default=None, metavar="MODULE",
                   help="with --recompute selective, what it reruns in backward (Megatron --recompute-modules: "
                        f"{', '.join(RECOMPUTE_MODULES)}); default: the engine's own (Megatron: core_attn; `plan` also "
                        "tries moe_act, then mla_up_proj, then moe_act layernorm on MoE / MLA models, each where no "
                        "recompute and no narrower set fits)")
    g.add_argument("--cuda-graph", choices=CUDA_GRAPHS, default=None,
                   help="CUDA graphs of the training layers (Megatron --cuda-graph-impl): one launch per captured part "
                        "instead of one per kernel (full-iteration: one for the whole forward-backward, Megatron "
                        "--cuda-graph-impl full_iteration); default: the engine's own (none)")
    g.add_argument("--cuda-graph-scope", nargs="+", choices=CUDA_GRAPH_SCOPES, default=None, metavar="PART",
                   help="with --cuda-graph, the parts of each layer captured (Megatron --cuda-graph-modules / "
                        f"--cuda-graph-scope: {', '.join(CUDA_GRAPH_SCOPES)}); default: the whole layer")
    g.add_argument("--ep-overlap", choices=EP_OVERLAPS, default=None,
                   help="where ep > 1: the MoE all-to-alls behind another micro-batch's compute (Megatron "
                        "--overlap-moe-expert-parallel-comm; a2a-delay-wgrad adds --delay-wgrad-compute); needs "
                        "--vpp with pp > 1; default: the engine's own (none)")
    g.add_argument("--moe-dispatcher", choices=MOE_DISPATCHERS, default=None,
                   help="MoE token dispatcher (Megatron --moe-token-dispatcher-type, flex with "
                        "--moe-flex-dispatcher-backend deepep|hybridep); default: the engine's own (alltoall)")
    g.add_argument("--moe-capacity-factor", type=float, default=None, metavar="C",
                   help="token dropping: each expert takes at most C times its balanced share of a rank's routed "
                        "tokens, the rest are dropped (Megatron --moe-expert-capacity-factor; NVIDIA's token-drop "
                        "benchmarks use 1.0); default: dropless")
    g.add_argument("--moe-pad-to-capacity", action="store_true", default=None,
                   help="with --moe-capacity-factor, pad every expert's input to its capacity (Megatron "
                        "--moe-pad-expert-input-to-capacity): static shapes, no host sync, the padded rows' work")
    g.add_argument("--fp8-attention", action="store_true", default=None,
                   help="with --precision fp8, run the fused attention in FP8 too (Megatron-core "
                        "fp8_dot_product_attention, Megatron-Bridge files only; NVIDIA's MXFP8 Bridge recipes set it); "
                        "default: the engine's own (16-bit attention)")
    g.add_argument("--fp8-output-proj", action="store_true", default=None,
                   help="with --precision fp8 --fp8-recipe te-mxfp8, run the output layer (LM head) in MXFP8 too "
                        "(Megatron-core fp8_output_proj, Megatron-LM --fp8-output-proj, core 0.18+; NVIDIA's MXFP8 "
                        "GPT-OSS and DeepSeek-V3 Bridge recipes set it); default: the engine's own (16-bit head)")
    g.add_argument("--cp-comm-type", choices=CP_COMM_TYPES, default=None,
                   help="where cp > 1: how context-parallel ranks exchange attention inputs (Megatron --cp-comm-type: "
                        "p2p ring, a2a all-to-all, allgather, a2a+p2p all-to-all inside a node and ring across); "
                        "default: the engine's own (Megatron p2p)")
    g.add_argument("--activation-offload-layers", type=positive_int, default=None, metavar="N",
                   help="offload the saved activations of the first N transformer layers to host memory during "
                        "forward, reloaded for backward (Megatron --cpu-offloading-num-layers, Transformer Engine's "
                        "CPU offload; Megatron only, with --pp 1 and --recompute none); default: none offloaded")
    g.add_argument("--mtp-layers", type=positive_int, default=None, metavar="N",
                   help="multi-token prediction: N MTP modules after the last layer, each one more layer like the "
                        "last and the output layer with its own loss (Megatron --mtp-num-layers; DeepSeek-V3 trains "
                        "1); default: none trained")
    g.add_argument("--compile", dest="torch_compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the model (torchtitan compile.enable); default: the engine's own "
                        "(torchtitan files compile fp8 and async-TP plans, other engines do not compile)")


def add_peft_flags(g) -> None:
    """Parameter-efficient fine-tuning of one plan (``autotune.specs.peft``: the plan's PEFT_SETTINGS)."""
    g.add_argument("--peft", choices=PEFT_METHODS, default=None,
                   help="fine-tune with LoRA as Megatron-Bridge runs it (peft=LoRA): base weights frozen (no gradients, "
                        "no optimizer states, no weight-gradient GEMMs), low-rank adapters trained; engine megatron "
                        "(Bridge files only); default: train every weight")
    g.add_argument("--lora-rank", type=positive_int, default=None, metavar="R",
                   help=f"with --peft lora, the adapters' rank (Bridge LoRA.dim; default {LORA_DEFAULT_RANK})")
    g.add_argument("--lora-alpha", type=float, default=None, metavar="A",
                   help=f"with --peft lora, the adapters' scale numerator (Bridge LoRA.alpha; default "
                        f"{LORA_DEFAULT_ALPHA:g}; no cost)")
    g.add_argument("--lora-targets", nargs="+", choices=LORA_TARGETS, default=None, metavar="MODULE",
                   help=f"with --peft lora, the linear layers given adapters ({', '.join(LORA_TARGETS)}; default all "
                        "four, Bridge's target_modules)")


def peft_args(args: argparse.Namespace) -> dict:
    """The PEFT settings the command line fixed (``ParallelPlan`` field -> value)."""
    return {name: tuple(value) if isinstance(value, list) else value for name in PEFT_SETTINGS
            if (value := getattr(args, name, None)) is not None}


def run_setting_args(args: argparse.Namespace) -> dict:
    """The run settings the command line fixed (``ParallelPlan`` field -> value), the rest left to the engine."""
    return {name: tuple(value) if isinstance(value, list) else value for name in RUN_SETTINGS
            if (value := getattr(args, name, None)) is not None}


def add_calibration(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calibration", help="efficiency parameters fitted by `autotune tune` on this hardware "
                   "(default: fitted on published Megatron-LM runs)")


# ---- what the common flags name ---------------------------------------------------------
def named_problems(err: InputError) -> list[str]:
    """The problems of a file's InputError, each naming the file (its subject) when one does."""
    if "'" not in err.subject:  # "--model", "cluster": the problems already say what they are about
        return list(err.problems)
    return [f"{err.subject}: {p}" for p in err.problems]


def load_inputs(args: argparse.Namespace, *, need_model: bool = True, need_num_gpus: bool = True):
    """Model and cluster from the common flags; every problem of both reported at once. ``need_num_gpus`` False:
    the cluster is a template (its GPU and node size) and ``--gpu`` alone gives one node of it."""
    from autotune.specs.loading import load_cluster, load_model

    problems: list[str] = flag_problems(args)
    model = cluster = None
    if args.model is None:
        if need_model:
            problems.append("give --model (a preset name, a config.json or a model YAML)")
    else:
        try:
            model = load_model(args.model)
        except InputError as err:
            problems += named_problems(err)
    if args.cluster is None and (args.gpu is None or (args.num_gpus is None and need_num_gpus)):
        problems.append("give --gpu and --num-gpus, or --cluster FILE" if need_num_gpus else
                        "give --gpu (or --cluster FILE)")
    elif any(p.startswith(("--num-gpus ", "--gpus-per-node ")) for p in problems):
        if args.gpu is not None:  # the counts are already reported; still check the GPU name
            from autotune.specs.presets import load_gpu_preset

            try:
                load_gpu_preset(args.gpu)
            except InputError as err:
                problems += list(err.problems)
    else:
        try:
            cluster = load_cluster(gpu=args.gpu, num_gpus=args.num_gpus, gpus_per_node=args.gpus_per_node,
                                   cluster_path=args.cluster)
        except InputError as err:
            problems += named_problems(err)
    if problems:
        raise InputError(problems, subject="input")
    return model, cluster


def time_settings(args: argparse.Namespace):
    from autotune.cost.efficiency import load_efficiency
    from autotune.cost.step_time import TimeSettings

    path = getattr(args, "calibration", None)
    return TimeSettings(efficiency=load_efficiency(path)) if path else TimeSettings()
