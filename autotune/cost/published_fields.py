"""The fields of one published-runs entry (``autotune/data/published_runs``) read as autotune's specs: the model,
the precision, the cluster, the parallel settings, the measured throughput and peak memory, the recompute words
(the files' conventions: free-text GPU names, fields with notes, ``derived:`` arithmetic); how the entries become
runs and predictions is :mod:`autotune.cost.published_runs`. Architecture facts a source leaves out come from the
public configuration it names (``autotune.cost.published_facts``)."""

from __future__ import annotations

import re

from autotune.cost.flops import step_flops
from autotune.cost.published_facts import ARCH, FAMILIES, GPU_PATTERNS, MTNLG, MTNLG_PARALLEL
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.presets import cluster_defaults, load_gpu_preset

__all__ = ["family_of", "lead_int", "read_cluster", "read_memory", "read_model", "read_parallel", "read_precision",
           "read_recompute", "read_throughput"]


def family_of(run_id: str) -> tuple[str, str]:
    for prefix, family, engine in FAMILIES:
        if run_id.startswith(prefix):
            return family, engine
    return "other", "none"


def lead_int(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    m = re.match(r"\s*(\d+)\b", str(value)) if value is not None else None
    return int(m.group(1)) if m else None


def read_recompute(text: str | None, num_layers: int) -> tuple[str, int | None] | None:
    t = str(text or "none").lower()
    if t.startswith("selective (layer"):  # torchtitan layer SAC: every 2nd block checkpointed (ac_freq 2)
        return "full", max(1, num_layers // 2)
    for word in ("none", "selective", "full"):
        if t.startswith(word):
            return word, None
    if "checkpointing" in t:
        return "full", None
    return None


def read_model(entry: dict, family: str) -> ModelSpec | None:
    m = dict(entry.get("model", {}))
    extra = ARCH.get(str(m.get("arch")), {})
    if family.endswith("(MT-NLG)"):
        extra = MTNLG
    m = {**extra, **{k: v for k, v in m.items() if v is not None}}
    seq = lead_int(m.get("seq_len"))
    if seq is None and family.startswith("torchtitan"):
        seq = 8192  # "not stated (default 8192 in configs)": torchtitan's llama3 train_configs
    padded = re.search(r"\((\d+) padded", str(m.get("vocab")))  # BLOOM: "250k (250880 padded in code)"
    vocab = int(padded.group(1)) if padded else lead_int(m.get("vocab"))
    layers, hidden, heads = m.get("layers"), m.get("hidden"), m.get("heads")
    if heads is None and str(m.get("arch", "")).startswith("MPT") and isinstance(hidden, int):
        heads = hidden // 128  # "heads do not change the FLOP count" (the entry); mpt-30b.yaml: 56 = 7168 / 128
    if not all(isinstance(v, int) for v in (layers, hidden, heads, seq)) or vocab is None:
        return None
    name = m.get("name") or entry["id"]
    arch = str(m.get("arch", ""))
    if arch.lower().startswith("llama") or "GQA" in arch:
        # Llama 2/3: RoPE, RMSNorm, SwiGLU, untied embeddings, no biases (the public configs).
        return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                         num_kv_heads=m.get("kv_heads") or heads, ffn_hidden_size=m["ffn_hidden"], vocab_size=vocab,
                         activation="swiglu", norm="rmsnorm", position_embedding="rope", max_position_embeddings=seq)
    if arch.startswith("MPT"):
        # llm-foundry mpt-*.yaml: ALiBi, LayerNorm without bias, GeLU, no biases, tied embeddings, no dropout.
        return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads or hidden // 128,
                         ffn_hidden_size=m.get("ffn_hidden", 4 * hidden), vocab_size=vocab, position_embedding="alibi",
                         max_position_embeddings=seq, tied_embeddings=True)
    if arch.startswith("BLOOM"):
        # BLOOM (Megatron-DeepSpeed): ALiBi, embedding LayerNorm, biases, tied embeddings, GeLU, no dropout.
        return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                         ffn_hidden_size=4 * hidden, vocab_size=vocab, position_embedding="alibi",
                         max_position_embeddings=seq, linear_bias=True, tied_embeddings=True, embedding_norm=True)
    # Megatron GPT of the papers: learned positions, LayerNorm, GeLU, biases, tied embeddings, dropout 0.1.
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     ffn_hidden_size=m.get("ffn_hidden", 4 * hidden), vocab_size=vocab, max_position_embeddings=seq,
                     linear_bias=True, tied_embeddings=True, dropout=0.1)


