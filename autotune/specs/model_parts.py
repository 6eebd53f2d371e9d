"""The parts of a model spec: parameter groups by how parallelism splits them, the mixture-of-experts block
and multi-latent attention (re-exported by :mod:`autotune.specs.model`); which local-attention layers a sequence
outgrows."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ParamGroups", "MoESpec", "MLASpec", "local_attention_below"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamGroups:
    """Parameter counts by how model parallelism splits them.

    ``tp_sharded`` is split across tensor-parallel ranks (column/row-parallel weights,
    column-parallel biases, vocab-parallel embeddings); ``replicated`` is held whole by every
    TP rank (norms, row-parallel biases, routers, learned position embeddings, MLA down
    projections); ``expert`` is split across expert-parallel ranks and, with expert tensor
    parallelism equal to TP (Megatron's default), across TP ranks too.
    """

    tp_sharded: int = 0
    replicated: int = 0
    expert: int = 0

    @property
    def total(self) -> int:
        return self.tp_sharded + self.replicated + self.expert

    def __add__(self, other: ParamGroups) -> ParamGroups:
        return ParamGroups(
            tp_sharded=self.tp_sharded + other.tp_sharded,
            replicated=self.replicated + other.replicated,
            expert=self.expert + other.expert,
        )

    def scaled(self, k: int) -> ParamGroups:
        return ParamGroups(tp_sharded=self.tp_sharded * k, replicated=self.replicated * k, expert=self.expert * k)

    def per_gpu(self, tp: int, ep: int) -> float:
        """Parameters one GPU holds of this group under tensor parallel ``tp`` and expert parallel ``ep``."""
        return self.tp_sharded / tp + self.replicated + self.expert / (ep * tp)


@dataclass(frozen=True, slots=True, kw_only=True)
class MoESpec:
    """Mixture-of-experts feed-forward layers (Mixtral, DeepSeek-V3)."""

    num_experts: int
    """Routed experts per MoE layer."""
    top_k: int
    """Routed experts each token visits."""
    expert_ffn_hidden_size: int
    """FFN width of one routed expert."""
    num_shared_experts: int = 0
    """Experts every token visits (DeepSeek); each of width ``shared_expert_ffn_hidden_size``."""
    shared_expert_ffn_hidden_size: int | None = None
    """Width of one shared expert; defaults to ``expert_ffn_hidden_size``."""
    shared_expert_gate: bool = False
    """The shared experts' output scaled by a sigmoid of a bias-free hidden_size -> 1 projection of the layer's input
    (Qwen2-MoE's ``shared_expert_gate``, transformers Qwen2MoeSparseMoeBlock; Megatron ``--moe-shared-expert-gate``):
    hidden_size more weights per MoE layer, held whole by every TP rank."""
    num_dense_layers: int = 0
    """Leading layers with a dense FFN of ``ModelSpec.ffn_hidden_size`` (DeepSeek-V3: 3)."""
    router_bias: bool = False
    """A per-expert routing bias (DeepSeek-V3's ``e_score_correction_bias``, GPT-OSS's router bias; ERNIE 4.5 MoE's
    ``e_score_correction_bias`` beside a softmax router, on the selection only: ``router_bias_gap`` in emit)."""
    moe_layer_step: int = 1
    """After the dense layers, layer ``i`` is MoE when ``(i + 1) % moe_layer_step == 0`` (Llama 4 Maverick: 2,
    dense and MoE layers alternate; Qwen3-MoE's decoder_sparse_step). 1: every layer after the dense ones."""
    # How the router turns its logits into the top-k weights, as Megatron-core's topk_routing_with_score_function
    # does (Megatron-LM @d98e8a6 megatron/core/transformer/moe/moe_utils.py:900-929): what the model computes, not
    # what it costs; the emitted files state it (--moe-router-score-function and the flags below).
    router_score: str = "softmax"
    """"softmax" (Mixtral, Qwen3, GPT-OSS: softmax over the top-k logits) or "sigmoid" (DeepSeek-V3, Kimi-K2,
    GLM-4.5: each expert's sigmoid, the top-k normalised to sum to 1; Llama 4: top-1, not normalised)."""
    router_pre_softmax: bool = False
    """Softmax over every expert before the top-k, the weights left unnormalised (Hugging Face ``norm_topk_prob``
    false; Megatron ``--moe-router-pre-softmax``)."""
    router_groups: int | None = None
    """Group-limited routing (DeepSeek-V3: 8 groups, ``n_group``): the top-k is taken within the best
    ``router_group_topk`` groups (``topk_group``: 4). None: one group."""
    router_group_topk: int | None = None
    router_scaling_factor: float = 1.0
    """The top-k weights' scale (``routed_scaling_factor``: DeepSeek-V3 2.5, Kimi-K2 2.827)."""
    router_probs_on_input: bool = False
    """The routing weight scales the expert's input, not its output (Llama 4: Llama4TextMoe multiplies the tokens by
    their sigmoid score before the experts; Megatron ``--moe-apply-probs-on-input``, top-1 only)."""
    aux_loss_coeff: float | None = None
    """The load-balancing loss's weight the checkpoint states (``router_aux_loss_coef``: Mixtral-8x7B 0.02, Qwen3
    0.001, GPT-OSS 0.9; ``aux_loss_alpha``: Kimi-K2 0.001). None: not stated (Megatron's default weight is 0, no such
    loss). A training objective, not a cost."""
    aux_loss_per_sequence: bool = False
    """The loss balances each sequence, not the whole micro-batch (``seq_aux``: DeepSeek-V3 / Kimi-K2; Megatron
    ``--moe-router-load-balancing-type seq_aux_loss``)."""

    @property
    def shared_width(self) -> int:
        return self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size

    def problems(self) -> list[str]:
        out = []
        for name in ("num_experts", "top_k", "expert_ffn_hidden_size"):
            if getattr(self, name) < 1:
                out.append(f"moe.{name} must be >= 1, got {getattr(self, name)}")
        if self.top_k > self.num_experts:
            out.append(f"moe.top_k ({self.top_k}) exceeds moe.num_experts ({self.num_experts}): lower top_k")
        if self.num_shared_experts < 0 or self.num_dense_layers < 0:
            out.append("moe.num_shared_experts and moe.num_dense_layers must be >= 0")
        if self.shared_expert_gate and not self.num_shared_experts:
            out.append("moe.shared_expert_gate gates the shared experts: it needs moe.num_shared_experts >= 1")
        if isinstance(self.moe_layer_step, bool) or not isinstance(self.moe_layer_step, int) or self.moe_layer_step < 1:
            out.append(f"moe.moe_layer_step must be a positive integer, got {self.moe_layer_step!r}")
        coeff = self.aux_loss_coeff
        if coeff is not None and (isinstance(coeff, bool) or not isinstance(coeff, (int, float)) or not coeff >= 0):
            out.append(f"moe.aux_loss_coeff must be a number >= 0 or absent, got {coeff!r}")
        if self.aux_loss_per_sequence and coeff is None:
            out.append("moe.aux_loss_per_sequence needs moe.aux_loss_coeff (the per-sequence loss's weight)")
        if self.router_score not in ("softmax", "sigmoid"):
            out.append(f"moe.router_score must be softmax or sigmoid, got {self.router_score!r}")
        if self.router_pre_softmax and self.router_score != "softmax":
            out.append("moe.router_pre_softmax applies to a softmax router only: drop it or set router_score softmax")
        if (self.router_groups is None) != (self.router_group_topk is None):
            out.append("moe.router_groups and moe.router_group_topk go together (n_group and topk_group): give both")
        elif self.router_groups is not None and self.router_group_topk is not None and not (
                1 <= self.router_group_topk <= self.router_groups and self.num_experts % self.router_groups == 0):
            out.append(f"moe.router_groups ({self.router_groups}) must divide num_experts ({self.num_experts}) and "
                       f"be >= router_group_topk ({self.router_group_topk}) >= 1")
        if self.router_probs_on_input not in (False, True) or (self.router_probs_on_input and self.top_k != 1):
            out.append(f"moe.router_probs_on_input must be true or false, true with top_k 1 only (Megatron-core's "
                       f"experts assert it); got {self.router_probs_on_input!r} with top_k {self.top_k}")
        if not self.router_scaling_factor > 0:
            out.append(f"moe.router_scaling_factor must be > 0, got {self.router_scaling_factor!r}")
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank compressed Q and KV."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    """None: Q is a plain projection (DeepSeek-V2-Lite)."""

    def problems(self) -> list[str]:
        return [
            f"mla.{n} must be >= 1, got {getattr(self, n)}"
            for n in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
            if getattr(self, n) < 1
        ] + (["mla.q_lora_rank must be >= 1 or absent"] if self.q_lora_rank is not None and self.q_lora_rank < 1 else [])


def local_attention_below(model, seq_len: int) -> str | None:
    """The local-attention layers of ``model`` (a ModelSpec) that see less than ``seq_len`` tokens, in words
    ("chunked attention (8192 tokens on 36 of 48 layers)"); None where every layer sees the whole sequence (a window no
    shorter than it is full causal attention)."""
    if model.sliding_window is None or seq_len <= model.sliding_window:
        return None
    kind = "chunked" if model.chunked_attention else "sliding-window"
    local = len(model.sliding_window_layers) if model.sliding_window_layers is not None else model.num_layers
    return f"{kind} attention ({model.sliding_window} tokens on {local} of {model.num_layers} layers)"
