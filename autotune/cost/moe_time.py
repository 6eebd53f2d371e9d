"""What an MoE layer does besides its GEMMs and its all-to-alls, as Megatron-core's all-to-all dispatcher runs it:
the token permutations around the all-to-alls, the router's memory-bound kernels, and the wait for the busiest
expert-parallel rank. :func:`autotune.cost.layer_time.layer_time` adds them to the MoE layer.

Token permutations (Megatron-core ``MoEAlltoAllTokenDispatcher``, megatron/core/transformer/moe/token_dispatcher.py
at d98e8a64: ``dispatch_preprocess`` :624-680 "Permutation 1", ``dispatch_postprocess`` :728-794 "Permutation 2",
``combine_preprocess`` :796-835 the reverse sort, ``combine_postprocess`` :876-900 "Unpermutation 1"), per token
of the layer's input, ``h`` wide, routed to ``k`` experts, 16-bit activations:

* permutation 1 (moe_utils.py ``permute``, fused in Transformer Engine with ``moe_permute_fusion``): each token
  read once and written once per expert it goes to: ``h + k h`` elements;
* permutation 2 (moe_utils.py ``sort_chunks_by_idxs``; only with more than one local expert): the ``k h`` tokens
  this rank received (as many as it sent, routing balanced) read and written in local-expert order: ``2 k h``;
* in combine the reverse sort (``2 k h``) and unpermutation 1 (``unpermute``): each token's ``k`` expert outputs
  read, weighted by their probabilities and summed into one row: ``k h + h``.

So ``2 h + 2 k h (+ 4 k h with local experts to sort)`` elements move forward; the backward runs each op's
transpose (a permute's gradient is an unpermute and the reverse), the same bytes again.

The router (router.py ``TopKRouter.forward`` :845, gating GEMM, then ``routing`` :746: softmax or sigmoid score over
the ``E`` logits, top-k, the routing map and probabilities; ``--moe-router-fusion`` runs them as one kernel): forward
reads the fp32 logits (4 B each; ``moe_router_dtype`` fp32, router.py:107, as Megatron-Bridge 067f987
models/deepseek/deepseek_v3_bridge.py:75 sets it) and writes the fp32 scores
and the boolean routing map (4 + 1 B); backward reads the scores' gradient and the saved scores and writes the
logits' gradient (4 + 4 + 4 B).

Load balance: NVIDIA's Megatron-Bridge performance recipes route with ``moe_router_force_load_balancing`` (e.g.
Megatron-Bridge 067f987 src/megatron/bridge/perf_recipes/deepseek/common.py:37, qwen/gb300/qwen3_moe.py:44,
gpt_oss/gb200/gpt_oss.py:186): Megatron-core replaces the logits by random ones (router.py:861-863,
moe_utils.py:1295 ``apply_random_logits``), so each token picks ``k`` of the ``E`` experts uniformly. A rank's
share is then a sum of independent hypergeometric draws, and every rank waits at the all-to-all for the busiest:
the expected maximum of ``ep`` such sums is about ``mean + sigma sqrt(2 ln ep)`` (the Gaussian maximum bound).
With tokens in the thousands this is a fraction of a percent: balanced routing costs little by itself; a learned
router's imbalance (not benchmarked by NVIDIA) would cost more and is not modelled.

The other dispatchers (``ParallelPlan.moe_dispatcher``, Megatron ``--moe-token-dispatcher-type``; megatron-core
0.19.2 = core_v0.19.0 token_dispatcher.py, per token of the layer's input, ``k`` picks of ``E`` experts):

* ``allgather`` (``MoEAllGatherTokenDispatcher`` :230-370): the routing map (1 B per expert), the fp32 probabilities
  (4 B) and the tokens (2 h B) are all-gathered over the TP x EP group (:278-300), so every rank holds the group's
  ``tokens x ep`` rows; the local experts' rows are permuted out (:317-324: ``2 k h`` elements), their outputs
  unpermuted into the whole gathered shape (:341-348: ``k h`` read, ``ep h`` written), cast to the probabilities'
  fp32 and reduce-scattered back (:357-359: ``ep h`` read at 2 B, written at 4 B; ``4 ep h`` bytes reduce-scattered),
  then cast back (``h`` at 4 B read, 2 B written). No ``permutation 1`` of the all-to-all dispatcher.
* ``flex`` (``MoEFlexTokenDispatcher`` :1743-1800, one group over TP x EP: DeepEP's ``_DeepepManager`` :1216-1460,
  HybridEP's ``_HybridEPManager`` :993-1215): a token goes once to each destination *rank* holding one of its
  experts (each TP rank of it: router_topk = tp k, num_experts = tp E, :1771-1777), not once per expert; across
  NVLink domains once per destination *domain* over RDMA to the peer GPU, which forwards it over NVLink (DeepEP
  README at 567632d "NVLink and RDMA forwarding"; Hybrid-EP docs/Hybrid-EP_Implementation.md:463-464 at 94a9f8f,
  "first performs IB communication between peer GPUs, then each rank distributes the received inter-node data
  locally"). Megatron hands both the 16-bit hidden states (:1309-1318 ``fused_dispatch(hidden_states, ...)``,
  :1139 ``hybrid_ep_dispatch(x=hidden_states)``), so dispatch and combine move 2 h B per row (DeepEP's FP8
  dispatch is DeepSeek's own setting, not Megatron's). The sender's rows go straight from the layer's input (no
  permutation 1; the combine kernel sums each token's returned rows): only the received rows are permuted to
  expert order and back (:1415-1460, ``permute`` / ``unpermute``; HybridEP's unfused default
  ``moe_permute_fusion_into_hybridep`` False, transformer_config.py:875): ``2 (D + k) h`` elements, ``D`` the
  token's distinct destination EP ranks. Under random routing a set of ``m`` experts misses all ``k`` picks with
  probability ``prod_i (E - m - i) / (E - i)``; so ``D = ep (1 - miss(E / ep))`` and the remote domains
  ``(N - 1)(1 - miss(E / N))`` of ``N`` domains.
  Rates, measured (facts, not fitted), the slowest bounding: RDMA at the NIC's line rate (DeepEP README at 567632d: H800 internode
  43-58 GB/s "bottleneck bandwidth (RDMA)" on a ~50 GB/s CX7; Hybrid-EP README_Hybrid-EP.md at 94a9f8f: H100 16
  ranks 8 SMs BF16 dispatch 57.7 GB/s); NVLink at 153/160 of the link (DeepEP README: intranode 153 GB/s on H800's
  ~160 GB/s) for the rows that leave the GPU, and every destination row (its own too: the READMEs' "algorithm" /
  "logical" bandwidth counts them) at the kernel's own rate with the SMs Megatron gives it (README_Hybrid-EP.md, B200 8
  ranks, torch API, BF16: DeepEP dispatch 348 / 494 GB/s and combine 302 / 420 GB/s at 16 / 24 SMs, their mean for
  Megatron's default 20 SMs, transformer_config.py:932-933; HybridEP at 16 SMs dispatch 536, combine 531 GB/s).
  DeepEP's NVLink domain is at most 8 ranks (DeepEP csrc/kernels/configs.cuh:3 ``NUM_MAX_NVL_PEERS 8``; only
  HybridEP spans a multi-node NVLink domain, transformer_config.py:870-873), HybridEP's the node's NVLink domain.

The experts' biases and a clamped GLU (GPT-OSS: ``add_bias_linear`` with experts, ``activation_func_clamp_value`` 7,
Megatron-Bridge 067f987 src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py:62, :83), as Megatron-core's
``TEGroupedMLP`` runs them (megatron-core d98e8a64), in 16-bit elements of the routed rows (``k`` per token):

* fc2's bias (experts.py:236-247 ``skip_bias_add=True``; :1039 ``_apply_bias``): weighted by each row's routing
  probability, the probabilities' sole consumer after the activation, so it cannot join fc2's epilogue. With the
  default ``moe_single_grouped_bias=False`` (transformer_config.py:870) it is the eager path (experts.py:345-380):
  per local expert ``t + b * p`` (the broadcast product written, 2 B; the add reads 2 + 2 and writes 2 B) and a
  ``torch.cat`` of the pieces (read 2, write 2): 12 B per element of fc2's ``h``-wide output, forward. Backward:
  the product's two gradients are reductions of a product with the output gradient (``g * p`` summed over the rows
  for the bias, ``g * b`` over ``h`` for the probability: each reads 2, writes 2, the sum reads 2), and the split's
  gradient concatenates the pieces' (read 2, write 2): 16 B.
* the clamp (fused_bias_geglu.py:410-432 ``weighted_bias_quick_geglu_impl``): before the fused activation kernel,
  the two halves of fc1's output are clamped (each read 2, written 2) and concatenated (read 2, written 2): 8 B per
  element of fc1's ``2 f``-wide output, forward; backward each clamp's gradient masks the incoming one (reads it and
  the saved input, writes: 6 B) and the chunk's gradient concatenates the halves' (read 2, write 2): 10 B. Selective
  ``moe_act`` recompute reruns it with the activation (experts.py:1019-1024 checkpoints ``bias_act_func``).

Where the experts run Transformer Engine's fused grouped MLP instead (the op fuser on the sync-free path of a
whole-iteration graph, MXFP8: ``autotune.cost.fused_grouped_mlp``), the GEMM epilogues take both in and only the
backward's read of fc2's output gradient for its scaled bias remains.

Token dropping (``ParallelPlan.moe_capacity_factor`` C, Megatron ``--moe-expert-capacity-factor``): an expert takes
at most ``ceil(C x tokens x k / E)`` of each rank's routed tokens (moe_utils.py:241-262 ``get_capacity`` at
core_v0.19.0; router.py:788-795 drops the rest by probability), so the busiest rank's rows are capped at C times
the balanced mean (:func:`routed_share`). With ``--moe-pad-expert-input-to-capacity`` every expert gets exactly
that many rows from every rank, padded (token_dispatcher.py:511-531: ``num_out_tokens = capacity x E``, the splits
filled with the capacity on the host): C times the mean whatever the routing, on every rank alike, and no token
counts copied to the host (:func:`static_dispatch`: the sync points of :536-610 are skipped), so the host reaches the
forward experts with the lead it kept over the GPU, which hides that much of their issue time
(``autotune.cost.launch.launch_exposed_s``). Without padding the counts are dynamic
and synced earlier ("before_permutation_1", :538-546): the dropless path's cost, capped.

Not modelled: the TP all-gather / reduce-scatter of the dispatched tokens with expert tensor parallelism in the
all-to-all dispatcher (token_dispatcher.py:741-751, :824), a learned router's imbalance under token dropping (the
busiest rank is at the cap), the paired EP-overlap schedule's forward sync under padding, the dispatchers'
buffers in memory, HybridEP's fused permutation (``--moe-permute-fusion-into-hybridep``). Other
engines' MoE layers are charged the same bytes as Megatron's all-to-all dispatcher, an approximation: torchtitan's
``ExpertParallel`` (torchtitan/distributed/expert_parallel.py ``_token_dispatch`` / ``_token_combine``) also sorts the
tokens by expert before its all-to-all and permutes / unpermutes the received ones by local expert around the
grouped GEMMs.
"""

