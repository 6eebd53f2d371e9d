"""Context parallelism as each engine runs it: the KV exchange of its attention, what of it hides behind each step's
attention kernel, the merges of the partial results, and the buffers it holds.

With ``cp`` ranks each holding ``s / cp`` tokens, causal attention is split into ``cp`` steps per pass. Every engine
modelled here balances the causal mask (each rank holds chunk ``r`` and chunk ``2cp - 1 - r`` of ``2cp``: torch's
head-tail ``_HeadTailLoadBalancer`` / ``_is_causal_behavior``, Megatron's ``get_batch_on_this_cp_rank``), so each
step computes the same half-square ``(s/cp) x (s/cp) / 2`` block: a step's kernel is ``1/cp`` of the rank's attention
(``attention_s / cp``), and only the communication issued during that kernel can hide behind it. The kinds
(``CommSchedule.cp_kind``):

* ``"p2p"``: Megatron-core ``--cp-comm-type p2p`` (its default), Transformer Engine ``AttnFuncWithCPAndKVP2P``
  (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py): forward, ``cp - 1`` send/recv of
  the K and V chunk, each issued before the step whose kernel hides it; backward, ``cp`` steps whose exchange carries
  the next K/V chunk and the running dK/dV together in the K/V dtype (``p2p_comm_buffers[i % 2]`` of shape
  ``(2, *kv.shape)``: step 0 K/V only, the last dK/dV only). Two such buffers in flight. The partial outputs are
  merged by fused corrections (``flash_attn_fwd_out_correction``). TransformerEngine d0067d0.
* ``"allgather"``: torch ``context_parallel`` (torchtitan; torch 2.13 torch/distributed/tensor/experimental/
  _context_parallel/_attention.py, the same in torch 2.7's experimental/_attention.py:
  ``_ContextParallelOptions.rotate_method = ALL_GATHER``; torchtitan v0.2.2 config/job_config.py:446
  ``context_parallel_rotate_method = "allgather"``): one all-gather of every rank's K and V (the whole sequence's)
  issued before step 0 and waited before step 1, so only step 0's kernel hides it, in forward and again in backward
  (``_templated_ring_attention_backward``'s ``kv_rotater``); the backward passes the dK/dV accumulators ring-wise in
  fp32 (``dkv_rotater`` is ``ALL_TO_ALL``, ``accum_dtype`` float32 under ``convert_to_f32``), each exchange waited
  after the next step's kernel and the last one after the loop (exposed). The merges are eager fp32 ops
  (``_SDPAMerger._merge_one``, ``_partial_update``'s ``torch.cat``).
* ``"ulysses"``: DeepSpeed ``DistributedAttention`` (deepspeed/sequence/layer.py ``_SeqAllToAll``): Q, K and V
  all-to-all'ed from sequence to head sharding before the (unsplit) attention kernel and the output back after it,
  the reverse in backward, on the compute stream (nothing hides). Megatron ``--cp-comm-type a2a`` runs the same
  exchange (TE ``AttnFuncWithCPAndQKVOA2A``).
* ``"te-allgather"``: Megatron ``--cp-comm-type allgather``, TE ``AttnFuncWithCPAndKVAllGather`` (context_parallel.py
  :3014, "KV all-gather between CP ranks is exposed"): forward K and V all-gathered before the two local chunks'
  kernels; backward gathered again and dK/dV reduce-scattered after the kernels; nothing hides, no output merges.
* ``"a2a+p2p"``: Megatron ``--cp-comm-type a2a+p2p``: the all-to-all among adjacent CP ranks inside a node, then the
  ``p2p`` ring across the rest (``autotune.specs.context_parallel``).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.cost import comm
from autotune.cost.efficiency import Efficiency
from autotune.specs.context_parallel import hierarchical_cp_sizes
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["CP_KINDS", "COMM_TYPE_KINDS", "RingTime", "cp_kind", "ring_time", "ring_transient_bytes"]

CP_KINDS = ("p2p", "allgather", "ulysses", "te-allgather", "a2a+p2p")
COMM_TYPE_KINDS = {"p2p": "p2p", "a2a": "ulysses", "allgather": "te-allgather", "a2a+p2p": "a2a+p2p"}
"""The kind each Megatron ``--cp-comm-type`` runs (``ParallelPlan.cp_comm_type``): Transformer Engine's a2a moves
what DeepSpeed's Ulysses does (Q, K, V to head sharding before the kernel, the output back, on the compute stream:
context_parallel.py ``AttnFuncWithCPAndQKVOA2A`` :4170, ``flash_attn_a2a_communicate`` :387)."""

# HBM bytes per element of the rank's attention output (q) or of its K and V chunk (kv) that the merges move.
# torch (eager, fp32 under convert_to_f32; _SDPAMerger.step / _merge_one, _templated_ring_attention_backward):
#   forward: step 0 out.to(f32) (read 2, write 4); each later step block_out.to(f32) 6, ``out - block_out`` 12,
#   ``sigmoid(dlse) * diff`` 8, ``out - ...`` 12 = 38; results().to(bf16) 6. Every step but the last concatenates
#   K and V for the rotater (``torch.cat([key.flatten(), value.flatten()])``: read 2, write 2 per kv element).
#   backward: zeros_like fp32 accumulators (write 4 per q and kv element); each step ``grad_query += `` (read 4 + 2,
#   write 4 = 10 per q); dK/dV: step 0 ``+=`` 10, later steps ``_partial_update(add=True)`` on half (5) and its
#   ``torch.cat`` (read 4, write 4), then ``torch.cat`` into the fp32 send buffer (8); the K/V rotater's cat (4)
#   every step but the last; the final ``.to(bf16)`` of dQ (6) and dK/dV (6).
# TE (fused kernels, flash_attn_fwd_out_correction / _init, run after the ring loop on the compute stream, so
#   exposed): forward each later step reads the step's 16-bit out and updates the fp32 sum (read 2 + 4, write 4 =
#   10), step 0 initialises it (6), the final cast 6; backward each later step adds its dQ and dK/dV into the 16-bit
#   accumulators (read 2 + 2, write 2 = 6).
_TORCH_FWD_Q = (6.0 + 6.0, 38.0)  # (once, per later step)
_TORCH_FWD_KV = 4.0  # per step but the last
_TORCH_BWD_Q = (4.0 + 6.0, 10.0)  # (once, per step)
# (zeros, step 0's add and send cat, the final cast; each later step)
_TORCH_BWD_KV = (4.0 + 10.0 + 8.0 + 6.0, 13.0 + 8.0 + 4.0)
_TE_FWD_Q = (6.0 + 6.0, 10.0)
_TE_BWD = 6.0
# TE all_gather (context_parallel.py ``AttnFuncWithCPAndKVAllGather`` :3014 at d0067d0), per element of one rank's K/V
# times cp (the gathered size): forward the gathered K/V reordered to sequence order (``index_select``: read 2, write
# 2); backward the same reorder of the K/V gathered again (4), each of the two chunks' dK/dV added into the
# whole-sequence accumulators (``dk.add_``, together about one whole sequence: read 2 + 2, write 2) and the
# accumulators reordered back before the reduce-scatter (4).
_TE_AG_FWD = 4.0
_TE_AG_BWD = 4.0 + 6.0 + 4.0


@dataclass(frozen=True, slots=True)
class RingTime:
    """One layer, one micro-batch: context-parallel communication of one forward pass and of the backward, what
    waits and what hides behind the attention kernels, and the merges' memory-bound seconds."""

    fwd_exposed_s: float = 0.0
    fwd_hidden_s: float = 0.0
    bwd_exposed_s: float = 0.0
    bwd_hidden_s: float = 0.0
    merge_fwd_s: float = 0.0
    merge_bwd_s: float = 0.0

    @property
    def comm_s(self) -> float:
        """All of one forward's and the backward's context-parallel communication."""
        return self.fwd_exposed_s + self.fwd_hidden_s + self.bwd_exposed_s + self.bwd_hidden_s


