"""Step-time model: collective formulas, placement, bubble, and the direction of each effect."""

import pytest

from autotune.cost import comm
from autotune.cost.efficiency import DEFAULT_EFFICIENCY, gemm_efficiency
from autotune.cost.kernels import rates
from autotune.cost.layer_passes import layer_passes
from autotune.cost.layer_time import layer_time, time_key
from autotune.cost.tp_pairing import async_tp_reduce_bytes, tp_pair_exposed_s
from autotune.cost.step_time import TimeSettings, estimate_step_time
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset
from autotune.specs.plan import ParallelPlan

H100 = load_cluster(gpu="h100-sxm-80gb", num_gpus=64, gpus_per_node=None, cluster_path=None)
LLAMA70 = load_model_preset("llama3-70b")
EFF = DEFAULT_EFFICIENCY


def plan(**kw):
    base = dict(tp=8, pp=1, dp=8, seq_len=4096, micro_batch_size=1, global_batch_size=64, grad_accum_steps=8,
                sequence_parallel=True, engine="megatron", zero_stage=1)
    base.update(kw)
    return ParallelPlan(**base)


def test_ring_collectives():
    link = comm.Link(100e9, 0.0, False)
    # ring all-reduce of M bytes over n ranks: 2 (n-1)/n M / B
    assert comm.all_reduce_s(8e9, 8, link) == pytest.approx(2 * 7 / 8 * 8e9 / 100e9)
    assert comm.all_gather_s(8e9, 8, link) == pytest.approx(7 / 8 * 8e9 / 100e9)
    assert comm.all_reduce_s(8e9, 1, link) == 0


def test_group_placement_on_two_levels():
    # tp=8 with stride 1 stays in a node of 8; dp=8 with stride 8 crosses nodes; tp=16 crosses.
    assert not comm.group_link(H100, EFF, 8, 1).crosses_nodes
    assert comm.group_link(H100, EFF, 8, 8).crosses_nodes
    assert comm.group_link(H100, EFF, 16, 1).crosses_nodes
    kf = H100.gpu.kernel_facts()  # nccl-tests bus fractions of the preset
    assert comm.group_link(H100, EFF, 8, 1).bandwidth_bytes_per_s == pytest.approx(450e9 * kf.intra_node_bus_fraction)
    # one member per node (stride 8): one NIC; eight per node (stride 1): 1/8 of the data each over 8 NICs
    assert comm.group_link(H100, EFF, 8, 8).bandwidth_bytes_per_s == pytest.approx(50e9 * kf.inter_node_bus_fraction)
    assert comm.group_link(H100, EFF, 16, 1).bandwidth_bytes_per_s == pytest.approx(
        min(450e9 * kf.intra_node_bus_fraction, 8 * 50e9 * kf.inter_node_bus_fraction))


def test_all_to_all_and_sends_across_nodes_go_through_one_nic():
    # 16 ranks, 8 per node: of each rank's M bytes, 7/16 go to NVLink peers and 8/16 through its own NIC, at once;
    # the ring bus bandwidth (8 NICs' worth) would have been 8x too fast for the NIC share.
    kf = H100.gpu.kernel_facts()
    nvlink, nic = 450e9 * kf.intra_node_bus_fraction, 50e9 * kf.inter_node_bus_fraction
    link = comm.group_link(H100, EFF, 16, 1)
    m = 1e9
    steps = 15 * link.latency_s
    assert comm.all_to_all_s(m, 16, link) == pytest.approx(max(7 / 16 * m / nvlink, 8 / 16 * m / nic) + steps)
    inside = comm.group_link(H100, EFF, 8, 1)
    assert comm.all_to_all_s(m, 8, inside) == pytest.approx(7 / 8 * m / nvlink + 7 * inside.latency_s)
    # a point-to-point send that crosses nodes has one NIC, one inside a node NVLink
    assert comm.p2p_s(m, link) == pytest.approx(m / nic + link.latency_s)
    assert comm.p2p_s(m, inside) == pytest.approx(m / nvlink + inside.latency_s)


def test_narrow_gemms_run_slower():
    wide = gemm_efficiency(EFF, 8192, 8192, 8192)
    narrow = gemm_efficiency(EFF, 8192, 8192, 8192 / 16)
    assert narrow < wide < EFF.gemm_peak_fraction


