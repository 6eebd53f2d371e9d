"""DeepSpeed ZeRO-3's parameter gathers as its prefetch coordinator issues them: per submodule, not per block.

DeepSpeed 0.19 (deepspeed/runtime/zero/partitioned_param_coordinator.py, ``_fetch_sub_module_impl``, lines
~364-486 at commit edaa722) fetches the parameters of each submodule in its pre-forward (pre-backward) hook and
waits for them; then it prefetches the next parameters of the recorded trace while the numel it has added is below
``min(stage3_max_live_parameters - n_available, stage3_prefetch_bucket_size)`` (``n_available`` counts the
gathered and in-flight parameters: the running submodule's among them). Consequences modelled here:

* a gather hides only behind the compute of the submodules between the one that prefetched it and its own: when
  every weight is larger than the prefetch bucket (5e7, what autotune emits), that is the one previous Linear
  (a 175B layer's fc1 gather, 604M parameters, hides behind the 151M-parameter output projection's GEMM);
* no prefetch follows a submodule whose own parameters reach ``stage3_max_live_parameters`` (1e9 emitted): a
  530B layer's QKV (1.26B) and MLP weights (1.68B each) leave the next gather fully exposed;
* ``stage3_max_reuse_distance`` (``__params_to_release``, lines ~636-664): a parameter is kept when it is used
  again within that many parameters of the trace, so under activation checkpointing the recomputed block's last
  Linear (and any whose reuse comes soon enough) is not gathered again for its backward.

The gathers share the network with the gradient reduce-scatters (``overlap_comm``), so per layer the waits are at
least the network work beyond the layer's compute. The first gather of a pass has nothing to hide behind. Gradients
are reduce-scattered per bucket (deepspeed/runtime/zero/stage3.py ``reduce_independent_p_g_buckets_and_remove_grads``:
the bucket is reduced when the next gradient would take it past ``reduce_bucket_size``); what is left in it when the
backward ends is reduced in ``independent_gradient_partition_epilogue``, which synchronizes the reduce stream: that
last bucket waits.
Dense attention + MLP layers only (``deepspeed_trace`` returns None otherwise; the caller keeps its per-block
model).

DeepSpeed before its coalesced collectives (v0.3.x to v0.5.4: 5ca86ae4e of 2021-04, in v0.3.14, is the code of
the time of Narayanan 2021's ZeRO-3 runs, arXiv v1 2021-04; the gathers changed with #1188, "ZeRO3, improved
parameter all-gather operation", in v0.5.5, the reduce-scatters with coalesced_collectives.py, #1453, in v0.6.0)
gathered and reduced each parameter through a list of one tensor per rank: ``partition_parameters.py``
``_allgather_param`` fills a zeroed full-size buffer, calls ``torch.cuda.synchronize()``, views the buffer as
``world_size`` partitions and passes the list to ``torch.distributed.all_gather``; ``_reduce_scatter_gradient``
passes ``world_size`` views to ``torch.distributed.reduce_scatter``. PyTorch's NCCL process group of that time
(torch/lib/c10d/ProcessGroupNCCL.cpp at 00f5dfd5, ``allgather`` / ``reduce_scatter``) runs a list collective on a
flattened copy: after the all-gather one ``copy_`` per rank out of it, before the reduce-scatter one ``copy_`` per
rank into it. So (``list_collectives``) each collective reads and writes its whole buffer once more in HBM, and
each gather's zero-fill and its ``world_size`` copy kernels come right after a device synchronize, with the GPU
idle: the fill's HBM time and ``world_size`` launches (``KERNEL_LAUNCH_S``, a floor) wait. (The reduce-scatter's
copies are issued from the gradient hook while the layer's backward is still queued: hidden.)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from autotune.cost.flops import layer_flops_per_token
from autotune.engines.facts import KERNEL_LAUNCH_S
from autotune.specs.model import ModelSpec

__all__ = ["TraceEntry", "deepspeed_trace", "trace_waits", "ZeroThreeWaits", "deepspeed_zero3_waits"]


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One step of the coordinator's trace: a submodule's compute and the gather its hook issues."""

    numel: float
    """Its parameters on this GPU (0: the attention core, which has none and whose module fetched nothing)."""
    compute_s: float
    gather_s: float = 0.0
    """0: nothing to gather (no parameters, or kept from an earlier use within the reuse distance)."""
    reduce_s: float = 0.0
    """The reduce-scatter of its gradients, issued after its backward."""


