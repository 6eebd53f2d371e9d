"""One transformer layer's forward time on one GPU, by part, and its TP / CP / MoE traffic.

``autotune.cost.step_time`` composes these into a step; :func:`layer_fwd_bwd_s` gives one layer's forward and
backward seconds on their own (Korthikanti et al. 2022, Table 4, times exactly that).

Compute is GEMM FLOPs at the GPU's measured, shape-dependent rate (``autotune.cost.kernels``), fused attention at
its kernel's rate, memory-bound kernels (and FP8 casts) at HBM speed (bytes counted below).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

from autotune.cost import comm, moe_time
from autotune.cost.activations import block_linears, block_mms
from autotune.cost.cp_ring import RingTime, ring_time
from autotune.cost.efficiency import Efficiency
from autotune.cost.attention_head_dim import head_dim_factor
from autotune.cost.attention_seq import kernel_key_length, key_length_factor
from autotune.cost.attention_tiles import executed_attention_share, fp8_backward_share
from autotune.cost import fp8_attention
from autotune.cost.lora import adapter_forward_s
from autotune.cost.kernels import Rates
from autotune.cost.rope_kernels import rope_bytes, rotary_share
from autotune.cost.tp_pairing import async_tp_reduce_bytes, op_sac_gathers, tp_pair_exposed_s
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["EAGER_BYTES", "ELEMENTWISE_KERNELS", "LayerTime", "elementwise_kernels", "attention_bwd_factor",
           "attention_bwd_s", "layer_time", "time_key"]

@dataclass(frozen=True, slots=True)
class LayerTime:
    """Forward seconds of one layer for one micro-batch on one GPU, by part, and its TP/CP/MoE traffic."""

    gemm_s: float
    attention_s: float
    elementwise_s: float
    elementwise_bwd_s: float
    """The memory-bound kernels' backward (their gradients: more bytes than the forward for norms and
    activations, fewer for dropout and residual adds)."""
    scores_s: float
    """The part of ``elementwise_s`` over the s x s attention scores (unfused attention's softmax and dropout; 0
    with a flash kernel): selective recompute runs it again with the core's GEMMs."""
    op_sac_recompute_s: float
    """What torchtitan's op-level selective checkpointing reruns in backward: the mm outputs its policy does not
    save, and every memory-bound kernel (``layer_time`` says which; ``activations.op_sac_layer_bytes`` what it
    keeps)."""
    tp_comm_s: float
    cp_comm_s: float
    """All of one forward's and the backward's context-parallel communication (``ring`` says what hides)."""
    moe_comm_s: float
    module_recompute_s: tuple[tuple[str, float], ...] = ()
    """(module, seconds) of what each of Megatron's selective recompute modules reruns (``recompute_modules``)."""
    experts_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """The routed experts of an MoE layer: (fc1 + fc2 GEMMs, activation forward, activation backward) seconds, what
    Megatron's EP overlap schedule runs as the layer's "mlp" node (``autotune.cost.ep_overlap``)."""
    ring: RingTime = RingTime()
    """Context parallelism as the engine runs it (``autotune.cost.cp_ring``)."""
    attention_exp_delta_s: float = 0.0
    """The part of ``attention_s`` that is the softmax exponentials' time beyond (negative: short of) the GPU's
    ``attention_fraction`` reference (``Rates.exp_delta_s``): the backward recomputes each exponential once, so
    it counts once there, not ``attention_bwd_factor`` times."""
    op_sac_tp_s: tuple[float, float] = (0.0, 0.0)
    """torchtitan's op-level SAC with sequence parallelism: the two input all-gathers its backward reruns (all of
    them, and what async TP's pairing leaves exposed: ``op_sac_gathers``)."""
    tp_unpaired_s: tuple[float, float] | None = None
    """Under async TP, one pass's (collectives the GEMM each is fused with cannot cover: ``tp_pair_exposed_s``,
    the reductions of its two fused reduce-scatters: ``async_tp_reduce_bytes``); None where the layer's
    collectives do not pair one to one with its GEMMs (MoE layers)."""
    adapter_s: float = 0.0
    """LoRA: the forward of the layer's adapters (``autotune.cost.lora.adapter_forward_s``); 0 without."""
    frozen: bool = False
    """LoRA: the base weights are frozen, so the backward runs no weight-gradient GEMM (``autotune.cost.lora``)."""
    attention_bwd_scale: float = 1.0
    """FP8 attention: its backward over what ``attention_bwd_s`` makes of its forward
    (``autotune.cost.fp8_attention``)."""


