"""Step time of one plan: compute, exposed communication, pipeline bubble, offload, optimizer.

The slowest pipeline stage sets the pace. One micro-batch on one stage takes
``t_mb = compute + TP collectives + exposed CP ring + MoE all-to-all + exposed ZeRO-3 gathers`` (the all-to-all
less what the EP overlap hides behind another micro-batch: ``autotune.cost.ep_overlap``);
a step runs ``m`` of them plus the 1F1B bubble of ``(pp-1)/vpp`` micro-batches (Narayanan et
al. 2021, Sec. 2.2), plus the pipeline sends, the data-parallel gradient reduction that the
last backward could not hide, the offload traffic and the optimizer update.

Compute is GEMM FLOPs at the GPU's measured, shape-dependent rate (``autotune.cost.kernels``), fused
attention at its kernel's rate, memory-bound kernels (and FP8 casts) at HBM speed (bytes counted below).
How communication overlaps is the engine's (``Engine.comm``): FSDP gathers each block's weights
``prefetch_layers`` ahead (only what the running block cannot hide waits), DeepSpeed ZeRO-3 each submodule's as
its prefetch coordinator reaches them (``autotune.cost.zero3_gathers``), gradients reduce per bucket or
per block, TP collectives overlap GEMMs with ``--tp-comm-overlap`` / async TP, and Megatron's backward TP
collective runs behind the weight-gradient GEMM (``autotune.cost.layer_time.layer_passes``). Pipeline sends are
split over the TP ranks where the engine does (Megatron's scatter/gather); gradients accumulated outside the
GEMMs (DeepSpeed's BF16_Optimizer) cost HBM time every micro-batch. Hidden communication still costs
``overlap_cost`` of its time (NCCL kernels share the SMs and HBM); the EP overlap's hidden all-to-all its own measured
share (``autotune.cost.ep_overlap.EP_A2A_OVERLAP_COST``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

from autotune.cost import comm, run_settings
from autotune.cost.activation_offload import offload_exposed_s, offloaded_activation_bytes
from autotune.cost.cp_ring import cp_kind
from autotune.cost.ep_overlap import EP_A2A_OVERLAP_COST, paired_exposed_s, paired_host_s, paired_share
from autotune.cost.expert_padding import expert_padding_rows
from autotune.cost.fused_grouped_mlp import fused_grouped_mlp
from autotune.cost.flops import StepFlops, cached_step_flops
from autotune.cost.fp8_head import output_layer_s
from autotune.cost.mtp import mtp_flops_per_token, mtp_head_s, mtp_layer_is_moe
from autotune.cost.pp_sends import exposed_pp_sends
from autotune.cost.kernels import rates
from autotune.cost.launch import host_issue_s, host_launch_s, launch_exposed_s
from autotune.cost.layer_passes import layer_passes
from autotune.cost.layer_time import elementwise_kernels, layer_time, time_key
from autotune.cost.loss_kernel import loss_bytes_per_logit
from autotune.cost.step_terms import variant_terms
from autotune.cost.time_settings import TimeSettings
from autotune.cost.zero3_gathers import deepspeed_zero3_waits
from autotune.engines import Engine, engine_for
from autotune.engines.megatron_fsdp import recompute_row_gathers
from autotune.specs.frozen import builder
from autotune.specs.hardware import ClusterSpec
from autotune.specs.layout import split_vpp_key, stage_layers
from autotune.specs.lora import adapter_params_per_layer
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.stage_mix import model_representative_stages

__all__ = ["StepTimeEstimate", "TimeSettings", "estimate_step_time"]

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
    stage_times_s: tuple[tuple[int, int, float], ...] = ()
    """(stage, transformer layers, seconds of compute and exposed communication per micro-batch) of each pipeline
    stage that can be the slowest (first, last, one middle stage per layer count): every stage waits for the slowest."""

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("step_time_s", "compute_s", "exposed_comm_s", "bubble_s", "offload_s",
                                              "optimizer_s", "tokens_per_s", "model_tflops_per_gpu",
                                              "hardware_tflops_per_gpu", "mfu", "hfu")}
        out["comm_parts_s"] = dict(self.comm_parts_s)
        out["stage_times_s"] = [{"stage": s, "layers": n, "s_per_microbatch": t} for s, n, t in self.stage_times_s]
        return out


_step_time_estimate = builder(StepTimeEstimate)


def _stage_layer_counts(model: ModelSpec, plan: ParallelPlan, stage: int, scheme: str) -> tuple[int, int]:
    """(dense layers, MoE layers) of a pipeline stage split by ``scheme`` (MoE layers follow the dense ones)."""
    first, per_stage = stage_layers(model.num_layers, plan.pp, stage, scheme)
    if model.moe is not None and model.moe.moe_layer_step != 1:  # dense and MoE layers interleaved (Llama 4)
        moe = sum(model.is_moe_layer(i) for i in range(first, first + per_stage))
    else:
        moe = 0 if model.moe is None else max(0, first + per_stage - max(first, model.moe.num_dense_layers))
    return per_stage - moe, moe


# Every plan field the critical stage's per-micro-batch time reads (``time_key``, the rates, the stage split and
# the recompute): plans that differ in ZeRO stage, replicas, offload or dp share it.
_STAGE_TIME_FIELDS = operator.attrgetter("engine", "fp8_recipe", "tp_overlap", "torch_compile",
                                         "seq_len", "micro_batch_size", "cp", "tp", "ep", "etp", "sequence_parallel",
                                         "precision", "flash_attention", "pp", "recompute", "recompute_num_layers",
                                         "recompute_modules", "cuda_graph", "cuda_graph_scope", "ep_overlap",
                                         "moe_dispatcher", "cp_comm_type", "peft", "lora_rank", "lora_targets",
                                         "moe_capacity_factor", "moe_pad_to_capacity", "mtp_layers", "fp8_attention",
                                         "fp8_output_proj", "loss_slots")
_stage_time_cache: dict[tuple, tuple] = {}


def _critical_stage(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, settings: TimeSettings,
                    engine: Engine) -> tuple[float, tuple, tuple, tuple]:
    """(HBM bytes/s, the slowest stage's per-micro-batch (compute, comm, tp, cp, moe, fwd, bwd, layers, tp hidden,
    moe exposed when paired: ``autotune.cost.ep_overlap``) seconds, each stage's (stage, layers, compute, comm, moe,
    moe paired) for ``StepTimeEstimate.stage_times_s``, and each stage's (stage, layers, seconds) unpaired),
    cached over the plan fields they read (``_STAGE_TIME_FIELDS``)."""
    # ids: the specs hash slowly; what of vpp the split depends on (layout.split_vpp_key)
    key = (id(model), id(cluster), id(settings), _STAGE_TIME_FIELDS(plan), split_vpp_key(plan))
    hit = _stage_time_cache.get(key)
    if hit is None or hit[0] is not model or hit[1] is not cluster or hit[2] is not settings:
        if len(_stage_time_cache) > 65536:
            _stage_time_cache.clear()
        hbm, worst, stage_times = _slowest_stage(model, cluster, plan, settings, engine)
        # Where no micro-batches pair (``paired_share`` 0): c + k - 0 * (mc - mp) is c + k exactly (finite terms).
        unpaired = tuple((s, n, c + k) for s, n, c, k, _, _ in stage_times)
        hit = _stage_time_cache[key] = (model, cluster, settings, (hbm, worst, stage_times, unpaired))
    return hit[3]


def _slowest_stage(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, settings: TimeSettings,
                   engine: Engine) -> tuple[float, tuple]:
    eff = settings.efficiency
    sched = engine.comm
    launch_s = host_issue_s(cluster, sched.kernel_launch_s)  # the engine's launch time on this cluster's host
    scheme = engine.layer_split_of(plan, model.num_layers)
    t = plan.tp
    tokens = plan.seq_len * plan.micro_batch_size / plan.cp
    key = time_key(plan)
    fp8_recipe = run_settings.fp8_recipe(plan, settings, engine)
    r = rates(cluster, plan.precision, eff, settings.attention_kernel or sched.attention_kernel, fp8_recipe)
    kernels = elementwise_kernels(sched.elementwise_kernels, run_settings.compiled(plan, settings, engine))
    selective = _selective_policy(plan, settings, engine)
    modules = run_settings.recompute_modules(plan)
    cp_kind, repeat_kv = _cp_run(plan, settings, engine)
    dense_layer = layer_time(model, cluster, key, False, eff, r, kernels, cp_kind, repeat_kv)
    moe_layer = layer_time(model, cluster, key, True, eff, r, kernels, cp_kind, repeat_kv,
                           expert_padding_rows(model, plan), fused_grouped_mlp(model, cluster, plan, fp8_recipe)) \
        if model.is_moe else dense_layer
    hbm = r.hbm
    tp_overlap = run_settings.tp_overlap(plan, settings, engine)
    tp_bwd_overlap = sched.tp_backward_overlapped(plan) if settings.tp_backward_overlap is None \
        else settings.tp_backward_overlap

    # Per micro-batch, per stage: forward, backward, recompute, and the collectives on the critical path.
    worst, stage_times = None, []
    per_layer: dict[tuple, tuple] = {}  # (is_moe, rec_share) -> a layer's passes and launch waits: the same per stage
    for stage in model_representative_stages(model, plan.pp, scheme, plan.vpp):
        n_dense, n_moe = _stage_layer_counts(model, plan, stage, scheme)
        if stage == plan.pp - 1 and plan.mtp_layers:  # the MTP modules' layers, like the last (cost/mtp.py)
            n_moe, n_dense = (n_moe + plan.mtp_layers, n_dense) if mtp_layer_is_moe(model) \
                else (n_moe, n_dense + plan.mtp_layers)
        n_layers = n_dense + n_moe
        rec_share = 1.0 if plan.recompute_num_layers is None else min(1.0, plan.recompute_num_layers / max(n_layers, 1))
        fwd = bwd = rec = tp_c = cp_c = moe_c = tp_hidden = moe_paired = 0.0
        for count, lt, is_moe in ((n_dense, dense_layer, False), (n_moe, moe_layer, True)):
            if not count:
                continue
            passes = per_layer.get((is_moe, rec_share))
            if passes is None:
                # torchtitan's op-level SAC covers dense blocks; MoE layers keep the attention-core policy.
                lp = layer_passes(lt, plan, rec_share, tp_overlap, tp_bwd_overlap,
                                  selective if lt is dense_layer else "attention-core", modules)
                # launches the GPU waits for (small per-GPU work), unless CUDA graphs issue them (cost/launch.py)
                passes = per_layer[is_moe, rec_share] = (lp, *launch_exposed_s(
                    model, plan, is_moe, lp.fwd_s, lp.bwd_s + lp.recompute_s, launch_s, fp8_recipe,
                    lt.experts_s[0] + lt.experts_s[1]))
            lp, wait_f, wait_b = passes
            fwd += count * (lp.fwd_s + wait_f)
            bwd += count * (lp.bwd_s + wait_b)
            rec += count * lp.recompute_s
            tp_c += count * lp.tp_exposed_s
            tp_hidden += count * (lp.tp_hidden_s + lp.cp_hidden_s)  # all communication hidden behind compute
            cp_c += count * lp.cp_exposed_s
            moe_c += count * lp.moe_s
            if is_moe and plan.ep_overlapped and lt.moe_comm_s > 0:
                moe_paired += paired_exposed_s(lt, count, lp.fwd_s, lp.bwd_s + lp.recompute_s,
                                               plan.ep_overlap == "a2a-delay-wgrad",
                                               paired_host_s(model, plan, host_launch_s(plan, launch_s),
                                                             fp8_recipe),
                                               wait_f + wait_b)
            else:
                moe_paired += count * lp.moe_s
        if stage == plan.pp - 1:
            logits_s, head_cast_s = output_layer_s(model, plan, r, tokens, hbm)  # 16-bit, or MXFP8 (cost/fp8_head)
            ce_s = tokens * loss_bytes_per_logit(settings.te_cross_entropy) * model.vocab_size / t / hbm
            fwd += logits_s + head_cast_s  # LoRA freezes the output layer too: its data gradient only (cost/lora)
            bwd += (1 if plan.peft else 2) * logits_s + head_cast_s + ce_s
            mtp_fwd, mtp_bwd = mtp_head_s(model, plan, r, logits_s, ce_s, head_cast_s)  # MTP's projections, heads
            fwd, bwd = fwd + mtp_fwd, bwd + mtp_bwd
        compute_mb = fwd + bwd + rec
        comm_mb = tp_c + cp_c + moe_c
        stage_times.append((stage, n_layers, compute_mb, comm_mb, moe_c, moe_paired))
        if worst is None or compute_mb + comm_mb > worst[0] + worst[1]:
            worst = (compute_mb, comm_mb, tp_c, cp_c, moe_c, fwd, bwd, n_layers, tp_hidden, moe_paired)
    assert worst is not None
    return hbm, worst, tuple(stage_times)


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
    hbm, worst, stage_times, unpaired = _critical_stage(model, cluster, plan, settings, engine)
    hidden = 0.0  # communication hidden behind compute, per micro-batch (costs overlap_cost of its time)
    assert worst is not None
    compute_mb, comm_mb, tp_c, cp_c, moe_c, fwd_mb, bwd_mb, n_layers, tp_hidden, moe_paired = worst
    hidden += tp_hidden
    ep_hidden = 0.0  # all-to-all hidden behind the paired micro-batch's compute (costs EP_A2A_OVERLAP_COST of it)
    if (share := paired_share(plan)) > 0:  # paired micro-batches hide their all-to-alls behind the other's compute
        paired_c = share * moe_paired + (1 - share) * moe_c
        ep_hidden = moe_c - paired_c
        comm_mb += paired_c - moe_c
        moe_c = paired_c
    m = plan.num_microbatches
    (accumulate_s, per_mb_sync, per_block, param_gather, gathers, reduce, replicate_s, pp_link, pcie, psi_part,
     offload, optimizer, peak) = variant_terms(model, cluster, plan, settings, engine, hbm, stage_params)
    compute_mb += accumulate_s
    bwd_mb += accumulate_s

    zero3_exposed = hidden_earlier = 0.0
    if per_block:
        # Per-block gathers (16-bit, or FP8 with FP8 all-gather) ``prefetch_layers`` ahead: forward gathers every
        # block, backward again under FULL_SHARD (reshard_after_forward), and reduce-scatters each block's grads.
        # Each collective pays its ring latency: FSDP2 one flat all-gather per block; DeepSpeed one per submodule
        # it fetches (the four Linear weights of a layer; biases and norms sit below
        # stage3_param_persistence_threshold and stay gathered).
        gather, latency, pieces = gathers
        layers = max(1, n_layers)
        per_layer_gather = (gather - latency) / layers + pieces * latency
        per_layer_reduce = (reduce - latency) / layers + pieces * latency
        fwd_layer = fwd_mb / layers
        bwd_layer = (compute_mb - fwd_mb) / layers
        depth = max(1, sched.prefetch_layers)
        # Backward gathers: FULL_SHARD re-gathers each block; DeepSpeed's activation checkpointing re-runs the
        # block's forward, whose pre-forward hooks fetch (and post-forward hooks release) the weights once more
        # before the backward hooks fetch them again (FSDP2 and Megatron-FSDP unshard once for recompute and backward).
        bwd_gathers = (1 if plan.zero_stage == 3 else 0) + (
            1 if plan.zero_stage == 3 and plan.recompute == "full" and sched.param_gather == "prefetch" else 0)
        # Megatron-FSDP with MXFP8 weights and full recompute: the recomputed forward gathers the row-wise data
        # again, unprefetched, so each of these waits (autotune.engines.megatron_fsdp.recompute_row_gathers).
        regathers = recompute_row_gathers(plan, run_settings.fp8_recipe(plan, settings, engine),
                                          engine.fp8_param_gather(plan)) if sched.param_gather == "megatron-fsdp" else 0
        fwd_wait = per_layer_gather + (n_layers - 1) * max(0.0, per_layer_gather - depth * fwd_layer)
        bwd_work = bwd_gathers * per_layer_gather + per_layer_reduce
        bwd_wait = per_layer_reduce + (n_layers - 1) * max(0.0, bwd_work - bwd_layer)
        bwd_wait += n_layers * regathers * per_layer_gather
        bwd_work += regathers * per_layer_gather
        network = n_layers * (per_layer_gather + bwd_work)
        ds = None
        if sched.param_gather == "prefetch" and plan.zero_stage == 3 and plan.overlap_comm:
            # DeepSpeed: per submodule, as its prefetch coordinator issues them (autotune.cost.zero3_gathers).
            # Full recompute reruns each block's forward, gathers and all, inside its backward; a selective
            # recompute's rerun (no parameters of its own) is backward compute.
            rec_mb = max(0.0, compute_mb - fwd_mb - bwd_mb)
            full = plan.recompute == "full"
            ds = deepspeed_zero3_waits(
                model, t, plan.seq_len, n_layers, fwd_s=fwd_mb, bwd_s=bwd_mb + (0.0 if full else rec_mb),
                rec_s=rec_mb if full else 0.0, gather_bw_s=gather - latency,
                reduce_bw_s=reduce - latency, latency_s=latency, bucket=settings.stage3_prefetch_bucket_size,
                max_live=settings.stage3_max_live_parameters, max_reuse=settings.stage3_max_reuse_distance,
                reduce_bucket=settings.reduce_bucket_size,
                list_collectives=(plan.dp, hbm) if settings.zero3_list_collectives else None)
        if ds is not None:
            fwd_wait, bwd_wait, network = ds.fwd_wait_s, ds.bwd_wait_s, ds.network_s
        if not plan.overlap_comm:
            fwd_wait = n_layers * per_layer_gather
            bwd_wait = n_layers * bwd_work
        hidden += network - (fwd_wait + bwd_wait)
        zero3_exposed = m * (fwd_wait + bwd_wait)
        if plan.pp > 1 and sched.param_gather == "fsdp2" and plan.zero_stage == 2:
            # torch.distributed.pipelining with FSDP2 (stage.py backward_maybe_with_nosync): every micro-batch but
            # the last runs with set_reshard_after_backward(False) and set_requires_gradient_sync(False); the
            # REDUCE_GRAD action after the stage's last backward reduce-scatters once. So one gather per step
            # (behind the first forward) and one reduction, after all backward work, that waits.
            zero3_exposed = fwd_wait + n_layers * per_layer_reduce
        dp_comm = 0.0
    elif per_mb_sync:
        per_mb = reduce  # every micro-batch reduces into the gradient shards
        dp_comm = per_mb + param_gather
        window = compute_mb - fwd_mb if plan.overlap_comm else 0.0
        zero3_exposed = (m - 1) * max(0.0, per_mb - window)
        # What the backward of the m - 1 earlier micro-batches hides of their reductions still costs overlap_cost
        # (counted with the last micro-batch's below); Megatron-FSDP's optim_grads reduce-scatters every micro-batch
        # (megatron_fsdp.py:761-786, grad_reduce_every_bprop).
        hidden_earlier = (m - 1) * min(per_mb, window)
    elif plan.zero_stage == 0:
        dp_comm = 2 * reduce  # all-reduce
    else:
        dp_comm = reduce + param_gather  # reduce-scatter grads, all-gather params
    # With overlap, the reduction hides behind the last micro-batch's backward (and the gathers behind the next
    # forward, where the engine overlaps them: CommSchedule.param_gather_overlap); without, it all waits.
    waits = 0.0 if sched.param_gather_overlap else param_gather
    windowed = dp_comm - waits
    dp_window = (bwd_mb + fwd_mb) if plan.overlap_comm else 0.0
    dp_exposed = max(0.0, windowed - dp_window) + waits + replicate_s
    hidden_dp = windowed - max(0.0, windowed - dp_window) + hidden_earlier

    # Pipeline: per micro-batch an activation send forward and a gradient send backward (1/t with SP's
    # scatter-gather); those the schedule waits for (autotune.cost.pp_sends).
    pp_comm = 0.0
    if plan.pp > 1:
        act_bytes = tokens * model.hidden_size * 2
        split = t if plan.sequence_parallel or sched.pp_scatter_gather else 1
        send_s = comm.p2p_s(act_bytes / split, pp_link)
        if sched.pp_scatter_gather and not plan.sequence_parallel and t > 1:
            send_s += comm.all_gather_s(act_bytes, t, comm.group_link(cluster, eff, t, 1))  # rebuilt over NVLink
        overlapped = sched.pp_overlap_interleaved if settings.pp_overlap_interleaved is None \
            else settings.pp_overlap_interleaved
        pp_comm = exposed_pp_sends(m, plan.pp, plan.vpp, overlapped) * send_s

    bubble = (plan.pp - 1) / plan.vpp * (compute_mb + comm_mb) if plan.pp > 1 else 0.0

    # Offload (ZeRO-Offload, ``step_terms.variant_terms``): and the weight partition fetched for every micro-batch's forward
    # and backward.
    if plan.offload_param != "none":
        offload += m * 2 * (2 * psi_part) / pcie
    if plan.activation_offload_layers:  # activation CPU offload's copies (autotune.cost.activation_offload)
        offloaded = offloaded_activation_bytes(model, plan, engine.activation_facts(plan),
                                               engine.layer_split_of(plan, model.num_layers))
        offload += m * offload_exposed_s(offloaded, cluster, fwd_mb, compute_mb - fwd_mb)

    contention = (eff.overlap_cost * (m * max(0.0, hidden) + max(0.0, hidden_dp))
                  + EP_A2A_OVERLAP_COST * m * max(0.0, ep_hidden))
    compute = m * compute_mb + contention
    exposed_comm = m * comm_mb + dp_exposed + pp_comm + zero3_exposed
    step = compute + exposed_comm + bubble + offload + optimizer
    tokens_step = plan.tokens_per_step
    flops = cached_step_flops(model, plan.seq_len, tokens_step, plan.recompute, run_settings.recompute_modules(plan),
                              _selective_policy(plan, settings, engine), plan.precision == "fp8",
                              model.num_layers * adapter_params_per_layer(model, plan.with_(tp=1)) if plan.peft
                              else None)
    if plan.mtp_layers:  # the MTP modules' FLOPs as Megatron counts them (autotune.cost.mtp); full recompute
        forward, layers = mtp_flops_per_token(model, plan.seq_len, plan.mtp_layers)  # reruns their layers' forward
        rerun = layers if plan.recompute == "full" else 0.0
        flops = StepFlops(model=flops.model + 3.0 * forward * tokens_step,
                          hardware=flops.hardware + (3.0 * forward + rerun) * tokens_step)
    num_gpus = plan.world_size
    model_tflops = flops.model / step / num_gpus / 1e12
    hardware_tflops = flops.hardware / step / num_gpus / 1e12
    return _step_time_estimate(  # StepTimeEstimate's fields in their order (a builder: ~10^4 per search)
        step, compute, exposed_comm, bubble, offload, optimizer, tokens_step / step, model_tflops, hardware_tflops,
        model_tflops * 1e12 / peak, hardware_tflops * 1e12 / peak,  # mfu, hfu
        {"tp": m * tp_c, "cp": m * cp_c, "moe": m * moe_c, "pp": pp_comm, "dp": dp_exposed, "zero3": zero3_exposed},
        unpaired if share == 0 else tuple(  # paired as the worst above
            (s, n, c + k - share * (mc - mp)) for s, n, c, k, mc, mp in stage_times))


def estimate_layer_time(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                        settings: TimeSettings | None = None) -> tuple[float, float]:
    """(forward, backward) seconds of one dense transformer layer for one micro-batch, as a layer-level timing
    measures them: the forward with its TP collectives; the backward with the recompute (and its collectives)
    the plan does, and the share of hidden communication that still costs compute (``overlap_cost``)."""
    settings = settings or TimeSettings()
    eff = settings.efficiency
    engine = engine_for(plan)
    sched = engine.comm
    fp8_recipe = run_settings.fp8_recipe(plan, settings, engine)
    r = rates(cluster, plan.precision, eff, settings.attention_kernel or sched.attention_kernel, fp8_recipe)
    lt = layer_time(model, cluster, time_key(plan), False, eff, r,
                    elementwise_kernels(sched.elementwise_kernels, run_settings.compiled(plan, settings, engine)),
                    *_cp_run(plan, settings, engine))
    tp_bwd = sched.tp_backward_overlapped(plan) if settings.tp_backward_overlap is None \
        else settings.tp_backward_overlap
    overlap = run_settings.tp_overlap(plan, settings, engine)
    lp = layer_passes(lt, plan, 1.0, overlap, tp_bwd, _selective_policy(plan, settings, engine),
                      run_settings.recompute_modules(plan))
    fwd = lp.fwd_s + lt.tp_comm_s * (plan.tp > 1 and overlap == "none")
    total = lp.fwd_s + lp.bwd_s + lp.recompute_s + lp.tp_exposed_s + lp.cp_exposed_s + lp.moe_s
    total += eff.overlap_cost * (lp.tp_hidden_s + lp.cp_hidden_s)
    return fwd, total - fwd


def _cp_run(plan: ParallelPlan, settings: TimeSettings, engine: Engine) -> tuple[str, bool]:
    """How the plan runs context parallelism (``autotune.cost.cp_ring``): its kind (the plan's --cp-comm-type, else
    the engine's) and whether its model code repeats K and V to every query head before attention (the run's stated
    code, else the engine's)."""
    repeat = engine.comm.cp_repeat_kv if settings.cp_repeat_kv is None else settings.cp_repeat_kv
    return cp_kind(plan, engine.comm.cp_kind) or "p2p", repeat


def _selective_policy(plan: ParallelPlan, settings: TimeSettings, engine: Engine) -> str:
    """What the plan's selective recompute reruns: the run's stated policy, else its engine's (as the ledger)."""
    if plan.recompute != "selective":
        return "attention-core"
    return settings.selective_policy or engine.activation_facts(plan).selective
