"""The model a job's Megatron arguments describe (``--num-layers``, ``--hidden-size``, ... ``--num-experts``), as a
model preset where one has that shape (:func:`preset_like`), else a :class:`ModelSpec` of the stated fields; read by
:mod:`autotune.job_files` for ``estimate --from`` / ``plan --from``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from autotune.emit.job_args import FROM_SUBJECT as _SUBJECT
from autotune.emit.job_args import number as _float
from autotune.emit.job_args import whole as _int
from autotune.emit.megatron_attention import MLA_YARN_FIXED, YARN_DEFAULTS
from autotune.emit.megatron_flags import layer_pattern
from autotune.emit.megatron_model_flags import MEGATRON_NORM_EPS
from autotune.emit.megatron_scripts import unmodelled_job
from autotune.emit.shell_args import read_megatron_launch
from autotune.errors import InputError
from autotune.specs.model import ModelSpec, MoESpec
from autotune.specs.model_parts import MLASpec

__all__ = ["megatron_model", "preset_like", "moe_layer_flags", "refuse_unmodelled", "shape_differs"]


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


FILE_DECIDES = ("dropout", "rope_scaling", "rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                "rope_original_max_positions", "yarn_beta_fast", "yarn_beta_slow", "yarn_mscale", "yarn_mscale_all_dim",
                "yarn_truncate", "norm_zero_centered", "activation", "rotary_fraction", "norm_eps")
"""Fields a Megatron-LM argument file decides whichever preset has its shape (a flag present or not)."""


def _plain_activation(f: dict) -> str:
    """A plain MLP's activation as Megatron runs it: squared ReLU; GeLU's tanh form where the bias-GeLU fusion runs
    (biases, no --no-bias-gelu-fusion) or --openai-gelu says so (Megatron-DeepSpeed); else F.gelu, the exact form."""
    if "--squared-relu" in f:
        return "squared_relu"
    fused = "--disable-bias-linear" not in f and "--no-bias-gelu-fusion" not in f
    return "gelu_tanh" if fused or "--openai-gelu" in f else "gelu"


def megatron_runs(m: ModelSpec, field: str):
    """The value Megatron runs for ``field``: a YaRN field left unstated is Megatron-core's default (YARN_DEFAULTS),
    an unstated norm epsilon its 1e-5."""
    value = getattr(m, field)
    if field == "norm_eps":  # unstated: Megatron's default
        return MEGATRON_NORM_EPS if value is None else value
    if value is None and m.rope_scaling == "yarn":
        return {**YARN_DEFAULTS, "yarn_truncate": True}.get(field)
    return value


def _decided(m: ModelSpec) -> str:
    """The FILE_DECIDES fields of ``m`` in words."""
    scaling = "none" if m.rope_scaling is None else f"{m.rope_scaling} x{m.rope_scaling_factor:g}"
    return (f"dropout {m.dropout:g}, RoPE scaling {scaling}, {m.activation}"
            f"{f', RoPE on {m.rotary_fraction:g} of each head' if m.rotary_fraction != 1 else ''}"
            f"{', (1 + weight) norms' if m.norm_zero_centered else ''}"
            f"{f', norm eps {m.norm_eps:g}' if megatron_runs(m, 'norm_eps') != MEGATRON_NORM_EPS else ''}")


def _dropout(f: dict, path: str) -> float:
    """The hidden dropout Megatron-LM runs with (--hidden-dropout, default 0.1); ModelSpec has one dropout for the
    hidden states and the attention probabilities."""
    value = _float(f.get("--hidden-dropout"), "--hidden-dropout", path)
    return 0.1 if value is None else value


def _file_balancing(preset: ModelSpec, spec: ModelSpec, path: str, notes: list[str],
                    aux_default: float) -> ModelSpec:
    """The preset with the load-balancing loss the file trains: its own where it states one, else the engine's
    default weight (``aux_default``: Megatron-LM 0, none; Megatron-DeepSpeed 0.1), said beside the checkpoint's."""
    if preset.moe is None or spec.moe is None:
        return preset
    ran = (spec.moe.aux_loss_coeff, spec.moe.aux_loss_per_sequence)
    if ran[0] is None:
        ran = (aux_default, False)
    had = (preset.moe.aux_loss_coeff or 0.0, preset.moe.aux_loss_per_sequence)
    if ran == had:
        return preset
    notes.append(f"model: a load-balancing loss of weight {ran[0]:g}{' per sequence' if ran[1] else ''} as {path} "
                 f"trains it (the checkpoint's: {had[0]:g}{' per sequence' if had[1] else ''})")
    moe = dataclasses.replace(preset.moe, aux_loss_coeff=ran[0] or None, aux_loss_per_sequence=ran[1] and ran[0] > 0)
    return dataclasses.replace(preset, moe=moe)


