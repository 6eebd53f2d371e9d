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
  ``is_layer_window_attention``).
* chunked attention (Llama 4): Megatron-LM's GPT model has none (its SelfAttention passes ``attention_chunk`` 0,
  megatron/core/transformer/attention.py:952 at d98e8a6; Megatron-Bridge's Llama 4 provider chunks in its own
  attention module, llama4_utils.py, with no recipe in 0.6). A sequence no longer than the chunk is one chunk, the
  same model: :func:`chunked_attention_problem` refuses longer ones.
* rotary-free (NoPE) layers (``ModelSpec.is_rotary_layer``: Llama 4's global layers, transformers Llama4TextConfig
  ``no_rope_layers``; SmolLM3's every 4th; EXAONE 4's global ones): ``--no-rope-freq`` (arguments.py:304-320, 2428:
  an int N skips RoPE on every Nth layer, 1-indexed, where N divides the layers, transformer_config.py:3138-3152;
  else a 0/1 list, 1 = no RoPE; attention.py:1322 reads it per layer).
"""

from __future__ import annotations

from autotune.specs.model import ModelSpec
from autotune.specs.model_parts import local_attention_below

__all__ = ["flag_number", "position_and_attention_flags", "chunked_attention_problem", "no_rope_freq"]


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


def no_rope_freq(model: ModelSpec) -> int | list[int] | None:
    """TransformerConfig.no_rope_freq for the model's rotary-free layers (module docstring): an int N where exactly
    every Nth layer (1-indexed) skips RoPE, else the per-layer 0/1 list (1 = no RoPE); None where every layer rotates
    or the model has no RoPE. Megatron-LM's --no-rope-freq and Bridge's model.no_rope_freq both carry it."""
    if model.position_embedding != "rope":
        return None
    nope, n = [int(not model.is_rotary_layer(i)) for i in range(model.num_layers)], model.num_layers
    if not any(nope):
        return None
    for every in range(2, n + 1):
        if n % every == 0 and all(nope[i] == ((i + 1) % every == 0) for i in range(n)):
            return every
    return nope


def position_and_attention_flags(model: ModelSpec) -> list[str]:
    """The position-embedding and attention-variant flags of ``model`` (module docstring)."""
    rope = model.position_embedding == "rope"
    yarn = rope and model.rope_scaling == "yarn" and model.mla is None
    args = ["--position-embedding-type", "yarn" if yarn else "rope" if rope else "learned_absolute"]
    if rope:
        args += ["--rotary-base", flag_number(model.rope_theta)]
        if model.rotary_fraction != 1:  # the first rotary_percent of each head's channels (rope_utils.py)
            args += ["--rotary-percent", flag_number(model.rotary_fraction)]
    if yarn and model.rope_scaling_factor is not None:
        args += ["--rotary-scaling-factor", flag_number(model.rope_scaling_factor)]
    if yarn:  # GPTModel's YaRN reads these off the config (argument_utils.py _apply_yarn_config_from_args)
        args += _given(model, ("--yarn-original-max-position-embeddings", "rope_original_max_positions"),
                       ("--yarn-beta-fast", "yarn_beta_fast"), ("--yarn-beta-slow", "yarn_beta_slow"),
                       ("--mscale", "yarn_mscale"), ("--mscale-all-dim", "yarn_mscale_all_dim"))
        if model.yarn_truncate is False:  # yarn_correction_range_round_to_int (default true): transformers' truncate
            args.append("--no-yarn-correction-range-round-to-int")
    if model.mla is not None:  # MLATransformerConfig.rope_type (default yarn: say which), its factor and mscales
        args += ["--rope-type", "yarn" if model.rope_scaling == "yarn" else "rope"]
        if model.rope_scaling == "yarn":
            args += ["--rotary-scaling-factor", flag_number(model.rope_scaling_factor)]
            args += _given(model, ("--mscale", "yarn_mscale"), ("--mscale-all-dim", "yarn_mscale_all_dim"))
    if rope and model.rope_scaling in ("llama3", "linear") and rope_scaling_problem(model) is None:
        args += (["--use-rope-scaling", "--rope-scaling-factor", flag_number(model.rope_scaling_factor)]
                 if model.rope_scaling == "llama3" else
                 ["--rotary-seq-len-interpolation-factor", str(int(model.rope_scaling_factor))])
    if model.attention_sinks:
        args += ["--softmax-type", "learnable"]
    if model.sliding_window is not None and not model.chunked_attention:
        args += ["--window-size", f"{model.sliding_window - 1},0"]
        freq = _skip_freq(model)
        if freq is not None:
            args += ["--window-attn-skip-freq", freq]
    if (nope := no_rope_freq(model)) is not None:  # an int N, or the 0/1 list as "[0,1,...]"
        args += ["--no-rope-freq", str(nope) if isinstance(nope, int) else "[" + ",".join(map(str, nope)) + "]"]
    return args


YARN_DEFAULTS = {"rope_original_max_positions": 4096, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0, "yarn_mscale": 1.0,
                 "yarn_mscale_all_dim": 0.0}
"""Megatron-core's YaRN values where no flag is given (argument_utils.py _apply_yarn_config_from_args at d98e8a6;
the --yarn-* flags are new in 0.19: older releases run these values)."""


def _given(model: ModelSpec, *pairs: tuple[str, str]) -> list[str]:
    """Each (flag, field) pair's flag and value where the model states the field; the --yarn-* flags (Megatron-core
    0.19+) only where it is not Megatron's default."""
    out: list[str] = []
    for flag, field in pairs:
        value = getattr(model, field)
        if value is not None and not (flag.startswith("--yarn-") and value == YARN_DEFAULTS[field]):
            out += [flag, flag_number(value)]
    return out