EAGER_BYTES: dict[str, tuple[int, int]] = {
    # (forward, backward) HBM bytes per element of the composite ops as PyTorch modules run them op by op
    # (torchtitan d4c86e3 models/norms.py RMSNorm, models/llama/model.py FeedForward and apply_rotary_emb;
    # transformers' LlamaRMSNorm / LlamaMLP / apply_rotary_pos_emb are the same chains), 16-bit activations:
    # RMSNorm: x.float() 2+4, pow 4+4, mean 4, x * rsqrt 4+4, type_as 4+2, * weight 2+2 = 36; autograd back
    #   through them (weight product and its reduction 10, to-float 6, the rsqrt product and its reduction 20,
    #   mean's expand 4, pow 12, the two gradient paths summed 12, to-bf16 6) = 70.
    # SwiGLU: silu 2+2, * up 2+2+2 = 10; backward: both products' gradients 6+6, silu's 6 = 18.
    # RoPE (complex): x.float() 2+4, complex product 4+4, type_as 4+2 = 20; backward the same chain = 20.
    # One kernel per op (Megatron / Transformer Engine fused kernels, or torch.compile): 4 / 6, 6 / 10, 4 / 4.
    "rmsnorm": (36, 70), "swiglu": (10, 18), "rope": (20, 20),
}
ELEMENTWISE_KERNELS = ("fused", "eager")

UNALIGNED_HEAD_DIM = 8
"""Unfused attention (Megatron-LM ca7a2e34fe megatron/model/transformer.py, the code the Megatron-DeepSpeed
forks of 2021-22 carry): the fused QKV output is viewed as [sq, b, np, 3 * hn] and split along the last dim (lines
296-302), and the scores / context are ``torch.baddbmm`` / ``torch.bmm`` over those views (lines 374-377, 419):
per head a matrix that starts 3 * hn elements after the previous one. With hn not a multiple of 8 (16 bytes of
16-bit elements) these starts are not 16-byte aligned and the batched GEMMs leave the tensor cores
(``Rates.unaligned_s``). BigScience measured it (bigscience-workshop/bigscience 9e64ede,
train/tr11-176B-ml/chronicles-prequel.md, "NHEADs comparison", 02-23): NHIDDEN 13824 on 128 heads (hn 108) took
162.72 s per iteration against 121.28 s on 64 heads (hn 216), nothing else changed."""


def elementwise_kernels(engine_kernels: str, torch_compile: bool) -> str:
    """How a plan's memory-bound kernels run: "compiled" (fused by torch.compile, even what the engine leaves
    unfused: ``autotune.cost.rope_kernels``), else as the engine runs them ("fused" or "eager")."""
    if engine_kernels not in ELEMENTWISE_KERNELS:
        raise ValueError(f"CommSchedule.elementwise_kernels must be one of {ELEMENTWISE_KERNELS}, got "
                         f"{engine_kernels!r}")
    return "compiled" if torch_compile else engine_kernels