from __future__ import annotations

import math

from autotune.cost import comm
from autotune.cost.efficiency import Efficiency
from autotune.cost.fused_grouped_mlp import FUSED_FC2_BIAS_GRAD_BYTES
from autotune.specs.hardware import GB, ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["CLAMP_BYTES", "DEEPEP_NVL_PEERS", "EXPERT_BIAS_BYTES", "FLEX_KERNEL_GB_PER_S", "FLEX_NVLINK_FRACTION",
           "busiest_rank_factor", "dispatch_elements", "dispatcher_comm_s", "expert_extra_bytes", "flex_destinations",
           "router_bytes", "routed_share", "static_dispatch"]

ROUTER_BYTES = (4 + 4 + 1, 4 + 4 + 4)
"""(forward, backward) HBM bytes per router logit (module docstring)."""


EXPERT_BIAS_BYTES = (12, 16)
"""(forward, backward) HBM bytes per element of fc2's output for its probability-weighted bias (docstring)."""
CLAMP_BYTES = (8, 10)
"""(forward, backward) HBM bytes per element of fc1's gated output for the clamp around the activation."""


def expert_extra_bytes(model: ModelSpec, fused: bool = False) -> tuple[float, float, float]:
    """(forward, backward, of which the activation's forward) HBM bytes per token of one MoE layer's routed experts
    beyond the GEMMs and the fused activation: the biased fc2's weighted bias add and the clamped GLU (module
    docstring); per token of the layer's input on the experts' TP split (the caller divides by tp). ``fused``:
    the experts run TE's fused grouped MLP (``autotune.cost.fused_grouped_mlp``), whose GEMM epilogues take the
    biases and the clamp in, leaving the backward's one read of fc2's output gradient for its scaled bias."""
    moe = model.moe
    assert moe is not None
    rows = moe.top_k  # routed rows per token
    if fused:
        return 0.0, float(rows * model.hidden_size * FUSED_FC2_BIAS_GRAD_BYTES if model.linear_bias else 0), 0.0
    n_in = 2 if model.gated_mlp else 1
    bias_fwd, bias_bwd = (EXPERT_BIAS_BYTES if model.linear_bias else (0, 0))
    clamp_fwd, clamp_bwd = (CLAMP_BYTES if model.activation_clamp is not None and n_in == 2 else (0, 0))
    fc1_out = n_in * moe.expert_ffn_hidden_size
    act = rows * fc1_out * clamp_fwd
    return (rows * model.hidden_size * bias_fwd + act, rows * model.hidden_size * bias_bwd + rows * fc1_out * clamp_bwd,
            float(act))


