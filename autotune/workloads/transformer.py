"""A real decoder-only language model built from a :class:`~autotune.specs.model.ModelSpec`.

Used to check the memory ledger against what autograd really keeps, and as the model the built-in
trainers (:mod:`autotune.train`: emitted bundles and builtin profiling trials) train. The kernels
mirror what Megatron-core / Transformer Engine run on GPUs, so the
tensors autograd saves have the sizes the ledger assumes:

- Q, K and V come from three projections (one weight each, same parameter count as a fused
  QKV), so each of q, k, v is its own storage and attention keeps exactly q + k + v.
- ``flash_attention=True`` calls ``scaled_dot_product_attention(is_causal=True)``; on CPU in
  bf16 that is ``_scaled_dot_product_flash_attention_for_cpu``, which saves q, k, v, the output
  and an fp32 logsumexp, with GQA handled natively (``enable_gqa``: K/V are not expanded).
  The output comes back in [b, s, heads, d] memory order, so the output projection's input is a
  view of it (no second copy).
- ``flash_attention=False`` is the unfused path: softmax(Q K^T / sqrt(d) + causal mask) V,
  keeping the bf16 probabilities (2 a s^2 b bytes); GQA expands K/V as Megatron's unfused
  ``DotProductAttention`` does.
- RMSNorm, SwiGLU, RoPE and dropout are custom autograd functions that save what the fused GPU
  kernels save: RMSNorm its input and the fp32 rstd; SwiGLU only the fc1 output ([gate|up]);
  RoPE nothing but the (buffer) cos/sin tables; dropout a 1-byte bool mask.
- The loss casts the logits to fp32 and applies ``F.cross_entropy``, which keeps the fp32
  log-softmax (4 s b V bytes), like Megatron's fp32 vocab cross entropy.

Q/K norms (per head, whole-width, weightless) and Llama 4's layers without RoPE are built; MLA, attention sinks,
YaRN and GPT-OSS's clamped activation are not (``autotune.engines.builtin_trainer`` refuses those models). ALiBi
is treated as "no positional parameters" (no bias is applied:
flash kernels with ALiBi keep no extra activations, so memory is the same).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from autotune.specs.model import ModelSpec
from autotune.workloads.kernels import L2Norm, RMSNorm, apply_rope, bool_dropout, geglu, rms_norm, swiglu
from autotune.workloads.moe_balancing import with_balancing_loss

__all__ = ["build_model", "DecoderLM", "RMSNorm", "L2Norm", "rms_norm", "swiglu", "apply_rope", "bool_dropout",
           "scale_embeddings", "cap_logits", "soft_cap"]

Recompute = Literal["none", "selective", "full"]


# ---------------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------------
class _ZeroCenteredLayerNorm(nn.LayerNorm):
    """LayerNorm multiplying by (1 + weight), the weight starting at zero (Megatron ``--apply-layernorm-1p``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, 1 + self.weight, self.bias, self.eps)