def _behind(comm_s: float, kernel_s: float) -> tuple[float, float]:
    """(exposed, hidden) of ``comm_s`` issued before a kernel of ``kernel_s`` and waited after it."""
    exposed = max(0.0, comm_s - kernel_s)
    return exposed, comm_s - exposed


def kv_width(model: ModelSpec, repeat_kv: bool) -> float:
    """Width of the K (or V) tensor the attention op receives: the KV heads, or every query head where the model
    code repeats K and V before SDPA (torchtitan's ``repeat_kv``)."""
    return model.q_width if repeat_kv else model.kv_width


def cp_kind(plan: ParallelPlan, engine_kind: str | None) -> str | None:
    """How the plan's context parallelism runs: its ``cp_comm_type`` where it sets one, else the engine's kind."""
    return engine_kind if plan.cp_comm_type is None else COMM_TYPE_KINDS[plan.cp_comm_type]


def _ulysses_s(q_elems: float, kv_elems: float, size: int, link: comm.Link) -> float:
    """One pass's all-to-alls of Q, K, V and of the output over ``size`` ranks (16-bit)."""
    return comm.all_to_all_s((q_elems + kv_elems) * 2, size, link) + comm.all_to_all_s(q_elems * 2, size, link)


def ring_time(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, eff: Efficiency, hbm: float,
              attention_s: float, attention_bwd_s: float, kind: str, repeat_kv: bool = False) -> RingTime:
    """The context-parallel terms of one layer (module docstring); ``attention_s`` / ``attention_bwd_s``: the rank's
    forward / backward attention kernel time."""
    cp, t = plan.cp, plan.tp
    if cp <= 1:
        return RingTime()
    tokens = plan.seq_len * plan.micro_batch_size / cp
    q_elems = tokens * model.q_width / t
    kv_elems = tokens * 2 * kv_width(model, repeat_kv) / t  # K and V
    kv_bytes = kv_elems * 2  # 16-bit
    link = comm.group_link(cluster, eff, cp, t)  # cp ranks tp apart (Megatron and torchtitan mesh order)
    if kind == "ulysses":
        a2a = _ulysses_s(q_elems, kv_elems, cp, link)
        return RingTime(fwd_exposed_s=a2a, bwd_exposed_s=a2a)
    if kind == "te-allgather":  # gathered K/V forward and again backward, dK/dV reduce-scattered: all exposed
        gather = comm.all_gather_s(kv_bytes * cp, cp, link)
        scatter = comm.reduce_scatter_s(kv_bytes * cp, cp, link)
        return RingTime(fwd_exposed_s=gather, bwd_exposed_s=gather + scatter,
                        merge_fwd_s=kv_elems * cp * _TE_AG_FWD / hbm, merge_bwd_s=kv_elems * cp * _TE_AG_BWD / hbm)
    a2a = 0.0
    if kind == "a2a+p2p":  # the all-to-all inside the node, then the ring across nodes on the gathered sequence
        inner, cp = hierarchical_cp_sizes(cp, t, cluster.gpus_per_node)
        a2a = _ulysses_s(q_elems, kv_elems, inner, comm.group_link(cluster, eff, inner, t)) if inner > 1 else 0.0
        link = comm.group_link(cluster, eff, cp, t * inner)
        if cp <= 1:
            return RingTime(fwd_exposed_s=a2a, bwd_exposed_s=a2a)
    step_f = attention_s / cp
    step_b = attention_bwd_s / cp
    fe = fh = be = bh = 0.0
    if kind == "allgather":
        fe, fh = _behind(comm.all_gather_s(kv_bytes * cp, cp, link), step_f)
        be, bh = _behind(comm.all_gather_s(kv_bytes * cp, cp, link), step_b)
        dkv = comm.p2p_s(kv_elems * 4, link)  # fp32 accumulators, one permute per step
        e, h = _behind(dkv, step_b)
        be, bh = be + (cp - 1) * e + dkv, bh + (cp - 1) * h
        once, later = _TORCH_FWD_Q
        merge_f = q_elems * (once + (cp - 1) * later) + kv_elems * (cp - 1) * _TORCH_FWD_KV
        once, per = _TORCH_BWD_Q
        kv_once, kv_later = _TORCH_BWD_KV
        merge_b = q_elems * (once + cp * per) + kv_elems * (kv_once + (cp - 1) * kv_later)
    else:  # "p2p", or the ring of "a2a+p2p"
        one = comm.p2p_s(kv_bytes, link)
        e, h = _behind(one, step_f)
        fe, fh = (cp - 1) * e, (cp - 1) * h
        # backward: K/V only at step 0, K/V with dK/dV at the middle steps, dK/dV only at the last
        for step_comm in [one] + [comm.p2p_s(2 * kv_bytes, link)] * (cp - 2) + [one]:
            e, h = _behind(step_comm, step_b)
            be, bh = be + e, bh + h
        once, later = _TE_FWD_Q
        merge_f = q_elems * (once + (cp - 1) * later)
        merge_b = (q_elems + kv_elems) * (cp - 1) * _TE_BWD
    return RingTime(fe + a2a, fh, be + a2a, bh, merge_f / hbm, merge_b / hbm)


