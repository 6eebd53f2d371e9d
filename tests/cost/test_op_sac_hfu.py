"""HFU under torchtitan's op-level selective checkpointing counts what it reruns: the every-second mm outputs it does
not save (wk, wo, w3 of a Llama block: ``block_mms[1::2]``), every GEMM under 0.2.2's Float8 save list, none under
0.3's; Megatron's selective recompute still counts the attention core. Derived by hand for Llama 3 8B."""

from __future__ import annotations

import pytest

from autotune.cost.flops import step_flops
from autotune.cost.step_time import TimeSettings, estimate_step_time
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset

MODEL = load_model_preset("llama3-8b")
CLUSTER = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
S = 8192


def _extra_flops(engine: str, precision: str, policy: str | None = None) -> tuple[float, float]:
    """(hardware - model FLOPs of one step from the estimate's TFLOP/s, tokens per step)."""
    plan = ParallelPlan(engine=engine, dp=8, zero_stage=3 if engine == "fsdp" else 1, seq_len=S, global_batch_size=8,
                        recompute="selective", precision=precision)
    t = estimate_step_time(MODEL, CLUSTER, plan, TimeSettings(selective_policy=policy))
    extra = (t.hardware_tflops_per_gpu - t.model_tflops_per_gpu) * 1e12 * t.step_time_s * plan.world_size
    return extra, plan.tokens_per_step


def test_the_facts_the_hand_count_uses():
    m = MODEL
    assert (m.num_layers, m.hidden_size, m.q_width, m.kv_width, m.ffn_hidden_size) == (32, 4096, 4096, 1024, 14336)
    assert not (m.linear_bias or m.qkv_bias) and m.activation == "swiglu" and m.moe is None


def test_op_sac_counts_the_every_second_mm_it_reruns():
    h, kv, f, layers = 4096, 1024, 14336, 32
    # wq wk wv wo w1 w3 w2: the 2nd, 4th and 6th rerun (wk: h -> kv, wo: h -> h, w3: h -> f), 2 FLOPs a multiply-add
    per_token = layers * 2 * (h * kv + h * h + h * f)
    extra, tokens = _extra_flops("fsdp", "bf16")
    assert extra == pytest.approx(per_token * tokens, rel=1e-9)
    assert extra == pytest.approx(_extra_flops("fsdp", "bf16", "op-sac-0.3")[0], rel=1e-12)  # bf16: same mms


def test_float8_reruns_every_gemm_under_02_and_none_under_03():
    h, kv, f, layers = 4096, 1024, 14336, 32
    every_gemm = layers * 2 * (h * h + 2 * h * kv + h * h + 3 * h * f)  # wq wk wv wo, w1 w3 w2
    extra, tokens = _extra_flops("fsdp", "fp8")
    assert extra == pytest.approx(every_gemm * tokens, rel=1e-9)
    assert _extra_flops("fsdp", "fp8", "op-sac-0.3")[0] == pytest.approx(0.0, abs=1e-3 * tokens)


def test_megatron_selective_still_counts_the_attention_core():
    attention_core = 32 * 2 * S * (4096 + 4096)  # scores and the weighted sum over the full s x s square
    extra, tokens = _extra_flops("megatron", "bf16")
    assert extra == pytest.approx(attention_core * tokens, rel=1e-9)
    assert step_flops(MODEL, S, tokens, "selective").hardware - step_flops(MODEL, S, tokens, "none").hardware \
        == pytest.approx(extra, rel=1e-9)
