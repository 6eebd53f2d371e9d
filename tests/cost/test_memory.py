"""Model-state bytes against the ZeRO paper and Megatron's formula; ledger invariants."""

import pytest

from autotune.cost.memory import estimate_memory, model_state_bytes
from autotune.specs.hardware import ClusterSpec, GPUSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.settings import MemorySettings

PSI = 7.5e9  # ZeRO paper Fig. 1: 7.5B parameters, Nd = 64, K = 12
GB = 1e9


def states(**kw):
    p = ParallelPlan(dp=64, **kw)
    s = model_state_bytes(p, PSI, 0.0)
    return s, (s.weights + s.gradients + s.optimizer_states) / GB


def test_zero_paper_figure_1():
    # Baseline (2+2+K)*Psi = 120 GB; P_os+g: 2Psi + (2+K)Psi/Nd = 16.6 GB; P_os+g+p: (2+2+K)Psi/Nd = 1.9 GB.
    assert states(zero_stage=0)[1] == pytest.approx(120.0)
    assert states(zero_stage=2)[1] == pytest.approx(16.64, abs=0.01)
    assert states(zero_stage=3)[1] == pytest.approx(1.875)


def test_deepspeed_zero1_keeps_only_a_gradient_partition():
    # DeepSpeed 0.19.8 reduces each bucket into the owner's partition during backward (measured), so
    # ZeRO-1 holds what the paper's P_os+g holds; the paper's own P_os (31.4 GB) keeps full gradients.
    assert states(zero_stage=1)[1] == pytest.approx(states(zero_stage=2)[1])


def test_seed_numbers_70b():
    # Seed §1.1: 70B in 16-bit is ~140 GB of weights and ~16 bytes/param of model states under AdamW.
    s, total_gb = states(zero_stage=0)
    assert s.weights / PSI == 2
    assert (s.weights + s.gradients + s.optimizer_states) / PSI == 16
    s70 = model_state_bytes(ParallelPlan(), 70e9, 0.0)
    assert s70.weights / GB == pytest.approx(140)
    assert (s70.weights + s70.gradients + s70.optimizer_states) / 1e12 == pytest.approx(1.12)


@pytest.mark.parametrize("d", [1, 8, 64])
def test_megatron_distributed_optimizer_6_plus_12_over_d(d):
    # Megatron theoretical_memory_usage.py: 18 B/param without, 6 + 12/d with the distributed optimizer.
    plain = model_state_bytes(ParallelPlan(dp=d, engine="megatron", zero_stage=0), PSI, 0.0)
    dist = model_state_bytes(ParallelPlan(dp=d, engine="megatron", zero_stage=1), PSI, 0.0)
    assert (plain.weights + plain.gradients + plain.optimizer_states) / PSI == pytest.approx(18)
    assert (dist.weights + dist.gradients + dist.optimizer_states) / PSI == pytest.approx(6 + 12 / d)



@pytest.mark.parametrize("zero_stage,owned", [(0, 1.0), (1, 1 / 8)])
def test_megatron_fp16_step_copies_grads_to_fp32(zero_stage, owned):
    # optimizer.py / distrib_optimizer.py _copy_model_grads_to_main_grads: main_grad.float() is a new fp32
    # copy of fp16 grads (of the rank's shard with the distributed optimizer), an alias of bf16's fp32 ones.
    fp16 = model_state_bytes(ParallelPlan(dp=8, engine="megatron", zero_stage=zero_stage, precision="fp16"),
                             PSI, 0.0)
    bf16 = model_state_bytes(ParallelPlan(dp=8, engine="megatron", zero_stage=zero_stage), PSI, 0.0)
    assert fp16.step_transient == pytest.approx(4 * PSI * owned)
    assert bf16.step_transient == 0

@pytest.mark.parametrize("optimizer,k", [("adamw", 12), ("sgd", 8), ("adafactor", 4), ("adamw8bit", 6)])
def test_optimizer_state_bytes(optimizer, k):
    s = model_state_bytes(ParallelPlan(optimizer=optimizer), PSI, 0.0)
    assert s.optimizer_states / PSI == k


def test_cpu_offload_moves_states_to_host():
    s = model_state_bytes(ParallelPlan(dp=8, zero_stage=2, offload_optimizer="cpu"), PSI, 0.0)
    assert s.optimizer_states == 0 and s.gradients == 0
    assert s.host_optimizer_states == pytest.approx(12 * PSI / 8)
    assert s.host_gradients == pytest.approx(4 * PSI / 8)  # fp32 gradient partition on the host
    assert s.host_buffers == pytest.approx(2 * PSI / 8)  # ZeRO-1/2: 16-bit weight partition staged on the host
    p = model_state_bytes(ParallelPlan(dp=8, zero_stage=3, offload_optimizer="cpu", offload_param="cpu"), PSI, 0.0)
    assert p.weights == 0 and p.host_weights == pytest.approx(2 * PSI / 8)
    assert p.host_gradients == pytest.approx(6 * PSI / 8)  # ZeRO-3 keeps fp32 and 16-bit partitions on the host


