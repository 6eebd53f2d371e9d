"""The package's public API: lazy exports and the one-call DeepSpeed config for existing pipelines."""

import subprocess
import sys

import pytest

import autotune


def test_deepspeed_config_for_an_existing_pipeline():
    cfg = autotune.deepspeed_config(model="llama3-8b", gpu="h100-sxm-80gb", num_gpus=8, seq_len=4096,
                                    global_batch=64)
    assert cfg["train_batch_size"] == 64
    assert cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * 8 == 64
    assert cfg["zero_optimization"]["stage"] in (0, 1, 2, 3)


@pytest.mark.slow
def test_exports_resolve_and_import_is_light():
    for name in autotune.__all__:
        assert getattr(autotune, name) is not None
    # `import autotune` must not import torch or deepspeed (the CLI's --help stays fast)
    code = "import sys, autotune; print('torch' in sys.modules, 'deepspeed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
