"""Step time of one plan: compute, exposed communication, pipeline bubble, offload, optimizer.

The slowest pipeline stage sets the pace. One micro-batch on one stage takes
``t_mb = compute + TP collectives + exposed CP ring + MoE all-to-all + exposed ZeRO-3 gathers``;
a step runs ``m`` of them plus the 1F1B bubble of ``(pp-1)/vpp`` micro-batches (Narayanan et
al. 2021, Sec. 2.2), plus the pipeline sends, the data-parallel gradient reduction that the
last backward could not hide, the offload traffic and the optimizer update.

Compute is GEMM FLOPs at the GPU's measured, shape-dependent rate (``autotune.cost.kernels``), fused
attention at its kernel's rate, memory-bound kernels (and FP8 casts) at HBM speed (bytes counted below).
How communication overlaps is the engine's (``Engine.comm``): ZeRO-3 / FSDP gather each block's weights
``prefetch_layers`` ahead (only what the running block cannot hide waits), gradients reduce per bucket or
per block, TP collectives overlap GEMMs with ``--tp-comm-overlap`` / async TP. Hidden communication still
costs ``overlap_cost`` of its time (NCCL kernels share the SMs and HBM).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from autotune.cost import comm
from autotune.cost.efficiency import DEFAULT_EFFICIENCY, Efficiency
from autotune.cost.flops import logits_flops_per_token, step_flops
from autotune.cost.kernels import FP8_RECIPES, Rates, rates
from autotune.cost.memory import split_scheme, stage_param_groups
from autotune.engines import engine_for
from autotune.specs.hardware import GB, ClusterSpec
from autotune.specs.layout import representative_stages, stage_layers
from autotune.specs.model import ModelSpec
from autotune.specs.plan import OPTIMIZER_STATE_BYTES, ParallelPlan

__all__ = ["TimeSettings", "StepTimeEstimate", "estimate_step_time"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeSettings:
    efficiency: Efficiency = DEFAULT_EFFICIENCY
    host_memory_bandwidth_gb_per_s_per_node: float = 200.0
    """Achievable DRAM bandwidth of a node's CPUs, which CPU Adam (memory-bound) shares."""
    fp8_recipe: str | None = None
    """FP8 scaling recipe (``autotune.cost.kernels.FP8_RECIPES``); None: the engine's default."""
    tp_overlap: str | None = None
    """"none", "userbuffers" or "async-tp"; None: the engine's default."""
    torch_compile: bool = False
    """torch.compile on (torchtitan ``--compile``): inductor fuses the elementwise chains (half the bytes)."""

    def __post_init__(self) -> None:
        from autotune.errors import require_no_problems

        problems = []
        if self.fp8_recipe is not None and self.fp8_recipe not in FP8_RECIPES:
            problems.append(f"fp8_recipe must be one of {', '.join(FP8_RECIPES)}, got {self.fp8_recipe!r}")
        if self.tp_overlap not in (None, "none", "userbuffers", "async-tp"):
            problems.append(f"tp_overlap must be none, userbuffers or async-tp, got {self.tp_overlap!r}")
        require_no_problems(problems, subject="time settings")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTimeEstimate:
    """The contract's ``time`` block (seconds, per step)."""

    step_time_s: float
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    offload_s: float
    optimizer_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    comm_parts_s: dict[str, float] = field(default_factory=dict)
    """Exposed communication by kind: tp, cp, moe, pp, dp, zero3."""

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("step_time_s", "compute_s", "exposed_comm_s", "bubble_s", "offload_s",
                                              "optimizer_s", "tokens_per_s", "model_tflops_per_gpu",
                                              "hardware_tflops_per_gpu", "mfu", "hfu")}
        out["comm_parts_s"] = dict(self.comm_parts_s)
        return out


@dataclass(frozen=True, slots=True)
class _LayerTime:
    """Forward seconds of one layer for one micro-batch on one GPU, by part, and its TP/CP/MoE traffic."""

    gemm_s: float
    attention_s: float
    elementwise_s: float
    tp_comm_s: float
    cp_comm_s: float
    moe_comm_s: float


