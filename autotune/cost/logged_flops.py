"""The training FLOPs per token that Megatron-Bridge logs ("TFLOP/s/GPU"), re-expressed for a :class:`ModelSpec`.

Megatron-Bridge divides its own count by the step time; it is not our model-FLOPs count
(:mod:`autotune.cost.flops`: full s x s attention square, Narayanan et al. 2021). Its count,
``num_floating_point_operations`` (NVIDIA-NeMo/Megatron-Bridge@067f987df03b:
src/megatron/bridge/training/utils/flop_utils.py:617-1658, standard-transformer branch
``transformer_flops`` at 947-1571), per token and for fixed-length sequences, is 3 (forward, weight
gradient, data gradient) x 2 (multiply-add) x the weight-GEMM sizes below, plus the attention core:

- attention (GQA/MHA, 1351-1408): h x (q + 2 kv) for Q/K/V and q x h for the output projection,
  q = heads x head_dim, kv = kv_heads x head_dim; core q x s (causal: s/2 average keys, x2 for QK^T
  and PV); a sliding-window layer of window W sees on average W - W (W - 1) / (2 s) keys instead
  (1364-1405); biases, Q/K norms, sinks and the router are not counted;
- MLA (1303-1348): q_lora_rank x (h + heads x (qk + rope) + 1), kv_lora_rank x (h + heads x (qk + v) + 1),
  h x rope, heads x v x h, core s/2 x heads x (qk + rope + v);
- MLP (1043-1054, 1530-1554): h x ffn x (3 if gated else 2) per dense layer; per MoE layer
  top_k x h x expert_ffn x (3|2) plus h x (shared experts' total width) x (3|2);
- MTP (1034-1041, 1557-1566): each module adds one layer of the last decoder layer's kind (dense or MoE),
  3h + 2h^2 (norms, eh_proj) and one more output layer;
- logits (1523-1528, 1568): h x V_padded x (1 + MTP modules); the vocabulary is padded to a multiple of
  make_vocab_size_divisible_by x TP (megatron.training.vocab_utils.calculate_padded_vocab_size).

Two versions of the formula are in NVIDIA's published tables (bench/data/nvidia_recipes_blackwell.csv):

- ``"26.06"`` (containers 26.06 and later; Bridge from commit baa0259bd, "[training] fix flops computation",
  2026-05-28, in v0.5.0): every gated MLP counts 3 projections, sliding windows are counted as above;
- ``"25.09"`` (containers 25.09 to 26.04.01; Bridge v0.1.0 to v0.4.2, e.g. v0.4.0 0fbfe7d3e:
  flop_utils.py:296-298, 368-383): a gated MLP counts 3 projections only when its activation is SiLU
  (``gated_linear_unit and activation_func == F.silu``), and there is no sliding-window term (every layer
  full causal). GPT-OSS runs a quick-GELU GLU (gpt_oss_bridge.py:82 at 067f987), so that formula counted
  its experts as 2-projection MLPs: 27.1 GFLOP/token at seq 4096 against 32.6 from 26.06 on.

ModelSpec cannot say which activation a gated MLP uses (``activation`` is "swiglu" for GPT-OSS too) nor
Bridge's ``make_vocab_size_divisible_by``: both are keyword arguments here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autotune.engines import engine_for
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["FormulaVersion", "FORMULA_VERSIONS", "LoggedFlops", "logged_flops", "logged_flops_per_token",
           "logged_tflops_per_gpu", "bridge_vocab_divisor", "padded_vocab_size", "causal_window_context"]

FormulaVersion = Literal["26.06", "25.09"]
FORMULA_VERSIONS: dict[str, str] = {
    "26.06": "NeMo containers 26.06 and later (Megatron-Bridge >= baa0259bd / v0.5.0, through 067f987df03b)",
    "25.09": "NeMo containers 25.09 to 26.04.01 (Megatron-Bridge v0.1.0 to v0.4.2, before baa0259bd)",
}

# fwd + wgrad + dgrad, each GEMM 2 FLOPs per multiply-add: flop_utils.py:1319, 1544-1545 at 067f987.
_TRAIN_GEMM = 3 * 2


def bridge_vocab_divisor(vocab_size: int) -> int:
    """``make_vocab_size_divisible_by`` as Bridge's Hugging Face conversion sets it: the largest power of two, at
    most 128, dividing the vocabulary (Megatron-Bridge@067f987df03b:
    src/megatron/bridge/models/conversion/model_bridge.py:637, 1716-1747). The DeepSeek-V3 and Kimi bridges
    override it with 1280 (deepseek/deepseek_v3_bridge.py:90, kimi/kimi_bridge.py:79)."""
    divisor = 128
    while vocab_size % divisor:
        divisor //= 2
    return divisor


def padded_vocab_size(vocab_size: int, divisor: int, tp: int) -> int:
    """The vocabulary rounded up to a multiple of ``divisor x tp``, as Megatron's calculate_padded_vocab_size
    (which the FLOPs count calls whatever ``should_pad_vocab`` says, flop_utils.py:1523-1528 at 067f987)."""
    multiple = divisor * tp
    return -(-vocab_size // multiple) * multiple


def causal_window_context(window: int, seq_len: int) -> float:
    """Keys a query sees on average under a causal sliding window of ``window`` tokens: (W (W + 1) / 2 +
    (s - W) W) / s = W - W (W - 1) / (2 s) when W < s, else the causal s / 2 (flop_utils.py:1369-1377)."""
    if window < seq_len:
        return window - window * (window - 1) / (2 * seq_len)
    return seq_len / 2


def _glu_projections(model: ModelSpec, version: FormulaVersion, silu_glu: bool) -> int:
    """3 for a gated MLP (gate, up, down), else 2 (flop_utils.py:1053-1054 at 067f987; v0.4.0 296-298 also
    required a SiLU activation)."""
    gated = model.gated_mlp
    if version == "25.09":
        gated = gated and silu_glu
    return 3 if gated else 2


def _attention_per_token(model: ModelSpec, seq_len: int, version: FormulaVersion,
                         layer_indices: range) -> tuple[float, float]:
    """(projections, core) multiply-adds per token, forward, of the attention blocks of ``layer_indices`` (indices
    past the decoder are MTP layers), Bridge's way (before its x3 x2)."""
    h, heads = model.hidden_size, model.num_attention_heads
    n = len(layer_indices)
    if model.mla is not None:  # flop_utils.py:1303-1348
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank is None:
            q_term = h * heads * qk
        else:
            q_term = m.q_lora_rank * (h + heads * qk + 1)  # down, up, q norm
        kv_term = m.kv_lora_rank * (h + heads * (m.qk_nope_head_dim + m.v_head_dim) + 1) + h * m.qk_rope_head_dim
        out_term = heads * m.v_head_dim * h
        core = seq_len * heads * qk / 2 + seq_len * heads * m.v_head_dim / 2
        return n * (q_term + kv_term + out_term), n * core
    q = heads * model.attention_head_dim  # kv_channels x heads, flop_utils.py:951
    kv = model.kv_heads * model.attention_head_dim
    projections = h * (q + 2 * kv) + q * h  # flop_utils.py:1352-1359 (no output gate in our specs)
    full_core = q * seq_len  # q x (s/2) x 2: flop_utils.py:1395, 1407
    if version == "25.09" or model.sliding_window is None:
        return n * projections, n * full_core
    local = sum(_is_window_layer(model, i) for i in layer_indices)
    window_core = q * causal_window_context(model.sliding_window, seq_len) * 2  # flop_utils.py:1396
    return n * projections, (n - local) * full_core + local * window_core


