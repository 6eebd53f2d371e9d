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

The host issues the nodes one after another in that order (``run`` :260-301: combine_bwd, pre_dispatch_fwd,
mlp_bwd, dispatch_fwd, mlp_bwd_dw, dispatch_bwd, mlp_fwd, combine_fwd, pre_dispatch_bwd); a node's GPU work cannot
start before its issue begins nor end before it ends (the routed experts issue one cuBLASLt call per local expert,
``autotune.cost.expert_host``, which at small micro-batches outlasts their GPU work). And the forward dispatch waits
on the host for the token counts: the pre-dispatch node ends with the dispatcher's preprocess (its device-to-host
copy of the counts, ``fine_grained_callables.py:67-150``), and the dispatch synchronises with it before its
all-to-all (``token_dispatcher.py:594-596`` sync point "before_ep_alltoall", ``_maybe_dtoh_and_synchronize``
:921-958; HybridEP's dispatch syncs likewise, :1111-1112). So the host cannot issue the experts' weight gradient
and the forward experts before the paired forward's attention side has run: :func:`paired_layers_s` takes the
host's issue times per node (``host``) and keeps that order and that wait.

Only the steady phase pairs micro-batches (``pipeline_parallel/combined_1f1b.py:51-65`` without pipelining: the
first forward and the last backward run alone; ``schedules.py:939-943`` with interleaving: one forward more
before the steady phase): the others' all-to-alls wait as without the overlap (:func:`paired_share`). What the
schedule hides still slows the compute beside it (``EP_A2A_OVERLAP_COST`` of each hidden second, charged by
``autotune.cost.step_time``). Not modelled: the TP collectives stay on the compute stream where ``layer_passes``
puts them; the dispatcher's permutations (``autotune.cost.moe_time``) count with the attention side, the received
tokens' sort among them, not with the experts; the one-layer peak of two micro-batches' activations without
pipelining.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.cost.expert_host import grouped_mlp_host_parts_s
from autotune.cost.launch import layer_launches
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

if TYPE_CHECKING:
    from autotune.cost.layer_time import LayerTime

# What hiding an all-to-all behind the paired micro-batch's compute costs that compute, per second hidden: measured,
# not fitted. Megatron-Bridge@067f987 skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md:62-87 (a controlled A/B,
# 2026-07-25: Qwen3-30B-A3B pre-training on 16 H100, BF16, seq 4096, TP1 PP1 CP1 EP16, MBS 1, GBS 1024, forced
# balance, HybridEP, Transformer Engine graph scopes moe_router + moe_preprocess; only
# overlap_moe_expert_parallel_comm changed) profiles rank 0 with Nsight Systems, the same 463,348 kernels each way:
# communication concurrent with GEMM / attention went from 9.079 ms to 3,958.997 ms, but the GPU-active interval
# union fell only from 22.821 s to 21.221 s. Had the compute run as fast beside the all-to-all, the union would have
# fallen by the whole concurrent time; the 2.359 s it did not is the compute's slowdown: 0.596 of each second hidden
# (the dispatcher's kernels hold SMs for their whole transfer, HybridEP 32 of an H100's 132, and share HBM). The
# model hides 4.17 s of that run's all-to-all (autotune estimate, the A/B's flags), as much as the profile's 3.96 s.
# It replaces the shared ``Efficiency.overlap_cost`` (0.21, fitted on NCCL collectives behind GEMMs) for the
# all-to-all alone; bench/ep_overlap_ab.py checks it on the same page's other A/B (the alltoall dispatcher, no CUDA
# graphs: 41.25 s off, 31.31 s on), which it was not taken from.
_CONCURRENT_S, _UNION_OFF_S, _UNION_ON_S = 3.958997, 22.821, 21.221
EP_A2A_OVERLAP_COST = (_CONCURRENT_S - (_UNION_OFF_S - _UNION_ON_S)) / _CONCURRENT_S

__all__ = ["EP_A2A_OVERLAP_COST", "paired_exposed_s", "paired_host_s", "paired_layers_s", "paired_share"]

HostIssue = tuple[float, float, float, float, float]
"""Host seconds to issue one MoE layer's (pre_dispatch forward, experts forward, pre_dispatch backward, experts'
data gradient, their weight gradient) nodes."""


def paired_layers_s(layers: int, fwd: tuple[float, float], bwd: tuple[float, float, float, float],
                    a2a_s: float, delay_wgrad: bool, host: HostIssue | None = None) -> float:
    """Seconds for ``layers`` MoE layers' forward of one micro-batch paired with their backward of another.

    ``fwd``: (pre_dispatch, experts) forward seconds; ``bwd``: (pre_dispatch data gradient, its weight gradient,
    experts' data gradient, their weight gradient) seconds; ``a2a_s``: one all-to-all (a dispatch or a combine);
    ``host``: the host's seconds to issue (pre_dispatch forward, experts forward, pre_dispatch backward, experts'
    data gradient, their weight gradient), None for a host that never holds the GPU up (module docstring)."""
    pre_f, exp_f = fwd
    pre_dgrad, pre_wgrad, exp_dgrad, exp_wgrad = bwd
    h_pre_f, h_exp_f, h_pre_b, h_exp_d, h_exp_w = host or (0.0,) * 5
    if not delay_wgrad:  # each backward node computes its weight gradients with its data gradients
        pre_dgrad, pre_wgrad, exp_dgrad, exp_wgrad = pre_dgrad + pre_wgrad, 0.0, exp_dgrad + exp_wgrad, 0.0
        h_exp_d, h_exp_w = h_exp_d + h_exp_w, 0.0
    clock = 0.0  # the host, issuing in run()'s order

    def node(ready: float, gpu_s: float, host_s: float) -> float:
        """End of a node whose inputs and stream are free at ``ready``: not before its issue begins + its GPU
        work, nor before its issue ends."""
        nonlocal clock
        begin, clock = clock, clock + host_s
        return max(max(ready, begin) + gpu_s, clock)

    comp = comm = grad = out = 0.0  # streams free; the backward input and the forward input of the next pair ready
    for _ in range(layers):
        combine_b = node(max(comm, grad), a2a_s, 0.0)
        pre_f_end = node(max(comp, out), pre_f, h_pre_f)
        mlp_b = node(max(pre_f_end, combine_b), exp_dgrad, h_exp_d)
        if host is not None:  # the dispatch's host sync on the forward's token counts
            clock = max(clock, pre_f_end)
        dispatch_f = node(max(combine_b, pre_f_end), a2a_s, 0.0)
        mlp_b_dw = node(mlp_b, exp_wgrad, h_exp_w)
        dispatch_b = node(max(dispatch_f, mlp_b), a2a_s, 0.0)
        mlp_f = node(max(mlp_b_dw, dispatch_f), exp_f, h_exp_f)
        combine_f = node(max(dispatch_b, mlp_f), a2a_s, 0.0)
        pre_b = node(max(mlp_f, dispatch_b), pre_dgrad, h_pre_b)
        comp, comm, grad, out = pre_b + pre_wgrad, combine_f, pre_b, combine_f
    return max(comp, comm)


def paired_exposed_s(lt: LayerTime, count: int, fwd_s: float, bwd_s: float, delay_wgrad: bool,
                     host: HostIssue | None = None, waits_s: float = 0.0) -> float:
    """The all-to-all seconds ``count`` MoE layers of time ``lt`` (one layer's forward ``fwd_s``, backward with its
    recompute ``bwd_s``) leave exposed when paired: the attention side is the layer less its routed experts
    (``LayerTime.experts_s``); a weight gradient takes as long as its forward GEMM, as ``layer_passes`` counts.
    ``host``: the issue seconds per node (:func:`paired_layers_s`); ``waits_s``: what one layer already waits for
    its launches beyond ``fwd_s + bwd_s`` (``autotune.cost.launch.launch_exposed_s``), not counted twice."""
    gemm_e, act_f, act_b = lt.experts_s
    exp_f, exp_dgrad, exp_wgrad = gemm_e + act_f, gemm_e + act_b, gemm_e
    pre_wgrad = lt.gemm_s - gemm_e
    pre_dgrad = max(0.0, bwd_s - exp_dgrad - exp_wgrad - pre_wgrad)
    paired = paired_layers_s(count, (fwd_s - exp_f, exp_f), (pre_dgrad, pre_wgrad, exp_dgrad, exp_wgrad),
                             lt.moe_comm_s / 2, delay_wgrad, host)
    return max(0.0, paired - count * (fwd_s + bwd_s + waits_s))


def paired_host_s(model: ModelSpec, plan: ParallelPlan, launch_s: float, fp8_recipe: str | None) -> HostIssue | None:
    """The host's issue seconds per node of one MoE layer (:data:`HostIssue`): the attention side's launches
    (``autotune.cost.launch.layer_launches``: the parts CUDA graphs capture one launch each, the dispatcher's kernels
    with them) and the routed experts' calls (``autotune.cost.expert_host``); None for an engine without a launch
    model."""
    if launch_s <= 0:
        return None
    fwd_n, bwd_n = layer_launches(model, plan, True)
    exp_f, exp_dgrad, exp_wgrad = grouped_mlp_host_parts_s(model, plan, fp8_recipe, launch_s)
    return fwd_n * launch_s, exp_f, bwd_n * launch_s, exp_dgrad, exp_wgrad


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