def megatron_model(f: dict, path: str, notes: list[str], aux_default: float = 0.0,
                   deepspeed_experts: list[str] | None = None) -> ModelSpec | None:
    """The model Megatron-LM arguments state (``deepspeed_experts``: a Megatron-DeepSpeed file's --num-experts
    values, read as DeepSpeed-MoE's: ``autotune.job_megatron_deepspeed``); None where they state no shape."""
    def n(flag: str) -> int | None:
        return _int(f.get(flag), flag, path)

    refuse_unmodelled(path)
    layers, hidden, heads = n("--num-layers"), n("--hidden-size"), n("--num-attention-heads")
    if layers is None or hidden is None or heads is None:
        return None
    groups = n("--num-query-groups") if "--group-query-attention" in f else n("--num-key-value-heads")
    vocab = n("--vocab-size")
    if vocab is not None and f.get("--tokenizer-type") == "NullTokenizer" and "--legacy-tokenizer" in f:
        vocab += 1  # the legacy NullTokenizer adds one EOD token; megatron-core's holds --vocab-size (emit/megatron.py)
    gated = "--swiglu" in f or "--quick-geglu" in f  # the latter: GPT-OSS's clamped GLU (emit.megatron)
    # unset: 4h, or with --swiglu 8h/3 down to a multiple of 64 (Megatron-LM arguments.py:1280-1289 at core_v0.19.0;
    # Megatron-DeepSpeed arguments.py:287-296)
    ffn = n("--ffn-hidden-size") or (int(4 * hidden * 2 / 3 / 64) * 64 if "--swiglu" in f else 4 * hidden)
    if deepspeed_experts is not None:
        from autotune.job_megatron_deepspeed import deepspeed_moe

        moe = deepspeed_moe(f, n, deepspeed_experts, ffn, path, notes)
    else:
        experts = n("--num-experts")
        moe = None if not experts else _moe(f, n, experts, layers, ffn, path)
    # Megatron-LM's MLA flags and their defaults (arguments.py:3548-3557 at d98e8a6)
    mla = None if "--multi-latent-attention" not in f else MLASpec(
        kv_lora_rank=n("--kv-lora-rank") or 32, qk_nope_head_dim=n("--qk-head-dim") or 128,
        qk_rope_head_dim=n("--qk-pos-emb-head-dim") or 64, v_head_dim=n("--v-head-dim") or 128,
        q_lora_rank=n("--q-lora-rank"))
    rope = (f.get("--position-embedding-type") in ("rope", "yarn") or "--use-rotary-position-embeddings" in f)
    rope_base = _float(f.get("--rotary-base"), "--rotary-base", path)
    spec = ModelSpec(
        name=Path(path).stem, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        ffn_hidden_size=ffn, vocab_size=vocab or 128256, num_kv_heads=groups,
        head_dim=n("--kv-channels"), activation="swiglu" if gated else _plain_activation(f),
        norm="rmsnorm" if str(f.get("--normalization", "")).lower() == "rmsnorm" else "layernorm",
        tied_embeddings="--untie-embeddings-and-output-weights" not in f,
        position_embedding="rope" if rope else "learned",
        max_position_embeddings=n("--max-position-embeddings") or n("--seq-length") or 2048,
        rope_theta=rope_base or 10000.0, linear_bias="--disable-bias-linear" not in f,
        rotary_fraction=_float(f.get("--rotary-percent"), "--rotary-percent", path) or 1.0,
        # Megatron-LM's --hidden-dropout default is 0.1 (arguments.py; megatron_flags_core_v0.19.json)
        dropout=_dropout(f, path),
        qkv_bias="--add-qkv-bias" in f, norm_zero_centered="--apply-layernorm-1p" in f, moe=moe, mla=mla,
        # --norm-epsilon (Megatron-LM) or --layernorm-epsilon (Megatron-DeepSpeed), both default 1e-5
        norm_eps=_float(f.get("--norm-epsilon", f.get("--layernorm-epsilon")), "--norm-epsilon", path)
        or MEGATRON_NORM_EPS,
        **_attention_fields(f, n, layers, path))
    if deepspeed_experts is not None:
        from autotune.job_megatron_deepspeed import pyramid_note

        notes += [note] if (note := pyramid_note(spec, [int(v) for w in deepspeed_experts for v in w.split()],
                                                 path)) else []
    preset = preset_like(spec, vocab, rope_base, str(f.get("--tokenizer-model") or ""))
    if preset is not None:
        notes.append(f"model: the shape {path} states is the preset {preset.name}'s")
        # what Megatron runs is the file's (its dropout default 0.1 if unsaid; RoPE scaling only where a flag says so)
        ran = {k: getattr(spec, k) for k in FILE_DECIDES if megatron_runs(spec, k) != megatron_runs(preset, k)}
        if ran:
            notes.append(f"model: {_decided(spec)} as {path} runs it (the preset has {_decided(preset)})")
            preset = dataclasses.replace(preset, **ran)
        return _file_balancing(preset, spec, path, notes, aux_default)
    # unset, the fork's pretrain_gpt.py takes GPT2BPETokenizer (args_defaults, Megatron-DeepSpeed@4efb479d :364)
    tokenizer = f.get("--tokenizer-type") or ("GPT2BPETokenizer" if deepspeed_experts is not None else None)
    if vocab is None and tokenizer == "GPT2BPETokenizer":  # GPT-2's BPE: 50,257 tokens (its vocab.json)
        notes.append("model: GPT-2's BPE vocabulary, 50,257 tokens (--tokenizer-type GPT2BPETokenizer"
                     f"{'' if f.get('--tokenizer-type') else ', the fork pretrain_gpt.py default'})")
        return dataclasses.replace(spec, vocab_size=50257)
    if vocab is None:
        raise InputError([f"{path} gives the model shape but not its vocabulary size (a tokenizer autotune does not "
                          f"read): give --model (a preset, config.json or model YAML) or --vocab-size in the file"],
                         subject=_SUBJECT)
    return spec