_transient_cache: dict[tuple, tuple[ModelSpec, float]] = {}


def ring_transient_bytes(model: ModelSpec, plan: ParallelPlan, kind: str, repeat_kv: bool = False,
                         gpus_per_node: int = 8) -> float:
    """:func:`_ring_transient_bytes`, cached over the plan fields it reads (cp, tp, the sequence and the micro-batch):
    the ledger asks it for every pipeline stage of every layout, virtual-stage count and recompute mode, ~10^4 times
    a search with ~10^2 distinct answers. Keyed by the model's id (it hashes slowly); each entry keeps its model, so
    a reused id cannot match."""
    key = (id(model), plan.cp, plan.tp, plan.seq_len, plan.micro_batch_size, kind, repeat_kv, gpus_per_node)
    hit = _transient_cache.get(key)
    if hit is None or hit[0] is not model:
        if len(_transient_cache) > 4096:
            _transient_cache.clear()
        hit = _transient_cache[key] = (model, _ring_transient_bytes(model, plan, kind, repeat_kv, gpus_per_node))
    return hit[1]


def _ring_transient_bytes(model: ModelSpec, plan: ParallelPlan, kind: str, repeat_kv: bool = False,
                          gpus_per_node: int = 8) -> float:
    """Bytes one layer's context-parallel attention holds beyond the saved activations while it runs (the larger of
    its forward and its backward; one layer at a time, so once per GPU).

    * allgather: the gathered K and V of the whole sequence (``cp`` chunks, 16-bit); forward the fp32 running
      output and one fp32 temporary of the merge; backward the fp32 dQ/dK/dV accumulators and two fp32 dK/dV buffers
      in flight (the one sent, the one received).
    * te-allgather: forward the gathered K and V (16-bit); backward those again, the whole sequence's dK/dV and
      its reordered copy before the reduce-scatter (context_parallel.py ``AttnFuncWithCPAndKVAllGather.backward``).
    * p2p: forward every step's received K/V chunk and every step's 16-bit partial output (``p2p_comm_buffers`` and
      ``out_per_step``, lists of ``cp`` kept until the loop ends: the outputs are corrected after it,
      context_parallel.py ``AttnFuncWithCPAndKVP2P.forward``) and the fp32 merged output; backward two
      ``(2, *kv.shape)`` buffers (K/V and dK/dV each) and the 16-bit dQ and dK/dV.
    * ulysses: the head-sharded Q, K, V and output of the whole sequence (the all-to-all's outputs), 16-bit.
    * a2a+p2p: the all-to-all's outputs, then the ring's buffers over the ring's ranks (``gpus_per_node`` sets the
      split, :func:`autotune.specs.context_parallel.hierarchical_cp_sizes`).
    """
    cp, t = plan.cp, plan.tp
    if cp <= 1:
        return 0.0
    tokens = plan.seq_len * plan.micro_batch_size / cp
    q_elems = tokens * model.q_width / t
    kv_elems = tokens * 2 * kv_width(model, repeat_kv) / t
    a2a_out = (2 * q_elems + kv_elems) * 2
    if kind == "ulysses":
        return a2a_out
    if kind == "allgather":
        gathered = kv_elems * cp * 2
        fwd = gathered + 2 * q_elems * 4
        bwd = gathered + (q_elems + kv_elems) * 4 + 2 * kv_elems * 4
        return max(fwd, bwd)
    if kind == "te-allgather":
        return 3 * kv_elems * cp * 2
    extra = 0.0
    if kind == "a2a+p2p":
        inner, cp = hierarchical_cp_sizes(cp, t, gpus_per_node)
        extra = a2a_out if inner > 1 else 0.0
        if cp <= 1:
            return extra
    fwd = cp * kv_elems * 2 + cp * q_elems * 2 + q_elems * 4
    bwd = 2 * 2 * kv_elems * 2 + (q_elems + kv_elems) * 2
    return extra + max(fwd, bwd)
