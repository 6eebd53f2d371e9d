"""The model a job's Megatron arguments describe (``--num-layers``, ``--hidden-size``, ... ``--num-experts``), as a
model preset where one has that shape (:func:`preset_like`), else a :class:`ModelSpec` of the stated fields; read by
:mod:`autotune.job_files` for ``estimate --from`` / ``plan --from``."""

from __future__ import annotations

from pathlib import Path

from autotune.emit.job_args import FROM_SUBJECT as _SUBJECT
from autotune.emit.job_args import number as _float
from autotune.emit.job_args import whole as _int
from autotune.errors import InputError
from autotune.specs.model import ModelSpec, MoESpec

__all__ = ["megatron_model", "preset_like"]


def preset_like(spec: ModelSpec, vocab: int | None, rope: float | None, hint: str) -> ModelSpec | None:
    """The model preset with the shape the file states, if one has it; of several, the one that also has the file's
    vocabulary, RoPE base and position table, and whose name the tokenizer's names (``hint``)."""
    import re

    from autotune.specs.presets import load_model_preset, model_preset_names

    def shape(m: ModelSpec) -> tuple:
        return (m.num_layers, m.hidden_size, m.num_attention_heads, m.kv_heads, m.ffn_hidden_size,
                m.moe.num_experts if m.moe else 0, m.mla is None)

    def plain(text: str) -> str:
        return re.sub(r"[^a-z0-9]", "", text.lower())

    found = [p for p in map(load_model_preset, model_preset_names()) if shape(p) == shape(spec)]
    score = [(p.vocab_size == vocab, p.rope_theta == rope, plain(p.name) in plain(hint),
              p.max_position_embeddings == spec.max_position_embeddings) for p in found]
    return max(zip(score, range(len(found)), found))[2] if found else None


def megatron_model(f: dict, path: str, notes: list[str]) -> ModelSpec | None:
    def n(flag: str) -> int | None:
        return _int(f.get(flag), flag, path)

    layers, hidden, heads = n("--num-layers"), n("--hidden-size"), n("--num-attention-heads")
    if layers is None or hidden is None or heads is None:
        return None
    groups = n("--num-query-groups") if "--group-query-attention" in f else n("--num-key-value-heads")
    vocab = n("--vocab-size")
    if vocab is not None and f.get("--tokenizer-type") == "NullTokenizer":
        vocab += 1  # Megatron's NullTokenizer adds one EOD token
    experts = n("--num-experts")
    moe = None if not experts else MoESpec(num_experts=experts, top_k=n("--moe-router-topk") or 2,
                                           expert_ffn_hidden_size=n("--moe-ffn-hidden-size") or n("--ffn-hidden-size"))
    rope = (f.get("--position-embedding-type") in ("rope", "yarn") or "--use-rotary-position-embeddings" in f)
    rope_base = _float(f.get("--rotary-base"), "--rotary-base", path)
    spec = ModelSpec(
        name=Path(path).stem, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        ffn_hidden_size=n("--ffn-hidden-size") or 4 * hidden, vocab_size=vocab or 128256, num_kv_heads=groups,
        head_dim=n("--kv-channels"), activation="swiglu" if "--swiglu" in f else "gelu",
        norm="rmsnorm" if str(f.get("--normalization", "")).lower() == "rmsnorm" else "layernorm",
        tied_embeddings="--untie-embeddings-and-output-weights" not in f,
        position_embedding="rope" if rope else "learned",
        max_position_embeddings=n("--max-position-embeddings") or n("--seq-length") or 2048,
        rope_theta=rope_base or 10000.0, linear_bias="--disable-bias-linear" not in f,
        qkv_bias="--add-qkv-bias" in f, moe=moe)
    preset = preset_like(spec, vocab, rope_base, str(f.get("--tokenizer-model") or ""))
    if preset is not None:
        notes.append(f"model: the shape {path} states is the preset {preset.name}'s")
        return preset
    if vocab is None:
        raise InputError([f"{path} gives the model shape but not its vocabulary size (a tokenizer autotune does not "
                          f"read): give --model (a preset, config.json or model YAML) or --vocab-size in the file"],
                         subject=_SUBJECT)
    return spec