@functools.lru_cache(maxsize=8192)
def _layer_time(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, moe_layer: bool,
                eff: Efficiency, r: Rates, compiled: bool) -> _LayerTime:
    h, t, s = model.hidden_size, plan.tp, plan.seq_len
    tokens = s * plan.micro_batch_size / plan.cp
    hbm = r.hbm
    t_seq = t if plan.sequence_parallel else 1
    n_in = 2 if model.activation == "swiglu" else 1

    def _gemm_s(flops, m, k, n, peak, eff_):  # linear layers at the plan's precision, the router in 16-bit
        del eff_
        return r.linear_s(flops, m, k, n) if peak == "linear" else r.bf16_s(flops, m, k, n)

    gemm_peak, bf16_peak = "linear", "bf16"
    qkv = model.q_width + 2 * model.kv_width
    gemm = _gemm_s(2 * tokens * h * qkv / t, tokens, h, qkv / t, gemm_peak, eff)
    gemm += _gemm_s(2 * tokens * model.attention_output_width * h / t, tokens, model.attention_output_width / t, h,
                    gemm_peak, eff)
    # FP8: every linear GEMM casts its inputs (forward: activations; the weights once per micro-batch) and, in
    # backward, its output gradients; widths summed over the layer's linear layers, per token.
    cast_width = h + model.attention_output_width + qkv + h
    if moe_layer:
        moe = model.moe
        assert moe is not None
        f = moe.expert_ffn_hidden_size
        m_expert = tokens * moe.top_k * plan.ep / moe.num_experts
        pairs = tokens * moe.top_k
        gemm += _gemm_s(2 * pairs * h * n_in * f / t, m_expert, h, n_in * f / t, gemm_peak, eff)
        gemm += _gemm_s(2 * pairs * f * h / t, m_expert, f / t, h, gemm_peak, eff)
        gemm += _gemm_s(2 * tokens * h * moe.num_experts, tokens, h, moe.num_experts, bf16_peak, eff)
        for _ in range(moe.num_shared_experts):
            fs = moe.shared_width
            gemm += _gemm_s(2 * tokens * h * (n_in + 1) * fs / t, tokens, h, fs / t, gemm_peak, eff)
        ffn_width = moe.top_k * f + moe.num_shared_experts * moe.shared_width
        cast_width += moe.top_k * (h + f + n_in * f + h)
    else:
        f = model.ffn_hidden_size
        gemm += _gemm_s(2 * tokens * h * n_in * f / t, tokens, h, n_in * f / t, gemm_peak, eff)
        gemm += _gemm_s(2 * tokens * f * h / t, tokens, f / t, h, gemm_peak, eff)
        ffn_width = f
        cast_width += h + f + n_in * f + h

    # Attention core: the full-square FLOPs, of which a causal flash kernel executes half, at the fused kernel's
    # rate; unfused attention runs batched GEMMs of head_dim depth.
    head_dim = model.q_width / model.num_attention_heads
    core_flops = 2 * tokens * s * (model.q_width + model.attention_output_width) / t
    if plan.flash_attention:
        attention = core_flops / 2 / r.attention
    else:
        attention = _gemm_s(core_flops, s / plan.cp, head_dim, s, bf16_peak, eff)

    # Elementwise bytes per token, forward: norms (read+write 2h each), two bias-dropout-residual adds
    # (read 2 x 2h, write 2h), the activation (read fc1 out, write fc2 in), RoPE on q and k,
    # and for unfused attention the scaled-masked softmax (+ dropout) over the s x s scores.
    residual = model.norms_per_layer * 4 * h + 2 * 6 * h + (2 * h if model.dropout > 0 else 0)
    width = ffn_width * (2 * n_in + 2)
    if model.position_embedding == "rope":
        width += 4 * (model.q_width + model.kv_width)
    if not plan.flash_attention:
        width += (9 if model.dropout > 0 else 4) * model.num_attention_heads * s
    elementwise = tokens * (residual / t_seq + width / t) / hbm * (0.5 if compiled else 1.0)
    if r.cast_bytes:
        elementwise += tokens * cast_width / t * r.cast_bytes / 2 / hbm  # forward half; backward adds the other

    # Tensor-parallel collectives: two per layer forward (all-reduce, or all-gather + reduce-scatter with SP).
    tp_link = comm.group_link(cluster, eff, t, 1)  # per ring step latency: the GPU's kernel facts
    tp_comm = 2 * comm.all_reduce_s(tokens * h * 2, t, tp_link)
    # Context-parallel ring: cp-1 exchanges of this rank's K and V chunk.
    cp_comm = 0.0
    if plan.cp > 1:
        cp_link = comm.group_link(cluster, eff, plan.cp, t)
        cp_comm = (plan.cp - 1) * comm.p2p_s(tokens * 2 * model.kv_width * 2 / t, cp_link)
    moe_comm = 0.0
    if moe_layer and plan.ep > 1:
        moe = model.moe
        assert moe is not None
        ep_link = comm.group_link(cluster, eff, plan.ep, t * plan.cp)
        moe_comm = 2 * comm.all_to_all_s(tokens * moe.top_k * h * 2 / t_seq, plan.ep, ep_link)
    return _LayerTime(gemm, attention, elementwise, tp_comm, cp_comm, moe_comm)