FLEX_NVLINK_FRACTION = 153 / 160
"""DeepEP's intranode dispatch on H800: 153 GB/s of ~160 GB/s NVLink (README at 567632d)."""
FLEX_KERNEL_GB_PER_S = {"flex-deepep": ((348 + 494) / 2, (302 + 420) / 2), "flex-hybridep": (536, 531)}
"""(dispatch, combine) GB/s of the flex backends' NVLink kernels with the SMs Megatron gives them (module
docstring: README_Hybrid-EP.md at 94a9f8f, B200, 8 ranks, BF16, torch API)."""
DEEPEP_NVL_PEERS = 8
"""DeepEP's NVLink domain (csrc/kernels/configs.cuh:3 at 567632d ``NUM_MAX_NVL_PEERS``)."""


def _miss(num_experts: int, top_k: int, held: float) -> float:
    """Chance that a token's ``top_k`` uniform picks of ``num_experts`` experts all miss a set of ``held``."""
    out = 1.0
    for i in range(top_k):
        out *= max(0.0, (num_experts - held - i) / (num_experts - i))
    return out


def flex_destinations(num_experts: int, top_k: int, ep: int, domains: int) -> tuple[float, float]:
    """(distinct destination EP ranks, distinct destination NVLink domains other than its own) of one token under
    random routing, ``ep`` ranks in ``domains`` domains (module docstring)."""
    ranks = ep * (1 - _miss(num_experts, top_k, num_experts / ep))
    remote = (domains - 1) * (1 - _miss(num_experts, top_k, num_experts / domains)) if domains > 1 else 0.0
    return ranks, remote