def test_optimizer_step_transient():
    # DeepSpeed makes fp32 gradient copies at the step: ZeRO-0 +4 B/param (20 B/param peak, measured),
    # ZeRO-1/2 the fp32 partition replaces the 16-bit one, ZeRO-3 adds it; Megatron's are fp32 already.
    assert model_state_bytes(ParallelPlan(dp=8), PSI, 0.0).step_transient == pytest.approx(4 * PSI)
    assert model_state_bytes(ParallelPlan(dp=8, zero_stage=2), PSI, 0.0).step_transient == pytest.approx(2 * PSI / 8)
    assert model_state_bytes(ParallelPlan(dp=8, zero_stage=3), PSI, 0.0).step_transient == pytest.approx(4 * PSI / 8)
    assert model_state_bytes(ParallelPlan(dp=8, engine="megatron"), PSI, 0.0).step_transient == 0


def test_deepspeed_zero12_rank_holds_straddling_tensors_whole():
    from autotune.engines.states import ds_zero12_grad_elements as _ds_zero12_grad_elements
    from autotune.specs.presets import load_model_preset

    gpt = load_model_preset("tiny-gpt")
    # Measured on DeepSpeed 0.19.8, 2 ranks: rank 0 holds 1,972,480 gradient elements (its 1,776,384-element
    # slice plus the rest of layers.1.mlp.fc2.weight, which straddles the boundary); rank 1 holds 1,842,432.
    assert _ds_zero12_grad_elements(gpt, 1, 0, 1, 2) == 1_972_480
    assert _ds_zero12_grad_elements(gpt, 1, 0, 1, 1) == gpt.num_params


def test_expert_params_partition_over_dp_over_ep():
    # 8 experts' worth of parameters with ep=4, dp=8: experts are replicated over dp/ep = 2 ranks.
    s = model_state_bytes(ParallelPlan(dp=8, ep=4, zero_stage=3), 0.0, 1e9)
    assert s.optimizer_states == pytest.approx(12 * 1e9 / 2)


GPU = GPUSpec(name="h100", memory_gib=80, peak_tflops={"bf16": 989}, hbm_bandwidth_gb_per_s=3350)
CLUSTER = ClusterSpec(gpu=GPU, num_nodes=8, gpus_per_node=8, intra_node_bandwidth_gb_per_s=450,
                      inter_node_bandwidth_gb_per_s=50, host_memory_gib_per_node=2048)
LLAMA70 = ModelSpec(name="llama3-70b", num_layers=80, hidden_size=8192, num_attention_heads=64, num_kv_heads=8,
                    ffn_hidden_size=28672, vocab_size=128256, activation="swiglu", norm="rmsnorm",
                    position_embedding="rope")


def test_first_stage_is_most_loaded_with_1f1b():
    plan = ParallelPlan(tp=8, pp=2, dp=4, zero_stage=1, seq_len=8192, global_batch_size=512, grad_accum_steps=128,
                        sequence_parallel=True, recompute="selective")
    est = estimate_memory(LLAMA70, CLUSTER, plan)
    assert est.stage == 0
    # weights: half the layers plus the embedding, over tp=8, in bf16
    per_gpu = (LLAMA70.stage_params(0, 40, has_embedding=True, has_output=False).per_gpu(8, 1))
    assert est.weights == pytest.approx(2 * per_gpu)
    assert est.total == pytest.approx(sum(est.terms().values()))
    assert est.fits


def test_overhead_setting_and_capacity():
    plan = ParallelPlan(tp=8, dp=8, zero_stage=3, seq_len=4096, global_batch_size=8)
    base = estimate_memory(LLAMA70, CLUSTER, plan, MemorySettings(cuda_context_bytes=0, fragmentation_fraction=0))
    more = estimate_memory(LLAMA70, CLUSTER, plan, MemorySettings(cuda_context_bytes=2**30, fragmentation_fraction=0))
    assert more.total - base.total == 2**30
    assert base.capacity == 80 * 2**30


def test_70b_on_8_gpus_needs_offload():
    tp8 = ParallelPlan(tp=8, dp=1, zero_stage=1, seq_len=8192, sequence_parallel=True, recompute="selective")
    assert not estimate_memory(LLAMA70, CLUSTER, tp8).fits  # 1.1 TB of states over 8 GPUs is 141 GB each
    offload = ParallelPlan(dp=8, zero_stage=3, offload_optimizer="cpu", seq_len=8192, recompute="full")
    est = estimate_memory(LLAMA70, CLUSTER, offload)
    assert est.fits
    # host per node: 8 GPUs x (fp32 + 16-bit gradient partitions 6 B + optimizer states 12 B) x Psi / 8
    assert est.host_per_node == pytest.approx(8 * 18 * LLAMA70.num_params / 8, rel=1e-9)