def attention_projections(model: ModelSpec, t: int) -> list[tuple[str, int, int, int]]:
    """The attention block's linear layers as (kind, in width, out width, tp split): "col" (column-parallel, the
    output split), "row" (row-parallel, the input split) or "dup" (duplicated on every TP rank, split 1).
    MLA (DeepSeek-V2/V3) projects through its low-rank latents, as flops.layer_flops_per_token counts: the Q and
    KV down-projections are duplicated over TP (megatron/core/transformer/multi_latent_attention.py: TELinear
    ``parallel_mode='duplicated'``), the up-projections column-parallel, the output row-parallel."""
    h = model.hidden_size
    if model.mla is None:
        return [("col", h, model.q_width + 2 * model.kv_width, t), ("row", model.attention_output_width, h, t)]
    m, a = model.mla, model.num_attention_heads
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    q = ([("dup", h, m.q_lora_rank, 1), ("col", m.q_lora_rank, a * qk, t)] if m.q_lora_rank
         else [("col", h, a * qk, t)])
    return q + [("dup", h, m.kv_lora_rank + m.qk_rope_head_dim, 1),
                ("col", m.kv_lora_rank, a * (m.qk_nope_head_dim + m.v_head_dim), t),
                ("row", a * m.v_head_dim, h, t)]