def dispatch_elements(model: ModelSpec, plan: ParallelPlan) -> tuple[float, float]:
    """(elements per token moved by the permutations forward, on the dispatcher's token split; elements per token
    moved by the sorts of the received tokens, which every TP rank runs on the gathered tokens), 16-bit elements
    (fp32 ones count twice). Backward: the same again (module docstring)."""
    moe = model.moe
    assert moe is not None
    h, k = model.hidden_size, moe.top_k
    dispatcher = plan.moe_dispatcher or "alltoall"
    if dispatcher == "allgather":  # cast back after the reduce-scatter; permute, unpermute, fp32 cast of the gathered
        return 3.0 * h, float(2 * k * h + (k * h + plan.ep * h) + 3 * plan.ep * h)
    if dispatcher.startswith("flex"):  # only the received rows, permuted to expert order and back
        ranks, _ = flex_destinations(moe.num_experts, k, plan.ep, 1)
        return 0.0, 2 * (ranks + k) * h
    local_experts = moe.num_experts // max(1, plan.ep)
    permutes = 2 * h + 2 * k * h
    sorts = 4 * k * h if local_experts > 1 else 0
    return float(permutes), float(sorts)


def router_bytes(model: ModelSpec) -> tuple[float, float]:
    """(forward, backward) HBM bytes per token of the router's score, top-k and routing-map kernels."""
    moe = model.moe
    assert moe is not None
    return ROUTER_BYTES[0] * moe.num_experts, ROUTER_BYTES[1] * moe.num_experts