def test_bubble_is_p_minus_1_over_m_v():
    # No tensor/context parallel traffic, so a micro-batch's time is its compute: bubble/compute = (p-1)/(v m).
    p = plan(tp=1, pp=8, dp=8, sequence_parallel=False, global_batch_size=256, grad_accum_steps=32)
    for vpp in (1, 2):
        est = estimate_step_time(LLAMA70, H100, p.with_(vpp=vpp))
        assert est.bubble_s / est.compute_s == pytest.approx(7 / (vpp * 32), rel=0.02)


def test_fp8_speeds_up_gemms_only():
    bf16 = estimate_step_time(LLAMA70, H100, plan())
    fp8 = estimate_step_time(LLAMA70, H100, plan(precision="fp8"))
    assert 1.2 < bf16.compute_s / fp8.compute_s < 2.0  # attention and elementwise stay 16-bit
    assert fp8.model_tflops_per_gpu > bf16.model_tflops_per_gpu


def test_tensor_parallel_across_nodes_costs_more():
    inside = estimate_step_time(LLAMA70, H100, plan(tp=8, dp=8))
    across = estimate_step_time(LLAMA70, H100, plan(tp=16, dp=4, global_batch_size=64, grad_accum_steps=16))
    assert across.comm_parts_s["tp"] > 5 * inside.comm_parts_s["tp"] / 2


def test_zero3_exposes_more_than_zero1_on_a_slow_network():
    slow = load_cluster(gpu="h100-sxm-80gb", num_gpus=64, gpus_per_node=None, cluster_path=None,
                        inter_node_bandwidth_gb_per_s=3)
    z1 = estimate_step_time(LLAMA70, slow, plan(tp=8, engine="deepspeed", zero_stage=1, sequence_parallel=True))
    z3 = estimate_step_time(LLAMA70, slow, plan(tp=8, engine="deepspeed", zero_stage=3, sequence_parallel=True))
    assert z3.exposed_comm_s > z1.exposed_comm_s


def test_offload_replaces_the_gpu_optimizer_step():
    est = estimate_step_time(LLAMA70, H100, plan(tp=8, engine="deepspeed", zero_stage=2,
                                                 offload_optimizer="cpu"))
    assert est.offload_s > 0 and est.optimizer_s == 0
    parts = est.compute_s + est.exposed_comm_s + est.bubble_s + est.offload_s + est.optimizer_s
    assert est.step_time_s == pytest.approx(parts)


def test_mfu_is_model_flops_over_peak():
    est = estimate_step_time(LLAMA70, H100, plan())
    assert est.mfu == pytest.approx(est.model_tflops_per_gpu / 989)
    assert est.hfu >= est.mfu and est.tokens_per_s == pytest.approx(64 * 4096 / est.step_time_s)


def test_optimizer_step_counts_the_passes_around_adam():
    # Per local parameter: Adam 24 B (fp32 master, m, v read + written) + the gradient + the 16-bit weight write,
    # plus the engine's passes: the gradient norm (4 B), the master re-read of the master-to-model copy (4 B,
    # not under FSDP, whose sharded fp32 parameters are the optimizer's own) and fp16's unscale (8 B).
    from autotune.engines import engine_for

    mega = plan(tp=8, dp=8, zero_stage=0)
    assert engine_for(mega).optimizer_pass_bytes(mega) == 8.0
    assert engine_for(mega.with_(precision="fp16")).optimizer_pass_bytes(mega.with_(precision="fp16")) == 16.0
    fsdp = plan(engine="fsdp", zero_stage=3, sequence_parallel=True)
    assert engine_for(fsdp).optimizer_pass_bytes(fsdp) == 4.0
    est = estimate_step_time(LLAMA70, H100, mega)
    psi = LLAMA70.num_params / 8
    hbm = H100.gpu.hbm_bandwidth_gb_per_s * 1e9 * H100.gpu.kernel_facts().hbm_fraction
    grad = engine_for(mega).grad_reduce_bytes(mega)
    assert est.optimizer_s == pytest.approx(psi * (24 + grad + 2 + 8) / hbm, rel=0.02)