@functools.lru_cache(maxsize=8192)
def layer_time(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, moe_layer: bool,
                eff: Efficiency, r: Rates, kernels: str = "fused", cp_kind: str = "p2p",
                cp_repeat_kv: bool = False, expert_pad_rows: float = 0.0, fused_experts: bool = False) -> LayerTime:
    """One layer's forward parts; ``kernels``: "fused" (one kernel per op: Megatron / TE), "compiled"
    (torch.compile) or "eager" (PyTorch modules op by op: torchtitan and transformers without compile,
    ``EAGER_BYTES``); ``cp_kind``
    and ``cp_repeat_kv``: how the engine runs context parallelism (``autotune.cost.cp_ring``);
    ``expert_pad_rows``: zero rows each local expert's GEMMs run beyond its routed ones
    (``autotune.cost.expert_padding``); ``fused_experts``: the routed experts run TE's fused grouped MLP
    (``autotune.cost.fused_grouped_mlp``)."""
    h, t, s = model.hidden_size, plan.tp, plan.seq_len
    tokens = s * plan.micro_batch_size / plan.cp
    hbm = r.hbm
    t_seq = t if plan.sequence_parallel else 1
    n_in = 2 if model.gated_mlp else 1

    def _gemm_s(flops, m, k, n, peak, eff_):  # linear layers at the plan's precision, the router in 16-bit
        del eff_
        return r.linear_s(flops, m, k, n) if peak == "linear" else r.bf16_s(flops, m, k, n)

    gemm_peak, bf16_peak = "linear", "bf16"
    qkv = model.q_width + 2 * model.kv_width
    projections = attention_projections(model, t)
    gemm = sum(_gemm_s(2 * tokens * k * n / split, tokens, k / split if kind == "row" else k,
                       n / split if kind != "row" else n, gemm_peak, eff) for kind, k, n, split in projections)
    # FP8: every linear GEMM casts its inputs (forward: activations; the weights once per micro-batch) and, in
    # backward, its output gradients; widths summed over the layer's linear layers, per token.
    cast_width = sum(k + n for _, k, n, _ in projections)
    # MLA's up-projections (the "col" ones that do not read the hidden state): what mla_up_proj recompute reruns.
    up_gemm = sum(_gemm_s(2 * tokens * k * n / split, tokens, k, n / split, gemm_peak, eff)
                  for kind, k, n, split in projections if kind == "col" and k != h) if model.mla else 0.0
    router = shared = 0.0
    if moe_layer:
        moe = model.moe
        assert moe is not None
        f = moe.expert_ffn_hidden_size
        m_expert = tokens * moe.top_k * plan.ep / moe.num_experts
        pairs = tokens * moe.top_k
        # every EP rank waits for the busiest one's tokens (autotune.cost.moe_time: random balanced routing)
        busiest = moe_time.busiest_rank_factor(tokens, plan.ep, moe.num_experts, moe.top_k)
        busiest = moe_time.routed_share(plan, busiest)  # token dropping caps it, padding fixes it
        # the grouped GEMMs run each expert's padded rows (autotune.cost.expert_padding)
        padded = 1.0 + expert_pad_rows / m_expert if m_expert > 0 else 1.0
        m_rows = m_expert * padded
        # one grouped GEMM each over the local experts (Rates.grouped_s: its own curve over the rows per expert)
        fc1 = busiest * r.grouped_s(2 * pairs * padded * h * n_in * f / t, m_rows, h, n_in * f / t)
        fc2 = busiest * r.grouped_s(2 * pairs * padded * f * h / t, m_rows, f / t, h)
        gates = moe.num_experts + moe.shared_expert_gate  # Qwen2-MoE's hidden -> 1 shared gate (flops._router_flops)
        router = _gemm_s(2 * tokens * h * gates, tokens, h, gates, bf16_peak, eff)
        gemm = gemm + fc1 + fc2 + router  # in this order (the search's golden step times)
        for _ in range(moe.num_shared_experts):
            fs = moe.shared_width
            one = _gemm_s(2 * tokens * h * (n_in + 1) * fs / t, tokens, h, fs / t, gemm_peak, eff)
            gemm += one
            shared += one
        mlp = fc1 + fc2
        routed_width, shared_width = moe.top_k * f, moe.num_shared_experts * moe.shared_width
        # the padded rows are quantized too, and a capacity's rows (moe_time.routed_share: 1 dropless)
        cast_width += moe.top_k * (h + f + n_in * f + h) * padded * moe_time.routed_share(plan)
    else:
        f = model.ffn_hidden_size
        fc1 = _gemm_s(2 * tokens * h * n_in * f / t, tokens, h, n_in * f / t, gemm_peak, eff)
        fc2 = _gemm_s(2 * tokens * f * h / t, tokens, f / t, h, gemm_peak, eff)
        gemm = gemm + fc1 + fc2
        mlp = fc1 + fc2
        routed_width, shared_width = f, 0
        cast_width += h + f + n_in * f + h
    ffn_width = routed_width + shared_width

    # Attention core: the full-square FLOPs, of which a causal flash kernel executes half, at the fused kernel's
    # rate for the head width (autotune.cost.attention_head_dim) and for the key length of each kernel call
    # (autotune.cost.attention_seq: context parallelism's ring steps are shorter calls); unfused attention runs
    # batched GEMMs of head_dim depth.
    head_dim = model.q_width / model.num_attention_heads
    core_flops = 2 * tokens * s * (model.q_width + model.attention_output_width) / t
    exp_delta, bwd_scale = 0.0, 1.0
    if plan.flash_attention:  # sliding-window / chunked layers run only the tiles their band touches
        executed = executed_attention_share(model, s)
        key_len = kernel_key_length(s, plan.cp, cp_kind, t, cluster.gpus_per_node, executed)
        kernel_rate = r.attention * head_dim_factor(r.attention_kernel, head_dim)
        attention = core_flops / 2 * executed / (kernel_rate * key_length_factor(r.attention_kernel, key_len))
        # one exponential per executed (query, key) pair and head: the executed FLOPs over 2 (q + v) head widths
        exp_delta = tokens * s * model.num_attention_heads * executed / 2 / t * r.exp_delta_s
        attention += exp_delta
        if plan.fp8_attention:  # cuDNN's FP8 kernels, NVIDIA's timings (autotune.cost.fp8_attention)
            fwd_x, bwd_x = fp8_attention.speedup(plan.fp8_recipe, head_dim)
            attention, exp_delta = attention / fwd_x, exp_delta / fwd_x
            bwd_scale = fp8_attention.backward_scale(fwd_x, bwd_x, executed, fp8_backward_share(model, s))
    elif head_dim % UNALIGNED_HEAD_DIM:
        attention = r.unaligned_s(core_flops, s / plan.cp, head_dim, s)
    else:
        attention = _gemm_s(core_flops, s / plan.cp, head_dim, s, bf16_peak, eff)

    # Elementwise bytes per token, forward and backward, kernel by kernel (16-bit tensors, 1-byte dropout masks):
    # * norm: forward reads x, writes y (4 B per element); backward reads x and dy, writes dx (6 B).
    # * bias-dropout-residual add, twice: forward reads x and the residual, writes the sum (6 B) and the mask (1 B);
    #   backward reads dy and the mask, writes dx (5 B; the residual's gradient is dy itself); no dropout: the
    #   add's backward is the identity. With biases, each bias gradient is a reduction over the tokens that reads
    #   its output's gradient (2 B per element): the two row-parallel biases on the residual stream, the QKV and
    #   fc1 biases on the tp-split widths.
    # * activation: GeLU reads fc1's output, writes fc2's input (4 B per ffn element), backward reads input and
    #   dy, writes dx (6 B); SwiGLU reads gate and up, writes their product (6 B), backward reads gate, up and dy,
    #   writes both gradients (10 B).
    # * RoPE on q and k: reads and writes each (4 B), the same backward; Megatron's unfused YaRN chain more
    #   (autotune.cost.rope_kernels).
    # * unfused attention over the s x s scores: scaled-masked softmax 4 B forward, 6 B backward; its dropout
    #   5 B forward (read, write, mask), 5 B backward (read dy and the mask, write dx).
    # ``kernels="eager"``: the composite ops run op by op (EAGER_BYTES); "fused" as above.
    eager = kernels == "eager"
    dropout = model.dropout > 0
    bias_grad = 2 * h if model.linear_bias else 0
    norm_fwd, norm_bwd = EAGER_BYTES["rmsnorm"] if eager and model.norm == "rmsnorm" else (4, 6)
    swiglu_fwd, swiglu_bwd = EAGER_BYTES["swiglu"] if eager else (6, 10)
    rope_fwd, rope_bwd = EAGER_BYTES["rope"] if eager else rope_bytes(model, kernels)
    res_fwd = model.norms_per_layer * norm_fwd * h + 2 * (6 * h + (h if dropout else 0))
    res_bwd = model.norms_per_layer * norm_bwd * h + 2 * ((5 * h if dropout else 0) + bias_grad)
    wide_fwd = ffn_width * (swiglu_fwd if n_in == 2 else 4)
    # the routed fc1 biases' gradients come out of the fused grouped MLP's dgrad epilogue (fused_grouped_mlp)
    biased_fc1 = ffn_width - (routed_width if moe_layer and fused_experts else 0)
    wide_bias_grads = 2 * (qkv + n_in * biased_fc1) if model.linear_bias else 0
    wide_bwd = ffn_width * (swiglu_bwd if n_in == 2 else 6) + wide_bias_grads
    rotary = rotary_share(model, moe_layer) * (model.q_width + model.kv_width)  # NoPE layers rotate nothing
    wide_fwd += rope_fwd * rotary
    wide_bwd += rope_bwd * rotary
    scores_fwd = 0.0
    if not plan.flash_attention:
        scores = model.num_attention_heads * s
        scores_fwd = (9 if dropout else 4) * scores
        wide_fwd += scores_fwd
        wide_bwd += (11 if dropout else 6) * scores
    scores_s = tokens * scores_fwd / t / hbm
    elementwise = tokens * (res_fwd / t_seq + wide_fwd / t) / hbm
    # torchtitan op-level SAC (models/llama3/infra/parallelize.py _custom_policy, as activations.op_sac_layer_bytes
    # keeps): the outputs of aten.mm are saved except every second one (activations.block_mms[1::2] rerun: wk, wo
    # and w3, or fc2; linears with a bias run aten.addmm and all rerun), SDPA's are saved, every other op
    # reruns (norms, activation, RoPE, adds); under Float8 the linears run aten._scaled_mm, not in the save list, so
    # all of them rerun with their casts. Dense blocks only.
    if plan.precision == "fp8":
        rerun_gemms = gemm
    else:
        rerun = block_mms(model)[1::2] + [(kind, k, n) for kind, k, n, biased in block_linears(model) if biased]
        rerun_gemms = sum(_gemm_s(2 * tokens * k * n / t, tokens, k, n / t, gemm_peak, eff) if kind == "col" else
                          _gemm_s(2 * tokens * k * n / t, tokens, k / t, n, gemm_peak, eff) for kind, k, n in rerun)
    elementwise_bwd = tokens * (res_bwd / t_seq + wide_bwd / t) / hbm
    dispatch_s = extra_act = extra_fwd = extra_bwd = 0.0
    if moe_layer:  # experts' weighted fc2 bias and clamped GLU on the busiest rank's rows (moe_time docstring)
        extra_fwd, extra_bwd, extra_act = (busiest * tokens * b / t / hbm
                                           for b in moe_time.expert_extra_bytes(model, fused_experts))
        elementwise += extra_fwd
        elementwise_bwd += extra_bwd
    if moe_layer:  # the dispatcher's permutations and the router's kernels (autotune.cost.moe_time)
        permutes, sorts = moe_time.dispatch_elements(model, plan)
        router_fwd, router_bwd = moe_time.router_bytes(model)
        dispatch_s = tokens * (2 * permutes / t_seq + 2 * sorts * busiest) / hbm
        elementwise += dispatch_s + tokens * router_fwd / t_seq / hbm
        elementwise_bwd += dispatch_s + tokens * router_bwd / t_seq / hbm
        dispatch_s += tokens * router_fwd / t_seq / hbm
    if r.cast_bytes:  # half the casts in forward (activations, weights), half in backward (output gradients)
        casts = tokens * cast_width / t * r.cast_bytes / 2 / hbm
        elementwise += casts
        elementwise_bwd += casts
    op_sac = rerun_gemms + elementwise - scores_s
    # Megatron's selective recompute modules (activations.recompute_module_bytes says what each drops): the forward
    # kernels each reruns in backward. The MoE block's all-to-alls rerun too (layer_passes adds them).
    act = tokens * (swiglu_fwd if n_in == 2 else 4) / t / hbm  # per ffn element
    rope = tokens * rope_fwd * rotary / t / hbm
    modules = {"core_attn": attention + scores_s,
               "layernorm": tokens * norm_fwd * h / t_seq / hbm * ((model.mla is not None) + moe_layer)}
    if model.mla is not None:
        modules["mla_up_proj"] = up_gemm + rope
    if moe_layer:
        modules.update(moe=mlp + router + shared + act * ffn_width + dispatch_s + extra_fwd,
                       moe_act=act * routed_width + extra_act,
                       shared_experts=shared + act * shared_width)
    else:
        modules["mlp"] = mlp + act * routed_width

    # Tensor-parallel collectives: two per layer forward (all-reduce, or all-gather + reduce-scatter with SP).
    tp_link = comm.group_link(cluster, eff, t, 1)  # per ring step latency: the GPU's kernel facts
    tp_comm = 2 * comm.all_reduce_s(tokens * h * 2, t, tp_link)
    unpaired = None
    if not moe_layer and t > 1:
        col = sum(_gemm_s(2 * tokens * k * n / split, tokens, k, n / split, gemm_peak, eff)
                  for kind, k, n, split in projections if kind != "row")
        row = gemm - col - fc1 - fc2  # the attention output projection(s)
        unpaired = (tp_pair_exposed_s(tp_comm / 4, (col, row, fc1, fc2)),
                    2 * async_tp_reduce_bytes(tokens, h, t) / hbm)
    sac_tp = op_sac_gathers(model, plan, tp_comm / 4, _gemm_s, gemm_peak, eff) if not moe_layer else (0.0, 0.0)
    # Context parallelism: the engine's KV exchange per attention step, what hides, the merges (cost/cp_ring.py).
    ring = ring_time(model, cluster, plan, eff, hbm, attention, attention_bwd_s(attention, exp_delta, plan, bwd_scale),
                     cp_kind,
                     cp_repeat_kv)
    moe_comm = 0.0
    if moe_layer and plan.ep > 1:  # the dispatcher's all-to-alls / all-gathers (autotune.cost.moe_time)
        moe_comm = busiest * moe_time.dispatcher_comm_s(model, cluster, plan, eff, tokens)
    routed_act = act * routed_width * (busiest if moe_layer else 1.0)
    experts = ((mlp, routed_act + extra_fwd, routed_act * (swiglu_bwd / swiglu_fwd if n_in == 2 else 6 / 4) + extra_bwd)
               if moe_layer else (0.0, 0.0, 0.0))
    adapter = adapter_forward_s(model, plan, r.bf16_s, hbm) if plan.peft else 0.0
    return LayerTime(gemm, attention, elementwise, elementwise_bwd, scores_s, op_sac, tp_comm, ring.comm_s, moe_comm,
                     tuple(modules.items()), experts, ring, exp_delta, sac_tp, unpaired, adapter, plan.peft is not None,
                     bwd_scale)


