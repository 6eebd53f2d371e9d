"""The largest values autotune accepts in a model or cluster: far above anything trained or built, low enough
that every loop and table sized by them stays small. A value above one is refused with a message naming it.
"""

from __future__ import annotations

__all__ = ["MODEL_LIMITS", "MAX_ROPE_THETA", "MAX_GPUS", "MAX_GPUS_PER_NODE", "MAX_BANDWIDTH_GB_PER_S",
           "MAX_MEMORY_GIB", "model_limit_problems"]


# The largest value of each size field we accept. Far above any model trained (Megatron's 1T GPT:
# 128 layers, hidden 25,600, 160 heads; DeepSeek-V3: 256 routed experts; Llama 4 Scout: 10M-token
# context), low enough that every loop and table sized by them stays small.
MODEL_LIMITS = {
    "num_layers": 4096, "hidden_size": 2**20, "num_attention_heads": 2**16, "num_kv_heads": 2**16,
    "head_dim": 2**16, "ffn_hidden_size": 2**22, "vocab_size": 2**24, "max_position_embeddings": 2**27,
    "norms_per_layer": 16, "moe.num_experts": 2**16, "moe.top_k": 2**16, "moe.expert_ffn_hidden_size": 2**22,
    "moe.num_shared_experts": 2**10, "moe.shared_expert_ffn_hidden_size": 2**22, "moe.num_dense_layers": 4096,
    "mla.kv_lora_rank": 2**20, "mla.qk_nope_head_dim": 2**16, "mla.qk_rope_head_dim": 2**16,
    "mla.v_head_dim": 2**16, "mla.q_lora_rank": 2**20,
}
MAX_ROPE_THETA = 1e12  # Llama 3 uses 5e5, Qwen2.5 1e6
# No cluster has a million GPUs (the largest reported training clusters hold ~100k); NVL576 racks
# hold 576 GPUs per NVLink domain.
MAX_GPUS = 2**20
MAX_GPUS_PER_NODE = 1024
MAX_BANDWIDTH_GB_PER_S = 1e6  # per GPU, one direction: NVLink 5 is 900
MAX_MEMORY_GIB = 2**24  # 16 PiB: per GPU or per node


def model_limit_problems(fields: dict) -> list[str]:
    """Size fields above MODEL_LIMITS (and an absurd rope_theta), one line each."""
    problems = []
    for key, limit in MODEL_LIMITS.items():
        block, _, name = key.rpartition(".")
        holder = fields.get(block) if block else fields
        value = holder.get(name) if isinstance(holder, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            problems.append(f"{key} ({value:,}) is above {limit:,}, the largest this tool accepts (far beyond any "
                            "trained model): check the number")
    theta = fields.get("rope_theta")
    if isinstance(theta, int | float) and not isinstance(theta, bool) and theta > MAX_ROPE_THETA:
        problems.append(f"rope_theta ({theta:g}) is above {MAX_ROPE_THETA:g}: check the number")
    return problems