def _forward_pieces(model: ModelSpec, tp: int, seq_len: int) -> list[tuple[float, float]] | None:
    """(parameters per GPU, forward FLOPs per token) of a layer's submodules in forward order: QKV, the attention
    core, output projection, MLP input (fc1, or gate + up), MLP output. None for MoE / MLA layers."""
    if model.is_moe or model.mla is not None:
        return None
    h = model.hidden_size
    qkv = h * (model.q_width + 2 * model.kv_width) / tp
    proj = model.q_width * h / tp
    n_in = 2 if model.gated_mlp else 1
    mlp_in = n_in * h * model.ffn_hidden_size / tp
    mlp_out = model.ffn_hidden_size * h / tp
    core = layer_flops_per_token(model, seq_len).attention / tp
    return [(qkv, 2 * qkv), (0.0, core), (proj, 2 * proj), (mlp_in, 2 * mlp_in), (mlp_out, 2 * mlp_out)]


def deepspeed_trace(model: ModelSpec, tp: int, seq_len: int, *, fwd_s: float, bwd_s: float, rec_s: float,
                    gather_bw_s: float, reduce_bw_s: float, latency_s: float, backward: bool,
                    max_reuse: float) -> list[TraceEntry] | None:
    """One layer's part of the coordinator's trace in a forward pass, or in a backward pass (with activation
    checkpointing, ``rec_s`` > 0: the block's recomputed forward, then its backward). ``fwd_s`` / ``bwd_s`` /
    ``rec_s``: one layer's compute in each, shared by the submodules by their FLOPs; ``gather_bw_s`` /
    ``reduce_bw_s``: one layer's all-gather / reduce-scatter bandwidth time, shared by their parameters;
    ``latency_s``: the ring latency each collective pays. None for MoE / MLA layers."""
    pieces = _forward_pieces(model, tp, seq_len)
    if pieces is None:
        return None
    total_numel = sum(p for p, _ in pieces)
    total_flops = sum(f for _, f in pieces)

    def entry(numel: float, flops: float, seconds: float, gather: bool, reduce: bool) -> TraceEntry:
        share = numel / total_numel
        return TraceEntry(numel, seconds * flops / total_flops,
                          gather_bw_s * share + latency_s if gather and numel > 0 else 0.0,
                          reduce_bw_s * share + latency_s if reduce and numel > 0 else 0.0)

    if not backward:
        return [entry(p, f, fwd_s, True, False) for p, f in pieces]
    reverse = pieces[::-1]
    if rec_s <= 0:
        return [entry(p, f, bwd_s, True, True) for p, f in reverse]
    out = [entry(p, f, rec_s, True, False) for p, f in pieces]
    # The backward use of a weight follows its recomputed use with the later weights in between twice (recomputed,
    # then backward): within max_reuse parameters the gathered copy is kept and not gathered again.
    for i, (p, f) in enumerate(reverse):
        between = 2 * sum(q for q, _ in reverse[:i])
        out.append(entry(p, f, bwd_s, between >= max_reuse, True))
    return out


_LOOKBACK_LAYERS = 8
"""How many layers back a prefetch is looked for: the bucket stops the walk long before for weights of 5e7 / 8."""


def trace_waits(trace: list[TraceEntry], bucket: float, max_live: float) -> tuple[float, float]:
    """(seconds the compute waits for gathers, network seconds) of one layer of a trace that repeats layer after
    layer. An entry's gather was issued by the hook of an earlier submodule j when the numel gathered strictly
    between them is below the prefetch bucket and, with j's own parameters (gathered, so counted as available),
    below max_live; it hides behind the compute from j to it. Per layer the waits are at least the network work
    beyond the compute (all-gathers and reduce-scatters share the links)."""
    n = len(trace)
    waits = 0.0
    for i, e in enumerate(trace):
        if e.gather_s <= 0:
            continue
        window = hidden_by = between = 0.0
        for back in range(1, _LOOKBACK_LAYERS * n + 1):  # up to the same submodule layers back
            j = trace[(i - back) % n]
            window += j.compute_s
            if j.numel > 0 and between < bucket and j.numel + between < max_live:
                hidden_by = window  # j's hook prefetched this entry's parameters
            if j.gather_s > 0:
                between += j.numel
            if between >= bucket:
                break
        waits += max(0.0, e.gather_s - hidden_by)
    network = sum(e.gather_s + e.reduce_s for e in trace)
    compute = sum(e.compute_s for e in trace)
    return max(waits, network - compute), network


