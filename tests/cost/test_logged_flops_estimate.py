"""`autotune estimate` states the TFLOP/s per GPU Megatron-Bridge logs (autotune.cost.logged_flops), so a user can
hold the estimate against the job's own log line; NVIDIA's tables pair that figure with the tokens/s they measured.
"""

from __future__ import annotations

import json

import pytest

from autotune.cli import main

# NVIDIA-NeMo/Megatron-Bridge@067f987df03b docs/performance-summary.md#L59 (bench/data/nvidia_recipes_blackwell.csv):
# GPT-OSS-120B, 64 GB300, MXFP8, GBS 1280, MBS 4, seq 4096, EP 16: 33024 tokens/s and 1077 Model TFLOP/s per GPU.
GPT_OSS_ROW = ["estimate", "--model", "gpt-oss-120b", "--gpu", "gb300", "--num-gpus", "64", "--engine", "megatron",
               "--seq-len", "4096", "--global-batch", "1280", "--micro-batch", "4", "--ep", "16", "--precision",
               "fp8", "--fp8-recipe", "te-mxfp8"]
NVIDIA_TOKENS, NVIDIA_TFLOPS = 33024, 1077


def _run(argv, capsys) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def test_the_logged_figure_is_nvidias_flops_per_token_at_the_predicted_throughput(capsys):
    doc = json.loads(_run([*GPT_OSS_ROW, "--json"], capsys))
    time = doc["time"]
    per_gpu_tokens = time["tokens_per_s"] / 64
    # what Bridge logs per token, from the estimate's own two numbers, against NVIDIA's published pair (0.5%: the
    # rounding of NVIDIA's two integer columns, tests/cost/test_logged_flops.py)
    assert time["megatron_bridge_tflops_per_gpu"] / per_gpu_tokens == pytest.approx(
        NVIDIA_TFLOPS / NVIDIA_TOKENS, rel=0.005)
    # our own model FLOPs count GPT-OSS's attention over the full square and ignore its sliding windows: 17% more
    assert time["model_tflops_per_gpu"] / time["megatron_bridge_tflops_per_gpu"] == pytest.approx(1.167, abs=0.01)
    text = _run(GPT_OSS_ROW, capsys)
    logged = time["megatron_bridge_tflops_per_gpu"]
    assert f"Megatron-Bridge logs {logged:,.0f} TFLOP/s per GPU" in text


def test_other_engines_and_lora_state_no_logged_figure(capsys):
    fsdp = ["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--engine", "fsdp",
            "--global-batch", "64"]
    assert "megatron_bridge_tflops_per_gpu" not in json.loads(_run([*fsdp, "--json"], capsys))["time"]
    assert "Megatron-Bridge logs" not in _run(fsdp, capsys)
    lora = ["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--engine", "megatron",
            "--global-batch", "64", "--peft", "lora"]
    assert "Megatron-Bridge logs" not in _run(lora, capsys)
