"""The flags that state how a run's own code differs from its engine's in what it keeps in memory.

They serve `autotune estimate` for costing a run whose program is not the engine's (a published run's own stack:
Meta's Llama 3, arXiv 2407.21783 Sec. 3.3.2). The files `autotune emit` writes run the engine's code, which cannot
be told to behave so, and emit refuses them (``run_code_problems``) rather than cost files that do not.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

__all__ = ["RunCodeFlag", "RUN_CODE_FLAGS", "add_run_code_flags", "run_code_settings", "run_code_problems"]


@dataclass(frozen=True, slots=True)
class RunCodeFlag:
    flag: str
    setting: str
    """The ``MemorySettings`` field it sets (None there: the engine's own)."""
    true_choice: str
    false_choice: str
    help: str

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


RUN_CODE_FLAGS = (
    RunCodeFlag("--linear-inputs", "linear_inputs_gathered", "gathered", "shard",
                "under sequence parallelism, what the column-parallel linears save for backward: the sequence-gathered "
                "input (torchtitan's DTensor TP) or the shard, re-gathered in backward (Megatron, Korthikanti et al. "
                "2022)"),
    RunCodeFlag("--grad-accumulation", "grad_accumulation_sharded", "sharded", "unsharded",
                "under pipelining with FSDP sharding, where the micro-batches' gradients add up: sharded = each "
                "micro-batch's are reduce-scattered into the fp32 shards as its backward ends (Meta's Llama 3 stack); "
                "unsharded = the stage's whole gradient accumulates in fp32 through the step and is reduce-scattered "
                "after the last micro-batch (torch.distributed.pipelining)"),
    RunCodeFlag("--pipeline-buffers", "pipeline_buffers_released", "released", "kept",
                "what a pipeline stage holds of its inputs and outputs: released = freed once no later computation "
                "reads them, only the tensors in transit held (Meta's Llama 3 stack); kept = a receive buffer per "
                "micro-batch and the outputs of those in flight (torch.distributed.pipelining)"),
    RunCodeFlag("--cross-entropy", "te_cross_entropy", "te", "fp32",
                "what the loss keeps of the logits for backward: te = Transformer Engine's parallel_cross_entropy, the "
                "16-bit logits with the gradient written into them (Megatron-Bridge's runs: cross_entropy_fusion_impl "
                "te); fp32 = an fp32 softmax (Megatron-LM's vocab-parallel cross entropy)"),
)


def add_run_code_flags(group) -> None:
    for f in RUN_CODE_FLAGS:
        group.add_argument(f.flag, choices=(f.true_choice, f.false_choice), default=None,
                           help=f"{f.help}; default: the engine's own (`emit` refuses it: its files run the engine's "
                                f"code)")


def run_code_settings(args: argparse.Namespace) -> dict[str, bool]:
    """The ``MemorySettings`` fields the flags given set."""
    return {f.setting: getattr(args, f.dest) == f.true_choice for f in RUN_CODE_FLAGS
            if getattr(args, f.dest, None) is not None}


def run_code_problems(args: argparse.Namespace) -> list[str]:
    """One problem per flag given to a command that writes the engine's files."""
    return [f"{f.flag} states what another program's code keeps in memory (a published run's own stack), but the "
            f"files emit writes run the engine's code: drop {f.flag} here; `autotune estimate {f.flag} ...` costs "
            f"such a run" for f in RUN_CODE_FLAGS if getattr(args, f.dest, None) is not None]