def busiest_rank_factor(tokens: float, ep: int, num_experts: int, top_k: int) -> float:
    """The busiest expert-parallel rank's routed tokens over the mean, under uniform random routing (each of the
    ``ep`` ranks' ``tokens`` tokens picks ``top_k`` of ``num_experts`` experts; a rank holds ``num_experts / ep``):
    1 + sigma sqrt(2 ln ep) / mean (module docstring)."""
    if ep <= 1 or tokens <= 0:
        return 1.0
    share = (num_experts / ep) / num_experts  # a rank's share of the experts
    # hypergeometric variance of one token's picks landing on the rank
    var_one = top_k * share * (1 - share) * (num_experts - top_k) / max(1, num_experts - 1)
    mean = tokens * ep * top_k * share
    sigma = math.sqrt(tokens * ep * var_one)
    return 1.0 + sigma * math.sqrt(2 * math.log(ep)) / mean


def routed_share(plan: ParallelPlan, busiest: float = 1.0) -> float:
    """The rows a rank's experts run over the balanced mean, given the dropless ``busiest`` share: the capacity factor
    with padding, capped at it without, ``busiest`` dropless (module docstring, "Token dropping")."""
    factor = plan.moe_capacity_factor
    if factor is None:
        return busiest
    return factor if plan.moe_pad_to_capacity else min(busiest, factor)


def static_dispatch(plan: ParallelPlan) -> bool:
    """The all-to-all dispatcher with every expert's input padded to its capacity: static splits, no host sync."""
    return bool(plan.moe_pad_to_capacity) and plan.moe_capacity_factor is not None and plan.moe_dispatcher in (
        None, "alltoall")


def dispatcher_comm_s(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, eff: Efficiency,
                      tokens: float) -> float:
    """One MoE layer's forward dispatch and combine seconds on the plan's dispatcher for ``tokens`` tokens of the
    layer's input (before the sequence-parallel split), the balanced routing's mean (module docstring)."""
    moe = model.moe
    assert moe is not None
    # the dispatcher's "tp" is the expert tensor-parallel group (token_dispatcher.py:84-89 at d98e8a64: expt_tp,
    # tp_ep); the tokens arrive split over the attention's tp by sequence parallelism
    h, k, t, ep = model.hidden_size, moe.top_k, plan.expert_tp, plan.ep
    t_seq = plan.tp if plan.sequence_parallel else 1
    dispatcher = plan.moe_dispatcher or "alltoall"
    if ep <= 1:
        return 0.0
    if dispatcher == "alltoall":
        # the EP ranks lie etp apart: Megatron builds the expert grid from etp, ep, edp, pp without cp
        # (megatron/core/parallel_state.py:887-895, order tp-ep-dp-pp), so with parallel folding (etp 1) an EP group
        # is ep neighbouring ranks whatever tp and cp are
        link = comm.group_link(cluster, eff, ep, plan.expert_tp)
        return 2 * comm.all_to_all_s(tokens * k * h * 2 / t_seq, ep, link)
    n = t * ep  # the TP x EP group (token_dispatcher.py:278-300, :1743-1800): etp x ep neighbouring ranks of the
    link = comm.group_link(cluster, eff, n, 1)  # expert grid, which has no cp (parallel_state.py:887-895)
    if dispatcher == "allgather":
        rows = tokens / t_seq * n  # every rank's gathered rows
        return (comm.all_gather_s(rows * (2 * h + 5 * moe.num_experts), n, link)
                + comm.reduce_scatter_s(rows * 4 * h, n, link))
    domain = cluster.gpus_per_node if dispatcher == "flex-hybridep" else min(DEEPEP_NVL_PEERS, cluster.gpus_per_node)
    per_domain = max(1, min(n, domain))
    domains = max(1, math.ceil(n / per_domain))
    ranks, remote = flex_destinations(moe.num_experts, k, ep, domains)
    rows = tokens / t_seq
    # The kernels' measured rates count every destination row, the local one too (DeepEP README: "logical
    # bandwidth ... contains local rank traffic"); the link carries all but the sender's (or relay's) own.
    copies = rows * ranks * t * 2 * h
    nvlink = cluster.intra_node_bandwidth_gb_per_s * FLEX_NVLINK_FRACTION * GB
    nic = cluster.inter_node_bandwidth_gb_per_s * GB
    out = 0.0
    for kernel_gb_per_s in FLEX_KERNEL_GB_PER_S[dispatcher]:  # dispatch, then combine
        out += max(copies / (kernel_gb_per_s * GB), copies * (1 - 1 / per_domain) / nvlink,
                   rows * remote * 2 * h / nic if nic > 0 else 0.0) + link.latency_s
    return out