def refuse_unmodelled(path: str) -> None:
    """InputError where the file's launch line runs a training script of another kind of model or task."""
    script = read_megatron_launch(path)[3] if Path(path).is_file() else None
    if other := unmodelled_job(script):
        raise InputError([f"{path} runs {script}: {other}, not a decoder language model's pretraining "
                          f"(pretrain_gpt.py): autotune does not model it; its language model alone is a "
                          f"pretrain_gpt.py job with those flags"], subject=_SUBJECT)


def shape_differs(model: ModelSpec, f: dict, path: str) -> str | None:
    """A note where ``--model`` replaces a shape the file states otherwise (its layers, width or heads)."""
    stated = {"layers": f.get("--num-layers"), "hidden": f.get("--hidden-size"), "heads": f.get("--num-attention-heads")}
    ours = {"layers": model.num_layers, "hidden": model.hidden_size, "heads": model.num_attention_heads}
    differ = [f"{k} {stated[k]}" for k in stated if stated[k] is not None and str(stated[k]) != str(ours[k])]
    return (f"{path} states {', '.join(differ)}: --model {model.name}'s shape taken ("
            f"{', '.join(f'{k} {ours[k]}' for k in ours)})") if differ else None


def _moe(f: dict, n, experts: int, layers: int, ffn: int, path: str) -> MoESpec:
    """The mixture of experts the MoE flags state: experts, shared experts, which layers (--moe-layer-freq) and the
    router (Megatron-core's flags, as autotune.emit.megatron writes them)."""
    width = n("--moe-ffn-hidden-size") or ffn  # unset: ffn_hidden_size (arguments.py:1596 at core_v0.19.0)
    shared = n("--moe-shared-expert-intermediate-size")
    score = f.get("--moe-router-score-function", "softmax")
    dense, step = moe_layer_flags(f.get("--moe-layer-freq"), layers, path)
    return MoESpec(num_experts=experts, top_k=n("--moe-router-topk") or 2, expert_ffn_hidden_size=width,
                   num_shared_experts=1 if shared else 0,
                   shared_expert_ffn_hidden_size=None if shared in (None, width) else shared,
                   shared_expert_gate=bool(shared) and "--moe-shared-expert-gate" in f,
                   num_dense_layers=dense, moe_layer_step=step,
                   router_score=score if score in ("softmax", "sigmoid") else "softmax",
                   router_bias="--moe-router-enable-expert-bias" in f or (score == "softmax" and
                                                                         "--disable-bias-linear" not in f),
                   # read under the softmax score only (moe_utils.py topk_routing_with_score_function, :900-915 at
                   # d98e8a64): a sigmoid router with the flag (Megatron-FSDP's DeepSeek-V3 example) runs without it
                   router_pre_softmax="--moe-router-pre-softmax" in f and score == "softmax",
                   router_groups=n("--moe-router-num-groups"),
                   router_group_topk=n("--moe-router-group-topk"),
                   router_scaling_factor=_float(f.get("--moe-router-topk-scaling-factor"),
                                                "--moe-router-topk-scaling-factor", path) or 1.0,
                   router_probs_on_input="--moe-apply-probs-on-input" in f, **_balancing(f, path))


