"""Sanity checks of the activation and DeepSpeed model-state measurements."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotune.specs.model import ModelSpec
from autotune.workloads.measure import saved_activation_bytes
from autotune.workloads.transformer import build_model

ROOT = Path(__file__).resolve().parents[2]


class _LinearSum(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(256, 128).to(torch.bfloat16)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.lin(x).float().sum()


def test_a_linear_layer_saves_exactly_its_input() -> None:
    x = torch.randn(4, 32, 256, dtype=torch.bfloat16, requires_grad=True)
    res = saved_activation_bytes(_LinearSum(), x, None)
    assert res["saved_bytes"] == x.numel() * 2  # weight and bias are parameters: excluded
    assert res["saved_by_dtype"] == {"bfloat16": x.numel() * 2}
    assert res["saved_by_module"] == {"lin": x.numel() * 2}
    assert res["retained_bytes"] == 0  # the input was made before the forward
    assert res["param_grad_bytes"] == (256 * 128 + 128) * 2


def _gpt(layers: int) -> ModelSpec:
    return ModelSpec(name="gpt", num_layers=layers, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
                     vocab_size=128, position_embedding="learned", max_position_embeddings=32, linear_bias=True,
                     tied_embeddings=True)


def _per_layer(recompute: str, flash: bool = True) -> float:
    s, b, out = 32, 2, {}
    for layers in (1, 2):
        model = build_model(_gpt(layers), seq_len=s, recompute=recompute, flash_attention=flash)
        ids = torch.randint(0, 128, (b, s))
        out[layers] = saved_activation_bytes(model, ids, ids, backward=False)
        # saved and retained differ only by the two int64 [b, s] tensors made before the forward
        assert out[layers]["saved_bytes"] - out[layers]["retained_bytes"] == 8 * b * s
    return out[2]["activation_bytes"] - out[1]["activation_bytes"]


def test_gpt_layer_saves_the_flash_formula() -> None:
    s, b, h, a = 32, 2, 64, 4
    sbh = s * b * h
    layer_norm_stats = 2 * 2 * (2 * s * b)  # 2 norms x (mean, rstd) in bf16 on CPU
    lse = 4 * a * s * b
    assert _per_layer("none") == 32 * sbh + lse + layer_norm_stats
    assert _per_layer("selective") == 32 * sbh + layer_norm_stats  # logsumexp recomputed
    assert _per_layer("full") == 2 * sbh  # only the block input
    assert _per_layer("none", flash=False) == 32 * sbh + 2 * a * s * s * b + layer_norm_stats


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_deepspeed_probe_single_rank(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    out = tmp_path / "probe.json"
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.workloads.ds_memory_probe", "--model", "tiny-gpt",
         "--configs", "zero0", "zero1", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert "RESULT" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
    data = json.loads(out.read_text())
    n = data["num_params"]
    for name in ("zero0", "zero1"):
        before = data["results"][name]["before_step"]
        assert before["params"] == 2 * n
        assert before["grads"] == 2 * n  # dp=1: the partition is everything
        assert before["optimizer_states"] - 12 * n < 1024  # + Adam 'step' scalars
        # the categories account for everything alive but the input batch
        assert before["unattributed"] <= 8 * 2 * 128 + 64