def _is_window_layer(model: ModelSpec, index: int) -> bool:
    """Whether layer ``index`` counts as sliding-window attention. Chunked attention (Llama 4) does not: Bridge
    runs it as ``attention_chunk_size`` (models/llama/llama4_utils.py), which the count never reads, so it is full
    causal there. An MTP layer (index >= num_layers) is local only when every layer is (``window_attn_skip_freq``
    None, flop_utils.py:1379-1381); with a layer pattern Bridge's answer depends on whether the provider gives an
    int frequency (the pattern runs on over the MTP layers, 1382-1385) or a list (truncated to the decoder,
    1386-1389): the list reading is taken."""
    if model.chunked_attention:
        return False
    if index < model.num_layers:
        return model.is_local_attention_layer(index)
    return model.sliding_window is not None and model.sliding_window_layers is None


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggedFlops:
    """Megatron-Bridge's training FLOPs per token (forward + backward), by term."""

    mlp: float
    """Dense MLPs, routed and shared experts (MTP layers' included)."""
    attention_projections: float
    """Q/K/V (or MLA's low-rank) and output projections."""
    attention_core: float
    """QK^T and PV over the causal (or sliding-window) context."""
    mtp_heads: float
    """The MTP modules' norms and 2h -> h projections."""
    logits: float
    """The output layer over the padded vocabulary, once per MTP module more."""

    @property
    def total(self) -> float:
        return self.mlp + self.attention_projections + self.attention_core + self.mtp_heads + self.logits