_TIME_KEY_FIELDS = operator.attrgetter("seq_len", "cp", "micro_batch_size", "tp", "ep", "etp", "sequence_parallel",
                                       "precision", "flash_attention", "moe_dispatcher", "peft", "lora_rank",
                                       "lora_targets", "moe_capacity_factor", "moe_pad_to_capacity", "fp8_recipe",
                                       "fp8_attention")
_time_key_cache: dict[tuple, ParallelPlan] = {}


def time_key(plan: ParallelPlan) -> ParallelPlan:
    """The plan reduced to the fields one layer's time depends on (a cache key). One plan per distinct set of these
    fields (cached: building and validating a plan cost a third of a step-time cache miss); a frozen plan, built
    from these fields alone, so the same whichever plan asked first."""
    fields = _TIME_KEY_FIELDS(plan)
    key = _time_key_cache.get(fields)
    if key is None:
        if len(_time_key_cache) > 4096:
            _time_key_cache.clear()
        (seq_len, cp, micro_batch_size, tp, ep, etp, sequence_parallel, precision, flash_attention, moe_dispatcher,
         peft, lora_rank, lora_targets, capacity_factor, pad_to_capacity, fp8_recipe, fp8_attn) = fields
        key = _time_key_cache[fields] = ParallelPlan(
            seq_len=seq_len, cp=cp, micro_batch_size=micro_batch_size, tp=tp, ep=ep, etp=etp,
            sequence_parallel=sequence_parallel, precision=precision, flash_attention=flash_attention,
            moe_dispatcher=moe_dispatcher, peft=peft, lora_rank=lora_rank, lora_targets=lora_targets,
            moe_capacity_factor=capacity_factor, moe_pad_to_capacity=pad_to_capacity, fp8_recipe=fp8_recipe,
            fp8_attention=fp8_attn)
    return key




def attention_bwd_s(attention_s: float, exp_delta_s: float, plan: ParallelPlan, scale: float = 1.0) -> float:
    """Backward seconds of the attention core whose forward takes ``attention_s``, ``exp_delta_s`` of them the
    exponentials' difference (``LayerTime.attention_exp_delta_s``): the flash backward recomputes the
    probabilities once (one exponential per pair, as the forward) around its GEMMs; ``scale``: FP8 attention's
    (``LayerTime.attention_bwd_scale``)."""
    return scale * (attention_bwd_factor(plan) * (attention_s - exp_delta_s) + exp_delta_s)


def attention_bwd_factor(plan: ParallelPlan) -> float:
    """Backward over forward time of the attention core: the flash backward recomputes the scores (5 GEMMs
    against the forward's 2, FlashAttention-2 paper Sec. 3.1.2); unfused attention runs 4 batched GEMMs for 2."""
    return 2.5 if plan.flash_attention else 2.0
