"""ModelSpec: the shape of a decoder-only transformer, and its exact parameter count.

Parameter counts are exact for the architectures the presets cover (GPT-2/3, Megatron GPT, OPT, BLOOM, GPT-NeoX,
Falcon, Llama 2/3/4, Mistral, Mixtral, Qwen2/3, Qwen3-MoE, DeepSeek-V3, Kimi-K2, GPT-OSS, Gemma 2/3, GLM-4.5, OLMo 2,
Phi-3): every weight matrix, bias, norm (Q/K norms included), attention sink, router, embedding and output layer is
counted, and which layers are dense or MoE; tests/specs/test_hf_readers_exact.py checks them against the models
transformers builds. Multi-token-prediction modules are carried (``num_mtp_layers``) but counted apart. Each parameter
is also tagged by how tensor and expert parallelism split it (``ParamGroups``), which the memory ledger needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autotune.errors import require_no_problems
from autotune.specs.model_checks import model_problems
from autotune.specs.model_parts import MLASpec, MoESpec, ParamGroups

__all__ = ["ModelSpec", "MoESpec", "MLASpec", "ParamGroups"]

Activation = Literal["gelu", "gelu_tanh", "swiglu", "geglu", "relu", "squared_relu"]
Norm = Literal["layernorm", "rmsnorm"]
PositionEmbedding = Literal["learned", "rope", "alibi"]
QKNorm = Literal["head", "full", "l2"]
RopeScaling = Literal["yarn", "llama3", "linear"]

# Fields added after the first presets: left out of to_dict at their defaults, so every earlier model
# serialises (and counts) as before.
_LATER_FIELDS = {"qk_norm": None, "parallel_residual": False, "post_norm": False, "rotary_fraction": 1.0,
                 "attention_sinks": False, "sliding_window": None, "sliding_window_layers": None,
                 "chunked_attention": False, "num_mtp_layers": 0, "activation_clamp": None,
                 "rope_scaling": None, "rope_scaling_factor": None, "rope_low_freq_factor": None,
                 "rope_high_freq_factor": None, "rope_original_max_positions": None, "yarn_beta_fast": None,
                 "yarn_beta_slow": None, "yarn_mscale": None, "yarn_mscale_all_dim": None, "yarn_truncate": None,
                 "attn_logit_softcap": None, "final_logit_softcap": None, "query_pre_attn_scalar": None,
                 "scaled_embeddings": False, "norm_zero_centered": False, "local_rope_theta": None, "norm_eps": None,
                 "attention_output_bias": False, "position_offset": 0, "note": None, "rope_layers": None}
_LATER_MOE = {"router_probs_on_input": False, "aux_loss_coeff": None, "aux_loss_per_sequence": False,
              "shared_expert_gate": False}
_LAYER_LISTS = ("sliding_window_layers", "rope_layers")  # tuples of layer indices, lists in YAML


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer. Validated on construction: every problem is reported at once."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    """Dense FFN width (for MoE models: the width of the leading dense layers, if any)."""
    vocab_size: int
    num_kv_heads: int | None = None
    """Key/value heads; fewer than the attention heads is GQA, 1 is MQA. None: same as heads."""
    head_dim: int | None = None
    """Per-head width; None: hidden_size / num_attention_heads."""
    activation: Activation = "gelu"
    """The MLP's activation: ``gelu`` (exact, erf: GPT-NeoX, Falcon), ``gelu_tanh`` (GeLU's tanh form: GPT-2/3's
    gelu_new, BLOOM, Megatron's fused bias-GeLU), ``relu`` (OPT), ``squared_relu`` (Nemotron-4), or gated:
    ``swiglu`` (SiLU gate: Llama), ``geglu`` (tanh-GeLU gate: Gemma)."""
    norm: Norm = "layernorm"
    norm_eps: float | None = None
    """The norms' epsilon (config.json rms_norm_eps: Llama 3 1e-5, Qwen3 1e-6); None: each engine's default."""
    tied_embeddings: bool = False
    position_embedding: PositionEmbedding = "learned"
    max_position_embeddings: int = 2048
    """Positions of the learned position table, the longest sequence it takes (counted only for ``learned``)."""
    position_offset: int = 0
    """Rows of the learned table before its first position, counted but never a position (OPT's 2)."""
    rope_theta: float = 10000.0
    """RoPE base frequency (Llama 2: 10,000; Llama 3: 500,000; Mixtral, Qwen2.5: 1,000,000). Only with rope."""
    rotary_fraction: float = 1.0
    """The share of each head's dimensions RoPE rotates, the first ones (GPT-NeoX ``rotary_pct`` 0.25, GLM-4.5
    ``partial_rotary_factor`` 0.5; Megatron ``--rotary-percent``); the rest carry no position. Only with rope."""
    rope_scaling: RopeScaling | None = None
    """RoPE frequency scaling (config.json ``rope_scaling.rope_type``): ``yarn`` (GPT-OSS, DeepSeek-V3: its cos / sin
    carry YaRN's attention factor; ``autotune.cost.rope_kernels``), ``llama3`` (Llama 3.1 / 4), ``linear`` (positions
    divided by the factor: Gemma 3's global layers). None: plain RoPE. Only with rope."""
    rope_scaling_factor: float | None = None
    """``rope_scaling.factor`` (GPT-OSS 32, Llama 3.1 8); None: not stated (yarn only: Megatron's default 1.0)."""
    # llama3 scaling: wavelengths above original / low_freq_factor are divided by the factor, those below original /
    # high_freq_factor kept, the ones between blended (Llama 3.1: 1, 4, 8192; Llama 4 Scout: 1, 1, 8192)
    rope_low_freq_factor: float | None = None
    rope_high_freq_factor: float | None = None
    rope_original_max_positions: int | None = None
    """llama3 / yarn: the context the frequencies were trained for (``original_max_position_embeddings``)."""
    # yarn as config.json's rope_scaling states it (None: not stated; transformers' and Megatron's defaults: original
    # context 4096, beta_fast 32, beta_slow 1, mscale 1, no mscale_all_dim, truncate true). GPT-OSS: truncate false;
    # DeepSeek-V3 / Kimi-K2: mscale_all_dim 1, MLA's softmax scale times (0.1 mscale_all_dim ln(factor) + 1)^2
    # (transformers DeepseekV3Attention); Kimi-K2: beta_fast 1.
    yarn_beta_fast: float | None = None
    yarn_beta_slow: float | None = None
    yarn_mscale: float | None = None
    yarn_mscale_all_dim: float | None = None
    yarn_truncate: bool | None = None
    linear_bias: bool = False
    """Biases on every linear layer (GPT-2/3, OPT, BLOOM, NeoX)."""
    qkv_bias: bool = False
    """Biases on the Q/K/V projections only (Qwen2)."""
    attention_output_bias: bool = False
    """A bias on the attention output projection without MLP biases (with ``qkv_bias``: Llama's attention_bias)."""
    embedding_norm: bool = False
    """A norm right after the token embedding (BLOOM)."""
    norms_per_layer: int = 2
    """Falcon-7B's parallel block has one; standard pre-norm blocks two."""
    parallel_residual: bool = False
    """Attention and MLP both read the layer's input, their outputs added to it together (GPT-NeoX's
    ``use_parallel_residual``, Falcon-40B/180B's two norms); with one norm per layer (Falcon-7B) always so."""
    post_norm: bool = False
    """The two norms on the attention and MLP outputs, before each residual add (OLMo 2's Olmo2DecoderLayer), not on
    their inputs. The same weights and cost; another model."""
    dropout: float = 0.0
    """Hidden and attention dropout probability (Megatron GPT: 0.1; Llama: 0)."""
    qk_norm: QKNorm | None = None
    """A norm on queries and keys before attention: ``head`` (one weight of head_dim each for Q and K, shared by
    the heads: Qwen3, Gemma 3, GLM-4.5), ``full`` (over the whole Q and K widths: OLMo 2) or ``l2`` (each head's Q and
    K divided by their root mean square, no weights, on the rotary layers only: Llama 4 Scout's ``use_qk_norm``,
    transformers ``Llama4TextAttention``). None: no norm."""
    attention_sinks: bool = False
    """A learned sink logit per attention head and layer (GPT-OSS)."""
    sliding_window: int | None = None
    """Tokens a local-attention layer sees (its window, or its chunk with ``chunked_attention``); None: all global."""
    sliding_window_layers: tuple[int, ...] | None = None
    """Indices of the local-attention layers (Gemma 2, GPT-OSS: every other one; Gemma 3: five of six; Llama 4:
    three of four); None with a ``sliding_window``: every layer."""
    chunked_attention: bool = False
    """Local layers attend within fixed chunks of ``sliding_window`` tokens, not a sliding window (Llama 4)."""
    activation_clamp: float | None = None
    """A clamp on the gated activation's inputs (GPT-OSS ``swiglu_limit`` 7.0: the gate clamped above, the linear half
    both ways); None: no clamp. Megatron-core runs it as extra kernels (``autotune.cost.layer_time``), except in
    Transformer Engine's fused grouped MLP (``autotune.cost.fused_grouped_mlp``)."""
    attn_logit_softcap: float | None = None
    """Attention scores capped as cap * tanh(score / cap) before the softmax (Gemma 2: 50); None: not capped."""
    final_logit_softcap: float | None = None
    """The output logits capped the same way (Gemma 2: 30); None: not capped."""
    query_pre_attn_scalar: float | None = None
    """Attention scores scaled by its -1/2 power, not head_dim's (Gemma 2/3 27B: hidden / heads, 144 and 168)."""
    scaled_embeddings: bool = False
    """The token embeddings multiplied by sqrt(hidden_size) (Gemma)."""
    norm_zero_centered: bool = False
    """Each norm multiplies by (1 + weight), its weight starting at zero (Gemma's RMSNorm; Megatron
    ``--apply-layernorm-1p``): the same function, another parametrisation (weight decay pulls it to 1)."""
    local_rope_theta: float | None = None
    """RoPE base of the local-attention layers where it is not ``rope_theta`` (Gemma 3: 10,000 beside 1,000,000)."""
    rope_layers: tuple[int, ...] | None = None
    """Indices of the layers that rotate Q and K, the rest position-free (NoPE: SmolLM3's ``no_rope_layers``, EXAONE 4's
    global layers); None: every layer (but Llama 4's global ones: :meth:`is_rotary_layer`). Only with rope."""
    num_mtp_layers: int = 0
    """Multi-token-prediction modules trained beside the model (DeepSeek-V3: 1). Not in :attr:`num_params` (the
    checkpoint's main model and ``transformers`` leave them out); :meth:`mtp_params` counts them."""
    note: str | None = None
    """What the count leaves out of the checkpoint it was read from (Gemma 3's vision tower); estimate prints it."""
    moe: MoESpec | None = None
    mla: MLASpec | None = None

    def __post_init__(self) -> None:
        require_no_problems(self.problems(), subject=f"model '{self.name}'")

    # ---- validation -------------------------------------------------------------------
    def problems(self) -> list[str]:
        """Every problem of the spec at once (autotune.specs.model_checks)."""
        return model_problems(self)

    # ---- derived shape ------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_width(self) -> int:
        """Width of the concatenated query heads (= hidden_size for most models)."""
        if self.mla is not None:
            return self.num_attention_heads * (self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim)
        return self.num_attention_heads * self.attention_head_dim

    @property
    def kv_width(self) -> int:
        """Width of the keys (and of the values) over all KV heads, as attention sees them."""
        if self.mla is not None:
            return self.num_attention_heads * (self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim)
        return self.kv_heads * self.attention_head_dim

    @property
    def v_width(self) -> int:
        if self.mla is not None:
            return self.num_attention_heads * self.mla.v_head_dim
        return self.kv_width

    @property
    def attention_output_width(self) -> int:
        """Width of the attention output (the output projection's input): heads x value head dim."""
        if self.mla is not None:
            return self.num_attention_heads * self.mla.v_head_dim
        return self.q_width

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def is_moe_layer(self, index: int) -> bool:
        moe = self.moe
        return moe is not None and index >= moe.num_dense_layers and (index + 1) % moe.moe_layer_step == 0

    @property
    def num_moe_layers(self) -> int:
        if self.moe is None:
            return 0
        if self.moe.moe_layer_step == 1:
            return self.num_layers - self.moe.num_dense_layers
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    def is_local_attention_layer(self, index: int) -> bool:
        """Whether layer ``index`` attends within ``sliding_window`` tokens (sliding or chunked)."""
        if self.sliding_window is None:
            return False
        return self.sliding_window_layers is None or index in self.sliding_window_layers

    @property
    def rotary_dim(self) -> int:
        """Each head's dimensions RoPE rotates (the first ones): head dim x rotary_fraction."""
        return round(self.attention_head_dim * self.rotary_fraction)

    @property
    def gated_mlp(self) -> bool:
        """Whether the MLP is gated (gate, up and down matrices): SwiGLU or GeGLU."""
        return self.activation in ("swiglu", "geglu")

    @property
    def parallel_block(self) -> bool:
        """Whether attention and MLP run side by side on the layer's input (parallel_residual, or one norm)."""
        return self.parallel_residual or self.norms_per_layer == 1

    def is_rotary_layer(self, index: int) -> bool:
        """Whether layer ``index`` rotates Q and K: ``rope_layers``, else every layer but Llama 4's global ones (outside
        its chunks: transformers Llama4TextConfig ``no_rope_layers``, Megatron's ``--no-rope-freq``)."""
        if self.position_embedding != "rope":
            return False
        if self.rope_layers is not None:
            return index in self.rope_layers
        return not self.chunked_attention or self.is_local_attention_layer(index)

    # ---- parameter counts ---------------------------------------------------------------
    def _norm_params(self, width: int) -> int:
        return width * (2 if self.norm == "layernorm" else 1)

    def attention_params(self) -> ParamGroups:
        """One attention block: projections, their biases; no norm."""
        h = self.hidden_size
        if self.mla is not None:
            m, a = self.mla, self.num_attention_heads
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            replicated = h * (m.kv_lora_rank + m.qk_rope_head_dim) + self._norm_params(m.kv_lora_rank)
            sharded = m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim) + a * m.v_head_dim * h
            if m.q_lora_rank is None:
                sharded += h * a * qk
            else:
                replicated += h * m.q_lora_rank + self._norm_params(m.q_lora_rank)
                sharded += m.q_lora_rank * a * qk
            return ParamGroups(tp_sharded=sharded, replicated=replicated)
        qkv_out = self.q_width + 2 * self.kv_width
        sharded = h * qkv_out + self.q_width * h
        replicated = 0
        if self.linear_bias or self.qkv_bias:
            sharded += qkv_out  # column-parallel bias: split with its weight
        if self.linear_bias or self.attention_output_bias:
            replicated += h  # row-parallel output bias: replicated
        return ParamGroups(tp_sharded=sharded, replicated=replicated) + self.attention_extras()

    def attention_extras(self) -> ParamGroups:
        """Q/K norms and attention sinks: with TP, per-head weights split with the heads, shared ones replicated."""
        sharded = self.num_attention_heads if self.attention_sinks else 0
        replicated = 0
        if self.qk_norm == "head":
            replicated += 2 * self._norm_params(self.attention_head_dim)
        elif self.qk_norm == "full":
            sharded += self._norm_params(self.q_width) + self._norm_params(self.kv_width)
        return ParamGroups(tp_sharded=sharded, replicated=replicated)

    def _mlp_matrix_params(self, width: int) -> tuple[int, int]:
        """(weights+column biases, row bias) of one dense MLP of FFN width ``width``."""
        h = self.hidden_size
        n_in = 2 if self.gated_mlp else 1  # SwiGLU / GeGLU: gate and up projections
        weights = (n_in + 1) * h * width
        col_bias = n_in * width if self.linear_bias else 0
        row_bias = h if self.linear_bias else 0
        return weights + col_bias, row_bias

    def mlp_params(self, layer_index: int) -> ParamGroups:
        """The feed-forward block of layer ``layer_index`` (dense or MoE), without its norm."""
        if not self.is_moe_layer(layer_index):
            sharded, row_bias = self._mlp_matrix_params(self.ffn_hidden_size)
            return ParamGroups(tp_sharded=sharded, replicated=row_bias)
        moe = self.moe
        assert moe is not None
        expert, expert_bias = self._mlp_matrix_params(moe.expert_ffn_hidden_size)
        groups = ParamGroups(
            expert=moe.num_experts * (expert + expert_bias),
            replicated=moe.num_experts * self.hidden_size + (moe.num_experts if moe.router_bias else 0),
        )
        if moe.num_shared_experts:
            shared, shared_bias = self._mlp_matrix_params(moe.shared_width)
            gate = self.hidden_size if moe.shared_expert_gate else 0  # Qwen2-MoE's hidden -> 1 sigmoid gate
            groups = groups + ParamGroups(
                tp_sharded=moe.num_shared_experts * shared, replicated=moe.num_shared_experts * shared_bias + gate)
        return groups

    def layer_params(self, layer_index: int) -> ParamGroups:
        norms = ParamGroups(replicated=self.norms_per_layer * self._norm_params(self.hidden_size))
        return self.attention_params() + self.mlp_params(layer_index) + norms

    def embedding_params(self) -> ParamGroups:
        """Input side: token embedding (vocab-parallel), learned positions, embedding norm."""
        replicated = 0
        if self.position_embedding == "learned":
            replicated += (self.max_position_embeddings + self.position_offset) * self.hidden_size
        if self.embedding_norm:
            replicated += self._norm_params(self.hidden_size)
        return ParamGroups(tp_sharded=self.vocab_size * self.hidden_size, replicated=replicated)

    def output_params(self) -> ParamGroups:
        """Output side: final norm and (untied) output projection."""
        head = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return ParamGroups(tp_sharded=head, replicated=self._norm_params(self.hidden_size))

    @property
    def num_params(self) -> int:
        """Exact number of trainable parameters."""
        layers = sum(self.layer_params(i).total for i in range(self.num_layers))
        return layers + self.embedding_params().total + self.output_params().total

    def mtp_params(self) -> int:
        """Parameters of the checkpoint's multi-token-prediction modules (``num_mtp_layers``; not in
        :attr:`num_params`): :meth:`mtp_module_params` each."""
        return self.num_mtp_layers * self.mtp_module_params().total if self.num_mtp_layers else 0

    def mtp_module_params(self) -> ParamGroups:
        """One multi-token-prediction module (DeepSeek-V3's layout; Megatron-core multi_token_prediction.py at
        d98e8a6): norms of the hidden state and of the next token's embedding and its output norm (replicated), a
        2h -> h column-parallel projection (``eh_proj``), and one more layer like the last; embedding and output
        head are the main model's."""
        h = self.hidden_size
        return ParamGroups(tp_sharded=2 * h * h, replicated=3 * self._norm_params(h)) \
            + self.layer_params(self.num_layers - 1)

    @property
    def num_active_params(self) -> int:
        """Parameters one token touches: for MoE, top-k routed plus shared experts; else num_params."""
        if self.moe is None:
            return self.num_params
        expert, expert_bias = self._mlp_matrix_params(self.moe.expert_ffn_hidden_size)
        inactive = (self.moe.num_experts - self.moe.top_k) * (expert + expert_bias)
        return self.num_params - self.num_moe_layers * inactive

    def stage_params(self, first_layer: int, num_layers: int, *, has_embedding: bool, has_output: bool) -> ParamGroups:
        """Parameters of a pipeline stage holding layers [first_layer, first_layer + num_layers).

        A tied model's last stage (pp > 1) keeps its own copy of the embedding as output layer,
        as Megatron does.
        """
        total = ParamGroups()
        for i in range(first_layer, first_layer + num_layers):
            total = total + self.layer_params(i)
        if has_embedding:
            total = total + self.embedding_params()
        if has_output:
            total = total + self.output_params()
            if self.tied_embeddings and not has_embedding:
                total = total + ParamGroups(tp_sharded=self.vocab_size * self.hidden_size)
        return total

    # ---- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict:
        out = {f: getattr(self, f) for f in self.__dataclass_fields__
               if f not in ("moe", "mla") and not (f in _LATER_FIELDS and getattr(self, f) == _LATER_FIELDS[f])}
        out.update({f: list(getattr(self, f)) for f in _LAYER_LISTS if getattr(self, f) is not None})
        if self.moe is not None:
            out["moe"] = {f: getattr(self.moe, f) for f in self.moe.__dataclass_fields__
                          if not (f == "moe_layer_step" and self.moe.moe_layer_step == 1)
                          and not (f in _LATER_MOE and getattr(self.moe, f) == _LATER_MOE[f])}
        if self.mla is not None:
            out["mla"] = {f: getattr(self.mla, f) for f in self.mla.__dataclass_fields__}
        return out

    @classmethod
    def from_dict(cls, data: dict) -> ModelSpec:
        """Build from a plain mapping (a model YAML after schema validation)."""
        data = dict(data)
        moe = data.pop("moe", None)
        mla = data.pop("mla", None)
        data.update({f: tuple(data[f]) for f in _LAYER_LISTS if isinstance(data.get(f), list)})
        return cls(
            **data,
            moe=MoESpec(**moe) if moe else None,
            mla=MLASpec(**mla) if mla else None,
        )

