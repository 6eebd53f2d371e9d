"""What the built-in FSDP trainer refuses, and why (no processes started: the reasons are checked first)."""

from __future__ import annotations

import pytest

from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset
from autotune.train.fsdp import CP_REFUSED, unsupported_reason
from autotune.train.pipelining import virtual_stages

LLAMA, GPT = load_model_preset("tiny-llama"), load_model_preset("tiny-gpt")


def plan(**kw) -> ParallelPlan:
    base = {"engine": "fsdp", "dp": 2, "zero_stage": 3, "seq_len": 64, "global_batch_size": 2}
    return ParallelPlan(**(base | kw))


@pytest.mark.parametrize("model, kw", [
    (LLAMA, {}), (GPT, {}), (LLAMA, {"zero_stage": 0}), (LLAMA, {"zero_stage": 2, "recompute": "full"}),
    (LLAMA, {"offload_param": "cpu", "offload_optimizer": "cpu"}), (LLAMA, {"dp": 4, "dp_replicate": 2}),
    (LLAMA, {"tp": 2, "sequence_parallel": True}), (GPT, {"tp": 2}),
    (LLAMA, {"pp": 2, "dp": 1, "grad_accum_steps": 2}), (LLAMA, {"pp": 2, "vpp": 2, "dp": 1, "grad_accum_steps": 2}),
])
def test_runs(model, kw):
    assert unsupported_reason(model, plan(**kw)) is None


@pytest.mark.parametrize("model, kw, words", [
    (LLAMA, {"cp": 2, "dp": 1}, "_scaled_dot_product_flash_attention_for_cpu"),
    (LLAMA, {"ep": 2}, "expert parallelism"),
    (LLAMA, {"precision": "fp8"}, "torchao"),
    (LLAMA, {"optimizer": "adamw8bit"}, "8-bit AdamW"),
    (LLAMA, {"offload_param": "nvme", "offload_optimizer": "nvme"}, "host memory only"),
    (LLAMA, {"tp": 3, "dp": 1}, "over tp=3"),
    (GPT, {"tp": 2, "sequence_parallel": True}, "--no-sequence-parallel"),
    (GPT, {"pp": 2, "dp": 1, "grad_accum_steps": 2}, "tied embeddings"),
    (GPT, {"loss_chunks": 4}, "drop --loss-chunks"),
    (LLAMA, {"loss_chunks": 5}, "equal chunks"),
    (LLAMA, {"pp": 2, "dp": 1, "grad_accum_steps": 1}, "at least as many micro-batches"),
    (LLAMA, {"pp": 4, "vpp": 2, "dp": 1, "grad_accum_steps": 4}, "cannot be split"),
])
def test_refuses_with_reason(model, kw, words):
    reason = unsupported_reason(model, plan(**kw))
    assert reason is not None and words in reason
    if "cp" in kw:
        assert reason == CP_REFUSED


def test_uneven_virtual_stages_cover_every_layer_once():
    stages = virtual_stages(3, 2, 1, "any")
    assert stages == [(0, 2), (2, 1)]  # no Megatron split of 3 over 2: uniform, the first stage gets one more
    stages = virtual_stages(10, 2, 2, "any")
    assert stages == [(0, 2), (2, 3), (5, 3), (8, 2)]  # Megatron's uneven split: the end stages get fewer
