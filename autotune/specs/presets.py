"""Model and GPU presets, read from the YAML files shipped in ``autotune/presets``.

``autotune/presets/models/<name>.yaml`` holds one :class:`ModelSpec` each (its fields, plus a
``source:`` line); ``autotune/presets/gpus.yaml`` holds, per GPU, the datasheet numbers
(``gpu:``), the usual server around it (``cluster:``) and a ``source:``. Files are parsed once.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import re

import yaml

from autotune.errors import InputError, suggest_names
from autotune.specs.hardware import GPUSpec, kernel_facts_from_dict
from autotune.specs.model import ModelSpec

__all__ = [
    "model_preset_names", "load_model_preset", "model_preset_source", "preset_matching",
    "gpu_preset_names", "load_gpu_preset", "cluster_defaults", "CLUSTER_DEFAULT_KEYS", "nearest_gpu_preset",
]

CLUSTER_DEFAULT_KEYS = (
    "gpus_per_node", "intra_node_bandwidth_gb_per_s", "inter_node_bandwidth_gb_per_s", "pcie_bandwidth_gb_per_s",
    "host_memory_gib_per_node", "nvme_bandwidth_gb_per_s", "nvme_capacity_gib_per_node",
)
_HELP = "`autotune estimate --help` lists the presets"


def _presets_dir():
    return importlib.resources.files("autotune.presets")


def _unknown(kind: str, name: object, known: tuple[str, ...], *, list_all: bool) -> InputError:
    prefixed = [k for k in known if k.startswith(str(name).lower())]  # "h100" -> the h100-* presets
    hint = suggest_names(str(name), prefixed or known)
    listing = f": {', '.join(known)}" if list_all else ""
    return InputError([f"unknown {kind} preset {name!r}{hint}; {_HELP}{listing}"], subject=f"{kind} preset")


# ---- models ------------------------------------------------------------------------------
def _by_family_then_size(name: str) -> tuple[str, float]:
    """llama2-7b < llama2-13b; megatron-gpt-529.6b < megatron-gpt-1t."""
    match = re.search(r"(\d+(?:\.\d+)?)([bt])$", name)
    if match is None:
        return name, 0.0
    return name[:match.start()], float(match[1]) * (1000.0 if match[2] == "t" else 1.0)


@functools.cache
def model_preset_names() -> tuple[str, ...]:
    """Names of the model presets, by family, then size."""
    folder = _presets_dir().joinpath("models")
    names = (p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))
    return tuple(sorted(names, key=_by_family_then_size))


# libyaml's safe loader where PyYAML was built with it: the GPU presets parse in ~5 ms instead of ~60 ms with the
# pure-Python one (the same documents: tests/specs/test_preset_yaml_loader).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_shipped_yaml(text: str):
    """A preset file of the package, parsed as ``yaml.safe_load`` parses it."""
    return yaml.load(text, Loader=_SAFE_LOADER)  # noqa: S506 (a safe loader)


@functools.cache
def _model_preset_data(name: str) -> dict:
    if name not in model_preset_names():
        raise _unknown("model", name, model_preset_names(), list_all=False)
    text = _presets_dir().joinpath("models", f"{name}.yaml").read_text(encoding="utf-8")
    return _load_shipped_yaml(text)


def model_preset_source(name: str) -> str:
    """Where preset ``name``'s numbers come from."""
    return _model_preset_data(name).get("source", "")


@functools.cache
def load_model_preset(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of preset ``name``; InputError (nearest names suggested) if unknown."""
    data = dict(_model_preset_data(name))
    data.pop("source", None)
    return ModelSpec.from_dict(data)


@functools.lru_cache(maxsize=256)
def preset_matching(model: ModelSpec, names: tuple[str, ...]) -> str | None:
    """Which of the presets ``names`` ``model`` is: the one named like it, else the one equal to it in every field
    but the name (a Hugging Face config.json of Llama 3 8B reads as the preset under the file's name,
    ``meta-llama/Meta-Llama-3-8B``); None when neither. A model named like a preset but shaped otherwise (a layer
    cut) keeps its name's answer: the caller decides whether the shape must match too."""
    if model.name in names:
        return model.name
    for name in names:
        preset = load_model_preset(name)
        if preset.num_layers == model.num_layers and preset.hidden_size == model.hidden_size:
            if dataclasses.replace(model, name=name) == preset:
                return name
    return None


# ---- GPUs --------------------------------------------------------------------------------
@functools.cache
def _gpu_presets() -> dict[str, dict]:
    text = _presets_dir().joinpath("gpus.yaml").read_text(encoding="utf-8")
    return _load_shipped_yaml(text)


@functools.cache
def gpu_preset_names() -> tuple[str, ...]:
    """Names of the GPU presets, in file order (oldest GPU first)."""
    return tuple(_gpu_presets())


def _gpu_entry(name: str) -> dict:
    if name not in _gpu_presets():
        raise _unknown("gpu", name, gpu_preset_names(), list_all=True)
    return _gpu_presets()[name]


@functools.cache
def load_gpu_preset(name: str) -> GPUSpec:
    """The :class:`GPUSpec` of preset ``name``; InputError (nearest names suggested) if unknown."""
    entry = _gpu_entry(name)
    gpu = entry["gpu"]

    kernels = kernel_facts_from_dict(entry["kernels"], name, "h100-sxm-80gb") if "kernels" in entry else None
    return GPUSpec(name=name, memory_gib=gpu["memory_gib"], peak_tflops=dict(gpu["peak_tflops"]),
                   hbm_bandwidth_gb_per_s=gpu["hbm_bandwidth_gb_per_s"], source=entry.get("source", ""),
                   kernels=kernels, compute_capability=gpu.get("compute_capability"))


def cluster_defaults(gpu_name: str) -> dict:
    """The usual server around GPU preset ``gpu_name``: the ClusterSpec fields in ``CLUSTER_DEFAULT_KEYS``."""
    cluster = _gpu_entry(gpu_name)["cluster"]
    return {k: cluster[k] for k in CLUSTER_DEFAULT_KEYS}


def nearest_gpu_preset(peak_tflops: dict[str, float], exclude: str = "") -> str:
    """The GPU preset whose 16-bit peak is closest to ``peak_tflops``' (what to copy kernel facts from)."""
    def sixteen(table) -> float:
        return max((v for k, v in table.items() if k in ("bf16", "fp16")), default=max(table.values()))

    peak = sixteen(peak_tflops)
    names = [n for n in gpu_preset_names() if n != "cpu" and n != exclude]
    return min(names, key=lambda n: abs(sixteen(load_gpu_preset(n).peak_tflops) - peak), default="h100-sxm-80gb")
