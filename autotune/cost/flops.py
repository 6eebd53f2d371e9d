"""Floating-point operations of one training step (a multiply-add counts 2).

Per layer and token (forward), for a GEMM of [tokens x k] @ [k x n]: 2*k*n FLOPs per token.
Attention scores and the weighted sum add 2*s*(q_width + out_width) per token, counted over
the full s x s square, the convention of Narayanan et al. 2021 (Eq. 3) and Korthikanti et al.
2022 (Eq. 7); a causal flash kernel executes half of it (``executed`` counts that).
Backward costs twice the forward. Model FLOPs count forward + backward; hardware FLOPs add
what recompute runs again (full: the layers' forward; selective: the attention core, or Megatron's modules, or
what torchtitan's op-level SAC reruns: :func:`op_sac_recompute_flops_per_token`).

Check (tests/cost/test_flops.py): for GPT with f = 4h, MHA, full recompute this reduces to
Narayanan's F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)); without recompute to
Korthikanti's model FLOPs 72*B*L*s*h^2*(1 + s/(6h) + V/(12*h*L)).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from autotune.cost.op_sac import block_linears, block_mms
from autotune.specs.model import ModelSpec

__all__ = ["LayerFlops", "layer_flops_per_token", "logits_flops_per_token", "StepFlops", "step_flops",
           "cached_step_flops", "recompute_flops_per_token", "causal_attention_share",
           "op_sac_recompute_flops_per_token"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerFlops:
    """Forward FLOPs per token of one layer, by kind."""

    gemm: float
    """Weight GEMMs: QKV, output projection, MLP (or routed + shared experts, router)."""
    attention: float
    """Scores (Q K^T) and the weighted sum (P V), full square (s x s)."""

    @property
    def total(self) -> float:
        return self.gemm + self.attention


def _mlp_gemm_flops(model: ModelSpec, width: int) -> float:
    matrices = 3 if model.gated_mlp else 2
    return 2.0 * matrices * model.hidden_size * width


def _router_flops(model: ModelSpec) -> float:
    """Forward FLOPs per token of an MoE layer's gating GEMMs: the router (hidden -> experts) and, with
    ``MoESpec.shared_expert_gate``, Qwen2-MoE's hidden -> 1 sigmoid gate on the shared experts' output (transformers
    models/qwen2_moe/modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock ``shared_expert_gate``; Megatron-core
    shared_experts.py SharedExpertMLP ``gate_weight``, a [1, hidden] matmul per token)."""
    moe = model.moe
    assert moe is not None
    return 2.0 * model.hidden_size * (moe.num_experts + (1 if moe.shared_expert_gate else 0))


def layer_flops_per_token(model: ModelSpec, seq_len: int, layer_index: int = 0) -> LayerFlops:
    h = model.hidden_size
    if model.mla is not None:
        m = model.mla
        a = model.num_attention_heads
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = (2.0 * h * m.q_lora_rank + 2.0 * m.q_lora_rank * a * qk) if m.q_lora_rank else 2.0 * h * a * qk
        kv = 2.0 * h * (m.kv_lora_rank + m.qk_rope_head_dim) + 2.0 * m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
        proj = q + kv + 2.0 * a * m.v_head_dim * h
    else:
        proj = 2.0 * h * (model.q_width + 2 * model.kv_width) + 2.0 * model.q_width * h
    attention = 2.0 * seq_len * (model.q_width + model.attention_output_width)
    if model.is_moe_layer(layer_index):
        moe = model.moe
        assert moe is not None
        mlp = (moe.top_k * _mlp_gemm_flops(model, moe.expert_ffn_hidden_size)
               + moe.num_shared_experts * _mlp_gemm_flops(model, moe.shared_width)
               + _router_flops(model))
    else:
        mlp = _mlp_gemm_flops(model, model.ffn_hidden_size)
    return LayerFlops(gemm=proj + mlp, attention=attention)


@functools.lru_cache(maxsize=1024)
def causal_attention_share(model: ModelSpec, seq_len: int) -> float:
    """The attention core a flash kernel executes, averaged over the layers, as a share of full causal attention
    (which executes half the s x s square). A sliding-window layer of window ``w`` (``ModelSpec.sliding_window``)
    scores query ``i`` against min(i, w) keys: sum = w s - w^2 / 2 of the causal s^2 / 2, so (2 w s - w^2) / s^2;
    a chunked layer (Llama 4) scores within chunks of ``w``: s / w chunks of w^2 / 2, so w / s. The kernel skips the
    tiles outside the band (FlashAttention-2's ``window_size`` / cuDNN's diagonal-band mask, which Megatron-core
    passes as ``window_size``: GPT-OSS ``window_size = (127, 0)``, every other layer, Megatron-Bridge 067f987
    src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py:86-88). The model FLOPs (:func:`layer_flops_per_token`)
    keep the full-square convention."""
    if model.sliding_window is None or seq_len <= 0:
        return 1.0
    w, s = min(model.sliding_window, seq_len), seq_len
    local = w / s if model.chunked_attention else (2 * w * s - w * w) / (s * s)
    n_local = sum(model.is_local_attention_layer(i) for i in range(model.num_layers))
    share = n_local / model.num_layers
    return 1.0 - share + share * local


def logits_flops_per_token(model: ModelSpec) -> float:
    return 2.0 * model.hidden_size * model.vocab_size


@dataclass(frozen=True, slots=True, kw_only=True)
class StepFlops:
    """FLOPs of one optimizer step over the whole job."""

    model: float
    """Forward + backward (MFU convention)."""
    hardware: float
    """Model FLOPs plus recompute (HFU convention)."""


@functools.lru_cache(maxsize=1024)
def _model_flops_per_token(model: ModelSpec, seq_len: int) -> tuple[float, float]:
    """(weight-GEMM, attention-core) forward FLOPs per token summed over all layers."""
    gemm = attention = 0.0
    for i in range(model.num_layers):
        f = layer_flops_per_token(model, seq_len, i)
        gemm += f.gemm
        attention += f.attention
    return gemm, attention


@functools.lru_cache(maxsize=1024)
def recompute_flops_per_token(model: ModelSpec, seq_len: int, modules: tuple[str, ...]) -> float:
    """Forward FLOPs per token that Megatron's selective recompute reruns, summed over all layers, by module
    (``ParallelPlan.recompute_modules``): core_attn the attention core (Korthikanti et al. 2022 Sec. 4.2); mlp the
    dense MLPs' GEMMs; moe the MoE blocks' (routed and shared experts, router); shared_experts the shared experts';
    mla_up_proj MLA's up-projections; layernorm and moe_act rerun memory-bound kernels only (no GEMM FLOPs)."""
    out = 0.0
    for i in range(model.num_layers):
        f = layer_flops_per_token(model, seq_len, i)
        out += f.attention if "core_attn" in modules else 0.0
        if not model.is_moe_layer(i):
            out += _mlp_gemm_flops(model, model.ffn_hidden_size) if "mlp" in modules else 0.0
        elif "moe" in modules:
            moe = model.moe
            out += (moe.top_k * _mlp_gemm_flops(model, moe.expert_ffn_hidden_size) + _router_flops(model)
                    + moe.num_shared_experts * _mlp_gemm_flops(model, moe.shared_width))
        elif "shared_experts" in modules:  # SharedExpertMLP.forward, its gate in it (shared_experts.py:200-204)
            out += model.moe.num_shared_experts * _mlp_gemm_flops(model, model.moe.shared_width)
            out += 2.0 * model.hidden_size if model.moe.shared_expert_gate else 0.0
        if "mla_up_proj" in modules and model.mla is not None:
            m, a = model.mla, model.num_attention_heads
            out += 2.0 * (m.q_lora_rank or 0) * a * (m.qk_nope_head_dim + m.qk_rope_head_dim)
            out += 2.0 * m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
    return out