@dataclass(frozen=True, slots=True)
class ZeroThreeWaits:
    fwd_wait_s: float
    bwd_wait_s: float
    network_s: float
    """All gathers and reduce-scatters of one micro-batch, hidden or not."""


def deepspeed_zero3_waits(model: ModelSpec, tp: int, seq_len: int, n_layers: int, *, fwd_s: float, bwd_s: float,
                          rec_s: float, gather_bw_s: float, reduce_bw_s: float, latency_s: float, bucket: float,
                          max_live: float, max_reuse: float, reduce_bucket: float,
                          list_collectives: tuple[int, float] | None = None) -> ZeroThreeWaits | None:
    """One micro-batch's gather waits under DeepSpeed ZeRO-3 (module docstring) over ``n_layers`` layers whose
    forward, backward and recompute take ``fwd_s``, ``bwd_s``, ``rec_s`` in all (``rec_s`` 0: no activation
    checkpointing); the stage's gathers and reduce-scatters take ``gather_bw_s`` / ``reduce_bw_s`` of bandwidth
    time, each collective ``latency_s`` more; ``reduce_bucket``: ``reduce_bucket_size``. None where the trace is not
    modelled (MoE, MLA). ``list_collectives``: (ranks, HBM bytes/s) where the collectives go through per-rank
    tensor lists (module docstring)."""
    layers = max(1, n_layers)
    host_s = 0.0
    if list_collectives is not None:
        ranks, hbm = list_collectives
        pieces = _forward_pieces(model, tp, seq_len)
        copy_s = 2 * 2 * sum(p for p, _ in pieces) * layers / hbm if pieces else 0.0  # 16-bit, read + write
        gather_bw_s, reduce_bw_s, host_s = gather_bw_s + copy_s, reduce_bw_s + copy_s, ranks * KERNEL_LAUNCH_S
    common = dict(gather_bw_s=gather_bw_s / layers, reduce_bw_s=reduce_bw_s / layers, latency_s=latency_s,
                  max_reuse=max_reuse)
    fwd = deepspeed_trace(model, tp, seq_len, fwd_s=fwd_s / layers, bwd_s=0.0, rec_s=0.0, backward=False, **common)
    if fwd is None:
        return None
    bwd = deepspeed_trace(model, tp, seq_len, fwd_s=0.0, bwd_s=bwd_s / layers, rec_s=rec_s / layers, backward=True,
                          **common)
    assert bwd is not None
    f_wait, f_net = trace_waits(fwd, bucket, max_live)
    b_wait, b_net = trace_waits(bwd, bucket, max_live)
    first = next((e.gather_s for e in fwd if e.gather_s > 0), 0.0)
    pieces = tuple(e.numel for e in reversed(fwd) if e.numel > 0)  # the order gradients arrive in
    tail = _last_bucket(pieces, layers, reduce_bucket)
    last_reduce = reduce_bw_s * tail / (layers * sum(pieces)) + latency_s if reduce_bw_s > 0 else 0.0
    # The pass's first gather has nothing before it to hide behind; the last reduce-scatter waits at its end.
    # Each gather first zero-fills its full 16-bit buffer, then the device synchronize waits for it.
    f_host, b_host = (sum(host_s + 2 * e.numel / list_collectives[1] for e in trace if e.gather_s > 0)
                      if list_collectives else 0.0 for trace in (fwd, bwd))
    return ZeroThreeWaits(fwd_wait_s=layers * (f_wait + f_host) + min(first, fwd[-1].compute_s),
                          bwd_wait_s=layers * (b_wait + b_host) + last_reduce, network_s=layers * (f_net + b_net))


@functools.lru_cache(maxsize=4096)
def _last_bucket(pieces: tuple[float, ...], n_layers: int, bucket: float) -> float:
    """Gradient elements in DeepSpeed's reduce bucket when the backward ends: ``pieces`` arrive layer after layer;
    the bucket is reduced when the next would take it past ``bucket`` (and it holds something)."""
    held = 0.0
    for _ in range(n_layers):
        for p in pieces:
            if held > 0 and held + p > bucket:
                held = 0.0
            held += p
    return held