@pytest.mark.parametrize("engine,zero_stage", [("deepspeed", 1), ("deepspeed", 2), ("megatron-deepspeed", 1)])
def test_deepspeed_waits_for_the_weight_all_gather_megatron_hides_it(engine, zero_stage, monkeypatch):
    # ZeRO-1/2 all-gather the updated 16-bit weights after the step: DeepSpeed inside step() (all_gather_dp_groups),
    # Megatron's distributed optimizer behind the next forward with --overlap-param-gather.
    from dataclasses import replace

    from autotune.engines import engine_for

    p = plan(tp=8, dp=8, engine=engine, zero_stage=zero_stage, micro_batch_size=4, global_batch_size=256)
    engine_cls = type(engine_for(p))
    assert not engine_cls.comm.param_gather_overlap
    assert type(engine_for(plan(engine="megatron", zero_stage=1))).comm.param_gather_overlap
    waits = estimate_step_time(LLAMA70, H100, p)
    monkeypatch.setattr(engine_cls, "comm", replace(engine_cls.comm, param_gather_overlap=True))
    hidden = estimate_step_time(LLAMA70, H100, p)
    psi = LLAMA70.num_params / 8
    link = comm.group_link(H100, EFF, 8, 8)
    gather = comm.reduce_scatter_s(psi * 2, 8, link)  # an all-gather moves what a reduce-scatter does
    assert waits.comm_parts_s["dp"] - hidden.comm_parts_s["dp"] == pytest.approx(gather, rel=0.05)


def test_async_tp_hides_each_collective_behind_its_own_gemm_only():
    """torchtitan's async TP fuses each all-gather / reduce-scatter with one projection: a narrow model at TP 8
    (Llama 3 8B: QKV 768 and output 512 columns per rank) leaves part of its collectives exposed, more of them
    than a wide one; with GEMMs longer than every collective nothing waits."""
    assert tp_pair_exposed_s(1.0, (2.0, 3.0, 4.0, 5.0)) == 0.0
    assert tp_pair_exposed_s(1.0, (0.5, 0.25, 4.0, 2.0)) == pytest.approx(0.5 + 0.75)
    h100 = load_cluster(gpu="h100-sxm-80gb", num_gpus=8, gpus_per_node=None, cluster_path=None)
    plan = ParallelPlan(tp=8, dp=1, micro_batch_size=4, global_batch_size=4, grad_accum_steps=1, seq_len=8192,
                        engine="fsdp", zero_stage=3, sequence_parallel=True, recompute="full")
    shares = []
    for name in ("llama3-8b", "llama3-70b"):
        model = load_model_preset(name)
        est = estimate_step_time(model, h100, plan, TimeSettings(tp_overlap="async-tp"))
        none = estimate_step_time(model, h100, plan, TimeSettings(tp_overlap="none"))
        assert 0 < est.comm_parts_s["tp"] < none.comm_parts_s["tp"]
        shares.append(est.comm_parts_s["tp"] / none.comm_parts_s["tp"])
    assert shares[0] > shares[1]


def test_async_tp_pays_its_fused_reduce_scatters_reduction_on_the_compute_stream():
    """torch's fused matmul + reduce-scatter sums the tp partial products in a separate kernel after the pipeline
    (HBM time in every forward and backward pass); NCCL's reduce-scatter does it inside the collective."""
    h100 = load_cluster(gpu="h100-sxm-80gb", num_gpus=8, gpus_per_node=None, cluster_path=None)
    model = load_model_preset("llama3-8b")
    plan = ParallelPlan(tp=8, dp=1, micro_batch_size=4, global_batch_size=4, grad_accum_steps=1, seq_len=8192,
                        engine="fsdp", zero_stage=3, sequence_parallel=True)
    r = rates(h100, "bf16", DEFAULT_EFFICIENCY, "fa2", None)
    lt = layer_time(model, h100, time_key(plan), False, DEFAULT_EFFICIENCY, r)
    fused = layer_passes(lt, plan, 1.0, "async-tp", True)
    plain = layer_passes(lt, plan, 1.0, "none", True)
    tokens, h = 8192 * 4, model.hidden_size
    reduce_s = 2 * async_tp_reduce_bytes(tokens, h, 8) / r.hbm
    assert fused.fwd_s - plain.fwd_s == pytest.approx(reduce_s)
    assert fused.bwd_s - plain.bwd_s == pytest.approx(reduce_s)