def logged_flops(model: ModelSpec, seq_len: int, *, mtp_layers: int = 0, tp: int = 1,
                 version: FormulaVersion = "26.06", silu_glu: bool = True,
                 vocab_divisor: int | None = None) -> LoggedFlops:
    """:func:`logged_flops_per_token`, by term."""
    if version not in FORMULA_VERSIONS:
        raise ValueError(f"version must be one of {sorted(FORMULA_VERSIONS)}, got {version!r}")
    if seq_len < 1 or tp < 1 or mtp_layers < 0:
        raise ValueError(f"need seq_len >= 1, tp >= 1, mtp_layers >= 0; got {seq_len}, {tp}, {mtp_layers}")
    h = model.hidden_size
    projections = _glu_projections(model, version, silu_glu)

    # Dense and MoE MLPs by layer (flop_utils.py:1009-1032: the moe_layer_freq pattern), MTP layers of the last
    # decoder layer's kind (1034-1041).
    moe_layers = model.num_moe_layers
    dense_layers = model.num_layers - moe_layers
    if model.is_moe_layer(model.num_layers - 1):
        moe_layers += mtp_layers
    else:
        dense_layers += mtp_layers
    mlp_width = model.ffn_hidden_size * projections * dense_layers  # flop_utils.py:1549
    if model.moe is not None:
        moe = model.moe
        routed = moe.expert_ffn_hidden_size * moe.top_k * projections  # 1531-1532
        shared = moe.num_shared_experts * moe.shared_width * projections  # 1048-1052, 1553
        mlp_width += (routed + shared) * moe_layers

    attention_projections, attention_core = _attention_per_token(model, seq_len, version,
                                                                 range(model.num_layers + mtp_layers))
    vocab = padded_vocab_size(model.vocab_size, vocab_divisor or bridge_vocab_divisor(model.vocab_size), tp)
    return LoggedFlops(
        mlp=_TRAIN_GEMM * h * mlp_width,
        attention_projections=_TRAIN_GEMM * attention_projections,
        attention_core=_TRAIN_GEMM * attention_core,
        mtp_heads=_TRAIN_GEMM * mtp_layers * (3 * h + 2 * h * h),  # 1557-1566: eh norms + final norm, eh_proj
        logits=_TRAIN_GEMM * h * vocab * (mtp_layers + 1),  # 1568
    )


def logged_flops_per_token(model: ModelSpec, seq_len: int, *, mtp_layers: int = 0, tp: int = 1,
                           version: FormulaVersion = "26.06", silu_glu: bool = True,
                           vocab_divisor: int | None = None) -> float:
    """Training FLOPs (forward + backward) per token that Megatron-Bridge counts and logs for ``model`` trained on
    fixed-length sequences of ``seq_len`` tokens: its ``num_floating_point_operations`` (flop_utils.py:617 at
    067f987df03b) divided by batch x seq_len.

    ``mtp_layers``: multi-token-prediction modules trained (``ParallelPlan.mtp_layers``; Megatron's
    ``mtp_num_layers``, DeepSeek-V3's recipes 1). ``tp``: tensor parallelism, which pads the vocabulary.
    ``version``: which published formula (:data:`FORMULA_VERSIONS`). ``silu_glu``: whether a gated MLP's activation
    is SiLU (only the "25.09" formula reads it; GPT-OSS's quick-GELU GLU is not). ``vocab_divisor``: Bridge's
    ``make_vocab_size_divisible_by`` (None: :func:`bridge_vocab_divisor`, the Hugging Face bridges' rule)."""
    return logged_flops(model, seq_len, mtp_layers=mtp_layers, tp=tp, version=version, silu_glu=silu_glu,
                        vocab_divisor=vocab_divisor).total


def logged_tflops_per_gpu(model: ModelSpec, plan: ParallelPlan, tokens_per_s: float) -> float | None:
    """The TFLOP/s per GPU a Megatron-Bridge job of ``plan`` logs at ``tokens_per_s`` (the whole job's): the
    current formula (``"26.06"``) over the plan's sequence length, MTP modules and TP. None for engines that log
    another count (``Engine.logged_flops``), and
    for LoRA, which Bridge counts from its packed dataset's statistics (flop_utils.py:983-1007 at 067f987)."""
    if engine_for(plan).logged_flops != "megatron-bridge" or plan.peft:
        return None
    per_token = logged_flops_per_token(model, plan.seq_len, mtp_layers=plan.mtp_layers or 0, tp=plan.tp)
    return per_token * tokens_per_s / plan.world_size / 1e12