def read_precision(entry: dict, family: str) -> tuple[str, str, dict]:
    """(plan precision, words, TimeSettings overrides) of a run."""
    words = str(entry.get("precision", "")).lower()
    opts = str(entry.get("parallel", {}).get("optimizations", "")).lower()
    over: dict = {}
    if "compile" in opts:
        over["torch_compile"] = True
    if "async" in opts:
        over["tp_overlap"] = "async-tp"
    if "tp-comm-overlap" in str(entry.get("parallel", {}).get("comm_overlap", "")):
        over["tp_overlap"] = "userbuffers"
    if "float8" in words or "fp8" in words:
        recipe = ("te-current" if "cs" in words.split("fp8")[-1] else "te-delayed") if "fp8" in words \
            else "torchao-tensorwise"  # torchtitan's Float8: torchao dynamic tensorwise scaling
        over["fp8_recipe"] = recipe
        return "fp8", f"fp8 ({recipe})", over
    if family.startswith("Megatron-LM 20") or "fp16" in words or "16-bit" in words:
        return "fp16", "fp16", over  # 2021-22 Megatron on A100: fp16 mixed precision (Narayanan Sec. 5)
    return "bf16", "bf16", over


def read_cluster(gpu_text: str, entry: dict) -> tuple[ClusterSpec | None, str]:
    preset = next((p for rx, p in GPU_PATTERNS if re.search(rx, gpu_text)), None)
    if preset is None:
        return None, f"GPU {gpu_text!r} has no preset (no engine here trains on it)"
    hw = entry["hardware"]
    num = lead_int(hw.get("total_gpus"))
    if num is None or not isinstance(hw.get("total_gpus"), int):
        return None, f"GPU count {hw.get('total_gpus')!r} is not one number"
    defaults = cluster_defaults(preset)
    per_node = min(hw.get("gpus_per_node", defaults["gpus_per_node"]), num)
    return ClusterSpec(gpu=load_gpu_preset(preset), num_nodes=max(1, num // per_node), gpus_per_node=per_node,
                       **{k: v for k, v in defaults.items() if k != "gpus_per_node"}), ""


def read_parallel(entry: dict) -> dict:
    p = dict(entry.get("parallel", {}))
    if family_of(entry["id"])[0].endswith("(MT-NLG)"):
        p = {**MTNLG_PARALLEL, **p}
    return p


def read_throughput(entry: dict, model: ModelSpec, num_gpus: int, preset_peak_tflops: float) -> float | None:
    """Measured tokens/s per GPU, from the most direct figure the entry has (an MFU against the entry's peak, or
    the GPU preset's datasheet 16-bit peak where the entry names none: the Megatron-LM README's MFUs are its
    TFLOP/s over 989, the H100's)."""
    m, d, p = entry.get("measured", {}), entry.get("derived", {}) or {}, read_parallel(entry)
    if isinstance(m.get("tokens_per_s_per_gpu"), int | float):
        return float(m["tokens_per_s_per_gpu"])
    if isinstance(m.get("tokens_per_s"), int | float):  # torchtitan asyncTP: "magnitude implies per GPU"
        return float(m["tokens_per_s"])
    if isinstance(m.get("tokens_per_s_total"), int | float):
        return m["tokens_per_s_total"] / num_gpus
    gb = lead_int(p.get("global_batch"))
    if isinstance(m.get("iteration_time_s"), int | float) and gb:
        return gb * model.max_position_embeddings / m["iteration_time_s"] / num_gpus
    if isinstance(d.get("tokens_per_s_per_gpu"), int | float):
        return float(d["tokens_per_s_per_gpu"])
    if isinstance(m.get("tflops_per_gpu"), int | float):
        rc = read_recompute(p.get("recompute"), model.num_layers)
        kind = str(m.get("tflops_per_gpu_kind", "model"))
        flops = step_flops(model, model.max_position_embeddings, 1.0, rc[0] if rc else "none")
        return m["tflops_per_gpu"] * 1e12 / (flops.hardware if kind.startswith("hardware") else flops.model)
    if isinstance(m.get("mfu"), int | float):
        per_token = step_flops(model, model.max_position_embeddings, 1.0, "none").model
        return m["mfu"] / 100 * (entry["hardware"].get("peak_tflops") or preset_peak_tflops) * 1e12 / per_token
    return None


def read_memory(entry: dict) -> tuple[float | None, str]:
    m = entry.get("measured", {})
    if isinstance(m.get("peak_memory_gib"), int | float):
        return float(m["peak_memory_gib"]), "allocator_reserved"  # torchtitan logs torch max_memory_reserved
    if isinstance(m.get("peak_memory_gb"), int | float):
        return float(m["peak_memory_gb"]) * 1e9 / 2**30 * 1.0, "nvidia_smi"
    return None, ""
