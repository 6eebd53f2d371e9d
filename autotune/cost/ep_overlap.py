"""Expert-parallel all-to-all overlap: Megatron-core's 1F1B batch-level overlap of one micro-batch's forward with
another's backward (``ParallelPlan.ep_overlap``: ``--overlap-moe-expert-parallel-comm``, ``--delay-wgrad-compute``).

Megatron-core 0.19.2 ``models/common/model_chunk_schedule_plan.py`` (``TransformerLayerSchedulePlan.run``, :224-290)
pairs the forward of layer i of one micro-batch with the backward of a layer of another, on two CUDA streams:

    comm stream: combine_bwd      | dispatch_fwd -> dispatch_bwd     | combine_fwd
    comp stream: pre_dispatch_fwd | mlp_bwd -> mlp_bwd_dw -> mlp_fwd | pre_dispatch_bwd (-> pre_dispatch_bwd_dw)

``pre_dispatch`` is the attention block, the pre-MLP norm, the router and the shared experts
(``models/gpt/fine_grained_callables.py:67-150``); ``mlp`` the routed experts. Each node waits for its inputs: the
backward dispatch for the experts' data gradient, the forward experts for the forward dispatch, and so on. Without
``--delay-wgrad-compute`` a node's backward computes its weight gradients too (``backward_dw`` does nothing), so
the backward dispatch waits for the experts' whole backward and the next layer's backward combine for the
attention's; with it the weight-gradient GEMMs run after (the experts' behind the backward dispatch, the
attention's behind the next layer's backward combine). :func:`paired_layers_s` runs that schedule over a stage's
MoE layers, node by node on the two streams; what it takes beyond the compute alone is the all-to-all left exposed.

Only the steady phase pairs micro-batches (``pipeline_parallel/combined_1f1b.py:51-65`` without pipelining: the
first forward and the last backward run alone; ``schedules.py:939-943`` with interleaving: one forward more
before the steady phase): the others' all-to-alls wait as without the overlap (:func:`paired_share`). Not
modelled: the TP collectives stay on the compute stream where ``layer_passes`` puts them; the dispatcher's
permutations (``autotune.cost.moe_time``) count with the attention side, the received tokens' sort among them, not
with the experts; the one-layer peak of two micro-batches' activations without pipelining.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.specs.plan import ParallelPlan

if TYPE_CHECKING:
    from autotune.cost.layer_time import LayerTime

__all__ = ["paired_exposed_s", "paired_layers_s", "paired_share"]


def paired_layers_s(layers: int, fwd: tuple[float, float], bwd: tuple[float, float, float, float],
                    a2a_s: float, delay_wgrad: bool) -> float:
    """Seconds for ``layers`` MoE layers' forward of one micro-batch paired with their backward of another.

    ``fwd``: (pre_dispatch, experts) forward seconds; ``bwd``: (pre_dispatch data gradient, its weight gradient,
    experts' data gradient, their weight gradient) seconds; ``a2a_s``: one all-to-all (a dispatch or a combine)."""
    pre_f, exp_f = fwd
    pre_dgrad, pre_wgrad, exp_dgrad, exp_wgrad = bwd
    if not delay_wgrad:  # each backward node computes its weight gradients with its data gradients
        pre_dgrad, pre_wgrad, exp_dgrad, exp_wgrad = pre_dgrad + pre_wgrad, 0.0, exp_dgrad + exp_wgrad, 0.0
    comp = comm = grad = out = 0.0  # streams free; the backward input and the forward input of the next pair ready
    for _ in range(layers):
        combine_b = max(comm, grad) + a2a_s
        pre_f_end = max(comp, out) + pre_f
        mlp_b = max(pre_f_end, combine_b) + exp_dgrad
        dispatch_f = max(combine_b, pre_f_end) + a2a_s
        dispatch_b = max(dispatch_f, mlp_b) + a2a_s
        mlp_f = max(mlp_b + exp_wgrad, dispatch_f) + exp_f
        pre_b = max(mlp_f, dispatch_b) + pre_dgrad
        combine_f = max(dispatch_b, mlp_f) + a2a_s
        comp, comm, grad, out = pre_b + pre_wgrad, combine_f, pre_b, combine_f
    return max(comp, comm)


def paired_exposed_s(lt: LayerTime, count: int, fwd_s: float, bwd_s: float, delay_wgrad: bool) -> float:
    """The all-to-all seconds ``count`` MoE layers of time ``lt`` (one layer's forward ``fwd_s``, backward with its
    recompute ``bwd_s``) leave exposed when paired: the attention side is the layer less its routed experts
    (``LayerTime.experts_s``); a weight gradient takes as long as its forward GEMM, as ``layer_passes`` counts."""
    gemm_e, act_f, act_b = lt.experts_s
    exp_f, exp_dgrad, exp_wgrad = gemm_e + act_f, gemm_e + act_b, gemm_e
    pre_wgrad = lt.gemm_s - gemm_e
    pre_dgrad = max(0.0, bwd_s - exp_dgrad - exp_wgrad - pre_wgrad)
    paired = paired_layers_s(count, (fwd_s - exp_f, exp_f), (pre_dgrad, pre_wgrad, exp_dgrad, exp_wgrad),
                             lt.moe_comm_s / 2, delay_wgrad)
    return max(0.0, paired - count * (fwd_s + bwd_s))


def paired_share(plan: ParallelPlan) -> float:
    """The share of a stage's (chunk-)micro-batches whose forward runs paired with another's backward: without
    pipelining all but one of ``m`` (combined_1f1b.py:51-65); interleaved, those after the first stage's warm-up
    forwards (``(pp - 1) * 2 + (vpp - 1) * pp`` chunk-micro-batches, one more with the overlap: schedules.py:
    925-943; all of them when m == pp). 0 where the overlap is off."""
    if not plan.ep_overlapped:
        return 0.0
    m = plan.num_microbatches
    if plan.pp == 1:
        return (m - 1) / m
    chunks = m * plan.vpp
    warmup = chunks if m == plan.pp else min((plan.pp - 1) * 2 + (plan.vpp - 1) * plan.pp + 1, chunks)
    return (chunks - warmup) / chunks
