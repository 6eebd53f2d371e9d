"""The fused attention rate by the key length of each kernel call (autotune.cost.attention_seq) against the H200
measurement, and the key length context parallelism leaves each call."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from autotune.cost.attention_seq import KEY_LENGTH_HALF, kernel_key_length, key_length_factor
from autotune.cost.kernels import rates
from autotune.cost.layer_time import layer_time
from autotune.cost.step_time import TimeSettings
from autotune.specs.loading import load_cluster
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

KERNELS = json.loads((Path(__file__).resolve().parents[2] / "bench" / "data" / "h200_kernels.json").read_text())
BACKENDS = {"fa2": "FLASH_ATTENTION", "fa3": "CUDNN_ATTENTION"}
# (sequence, fwd + bwd TFLOP/s) of the first sweep (head_dim 128, 2048 / 4096 / 8192), the rows `a` was fitted on
MEASURED_H200 = {kernel: tuple((row["seq"], row["fwd_bwd_tflops"]) for row in KERNELS["attention"]
                               if row["backend"] == backend) for kernel, backend in BACKENDS.items()}


@pytest.mark.parametrize("kernel, measured_ratio", [("fa2", 0.763), ("fa3", 0.707)])
def test_curve_reproduces_the_measured_2048_over_8192(kernel, measured_ratio):
    # H200, causal SDPA fwd + bwd (bench/data/h200_kernels.json): FLASH 221.0 / 289.8, CUDNN 376.3 / 532.1
    (s_short, r_short), _, (s_long, r_long) = MEASURED_H200[kernel]
    assert r_short / r_long == pytest.approx(measured_ratio, abs=1e-3)
    ratio = key_length_factor(kernel, s_short) / key_length_factor(kernel, s_long)
    assert ratio == pytest.approx(measured_ratio, rel=0.05)


@pytest.mark.parametrize("kernel", ["fa2", "fa3"])
def test_curve_meets_every_measured_row(kernel):
    # one asymptote through the three lengths: each row within 1% of f_inf x s / (s + a), f_inf from their mean
    rows = MEASURED_H200[kernel]
    f_inf = sum(r / key_length_factor(kernel, s) for s, r in rows) / len(rows)
    for s, r in rows:
        assert f_inf * key_length_factor(kernel, s) == pytest.approx(r, rel=0.01)


def test_factor_is_l_over_l_plus_a_and_monotone():
    assert key_length_factor("fa2", 946.0) == pytest.approx(0.5)
    assert key_length_factor("fa3", 1313.0) == pytest.approx(0.5)
    lengths = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 131072]
    for kernel in ("fa2", "fa3", "fa-triton"):
        f = [key_length_factor(kernel, s) for s in lengths]
        assert all(0 < x < y < 1 for x, y in zip(f, f[1:])), kernel
    # nearest measured kernel for the unmeasured ones; no tiled kernel, no curve
    assert key_length_factor("fa-triton", 2048) == key_length_factor("fa2", 2048)
    assert key_length_factor("unfused", 2048) == 1.0
    assert KEY_LENGTH_HALF["fa3"] > KEY_LENGTH_HALF["fa2"]


def test_key_length_under_context_parallelism():
    s = 32768
    assert kernel_key_length(s, 1, None) == s
    assert kernel_key_length(s, 4, "p2p") == s / 4
    assert kernel_key_length(s, 4, "allgather") == s / 4  # torch's ring: one kernel per step
    assert kernel_key_length(s, 4, "ulysses") == s  # the whole sequence, fewer heads
    assert kernel_key_length(s, 4, "te-allgather") == s
    # a2a+p2p: the all-to-all inside the node (tp 2: 4 of cp 8), the ring of 2 across
    assert kernel_key_length(s, 8, "a2a+p2p", tp=2, gpus_per_node=8) == s / 2
    # local layers: fewer useful keys per row, capped by the call's own length
    assert kernel_key_length(s, 1, None, executed_share=0.25) == s / 4
    assert kernel_key_length(s, 8, "p2p", executed_share=0.5) == s / 8


def _attention(cp: int, seq: int, cp_kind: str = "p2p") -> tuple[float, float]:
    """(rank's attention forward seconds, its executed FLOPs) of one layer."""
    m = ModelSpec(name="tiny", num_layers=2, hidden_size=4096, num_attention_heads=32, ffn_hidden_size=8192,
                  vocab_size=256, activation="swiglu", norm="rmsnorm", position_embedding="rope")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    eff = TimeSettings().efficiency
    r = rates(cluster, "bf16", eff, "fa3", None)
    plan = ParallelPlan(engine="megatron", dp=8 // cp, cp=cp, seq_len=seq, global_batch_size=8 // cp)
    lt = layer_time(m, cluster, plan, False, eff, r, cp_kind=cp_kind)
    tokens = seq / cp
    flops = 2 * tokens * seq * (m.q_width + m.attention_output_width) / 2
    return lt.attention_s, flops


def test_plain_sequence_lengths_give_a_monotone_rate():
    rate = [f / s for s, f in (_attention(1, seq) for seq in (1024, 2048, 4096, 8192, 16384))]
    assert all(x < y for x, y in zip(rate, rate[1:]))
    r = rates(load_cluster(gpu="h100-sxm-80gb", num_gpus=8), "bf16", TimeSettings().efficiency, "fa3", None)
    assert rate[-1] == pytest.approx(r.attention * key_length_factor("fa3", 16384), rel=1e-9)


def test_context_parallel_ring_slows_attention_per_flop():
    seq = 16384
    plain_s, plain_f = _attention(1, seq)
    ring_s, ring_f = _attention(4, seq, "p2p")
    assert ring_f == pytest.approx(plain_f / 4)
    # each ring step is a call of seq / 4 keys: the same FLOPs take longer
    assert ring_s / ring_f == pytest.approx(
        plain_s / plain_f * key_length_factor("fa3", seq) / key_length_factor("fa3", seq / 4), rel=1e-9)
    assert ring_s > plain_s / 4
    # Ulysses calls the kernel on the whole sequence: no slow-down per FLOP
    uly_s, uly_f = _attention(4, seq, "ulysses")
    assert uly_s / uly_f == pytest.approx(plain_s / plain_f, rel=1e-9)


def test_the_h200_sweep_follows_the_curve_beyond_the_fitted_lengths():
    # bench/data/h200_kernels.json "attention_sweep": head_dim 128, 1k-16k (1024 and 16384 not in the fit of a);
    # the model's isolated rate (gemm_peak_fraction 1) over the measured one stays flat across the lengths
    doc = KERNELS
    h200 = load_cluster(gpu="h200", num_gpus=1)
    isolated = TimeSettings().efficiency.with_(gemm_peak_fraction=1.0)
    for backend, kernel in (("FLASH_ATTENTION", "fa2"), ("CUDNN_ATTENTION", "fa3")):
        rows = [row for row in doc["attention_sweep"] if row["backend"] == backend and row["head_dim"] == 128
                and "error" not in row]
        assert {row["seq"] for row in rows} >= {1024, 16384}
        asymptote = rates(h200, "bf16", isolated, kernel, None).attention
        ratios = [asymptote * key_length_factor(kernel, row["seq"]) / (row["fwd_bwd_tflops"] * 1e12) for row in rows]
        assert max(ratios) / min(ratios) < 1.05, (backend, ratios)  # a flat curve would spread 1.9x over 1k-16k
        assert 0.9 < statistics.median(ratios) < 1.15, (backend, ratios)