def _balancing(f: dict, path: str) -> dict:
    """The load-balancing loss the file states: --moe-aux-loss-coeff (Megatron-LM; its first value where it lists
    one per --moe-router-load-balancing-type) or --moe-loss-coeff (Megatron-DeepSpeed); none where it states none."""
    flag = "--moe-aux-loss-coeff" if "--moe-aux-loss-coeff" in f else "--moe-loss-coeff"
    coeff = _float(str(f[flag]).split()[0], flag, path) if isinstance(f.get(flag), str) else None
    if coeff is None:
        return {}
    kind = str(f.get("--moe-router-load-balancing-type", "aux_loss")).split()[0]
    if kind not in ("aux_loss", "seq_aux_loss", "global_aux_loss"):  # none, sinkhorn: no weighted loss
        return {}
    return {"aux_loss_coeff": coeff, "aux_loss_per_sequence": kind == "seq_aux_loss"}


def moe_layer_flags(value: object, layers: int, path: str) -> tuple[int, int]:
    """(leading dense layers, moe_layer_step) of a --moe-layer-freq value: an int N (every Nth layer MoE) or a list
    expression of 0/1 per layer (Megatron evaluates it: arguments.py moe_freq_type), e.g. "([0]*3+[1]*58)"."""
    if value is None:
        return 0, 1
    text = str(value).strip()
    try:
        pattern = layer_pattern(text)
    except ValueError:
        raise InputError([f"{path}: --moe-layer-freq {text!r} is neither an int nor a list expression of 0 and 1 "
                          "(e.g. \"([0]*3+[1]*58)\")"], subject=_SUBJECT) from None
    if isinstance(pattern, int):
        if pattern < 1:
            raise InputError([f"{path}: --moe-layer-freq {pattern}: every Nth layer needs N >= 1"], subject=_SUBJECT)
        return 0, pattern
    if len(pattern) != layers or set(pattern) - {0, 1}:
        raise InputError([f"{path}: --moe-layer-freq gives {len(pattern)} entries for {layers} layers (0 or 1 each)"],
                         subject=_SUBJECT)
    leading = next((i for i, v in enumerate(pattern) if v), layers)
    for dense in dict.fromkeys((0, leading)):  # Llama 4 Maverick's [0,1,0,1,...]: no dense layers, every 2nd MoE
        for step in range(1, layers + 1):  # MoESpec: after the dense ones, layer i is MoE when (i + 1) % step == 0
            if all(bool(v) == ((i + 1) % step == 0) for i, v in enumerate(pattern) if i >= dense):
                return dense, step
    raise InputError([f"{path}: --moe-layer-freq {text!r}: MoE layers in no pattern autotune models (leading dense "
                      "layers, then every Nth layer)"], subject=_SUBJECT)


