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

Not modelled: the other dispatchers (``--moe-token-dispatcher-type allgather``, and ``flex`` with DeepEP or HybridEP,
which send each token once per destination rank or node, in FP8 for dispatch, with the permutations fused into the
communication kernels: NVIDIA's newest recipes run these), the TP all-gather / reduce-scatter of the dispatched
tokens with expert tensor parallelism (token_dispatcher.py:741-751, :824), token dropping (capacity factor). Other
engines' MoE layers are charged the same bytes, an approximation: torchtitan's ``ExpertParallel``
(torchtitan/distributed/expert_parallel.py ``_token_dispatch`` / ``_token_combine``) also sorts the tokens by expert
before its all-to-all and permutes / unpermutes the received ones by local expert around the grouped GEMMs.
"""

from __future__ import annotations

import math

from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["busiest_rank_factor", "dispatch_elements", "router_bytes"]

ROUTER_BYTES = (4 + 4 + 1, 4 + 4 + 4)
"""(forward, backward) HBM bytes per router logit (module docstring)."""


def dispatch_elements(model: ModelSpec, plan: ParallelPlan) -> tuple[float, float]:
    """(elements per token moved by the permutations forward, on the dispatcher's token split; elements per token
    moved by the sorts of the received tokens, which every TP rank runs on the gathered tokens). Backward: the
    same again (module docstring)."""
    moe = model.moe
    assert moe is not None
    h, k = model.hidden_size, moe.top_k
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