def _stage_layer_counts(model: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[int, int]:
    """(dense layers, MoE layers) of a pipeline stage (MoE layers follow the leading dense ones)."""
    first, per_stage = stage_layers(model.num_layers, plan.pp, stage, split_scheme(plan))
    moe = 0 if model.moe is None else max(0, first + per_stage - max(first, model.moe.num_dense_layers))
    return per_stage - moe, moe


def _time_key(plan: ParallelPlan) -> ParallelPlan:
    """The plan reduced to the fields one layer's time depends on (a cache key)."""
    return ParallelPlan(seq_len=plan.seq_len, cp=plan.cp, micro_batch_size=plan.micro_batch_size, tp=plan.tp,
                        ep=plan.ep, sequence_parallel=plan.sequence_parallel, precision=plan.precision,
                        flash_attention=plan.flash_attention)


def estimate_step_time(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                       settings: TimeSettings | None = None, *, stage_params: tuple[float, float] | None = None
                       ) -> StepTimeEstimate:
    """Step time of a valid plan. ``stage_params``: (dense, expert) parameters per GPU of the
    largest stage, if the caller already has them (the ledger does)."""
    settings = settings or TimeSettings()
    eff = settings.efficiency
    engine = engine_for(plan)
    sched = engine.comm
    t = plan.tp
    tokens = plan.seq_len * plan.micro_batch_size / plan.cp
    key = _time_key(plan)
    r = rates(cluster, plan.precision, eff, sched.attention_kernel, settings.fp8_recipe or sched.fp8_recipe)
    dense_layer = _layer_time(model, cluster, key, False, eff, r, settings.torch_compile)
    moe_layer = _layer_time(model, cluster, key, True, eff, r, settings.torch_compile) if model.is_moe else dense_layer
    hbm = r.hbm
    attn_bwd = 2.5 if plan.flash_attention else 2.0  # flash backward recomputes the scores (5 vs 2 GEMMs)
    tp_overlap = settings.tp_overlap or sched.tp_overlap
    hidden = 0.0  # communication hidden behind compute, per micro-batch (costs overlap_cost of its time)

    # Per micro-batch, per stage: forward, backward, recompute, and the collectives on the critical path.
    worst = None
    for stage in representative_stages(model.num_layers, plan.pp, split_scheme(plan)):
        n_dense, n_moe = _stage_layer_counts(model, plan, stage)
        n_layers = n_dense + n_moe
        rec_share = 1.0 if plan.recompute_num_layers is None else min(1.0, plan.recompute_num_layers / n_layers)
        fwd = bwd = rec = tp_c = cp_c = moe_c = tp_hidden = 0.0
        for count, lt in ((n_dense, dense_layer), (n_moe, moe_layer)):
            if not count:
                continue
            layer_fwd = lt.gemm_s + lt.attention_s + lt.elementwise_s
            fwd += count * layer_fwd
            bwd += count * (2 * lt.gemm_s + attn_bwd * lt.attention_s + 2 * lt.elementwise_s)
            if plan.recompute == "full":
                rec += count * layer_fwd * rec_share
            elif plan.recompute == "selective":
                rec += count * lt.attention_s
            passes = 2 + (rec_share if plan.recompute == "full" else 0)
            tp_total = lt.tp_comm_s * passes
            if tp_overlap != "none" and t > 1:  # collectives chunked behind the GEMMs that need them
                exposed = max(0.0, tp_total - lt.gemm_s * 3)
                tp_hidden += count * (tp_total - exposed)
                tp_total = exposed
            tp_c += count * tp_total
            cp_c += count * max(0.0, 3 * lt.cp_comm_s - (1 + attn_bwd) * lt.attention_s)
            moe_c += count * lt.moe_comm_s * passes
        if stage == plan.pp - 1:
            logits = logits_flops_per_token(model) * tokens / t
            logits_s = r.bf16_s(logits, tokens, model.hidden_size, model.vocab_size / t)  # output layer: 16-bit
            ce_s = tokens * 26 * model.vocab_size / t / hbm  # fp32 cross-entropy: ~14V B forward, ~12V backward
            fwd += logits_s
            bwd += 2 * logits_s + ce_s
        compute_mb = fwd + bwd + rec
        comm_mb = tp_c + cp_c + moe_c
        if worst is None or compute_mb + comm_mb > worst[0] + worst[1]:
            worst = (compute_mb, comm_mb, tp_c, cp_c, moe_c, fwd, bwd, n_layers, tp_hidden)
    assert worst is not None
    compute_mb, comm_mb, tp_c, cp_c, moe_c, fwd_mb, bwd_mb, n_layers, tp_hidden = worst
    hidden += tp_hidden
    m = plan.num_microbatches

    # Parameters this GPU holds (largest stage): dense over tp, experts over tp*ep.
    if stage_params is None:
        groups = [stage_param_groups(model, plan, s)
                  for s in representative_stages(model.num_layers, plan.pp, split_scheme(plan))]
        g = max(groups, key=lambda x: x.per_gpu(plan.tp, plan.ep))
        stage_params = (g.tp_sharded / t + g.replicated, g.expert / (t * plan.ep))
    dense_psi, expert_psi = stage_params
    psi = dense_psi + expert_psi

    # Data-parallel traffic (group: the sharding group of dp*cp / dp_replicate ranks, members tp apart).
    n_dp = plan.zero_partitions
    n_ep_dp = max(1, n_dp // plan.ep)
    dp_link = comm.group_link(cluster, eff, n_dp, t)
    edp_link = comm.group_link(cluster, eff, n_ep_dp, t * plan.cp * plan.ep)
    grad_bytes = engine.grad_reduce_bytes(plan)

    def reduce_scatter(bytes_per_param: float) -> float:
        return (comm.reduce_scatter_s(dense_psi * bytes_per_param, n_dp, dp_link)
                + comm.reduce_scatter_s(expert_psi * bytes_per_param, n_ep_dp, edp_link))

    # Hybrid sharding: the replicas all-reduce their shards' gradients once per step.
    replicate_s = 0.0
    if plan.dp_replicate > 1 and plan.zero_stage >= 2:
        rep_link = comm.group_link(cluster, eff, plan.dp_replicate, t * n_dp)
        replicate_s = comm.all_reduce_s(psi / n_dp * grad_bytes, plan.dp_replicate, rep_link)

    zero3_exposed = 0.0
    per_mb_sync = sched.grad_sync_every_microbatch or plan.zero_stage >= 2
    if plan.zero_stage == 3 or (plan.zero_stage == 2 and sched.param_gather == "fsdp2"):
        # Per-block gathers (16-bit, or FP8 with FP8 all-gather) ``prefetch_layers`` ahead: forward gathers every
        # block, backward again under FULL_SHARD (reshard_after_forward), and reduce-scatters each block's grads.
        gather_bytes = 1.0 if plan.precision == "fp8" and sched.fp8_param_gather else 2.0
        per_layer_gather = reduce_scatter(gather_bytes) / max(1, n_layers)
        per_layer_reduce = reduce_scatter(grad_bytes) / max(1, n_layers)
        fwd_layer = fwd_mb / max(1, n_layers)
        bwd_layer = (compute_mb - fwd_mb) / max(1, n_layers)
        depth = max(1, sched.prefetch_layers)
        bwd_gathers = 1 if plan.zero_stage == 3 else 0
        fwd_wait = per_layer_gather + (n_layers - 1) * max(0.0, per_layer_gather - depth * fwd_layer)
        bwd_work = bwd_gathers * per_layer_gather + per_layer_reduce
        bwd_wait = per_layer_reduce + (n_layers - 1) * max(0.0, bwd_work - bwd_layer)
        if not plan.overlap_comm:
            fwd_wait = n_layers * per_layer_gather
            bwd_wait = n_layers * bwd_work
        zero3_exposed = m * (fwd_wait + bwd_wait)
        hidden += n_layers * (per_layer_gather + bwd_work) - (fwd_wait + bwd_wait)
        dp_comm = 0.0
    elif per_mb_sync:
        per_mb = reduce_scatter(grad_bytes)  # every micro-batch reduces into the gradient shards
        dp_comm = per_mb + (reduce_scatter(2) if plan.zero_stage else 0.0)
        zero3_exposed = (m - 1) * max(0.0, per_mb - (compute_mb - fwd_mb if plan.overlap_comm else 0.0))
    elif plan.zero_stage == 0:
        dp_comm = 2 * reduce_scatter(grad_bytes)  # all-reduce
    else:
        dp_comm = reduce_scatter(grad_bytes) + reduce_scatter(2)  # reduce-scatter grads, all-gather params
    # With overlap, the reduction hides behind the last micro-batch's backward (and the gathers behind the next
    # forward); without, it all waits.
    dp_window = (bwd_mb + fwd_mb) if plan.overlap_comm else 0.0
    dp_exposed = max(0.0, dp_comm - dp_window) + replicate_s
    hidden_dp = dp_comm - max(0.0, dp_comm - dp_window)

    # Pipeline: per micro-batch an activation send forward and a gradient send backward (1/t with SP's
    # scatter-gather), on the critical path through all stages.
    pp_comm = 0.0
    if plan.pp > 1:
        pp_link = comm.group_link(cluster, eff, plan.pp, t * plan.cp * plan.dp)
        act_bytes = tokens * model.hidden_size * 2 / (t if plan.sequence_parallel else 1)
        pp_comm = (m + plan.pp - 1) * 2 * comm.p2p_s(act_bytes, pp_link)

    bubble = (plan.pp - 1) / plan.vpp * (compute_mb + comm_mb) if plan.pp > 1 else 0.0

    # Offload (ZeRO-Offload): gradients down and weights up over PCIe, CPU Adam at host-memory speed.
    pcie = cluster.pcie_bandwidth_gb_per_s * GB
    psi_part = dense_psi / n_dp + expert_psi / n_ep_dp if plan.zero_stage >= 1 else psi
    offload = 0.0
    k_bytes = OPTIMIZER_STATE_BYTES[plan.optimizer]
    if plan.offload_optimizer != "none":
        offload += (2 * psi_part + 2 * psi_part) / pcie
        # CPU Adam reads fp32 param, grad, m, v and writes param, m, v (28 B/param) plus the 16-bit copy.
        host_bw = settings.host_memory_bandwidth_gb_per_s_per_node * GB / cluster.gpus_per_node
        offload += psi_part * (k_bytes / 12 * 28 + 2) / host_bw
        if plan.offload_optimizer == "nvme":
            nvme_bw = max(cluster.nvme_bandwidth_gb_per_s, 1e-9) * GB / cluster.gpus_per_node
            offload += 2 * k_bytes * psi_part / nvme_bw
    if plan.offload_param != "none":
        offload += m * 2 * (2 * psi_part) / pcie  # fetch the weight partition for forward and backward
    optimizer = 0.0
    if plan.offload_optimizer == "none":
        # Fused Adam on the GPU: read master, m, v, grad; write master, m, v, 16-bit weights.
        optimizer = psi_part * (k_bytes / 12 * 24 + grad_bytes + 2) / hbm

    contention = eff.overlap_cost * (m * max(0.0, hidden) + max(0.0, hidden_dp))
    compute = m * compute_mb + contention
    exposed_comm = m * comm_mb + dp_exposed + pp_comm + zero3_exposed
    step = compute + exposed_comm + bubble + offload + optimizer
    tokens_step = plan.tokens_per_step
    flops = step_flops(model, plan.seq_len, tokens_step, plan.recompute)
    num_gpus = plan.world_size
    peak = _sixteen_peak(cluster, plan)
    model_tflops = flops.model / step / num_gpus / 1e12
    hardware_tflops = flops.hardware / step / num_gpus / 1e12
    return StepTimeEstimate(
        step_time_s=step, compute_s=compute, exposed_comm_s=exposed_comm, bubble_s=bubble, offload_s=offload,
        optimizer_s=optimizer, tokens_per_s=tokens_step / step, model_tflops_per_gpu=model_tflops,
        hardware_tflops_per_gpu=hardware_tflops, mfu=model_tflops * 1e12 / peak, hfu=hardware_tflops * 1e12 / peak,
        comm_parts_s={"tp": m * tp_c, "cp": m * cp_c, "moe": m * moe_c, "pp": pp_comm, "dp": dp_exposed,
                      "zero3": zero3_exposed},
    )


def _sixteen_peak(cluster: ClusterSpec, plan: ParallelPlan) -> float:
    """The datasheet 16-bit peak MFU is quoted against (FP8 runs too, as the sources quote them)."""
    gpu = cluster.gpu
    for prec in ("fp16" if plan.precision == "fp16" else "bf16", "fp16", "bf16"):
        if gpu.supports(prec):
            return gpu.peak_flops_per_s(prec)
    return max(gpu.peak_tflops.values()) * 1e12