@functools.lru_cache(maxsize=1024)
def op_sac_recompute_flops_per_token(model: ModelSpec, seq_len: int, policy: str, fp8: bool) -> float:
    """Forward FLOPs per token that torchtitan's op-level selective checkpointing reruns in backward, summed over all
    layers, as ``layer_time`` times them (``LayerTime.op_sac_recompute_s``) and ``activations.op_sac_layer_bytes``
    keeps them. A dense block saves the outputs of its 1st, 3rd, 5th... ``aten.mm`` and SDPA's, and reruns the other
    mms (``block_mms[1::2]``: wk, wo, w3 of a Llama block) and the linears with a bias (``aten.addmm``, not in the
    save list); under Float8 the linears run ``aten._scaled_mm``, which 0.2.2's save list lacks (every GEMM reruns)
    and 0.3's keeps (``policy`` "op-sac-0.3": none reruns). The memory-bound ops it reruns (norms, activation, RoPE,
    casts) add no GEMM FLOPs. MoE layers keep the attention-core policy (``op_sac_layer_bytes``): their attention
    core reruns."""
    if fp8:
        dense = 0.0 if policy == "op-sac-0.3" else sum(2.0 * k * n for _, k, n, _ in block_linears(model))
    else:
        rerun = block_mms(model)[1::2] + [(kind, k, n) for kind, k, n, biased in block_linears(model) if biased]
        dense = sum(2.0 * k * n for _, k, n in rerun)
    return sum(layer_flops_per_token(model, seq_len, i).attention if model.is_moe_layer(i) else dense
               for i in range(model.num_layers))


