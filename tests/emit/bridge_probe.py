"""Running code in megatron-bridge 0.6.2 (bridge_tooling.py) from a test: the stand-in modules its package imports
at module level (Transformer Engine, apex, HF ``datasets``, ``diffusers``, ``modelopt``, ``megatron.energon``,
tensorboard, protobuf: empty modules whose attributes are inert classes; nothing builds a config with them), the
offline hub of the library recipes' Hugging Face configs (bridge_hub.py) and one subprocess per probe. Used by
test_megatron_bridge_applied.py and test_bridge_run_config.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bridge_hub import hf_cache  # tests/emit/ is on sys.path
from bridge_tooling import bridge_path

__all__ = ["STANDIN", "run_bridge_probe"]

# Imported by Bridge's package at module level, not used to build or validate a config (see the docstring).
STANDIN = r'''
import abc, importlib.abc, importlib.machinery, sys, types
PREFIXES = ("transformer_engine", "apex", "datasets", "diffusers", "modelopt", "megatron.energon", "tensorboard",
            "google")
VERSIONS = {"transformer_engine": "2.14.0", "tensorboard": "2.19.0"}

class _Meta(abc.ABCMeta):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Meta(name, (_Inert,), {})

class _Inert(metaclass=_Meta):
    def __init__(self, *args, **kwargs): pass
    def __call__(self, *args, **kwargs): return None
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Meta(name, (_Inert,), {})

def _module_getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Meta(name, (_Inert,), {})

class _FusedAdam(_Inert):
    # TE's signature (TransformerEngine d0067d0 transformer_engine/pytorch/optimizers/fused_adam.py:112-131), which
    # megatron-core's OptimizerConfig inspects for --use-precision-aware-optimizer (optimizer_config.py:446-463)
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                 bias_correction=True, adam_w_mode=True, capturable=False, master_weights=False,
                 master_weight_dtype=None, exp_avg_dtype=None, exp_avg_sq_dtype=None, use_decoupled_grad=False,
                 store_param_remainders=False, set_grad_none=None):
        pass

NAMED = {"transformer_engine.pytorch.optimizers": {"FusedAdam": _FusedAdam}}

class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if any(fullname == p or fullname.startswith(p + ".") for p in PREFIXES):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None
    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__version__ = VERSIONS.get(spec.name.split(".")[0], "0.0.0")
        module.__getattr__ = _module_getattr
        module.__dict__.update(NAMED.get(spec.name, {}))
        return module
    def exec_module(self, module): pass

sys.meta_path.insert(0, _Finder())
'''


def run_bridge_probe(root: Path, probe: str, *argv: str, timeout: int = 900) -> dict:
    """Run ``probe`` (Python source that prints one ``PROBE-RESULT <json>`` line) with Bridge 0.6.2 on its path, the
    stand-ins first and the offline hub under ``root``; its JSON (pytest.skip from bridge_path where pip cannot get
    Bridge)."""
    tools = bridge_path()
    (root / "standins").mkdir(exist_ok=True)
    (root / "standins" / "autotune_standins.py").write_text(STANDIN)
    hub = hf_cache(root / "hub")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "standins"), str(tools)]),
           "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "",
           "HF_MODULES_CACHE": str(root / "hf_modules")}  # where transformers copies Kimi-K2's config class
    run = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, env=env, cwd=root,
                         timeout=timeout, check=False)
    lines = [line for line in run.stdout.splitlines() if line.startswith("PROBE-RESULT ")]
    assert run.returncode == 0 and lines, (run.stdout[-2000:] + run.stderr[-4000:])
    return json.loads(lines[-1].split(" ", 1)[1])
