"""The DeepSpeed trainer gives the MoE balancing loss's gradient the factor DeepSpeed's own ``engine.backward``
puts on the main loss (1/GAS, then the ZeRO / bf16 optimizer's loss scale), read from a real engine: the gradient
that reaches the loss tensor itself in ``engine.backward`` is the factor (autotune.train.deepspeed
._main_loss_factor). With fp16's dynamic scale 2^8 and GAS 4 that is 64: a balancing loss without it would
weigh 1/64 of the checkpoint's weight against the scaled main loss. DeepSpeed refuses fp16 on a CPU accelerator;
the script lets it (the loss scaler under test is the same Python on every device)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, os, sys, torch, deepspeed
import torch.distributed as dist
from autotune.train.deepspeed import _main_loss_factor

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
# DeepSpeed refuses fp16 on a CPU accelerator; the loss scaler under test is device-independent Python
from deepspeed.accelerator import get_accelerator
get_accelerator().is_fp16_supported = lambda: True
out = {}
for name, precision in (("bf16", {"bf16": {"enabled": True}}),
                        ("fp16", {"fp16": {"enabled": True, "initial_scale_power": 8}})):
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4, **precision,
           "zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW", "params": {"lr": 0.1, "torch_adam": True}}}
    model = torch.nn.Linear(4, 1)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    x = torch.ones(1, 4, dtype=torch.bfloat16 if name == "bf16" else torch.float16)
    loss = engine(x).float().sum()
    seen = []
    loss.register_hook(lambda g: seen.append(float(g)))
    factor = _main_loss_factor(engine, 1)
    engine.backward(loss)
    out[name] = {"factor": factor, "gradient_at_the_loss": seen[0], "ulysses_cp2": _main_loss_factor(engine, 2)}
print("FACTORS " + json.dumps(out))
"""


@pytest.mark.slow
def test_the_factor_is_what_engine_backward_puts_on_the_loss(free_port, tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(free_port)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("FACTORS ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    got = json.loads(lines[-1][len("FACTORS "):])
    for name in ("bf16", "fp16"):
        assert got[name]["factor"] == pytest.approx(got[name]["gradient_at_the_loss"], rel=1e-6), got
    assert got["bf16"]["factor"] == pytest.approx(0.25) and got["fp16"]["factor"] == pytest.approx(2 ** 8 / 4), got
    assert got["fp16"]["ulysses_cp2"] == pytest.approx(2 ** 8 / 8)