def _norm(spec: ModelSpec, width: int) -> nn.Module:
    eps = spec.norm_eps or 1e-5  # the checkpoint's epsilon (ModelSpec.norm_eps), else torch's LayerNorm default
    if spec.norm == "layernorm":
        return _ZeroCenteredLayerNorm(width, eps=eps) if spec.norm_zero_centered else nn.LayerNorm(width, eps=eps)
    return RMSNorm(width, eps=eps, zero_centered=spec.norm_zero_centered)


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap * tanh(x / cap) (Gemma 2's attention and output logits); ``x`` where there is no cap."""
    return x if cap is None else cap * torch.tanh(x / cap)


def scale_embeddings(spec: ModelSpec, x: torch.Tensor) -> torch.Tensor:
    """The token embeddings as the first layer sees them: times sqrt(hidden_size) for Gemma (in their own dtype,
    as transformers' Gemma2TextScaledWordEmbedding)."""
    return x * torch.tensor(spec.hidden_size ** 0.5, dtype=x.dtype) if spec.scaled_embeddings else x


def cap_logits(spec: ModelSpec, logits: torch.Tensor) -> torch.Tensor:
    """The output logits the loss takes: soft-capped for Gemma 2 (``final_logit_softcap``)."""
    return soft_cap(logits, spec.final_logit_softcap)


class Attention(nn.Module):
    """Layer ``index``'s self-attention: RoPE where the spec's layer rotates (Llama 4's global layers do not), and
    its Q/K norm (ModelSpec.qk_norm): per head before RoPE (Qwen3), over the whole projections (OLMo 2), or
    weightless on the rotary layers (Llama 4; a rotation keeps the norm, so before RoPE gives the same result)."""

    def __init__(self, spec: ModelSpec, index: int, *, flash: bool, selective: bool) -> None:
        super().__init__()
        h = spec.hidden_size
        qkv_bias = spec.linear_bias or spec.qkv_bias
        self.heads, self.kv_heads, self.head_dim = spec.num_attention_heads, spec.kv_heads, spec.attention_head_dim
        self.q = nn.Linear(h, spec.q_width, bias=qkv_bias)
        self.k = nn.Linear(h, spec.kv_width, bias=qkv_bias)
        self.v = nn.Linear(h, spec.v_width, bias=qkv_bias)
        self.o = nn.Linear(spec.q_width, h, bias=spec.linear_bias or spec.attention_output_bias)
        self.rope = spec.is_rotary_layer(index)
        self.rotary_dim = spec.rotary_dim  # GPT-NeoX, GLM-4.5: RoPE on the first dimensions of each head only
        self.flash, self.selective, self.p = flash, selective, spec.dropout
        self.qk_full = spec.qk_norm == "full"
        self.scale = (spec.query_pre_attn_scalar or self.head_dim) ** -0.5  # Gemma: query_pre_attn_scalar
        self.softcap = spec.attn_logit_softcap  # capped scores need the explicit softmax (no fused kernel here)
        self.local_rope: tuple[torch.Tensor, torch.Tensor] | None = None  # Gemma 3's local layers: their own base
        self.local_rope_theta = spec.local_rope_theta if self.rope and spec.is_local_attention_layer(index) else None
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        if spec.qk_norm in ("head", "full"):
            q_width, k_width = (spec.q_width, spec.kv_width) if self.qk_full else (self.head_dim, self.head_dim)
            self.q_norm, self.k_norm = _norm(spec, q_width), _norm(spec, k_width)
        elif spec.qk_norm == "l2" and self.rope:
            self.q_norm = self.k_norm = L2Norm()

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """q: [b, a, s, d], k/v: [b, kv, s, d] (strided views). Returns [b, a, s, d]."""
        if self.flash and self.softcap is None:
            # Attention-probability dropout is left out here: CPU sdpa with dropout_p > 0 falls back to
            # the fp32 math kernel; GPU flash attention regenerates the mask from the RNG (0 bytes kept).
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads,
                                                  scale=self.scale)
        groups = self.heads // self.kv_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        s = q.shape[2]
        scores = soft_cap(torch.matmul(q * self.scale, k.transpose(-1, -2)), self.softcap)
        if mask is None:  # the flash path's caller gave none: capped scores take the explicit softmax
            mask = torch.full((s, s), float("-inf"), dtype=scores.dtype, device=scores.device).triu(1)
        probs = torch.softmax(scores + mask[:s, :s], dim=-1)
        probs = bool_dropout(probs, self.p, self.training)
        return torch.matmul(probs, v)

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                mask: torch.Tensor | None) -> torch.Tensor:
        b, s, _ = x.shape
        q, k = self.q(x), self.k(x)
        if self.local_rope_theta is not None:
            cos, sin = self._local_tables(s, x.device)
        if self.qk_full:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(b, s, self.heads, self.head_dim)
        k = k.view(b, s, self.kv_heads, self.head_dim)
        v = self.v(x).view(b, s, self.kv_heads, -1)
        if self.q_norm is not None and not self.qk_full:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope and self.rotary_dim < self.head_dim:
            r = self.rotary_dim
            q = torch.cat([apply_rope(q[..., :r], cos, sin), q[..., r:]], dim=-1)
            k = torch.cat([apply_rope(k[..., :r], cos, sin), k[..., r:]], dim=-1)
        elif self.rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.selective:
            o = checkpoint(self.core, q, k, v, mask, use_reentrant=False)
        else:
            o = self.core(q, k, v, mask)
        # The CPU flash kernel returns [b, a, s, d] with [b, s, a, d] memory order: this is a view.
        o = o.transpose(1, 2).reshape(b, s, -1)
        return self.o(o)

    def _local_tables(self, s: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos / sin of this local layer's RoPE base (Gemma 3: 10,000 beside the global layers' 1,000,000)."""
        if self.local_rope is None or self.local_rope[0].shape[0] < s:
            cos, sin = _rope_tables(s, self.rotary_dim, self.local_rope_theta)
            self.local_rope = (cos.to(device), sin.to(device))
        cos, sin = self.local_rope
        return cos[:s], sin[:s]


class MLP(nn.Module):
    def __init__(self, hidden: int, width: int, activation: str, bias: bool) -> None:
        super().__init__()
        self.swiglu, self.geglu, self.activation = activation == "swiglu", activation == "geglu", activation
        self.fc1 = nn.Linear(hidden, (2 if self.swiglu or self.geglu else 1) * width, bias=bias)
        self.fc2 = nn.Linear(width, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        if self.swiglu or self.geglu:
            y = swiglu(y) if self.swiglu else geglu(y)
        elif self.activation in ("relu", "squared_relu"):
            y = F.relu(y).square() if self.activation == "squared_relu" else F.relu(y)
        else:  # gelu: erf's exact form; gelu_tanh: the tanh form
            y = F.gelu(y, approximate="tanh" if self.activation == "gelu_tanh" else "none")
        return self.fc2(y)


class MoE(nn.Module):
    """Dropless top-k MoE: the fp32 router as MoESpec states it (Megatron-core's topk_routing_with_score_function,
    moe_utils.py:900-929 at d98e8a6: a softmax over the top-k logits, or over every expert first; a sigmoid per
    expert with the routing bias for the choice only, group-limited, the top-k normalised; the scale), token
    permutation to the experts, the weights on their outputs (or, Llama 4, on their inputs); plus shared experts
    every token visits. In training, the checkpoint's load-balancing loss joins the router's gradient
    (:mod:`autotune.workloads.moe_balancing`)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        moe = spec.moe
        assert moe is not None
        h = spec.hidden_size
        self.moe, self.top_k, self.num_experts = moe, moe.top_k, moe.num_experts
        # A softmax router's bias is its linear layer's (GPT-OSS); a sigmoid router's is DeepSeek-V3's
        # e_score_correction_bias: it moves the choice only, and gradients do not train it.
        linear_bias = moe.router_bias and moe.router_score == "softmax"
        self.router = nn.Linear(h, moe.num_experts, bias=linear_bias)
        self.router_bias = nn.Parameter(torch.zeros(moe.num_experts), requires_grad=False) \
            if moe.router_bias and not linear_bias else None
        self.experts = nn.ModuleList(
            MLP(h, moe.expert_ffn_hidden_size, spec.activation, spec.linear_bias) for _ in range(moe.num_experts)
        )
        self.shared = nn.ModuleList(
            MLP(h, moe.shared_width, spec.activation, spec.linear_bias) for _ in range(moe.num_shared_experts)
        )  # Qwen2-MoE's sigmoid gate on the shared experts' output (Qwen2MoeSparseMoeBlock.shared_expert_gate)
        self.shared_gate = nn.Linear(h, 1, bias=False) if moe.shared_expert_gate else None

    def route(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(experts [T, k], fp32 weights [T, k], fp32 logits [T, E]) of the tokens ``t`` [T, h]."""
        moe = self.moe
        logits = self.router(t).float()
        scores = torch.sigmoid(logits) if moe.router_score == "sigmoid" else \
            torch.softmax(logits, dim=-1) if moe.router_pre_softmax else logits
        choice = scores if self.router_bias is None else scores + self.router_bias.float()
        if moe.router_groups is not None:  # the best router_group_topk groups, by their top (k / groups) sum
            groups = choice.view(choice.shape[0], moe.router_groups, -1)
            best = groups.topk(self.top_k // moe.router_group_topk, dim=-1).values.sum(-1)
            keep = torch.zeros_like(best).scatter_(1, best.topk(moe.router_group_topk, dim=-1).indices, 1.0)
            choice = groups.masked_fill(keep.unsqueeze(-1) == 0, float("-inf")).view_as(choice)
        idx = choice.topk(self.top_k, dim=-1).indices
        picked = scores.gather(-1, idx)
        if moe.router_score == "sigmoid":
            weights = picked / (picked.sum(-1, keepdim=True) + 1e-20) if self.top_k > 1 else picked
        else:
            weights = picked if moe.router_pre_softmax else torch.softmax(picked, dim=-1)
        return idx, weights * moe.router_scaling_factor, logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        t = x.reshape(-1, shape[-1])
        idx, weights, logits = self.route(t)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token_idx = order // self.top_k
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        x_perm = t.index_select(0, token_idx)
        w_perm = weights.reshape(-1)[order].to(x.dtype).unsqueeze(-1)
        if self.moe.router_probs_on_input:
            x_perm = x_perm * w_perm
        outs = [expert(chunk) for expert, chunk in zip(self.experts, x_perm.split(counts))]
        y_perm = torch.cat(outs) if self.moe.router_probs_on_input else torch.cat(outs) * w_perm
        # Un-permute with a gather and a sum over the k copies: saves only the index (index_add would
        # save the whole weighted expert output for its backward; Megatron's scatter_add does not).
        inverse = torch.argsort(order)
        out = y_perm.index_select(0, inverse).view(-1, self.top_k, shape[-1]).sum(1)
        shared = [expert(t) for expert in self.shared]
        if shared:
            gate = 1.0 if self.shared_gate is None else torch.sigmoid(self.shared_gate(t))
            out = out + gate * sum(shared[1:], shared[0])
        if not (self.training and torch.is_grad_enabled()):
            return out.view(shape)
        return with_balancing_loss(out.view(shape), logits, self.moe, shape[-2] if len(shape) == 3 else t.shape[0])


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, index: int, *, flash: bool, selective: bool) -> None:
        super().__init__()
        self.norms, self.post, self.parallel = spec.norms_per_layer, spec.post_norm, spec.parallel_block
        self.norm1 = _norm(spec, spec.hidden_size) if self.norms >= 1 else nn.Identity()
        self.attn = Attention(spec, index, flash=flash, selective=selective)
        self.norm2 = _norm(spec, spec.hidden_size) if self.norms >= 2 else None
        if self.norms == 4:  # Gemma 2/3's sandwich: a norm after each sublayer too, before its residual add
            self.post_attn_norm, self.post_mlp_norm = _norm(spec, spec.hidden_size), _norm(spec, spec.hidden_size)
        self.mlp = MoE(spec) if spec.is_moe_layer(index) else MLP(
            spec.hidden_size, spec.ffn_hidden_size, spec.activation, spec.linear_bias)
        self.p = spec.dropout

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                mask: torch.Tensor | None) -> torch.Tensor:
        if self.norms == 4:
            x = x + bool_dropout(self.post_attn_norm(self.attn(self.norm1(x), cos, sin, mask)), self.p,
                                 self.training)
            return x + bool_dropout(self.post_mlp_norm(self.mlp(self.norm2(x))), self.p, self.training)
        if self.post:  # OLMo 2: each sublayer's output normalised before its residual add
            x = x + bool_dropout(self.norm1(self.attn(x, cos, sin, mask)), self.p, self.training)
            return x + bool_dropout(self.norm2(self.mlp(x)), self.p, self.training)
        if self.parallel and self.norm2 is not None:  # GPT-NeoX, Falcon-40B: two norms, one residual add
            return x + bool_dropout(self.attn(self.norm1(x), cos, sin, mask), self.p, self.training) + bool_dropout(
                self.mlp(self.norm2(x)), self.p, self.training)
        if self.norm2 is not None:  # standard pre-norm block
            x = x + bool_dropout(self.attn(self.norm1(x), cos, sin, mask), self.p, self.training)
            return x + bool_dropout(self.mlp(self.norm2(x)), self.p, self.training)
        y = self.norm1(x)  # parallel block (Falcon): one norm feeds attention and MLP
        return x + bool_dropout(self.attn(y, cos, sin, mask), self.p, self.training) + bool_dropout(
            self.mlp(y), self.p, self.training)


def _scaled(inv: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """The inverse frequencies under the spec's RoPE scaling: linear divides them all by the factor (positions / factor);
    llama3 divides those of wavelengths above original / low_freq_factor, keeps those below original /
    high_freq_factor and blends the ones between (transformers' _compute_llama3_parameters, Megatron-core's
    RotaryEmbedding._apply_scaling)."""
    factor = spec.rope_scaling_factor
    if spec.rope_scaling == "linear":
        return inv / factor
    if spec.rope_scaling != "llama3":
        return inv
    low, high, original = spec.rope_low_freq_factor, spec.rope_high_freq_factor, spec.rope_original_max_positions
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > original / low, inv / factor, inv)
    if high > low:
        smooth = (original / wavelen - low) / (high - low)
        medium = (wavelen >= original / high) & (wavelen <= original / low)
        out = torch.where(medium, (1 - smooth) * out / factor + smooth * out, out)
    return out


def _rope_tables(seq_len: int, head_dim: int, base: float = 10000.0,
                 spec: ModelSpec | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos/sin tables [seq_len, head_dim] for rotate-half (GPT-NeoX / Llama) RoPE; ``spec``: its scaling
    (llama3 or linear) applied."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if spec is not None:
        inv = _scaled(inv, spec)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


class DecoderLM(nn.Module):
    def __init__(self, spec: ModelSpec, *, seq_len: int, recompute: Recompute = "none",
                 flash_attention: bool = True) -> None:
        super().__init__()
        if spec.mla is not None:
            raise NotImplementedError(f"model '{spec.name}': multi-head latent attention (MLA) is not implemented")
        if recompute not in ("none", "selective", "full"):
            raise ValueError(f"recompute must be none, selective or full, got {recompute!r}")
        if spec.position_embedding == "learned" and seq_len > spec.max_position_embeddings:
            raise ValueError(f"seq_len {seq_len} exceeds max_position_embeddings {spec.max_position_embeddings}")
        self.spec, self.seq_len, self.recompute = spec, seq_len, recompute
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.pos = nn.Embedding(spec.max_position_embeddings + spec.position_offset, spec.hidden_size) \
            if spec.position_embedding == "learned" else None
        self.embed_norm = _norm(spec, spec.hidden_size) if spec.embedding_norm else None
        self.layers = nn.ModuleList(
            Block(spec, i, flash=flash_attention, selective=recompute == "selective") for i in range(spec.num_layers)
        )
        self.final_norm = _norm(spec, spec.hidden_size)
        self.output = None if spec.tied_embeddings else nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.position_embedding == "rope":
            cos, sin = _rope_tables(seq_len, spec.rotary_dim, spec.rope_theta, spec)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        else:
            self.rope_cos = self.rope_sin = None
        if not flash_attention:
            mask = torch.full((seq_len, seq_len), float("-inf")).triu(1)
            self.register_buffer("causal_mask", mask, persistent=False)
        else:
            self.causal_mask = None
        self._init_weights()

    def _init_weights(self) -> None:
        gen = torch.Generator().manual_seed(1234)
        for name, p in self.named_parameters():
            if name.endswith("bias") or "router_bias" in name:
                nn.init.zeros_(p)
            elif p.dim() == 1:
                nn.init.ones_(p)  # (a zero-centred norm's weight is zeroed below)
            else:
                with torch.no_grad():
                    p.normal_(0.0, 0.02, generator=gen)
        for module in self.modules():
            if isinstance(module, _ZeroCenteredLayerNorm) or getattr(module, "zero_centered", False):
                nn.init.zeros_(module.weight)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        b, s = input_ids.shape
        x = scale_embeddings(self.spec, self.embed(input_ids))
        if self.pos is not None:
            x = x + self.pos.weight[self.spec.position_offset:self.spec.position_offset + s]  # OPT: from row 2
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        x = bool_dropout(x, self.spec.dropout, self.training)
        for layer in self.layers:
            if self.recompute == "full":
                x = checkpoint(layer, x, self.rope_cos, self.rope_sin, self.causal_mask, use_reentrant=False)
            else:
                x = layer(x, self.rope_cos, self.rope_sin, self.causal_mask)
        x = self.final_norm(x)
        weight = self.embed.weight if self.output is None else self.output.weight
        logits = cap_logits(self.spec, F.linear(x, weight))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))


def build_model(spec: ModelSpec, *, seq_len: int, recompute: Recompute = "none", flash_attention: bool = True,
                dtype: torch.dtype = torch.bfloat16) -> DecoderLM:
    """A decoder-only LM with exactly ``spec.num_params`` parameters; ``forward(input_ids, labels)`` gives
    the mean cross-entropy. Buffers (RoPE tables, the unfused causal mask) follow ``dtype`` except the
    fp32 RoPE tables."""
    model = DecoderLM(spec, seq_len=seq_len, recompute=recompute, flash_attention=flash_attention)
    model.to(dtype)
    if model.rope_cos is not None:  # RoPE tables stay fp32 (the fused kernels compute in fp32)
        model.rope_cos, model.rope_sin = _rope_tables(seq_len, spec.rotary_dim, spec.rope_theta, spec)
    return model