def step_flops(model: ModelSpec, seq_len: int, tokens: float, recompute: str,
               modules: tuple[str, ...] = ("core_attn",), *, selective: str = "attention-core",
               fp8: bool = False, lora_params: float | None = None) -> StepFlops:
    """Model and hardware FLOPs for ``tokens`` tokens of sequence length ``seq_len``; ``modules``: what Megatron's
    selective recompute reruns (:func:`recompute_flops_per_token`); ``selective``: the selective policy
    ("attention-core": Megatron's modules; "op-sac" / "op-sac-0.3": torchtitan's op-level SAC,
    :func:`op_sac_recompute_flops_per_token`, with ``fp8`` the plan's Float8 GEMMs). ``lora_params``: LoRA's
    adapter parameters over the model (None: full training); the frozen base GEMMs then run no weight-gradient
    GEMM (``autotune.cost.lora``), and each adapter parameter costs 6 FLOPs per token, as a trained weight."""
    gemm, attention = _model_flops_per_token(model, seq_len)
    forward = (gemm + attention + logits_flops_per_token(model)) * tokens
    model_flops = 3.0 * forward
    if lora_params is not None:
        model_flops += (6.0 * lora_params - gemm - logits_flops_per_token(model)) * tokens
    if recompute == "full":
        extra = (gemm + attention) * tokens
    elif recompute == "selective" and selective != "attention-core":
        extra = op_sac_recompute_flops_per_token(model, seq_len, selective, fp8) * tokens
    elif recompute == "selective":
        extra = recompute_flops_per_token(model, seq_len, modules) * tokens
    else:
        extra = 0.0
    return StepFlops(model=model_flops, hardware=model_flops + extra)


# Pure functions of a few plan fields that every plan of a search asks again, cached by the specs' ids (they are
# frozen and hash slowly); each entry keeps its specs so a reused id cannot match.
_flops_cache: dict[tuple, tuple[ModelSpec, StepFlops]] = {}


def cached_step_flops(model: ModelSpec, seq_len: int, tokens: float, recompute: str, modules: tuple[str, ...],
                      selective: str, fp8: bool, lora_params: float | None = None) -> StepFlops:
    """:func:`step_flops`, cached: the step-time model asks it for every plan of a search."""
    key = (id(model), seq_len, tokens, recompute, modules, selective, fp8, lora_params)
    hit = _flops_cache.get(key)
    if hit is None or hit[0] is not model:
        if len(_flops_cache) > 4096:
            _flops_cache.clear()
        hit = _flops_cache[key] = (model, step_flops(model, seq_len, tokens, recompute, modules, selective=selective,
                                                     fp8=fp8, lora_params=lora_params))
    return hit[1]
