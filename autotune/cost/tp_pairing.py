"""Tensor-parallel collectives that pair one to one with GEMMs: async TP hides each behind the GEMM it is fused
with (:func:`tp_pair_exposed_s`), and torchtitan's op-level SAC gathers the TP inputs again in backward
(:func:`op_sac_gathers`). ``autotune.cost.layer_time`` reads both."""

from __future__ import annotations

from collections.abc import Callable

from autotune.cost.efficiency import Efficiency
from autotune.cost.op_sac import block_linears
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["async_tp_reduce_bytes", "op_sac_gathers", "tp_pair_exposed_s"]


def tp_pair_exposed_s(collective_s: float, gemms_s: tuple[float, ...]) -> float:
    """Async TP (torch's micro-pipelined TP, torch.compile's ``_micro_pipeline_tp`` that torchtitan turns on,
    torchtitan/distributed/compile.py ``_maybe_enable_async_tp``) fuses each collective with one GEMM:
    ``symm_mem.fused_all_gather_matmul`` the all-gather with the projection that reads it, the reduce-scatter with
    the projection that writes it (forward ``y = all_gather(x) @ w``, dgrad ``dx = reduce_scatter(dy @ w)``,
    torchtitan b5bcd76 torchtitan/distributed/linear.py ``AllGatherLinear``). A collective hides only behind its
    own GEMM: of a layer's four (attention in / out, MLP in / out: ``gemms_s`` QKV, output projection, fc1, fc2),
    what each GEMM is too short to cover waits. The backward pairs the same GEMMs' dgrad (as many FLOPs)."""
    return sum(max(0.0, collective_s - g) for g in gemms_s)


def op_sac_gathers(model: ModelSpec, plan: ParallelPlan, gather_s: float, gemm_s: Callable[..., float],
                   peak: str, eff: Efficiency
                   ) -> tuple[float, float]:
    """(seconds, exposed under async TP) of the all-gathers torchtitan's op-level SAC reruns in backward with TP and
    sequence parallelism. Its policy saves the outputs of ``aten.mm``, SDPA and ``reduce_scatter_tensor``
    (parallelize_llama.py ``_save_list`` at 820504e, the async-TP benchmark's commit; the same list through v0.2.2)
    and recomputes every other op, ``all_gather_into_tensor`` among them: the gathered inputs of the attention and
    the MLP are gathered again in backward (for the rerun projections and the weight gradients). Async TP fuses each
    rerun gather with the rerun projections that read it (the 2nd of every two mm: wk, w3; every Float8 linear,
    ``aten._scaled_mm`` being out of the list); weight gradients gather along the other dimension, not fused."""
    t = plan.tp
    if t <= 1 or not plan.sequence_parallel:  # layer_passes counts them only under op-level SAC
        return 0.0, 0.0
    tokens = plan.seq_len * plan.micro_batch_size / plan.cp
    linears = block_linears(model)
    if plan.precision == "fp8":
        rerun = set(range(len(linears)))
    else:
        mm_index = [i for i, (_, _, _, biased) in enumerate(linears) if not biased]
        rerun = set(mm_index[1::2]) | {i for i, (_, _, _, biased) in enumerate(linears) if biased}
    sites = ([i for i in range(3)], [i for i in range(4, len(linears)) if linears[i][0] == "col"])
    paired = [sum(gemm_s(2 * tokens * linears[i][1] * linears[i][2] / t, tokens, linears[i][1], linears[i][2] / t,
                         peak, eff) for i in site if i in rerun) for site in sites]
    return 2 * gather_s, tp_pair_exposed_s(gather_s, tuple(paired))


def async_tp_reduce_bytes(tokens: float, width: float, tp: int) -> float:
    """HBM bytes of the reduction after one fused matmul + reduce-scatter of a [tokens x width] 16-bit output over
    ``tp`` ranks. torch's ``_fused_matmul_reduce_scatter_impl`` (torch/distributed/_symmetric_memory/__init__.py)
    sends each destination its [tokens/tp x width] partial product (``_pipelined_produce_and_all2all``, copy engines)
    into ``stacked_partials``, then sums the ``tp`` partials with one ``torch.sum(dim=0)`` kernel on the compute
    stream after the pipeline: it reads all of them (tokens x width) and writes the rank's share. NCCL's
    reduce-scatter reduces inside its own kernel, behind compute; this reduction is not."""
    return 2.0 * tokens * width * (1 + 1 / tp)
