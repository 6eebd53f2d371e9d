"""One layer's passes for one micro-batch: forward, backward and recompute seconds with the TP, CP and MoE
collectives each leaves on the critical path, as the engine schedules them (from autotune.cost.layer_time's
LayerTime)."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.cost.activations import recomputed
from autotune.cost.layer_time import LayerTime, attention_bwd_s
from autotune.specs.plan import ParallelPlan

__all__ = ["LayerPasses", "layer_passes"]


@dataclass(frozen=True, slots=True)
class LayerPasses:
    """One layer, one micro-batch: forward, backward, recompute seconds and the collectives on the critical path."""

    fwd_s: float
    bwd_s: float
    recompute_s: float
    tp_exposed_s: float
    tp_hidden_s: float
    cp_exposed_s: float
    moe_s: float
    cp_hidden_s: float = 0.0
    """Context-parallel communication hidden behind the attention kernels (costs ``overlap_cost`` of its time)."""


def layer_passes(lt: LayerTime, plan: ParallelPlan, rec_share: float, tp_overlap: str,
                 tp_backward_overlap: bool, selective: str = "attention-core",
                 modules: tuple[str, ...] = ("core_attn",)) -> LayerPasses:
    """Forward, backward and recompute of one layer with its communication exposed as the engine schedules it.

    TP collectives: two per pass (forward, recompute, backward). ``tp_overlap`` (userbuffers / async TP) chunks
    every one of them behind the GEMMs that need them. ``tp_backward_overlap``: the backward's collective of the
    input gradient runs asynchronously while the weight-gradient GEMM (as many FLOPs as the forward GEMM) computes
    (Megatron ``LinearWithGradAccumulationAndAsyncCommunication``: ``all_reduce`` / ``_reduce_scatter_base`` with
    ``async_op=True`` issued before the wgrad GEMM, megatron/core/tensor_parallel/layers.py); only what the wgrad
    GEMM cannot cover waits. ``modules``: what Megatron's selective recompute reruns (``recompute_modules``;
    LayerTime.module_recompute_s); "moe" reruns the MoE block's dispatch and combine all-to-alls as well.
    """
    ring = lt.ring
    # LoRA (autotune.cost.lora): frozen base layers run no weight-gradient GEMM; the adapters' GEMMs run forward
    # and, in backward, their data- and weight-gradient GEMMs (twice the forward).
    wgrad = 0.0 if lt.frozen else lt.gemm_s
    fwd = lt.gemm_s + lt.attention_s + lt.elementwise_s + ring.merge_fwd_s + lt.adapter_s
    bwd = (lt.gemm_s + wgrad + attention_bwd_s(lt.attention_s, lt.attention_exp_delta_s, plan, lt.attention_bwd_scale)
           + lt.elementwise_bwd_s + ring.merge_bwd_s + 2 * lt.adapter_s)
    async_pairs = tp_overlap == "async-tp" and plan.tp > 1 and lt.tp_unpaired_s is not None
    if async_pairs:  # the fused reduce-scatters' reductions, on the compute stream (forward: wo, fc2; dgrad: QKV, fc1)
        fwd += lt.tp_unpaired_s[1]
        bwd += lt.tp_unpaired_s[1]
    full = plan.recompute == "full"
    # Selective recompute (Korthikanti et al. 2022 Sec. 4.2) reruns the attention core by default: its GEMMs (or the
    # flash kernel) and, unfused, the softmax and dropout over the scores; Megatron's other modules what
    # LayerTime.module_recompute_s counts; torchtitan's op-level SAC ("op-sac") LayerTime.op_sac_recompute_s.
    rec = moe_reruns = ring_reruns = 0.0  # ring_reruns: forward passes of the attention core in recompute
    if full:
        rec = fwd * rec_share
    elif plan.recompute == "selective" and selective == "op-sac":
        rec = lt.op_sac_recompute_s
    elif plan.recompute == "selective" and selective == "op-sac-0.3":
        # torchtitan 0.3 keeps every Float8 GEMM's output: only the bf16 mm's rerun
        rec = lt.op_sac_recompute_s - (lt.gemm_s if plan.precision == "fp8" else 0.0)
    elif plan.recompute == "selective":
        rerun = recomputed(modules)
        rec = sum(seconds for name, seconds in lt.module_recompute_s if name in rerun)
        moe_reruns = 1.0 if "moe" in rerun else 0.0
        if "core_attn" in rerun:  # the context-parallel attention reruns whole: its exchange and merges
            rec += ring.merge_fwd_s
            ring_reruns = 1.0
    fwd_passes = 1 + (rec_share if full else 0.0)
    hidden = 0.0
    if async_pairs:  # each collective behind its own GEMM
        total = lt.tp_comm_s * (fwd_passes + 1)
        exposed = lt.tp_unpaired_s[0] * (fwd_passes + 1)
        hidden = total - exposed
    elif tp_overlap != "none" and plan.tp > 1:  # collectives chunked behind the GEMMs that need them
        total = lt.tp_comm_s * (fwd_passes + 1)
        exposed = max(0.0, total - (lt.gemm_s * 2 if lt.frozen else lt.gemm_s * 3))  # no wgrad GEMM when frozen
        hidden = total - exposed
    elif tp_backward_overlap and plan.tp > 1:
        bwd_exposed = max(0.0, lt.tp_comm_s - wgrad)  # behind the weight-gradient GEMM, none when frozen
        exposed = lt.tp_comm_s * fwd_passes + bwd_exposed
        hidden = lt.tp_comm_s - bwd_exposed
    else:
        exposed = lt.tp_comm_s * (fwd_passes + 1)
    if plan.recompute == "selective" and selective in ("op-sac", "op-sac-0.3") and plan.tp > 1:
        gathers, unpaired = lt.op_sac_tp_s  # the input all-gathers op-level SAC reruns (op_sac_gathers)
        rerun_exposed = unpaired if tp_overlap == "async-tp" else gathers
        exposed += rerun_exposed
        hidden += gathers - rerun_exposed
    # Context parallelism: each forward pass of the attention core (the forward, its recompute) exchanges K/V again.
    ring_passes = fwd_passes + ring_reruns
    cp = ring.fwd_exposed_s * ring_passes + ring.bwd_exposed_s
    cp_hidden = ring.fwd_hidden_s * ring_passes + ring.bwd_hidden_s
    return LayerPasses(fwd, bwd, rec, exposed, hidden, cp, lt.moe_comm_s * (fwd_passes + 1 + moe_reruns), cp_hidden)
