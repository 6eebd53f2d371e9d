"""megatron-bridge 0.6.2 and megatron-core 0.19.2, pip-installed into the test tooling's cache on first use
(tests/tooling.py), for the tests that run their code: test_megatron_bridge_applied.py,
test_megatron_core_run_settings.py, test_megatron_versions.py."""

from __future__ import annotations

from pathlib import Path

from tooling import tool_folder  # tests/ is on sys.path (no __init__)

# Bridge and core; what `import megatron.bridge.recipes` needs that this environment lacks or has at versions
# Bridge 0.6 refuses (transformers <= 5.12.1 wants tokenizers <= 0.23.0 and huggingface-hub < 2, which uses httpx;
# and kernels < 0.13, its METADATA's pin: kernels 0.19's LayerRepository refuses transformers 5.12's calls without a
# revision, "Either a revision or a version must be specified", at `import transformers.activations`).
PACKAGES = ["megatron-bridge==0.6.2", "megatron-core==0.19.2", "omegaconf==2.3.0", "hydra-core==1.3.8",
            "antlr4-python3-runtime==4.9.3", "transformers==5.12.1", "tokenizers==0.22.2",
            "huggingface-hub==1.33.0", "httpx==0.29.0", "httpcore==1.0.9", "kernels==0.12.3"]


def bridge_path() -> Path:
    """The folder holding megatron-bridge 0.6 (installed on first use); pytest.skip when pip cannot get it."""
    return tool_folder("megatron-bridge-0.6", PACKAGES, ignore_requires_python=True)