def _attention_fields(f: dict, n, layers: int, path: str) -> dict:
    """What the attention and MLP variant flags say (autotune.emit.megatron_attention writes them): Q/K norms,
    sinks, YaRN, sliding windows and the clamped GLU."""
    out: dict = {}
    if "--qk-layernorm" in f:
        out["qk_norm"] = "head"
    elif "--qk-l2-norm" in f:
        out["qk_norm"] = "l2"
    if f.get("--softmax-type") == "learnable":
        out["attention_sinks"] = True
    mla_yarn = "--multi-latent-attention" in f and f.get("--rope-type") == "yarn"
    if f.get("--position-embedding-type") == "yarn" or mla_yarn:
        out["rope_scaling"] = "yarn"
        factor = _float(f.get("--rotary-scaling-factor"), "--rotary-scaling-factor", path)
        out["rope_scaling_factor"] = 1.0 if factor is None else factor  # the flag's default (arguments.py)
        flags = (("--mscale", "yarn_mscale"), ("--mscale-all-dim", "yarn_mscale_all_dim")) + ((
            ("--yarn-original-max-position-embeddings", "rope_original_max_positions"),
            ("--yarn-beta-fast", "yarn_beta_fast"), ("--yarn-beta-slow", "yarn_beta_slow")) if not mla_yarn else ())
        for flag, field in flags:
            if f.get(flag) is not None:
                value = _float(f.get(flag), flag, path)
                out[field] = int(value) if field == "rope_original_max_positions" else value
        if not mla_yarn and "--no-yarn-correction-range-round-to-int" in f:
            out["yarn_truncate"] = False
        if mla_yarn:  # what MLATransformerConfig holds where no flag reaches (emit.megatron_attention.MLA_YARN_FIXED)
            out |= MLA_YARN_FIXED
    elif "--use-rope-scaling" in f:  # Megatron-core's llama3 scaling: factor a flag (default 8), the rest fixed
        factor = _float(f.get("--rope-scaling-factor"), "--rope-scaling-factor", path)
        out |= {"rope_scaling": "llama3", "rope_scaling_factor": 8.0 if factor is None else factor,
                "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0, "rope_original_max_positions": 8192}
    elif f.get("--rotary-seq-len-interpolation-factor") is not None:  # positions divided by it: linear scaling
        out |= {"rope_scaling": "linear", "rope_scaling_factor": _float(
            f.get("--rotary-seq-len-interpolation-factor"), "--rotary-seq-len-interpolation-factor", path)}
    if "--quick-geglu" in f:
        out["activation_clamp"] = _float(f.get("--activation-func-clamp-value"), "--activation-func-clamp-value",
                                         path)
    window = str(f.get("--window-size") or "")
    if window and window.split(",")[0].strip().isdigit():
        out["sliding_window"] = int(window.split(",")[0]) + 1  # (W - 1, 0): the window counts the query's token
        skip = f.get("--window-attn-skip-freq")
        if skip is not None:  # an int N: every Nth layer full; else 1 = windowed per layer
            text = str(skip).strip()
            try:
                pattern = layer_pattern(text)
                windowed = ([i for i in range(layers) if (i + 1) % pattern] if isinstance(pattern, int) else
                            [i for i, v in enumerate(pattern) if v])
            except (ValueError, ZeroDivisionError):
                raise InputError([f"{path}: --window-attn-skip-freq {text!r} is neither an int nor a list of 0 and 1"],
                                 subject=_SUBJECT) from None
            out["sliding_window_layers"] = tuple(windowed)
    if (nope := f.get("--no-rope-freq")) is not None:  # an int N: every Nth layer has no RoPE; else 1 = no RoPE
        try:
            pattern = layer_pattern(str(nope).strip())
            skipped = ({i for i in range(layers) if (i + 1) % pattern == 0} if isinstance(pattern, int) else
                       {i for i, v in enumerate(pattern) if v})
        except (ValueError, ZeroDivisionError):
            raise InputError([f"{path}: --no-rope-freq {nope!r} is neither an int nor a list of 0 and 1"],
                             subject=_SUBJECT) from None
        # what megatron-core asserts (core_v0.19.0 transformer_config.py:2813-2830): an int dividing the layers, or
        # one entry per layer (1 = no RoPE, attention.py:1321); a Bridge file's model.no_rope_freq comes here too
        # (job_bridge_model)
        wrong = (pattern < 1 or layers % pattern) if isinstance(pattern, int) else (
            len(pattern) != layers or set(pattern) - {0, 1})
        if wrong:
            raise InputError([f"{path}: --no-rope-freq (model.no_rope_freq) {nope!r} does not mark the {layers} "
                              f"layers: give an int that divides {layers} (every Nth layer skips RoPE) or a list of "
                              f"{layers} 0/1 entries (1 = no RoPE)"], subject=_SUBJECT)
        out["rope_layers"] = tuple(i for i in range(layers) if i not in skipped)
    return out
