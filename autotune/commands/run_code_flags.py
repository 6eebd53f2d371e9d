"""The flags that state how a run's own code differs from its engine's release: what it keeps in memory and how it
schedules its communication.

They serve `autotune estimate` for costing a run whose program is not the engine's release the CLI models (a
published run's own stack: Meta's Llama 3, arXiv 2407.21783 Sec. 3.3.2; the 2021-22 Megatron-LM and DeepSpeed of
the runs that made these engines' names). The files `autotune emit` writes run the modelled release's code, which
cannot be told to behave so, and emit refuses them (``run_code_problems``) rather than cost files that do not.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RunCodeFlag", "RUN_CODE_FLAGS", "add_run_code_flags", "run_code_settings", "run_code_time_settings",
           "run_code_problems", "run_code_plan_problems", "flag_applies"]

MEMORY, TIME = "memory", "time"


@dataclass(frozen=True, slots=True)
class RunCodeFlag:
    flag: str
    setting: str
    """The ``MemorySettings`` / ``TimeSettings`` field it sets (None there: the engine's own)."""
    choices: tuple[tuple[str, object], ...]
    """(the word on the command line, the field's value)."""
    help: str
    targets: tuple[str, ...] = (MEMORY,)
    """Which settings the field is in: ``MemorySettings`` (memory), ``TimeSettings`` (time), or both."""
    needs: tuple[str, Callable[[object], bool]] | None = None
    """(what a plan must have for the flag to change its cost, the test of a plan); None: taken as given."""

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def value(self, args: argparse.Namespace):
        """The field's value the flag gives; None where it is not given."""
        word = getattr(args, self.dest, None)
        return None if word is None else dict(self.choices)[word]


def _zero3_prefetch(plan) -> bool:
    from autotune.engines import engine_for

    return plan.zero_stage == 3 and plan.overlap_comm and engine_for(plan).comm.param_gather == "prefetch"


RUN_CODE_FLAGS = (
    RunCodeFlag("--linear-inputs", "linear_inputs_gathered", (("gathered", True), ("shard", False)),
                "under sequence parallelism, what the column-parallel linears save for backward: the sequence-gathered "
                "input (torchtitan's DTensor TP) or the shard, re-gathered in backward (Megatron, Korthikanti et al. "
                "2022)"),
    RunCodeFlag("--grad-accumulation", "grad_accumulation_sharded", (("sharded", True), ("unsharded", False)),
                "under pipelining with FSDP sharding, where the micro-batches' gradients add up: sharded = each "
                "micro-batch's are reduce-scattered into the fp32 shards as its backward ends (Meta's Llama 3 stack); "
                "unsharded = the stage's whole gradient accumulates in fp32 through the step and is reduce-scattered "
                "after the last micro-batch (torch.distributed.pipelining)"),
    RunCodeFlag("--pipeline-buffers", "pipeline_buffers_released", (("released", True), ("kept", False)),
                "what a pipeline stage holds of its inputs and outputs: released = freed once no later computation "
                "reads them, only the tensors in transit held (Meta's Llama 3 stack); kept = a receive buffer per "
                "micro-batch and the outputs of those in flight (torch.distributed.pipelining)"),
    RunCodeFlag("--cross-entropy", "te_cross_entropy", (("te", True), ("fp32", False)),
                "what the loss keeps of the logits for backward: te = Transformer Engine's parallel_cross_entropy "
                "before TE 2.18, the 16-bit logits with the gradient written into them (Megatron-Bridge's runs: "
                "cross_entropy_fusion_impl te); fp32 = 4 bytes a logit: an fp32 softmax (Megatron-LM's vocab-parallel "
                "cross entropy), or TE >= 2.18's, whose gradient is a separate fp32 tensor; the loss's time follows: "
                "10 bytes of HBM traffic a logit for te, 26 for fp32", (MEMORY, TIME)),
    # Scheduling: what older releases of the engines did, which the modelled ones no longer do by default.
    RunCodeFlag("--tp-backward-comm", "tp_backward_overlap", (("overlapped", True), ("blocking", False)),
                "the tensor-parallel all-reduce (or reduce-scatter) of a column-parallel linear's input gradient in "
                "backward: overlapped = behind the weight-gradient GEMM (Megatron's "
                "LinearWithGradAccumulationAndAsyncCommunication, Megatron-core's only way); blocking = waited for "
                "(Megatron-LM v2 of 2021 and the BigScience Megatron-DeepSpeed fork; Megatron-DeepSpeed's "
                "--no-async-tensor-model-parallel-allreduce)", (TIME,),
                ("tensor parallelism (--tp > 1)", lambda plan: plan.tp > 1)),
    RunCodeFlag("--pp-sends", "pp_overlap_interleaved", (("overlapped", True), ("blocking", False)),
                "the interleaved pipeline schedule's steady-phase sends and receives: overlapped = posted behind the "
                "next chunk's compute (Megatron overlap_p2p_comm, the default with virtual stages since Megatron-LM "
                "4eeff55d1f, 2023-10); blocking = each waited for (Megatron-LM before f9283c5a8a, 2023-05, and "
                "Megatron-LM's --no-overlap-p2p-communication)", (TIME,),
                ("an interleaved pipeline (--pp > 1 with --vpp > 1)", lambda plan: plan.pp > 1 and plan.vpp > 1)),
    RunCodeFlag("--zero3-collectives", "zero3_list_collectives", (("coalesced", False), ("lists", True)),
                "how DeepSpeed ZeRO-3 gathers and reduce-scatters its parameters and gradients: coalesced = one flat "
                "collective per bucket (DeepSpeed >= 0.6); lists = through per-rank tensor lists (DeepSpeed before "
                "v0.5.5)", (TIME,),
                ("DeepSpeed's ZeRO-3 with --overlap-comm (--zero 3, --engine deepspeed or megatron-deepspeed)",
                 _zero3_prefetch)),
    RunCodeFlag("--cp-kv", "cp_repeat_kv", (("gqa", False), ("repeated", True)),
                "under context parallelism, the width of the K and V the ring exchanges and holds: gqa = the model's "
                "K/V heads (SDPA's enable_gqa; torchtitan >= 0.2.2, Megatron); repeated = repeated to every query "
                "head before attention (torchtitan before v0.2.2: repeat_kv)", (MEMORY, TIME),
                ("context parallelism (--cp > 1)", lambda plan: plan.cp > 1)),
    RunCodeFlag("--attention-kernel", "attention_kernel", (("fa2", "fa2"), ("fa3", "fa3"), ("fa-triton", "fa-triton")),
                "the fused attention kernel the run's code calls: fa2 / fa3 = FlashAttention-2 / -3; fa-triton = "
                "FlashAttention in pre-MLIR Triton (llm-foundry's attn_impl triton, 2023), about 1.3x slower than "
                "FlashAttention-2 (Dao 2023, arXiv 2307.08691 Sec. 4)", (TIME,),
                ("a fused attention kernel (--flash-attention)", lambda plan: plan.flash_attention)),
)


def add_run_code_flags(group) -> None:
    for f in RUN_CODE_FLAGS:
        group.add_argument(f.flag, choices=tuple(word for word, _ in f.choices), default=None,
                           help=f"{f.help}; default: the engine's own (`emit` refuses it: its files run the engine's "
                                f"code)")


def _settings(args: argparse.Namespace, target: str) -> dict:
    return {f.setting: f.value(args) for f in RUN_CODE_FLAGS
            if target in f.targets and getattr(args, f.dest, None) is not None}


def run_code_settings(args: argparse.Namespace) -> dict:
    """The ``MemorySettings`` fields the flags given set."""
    return _settings(args, MEMORY)


def run_code_time_settings(args: argparse.Namespace) -> dict:
    """The ``TimeSettings`` fields the flags given set."""
    return _settings(args, TIME)


def run_code_problems(args: argparse.Namespace) -> list[str]:
    """One problem per flag given to a command that writes the engine's files."""
    return [f"{f.flag} states what another program's code does (a published run's own stack or an older release), "
            f"but the files emit writes run the modelled release's code: drop {f.flag} here; "
            f"`autotune estimate {f.flag} ...` costs such a run" for f in RUN_CODE_FLAGS
            if getattr(args, f.dest, None) is not None]


def flag_applies(flag: RunCodeFlag, plan) -> bool:
    """Whether ``flag`` changes the cost of ``plan`` (the memory flags: always taken as given)."""
    return flag.needs is None or flag.needs[1](plan)


def run_code_plan_problems(args: argparse.Namespace, plan, cluster) -> list[str]:
    """The run-code flags given that cannot change this plan's cost (so would be silently ignored), and an attention
    kernel the plan's GPU does not run."""
    problems = []
    for f in RUN_CODE_FLAGS:
        word = getattr(args, f.dest, None)
        if word is None:
            continue
        if not flag_applies(f, plan):
            problems.append(f"{f.flag} {word} changes only a plan with {f.needs[0]}; this plan has none: "
                            f"drop {f.flag}")
        elif f.setting == "attention_kernel":
            problems += _kernel_problems(f, word, cluster)
    return problems


def _kernel_problems(flag: RunCodeFlag, kernel: str, cluster) -> list[str]:
    from autotune.cost.kernels import DERIVED_ATTENTION_KERNELS

    facts = cluster.gpu.kernels
    runs = tuple(facts.attention_fraction) if facts is not None else ()
    base = DERIVED_ATTENTION_KERNELS.get(kernel, (kernel, 1.0))[0]
    if base in runs:
        return []
    ran = [k for k, _ in flag.choices if DERIVED_ATTENTION_KERNELS.get(k, (k, 1.0))[0] in runs]
    why = "FlashAttention-3 needs Hopper or newer" if kernel == "fa3" else "no measured rate of it here"
    way_out = f"pick {' or '.join(ran)}" if ran else "drop --attention-kernel (its attention is costed unfused)"
    return [f"--attention-kernel {kernel}: {cluster.gpu.name} has no {kernel} ({why}): {way_out}"]