MLA_YARN_FIXED = {"rope_original_max_positions": 4096, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0}
"""MLATransformerConfig's YaRN fields no Megatron-LM flag reaches (original_max_position_embeddings, beta_fast,
beta_slow: transformer_config.py at d98e8a6; the --yarn-* flags set GPTModel's non-MLA YaRN only)."""


def mla_yarn_gaps(model: ModelSpec) -> list[str]:
    """What of an MLA model's YaRN Megatron-LM's arguments leave at MLATransformerConfig's defaults where the model
    has another value (Kimi-K2: beta_fast 1, the config's 32); empty where the arguments say it all."""
    if model.mla is None or model.rope_scaling != "yarn":
        return []
    return [f"{field} {getattr(model, field):g} (MLATransformerConfig: {fixed:g})" for field, fixed in
            MLA_YARN_FIXED.items() if getattr(model, field) not in (None, fixed)]


MEGATRON_LLAMA3_SCALING = (1.0, 4.0, 8192)
"""The llama3 scaling Megatron-core builds (--use-rope-scaling): low_freq_factor, high_freq_factor and the original
context fixed (megatron/core/models/common/embeddings/rotary_pos_embedding.py RotaryEmbedding._apply_scaling at
d98e8a6); only the factor is a flag (--rope-scaling-factor)."""


def rope_scaling_problem(model: ModelSpec) -> str | None:
    """Why Megatron-LM's flags cannot give the model's RoPE scaling (None where they can): llama3 scaling other than
    Llama 3.1's parameters, or a linear one by a factor that is not an integer (--rotary-seq-len-interpolation-factor
    is an int: positions divided by it)."""
    if model.rope_scaling == "llama3":
        given = (model.rope_low_freq_factor, model.rope_high_freq_factor, model.rope_original_max_positions)
        if given != MEGATRON_LLAMA3_SCALING:
            return (f"{model.name} scales RoPE as llama3 with low / high frequency factors {given[0]:g} / {given[1]:g} "
                    f"and original context {given[2]}; Megatron-core's --use-rope-scaling fixes them at 1 / 4 and "
                    f"8192")
    if model.rope_scaling == "linear" and float(model.rope_scaling_factor) != int(model.rope_scaling_factor):
        return (f"{model.name} scales RoPE linearly by {model.rope_scaling_factor:g}; Megatron's "
                f"--rotary-seq-len-interpolation-factor takes an integer")
    return None


def chunked_attention_problem(model: ModelSpec, seq_len: int) -> str | None:
    """Why Megatron-LM cannot train ``model`` at ``seq_len``: chunked attention over a sequence longer than a chunk
    (module docstring); None where it can."""
    local = local_attention_below(model, seq_len) if model.chunked_attention else None
    if local is None:
        return None
    return (f"{model.name}'s {local}: Megatron-LM's GPT model has no chunked attention, so at seq_len {seq_len} those "
            f"layers would attend over the whole sequence: use --seq-len {model.sliding_window} or less, or an engine "
            "that runs the model's own attention (--engine deepspeed)")
