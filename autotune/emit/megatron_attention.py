"""Megatron-LM flags for the model's position embedding and attention variants: RoPE or YaRN, attention sinks,
sliding-window layers. Flags of megatron-core 0.19 (``emit/megatron_flags_core_v0.19.json``); what each sets, as
Megatron-Bridge's own GPT-OSS bridge sets the same fields (Megatron-Bridge 067f987
src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py:65-98):

* YaRN: ``--position-embedding-type yarn`` with ``--rotary-scaling-factor`` (megatron/training/argument_utils.py:384-413
  at d98e8a6 ``_apply_yarn_config_from_args``: the factor becomes ``yarn_rotary_scaling_factor``; the original
  context 4096 and beta fast / slow 32 / 1 are its defaults, GPT-OSS's own values). Not expressible on the command
  line: GPT-OSS's ``truncate: false`` (``yarn_correction_range_round_to_int`` False; the flag only turns it on and
  the default is True), which Bridge's provider sets.
* attention sinks: ``--softmax-type learnable`` (a learned offset per head, Transformer Engine's ``softmax_type``).
* sliding windows: ``--window-size W-1,0`` (the window counts the query's own token: Bridge sets
  ``(sliding_window - 1, 0)``) and ``--window-attn-skip-freq``: the full-attention layers, an int N where every Nth
  layer (1-indexed) is full, else the 0/1 list of windowed layers (megatron/core/transformer/utils.py:531-547
  ``is_layer_window_attention``). Chunked attention (Llama 4) is not a sliding window and is not written.
"""

from __future__ import annotations

from autotune.specs.model import ModelSpec

__all__ = ["flag_number", "position_and_attention_flags"]


def flag_number(x: float) -> str:
    """A number as Megatron's flags take it: an integral value without its ``.0``."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _skip_freq(model: ModelSpec) -> str | None:
    """--window-attn-skip-freq for the model's windowed layers; None where every layer is windowed."""
    windowed = model.sliding_window_layers
    if windowed is None:
        return None
    local = set(windowed)
    flags = [i in local for i in range(model.num_layers)]
    for every in range(2, model.num_layers + 1):
        if all(flags[i] == ((i + 1) % every != 0) for i in range(model.num_layers)):
            return str(every)
    return "[" + ",".join("1" if f else "0" for f in flags) + "]"


def position_and_attention_flags(model: ModelSpec) -> list[str]:
    """The position-embedding and attention-variant flags of ``model`` (module docstring)."""
    rope = model.position_embedding == "rope"
    yarn = rope and model.rope_scaling == "yarn"
    args = ["--position-embedding-type", "yarn" if yarn else "rope" if rope else "learned_absolute"]
    if rope:
        args += ["--rotary-base", flag_number(model.rope_theta)]
    if yarn and model.rope_scaling_factor is not None:
        args += ["--rotary-scaling-factor", flag_number(model.rope_scaling_factor)]
    if model.attention_sinks:
        args += ["--softmax-type", "learnable"]
    if model.sliding_window is not None and not model.chunked_attention:
        args += ["--window-size", f"{model.sliding_window - 1},0"]
        freq = _skip_freq(model)
        if freq is not None:
            args += ["--window-attn-skip-freq", freq]
    return args
