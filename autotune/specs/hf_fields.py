"""Reading one Hugging Face ``config.json``: typed fields, every problem recorded, transformers' defaults.

:class:`Fields` records each missing or ill-typed field instead of stopping at the first, so the
readers (``hf_config``, ``hf_readers_dense``, ``hf_readers_moe``, ``hf_readers_more``) report everything at
once.
:func:`transformers_view` normalises a config through ``transformers``' own config class when that
package is installed (an optional dependency): derived fields such as ``layer_types`` and the
class defaults then come from the class itself; without it the readers' own defaults, copied from
the ``transformers`` 5.24 config classes, apply.
"""

from __future__ import annotations

import math
from typing import Any

from autotune.specs.limits import MODEL_LIMITS

__all__ = ["Fields", "head_dim_or_none", "layer_indices", "local_layers", "transformers_view"]

class Fields:
    """Reads one config.json, recording every missing or ill-typed field instead of stopping at the first."""

    def __init__(self, data: dict, model_type: str) -> None:
        self.data, self.model_type = data, model_type
        self.problems: list[str] = []

    def _check_int(self, key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.problems.append(f"{key!r} must be an integer, got {value!r}")
            return 1
        return value

    def need(self, *keys: str, what: str) -> int:
        """A required integer field (the first of ``keys`` present); a placeholder 1 when missing."""
        for key in keys:
            if self.data.get(key) is not None:
                return self._check_int(key, self.data[key])
        names = " or ".join(repr(k) for k in keys)
        self.problems.append(f"missing {names} ({what}), required for model_type {self.model_type!r}")
        return 1

    def get_int(self, *keys: str, default: int | None) -> int | None:
        for key in keys:
            if self.data.get(key) is not None:
                return self._check_int(key, self.data[key])
        return default

    def get(self, key: str, default: Any) -> Any:
        """A field of the JSON type of ``default`` (bool, number or string); a problem, not a coercion, otherwise."""
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(default, bool):
            if not isinstance(value, bool):
                self.problems.append(f"{key!r} must be true or false, got {value!r}")
                return default
        elif isinstance(default, int | float):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                self.problems.append(f"{key!r} must be a finite number, got {value!r}")
                return default
        elif isinstance(default, str) and not isinstance(value, str):
            self.problems.append(f"{key!r} must be a string, got {value!r}")
            return default
        return value

    def unsupported(self, text: str) -> None:
        self.problems.append(f"{text} (model_type {self.model_type!r})")

    def positive(self, key: str, default: int) -> int:
        """An integer field that must be >= 1 (a layer interval): a problem and ``default`` otherwise."""
        value = self.get_int(key, default=default)
        if value is None or value < 1:
            self.problems.append(f"{key!r} must be a positive integer, got {value!r}")
            return default
        return value

    def router(self, *, score: str, groups: int = 1, group_topk: int = 1, scaling: float = 1.0,
               norm_topk: bool = True) -> dict:
        """The router's MoESpec fields (``router_score`` ...) from scoring_func, n_group / topk_group,
        routed_scaling_factor and norm_topk_prob, each defaulting to the config class's value given here."""
        kind = self.get("scoring_func", score)
        if kind not in ("softmax", "sigmoid"):
            self.unsupported(f"scoring_func {kind!r} is not modelled (softmax or sigmoid)")
            kind = score
        out: dict = {"router_score": kind}
        n, k = self.get_int("n_group", default=groups), self.get_int("topk_group", default=group_topk)
        if n is not None and n > 1:
            out.update(router_groups=n, router_group_topk=k if k is not None else n)
        factor = self.get("routed_scaling_factor", float(scaling))
        if factor != 1.0:
            out["router_scaling_factor"] = float(factor)
        if kind == "softmax" and not self.get("norm_topk_prob", norm_topk):
            out["router_pre_softmax"] = True  # softmax over every expert, the top-k left unnormalised
        return out | self.aux_loss()

    def aux_loss(self) -> dict:
        """The load-balancing loss's MoESpec fields as the file states them: ``router_aux_loss_coef`` (Mixtral,
        Qwen3-MoE, GPT-OSS, Llama 4), else DeepSeek's ``aux_loss_alpha`` with ``seq_aux``; none where it states
        neither (the class default is not the checkpoint's word). The weight is Megatron's ``moe_aux_loss_coeff``
        as Megatron-Bridge's conversion maps both (conversion/model_bridge.py:465-466 at v0.6.0)."""
        for key in ("router_aux_loss_coef", "aux_loss_alpha"):
            if self.data.get(key) is not None:
                out: dict = {"aux_loss_coeff": float(self.get(key, 0.0))}
                if key == "aux_loss_alpha" and self.get("seq_aux", False):
                    out["aux_loss_per_sequence"] = True
                return out
        return {}

    def required(self, raw: dict, *keys: str) -> None:
        """Shape fields the config itself must give (not left to a class default)."""
        for key in keys:
            if raw.get(key) is None:
                self.problems.append(f"missing {key!r}, required for model_type {self.model_type!r}")


USE_TRANSFORMERS = True
"""Normalise through transformers' config classes when importable (tests turn it off to check the fallbacks)."""

_BOOKKEEPING = ("model_type", "architectures", "auto_map", "transformers_version", "_name_or_path", "torch_dtype",
                "dtype", "quantization_config")


def transformers_view(data: dict, model_type: str) -> dict | None:
    """``data`` as transformers' config class for ``model_type`` reads it (its ``to_dict()``, defaults and
    derived fields filled in); None when transformers is missing, lacks the type or refuses the values
    (then the readers' own checks and defaults apply, and name any problem)."""
    if not USE_TRANSFORMERS:
        return None
    try:
        from transformers import AutoConfig
    except ImportError:
        return None
    kwargs = {k: v for k, v in data.items() if k not in _BOOKKEEPING}
    layers = kwargs.get("num_hidden_layers")
    if isinstance(layers, int) and layers > MODEL_LIMITS["num_layers"]:
        return None  # the class would build per-layer lists of that length; our limit check names the value
    try:
        return AutoConfig.for_model(model_type, **kwargs).to_dict()
    except Exception:  # noqa: BLE001 (any refusal: our own checks report the field)
        return None


def head_dim_or_none(head_dim: int | None, hidden: int, heads: int) -> int | None:
    """An explicit head_dim only where it differs from hidden/heads (Mistral-Nemo: 128 with 5120/32)."""
    return None if head_dim is None or head_dim * heads == hidden else head_dim


def layer_indices(num_layers: int) -> range:
    """The layers to build per-layer patterns over: a count above the limit (refused later, with its value
    named) gives none rather than a list that size."""
    return range(num_layers if num_layers <= MODEL_LIMITS["num_layers"] else 0)


def local_layers(f: Fields, num_layers: int, fallback: list[int]) -> list[int]:
    """Indices of the sliding-window or chunked-attention layers: from ``layer_types`` when the config
    (or transformers) gives it, else ``fallback`` (the class's own rule)."""
    types = f.data.get("layer_types")
    if types is None:
        return fallback
    if not isinstance(types, list) or len(types) != num_layers or not all(isinstance(t, str) for t in types):
        f.problems.append(f"'layer_types' must list one attention type per layer ({num_layers}), got {types!r}")
        return fallback
    unknown = sorted({t for t in types} - {"full_attention", "sliding_attention", "chunked_attention"})
    if unknown:
        f.unsupported(f"layer_types {unknown} are not modelled (full_attention, sliding_attention, chunked_attention)")
    return [i for i, t in enumerate(types) if t in ("sliding_attention", "chunked_attention")]
