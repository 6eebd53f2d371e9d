"""torchtitan's op-level selective activation checkpointing, per dense block: the block's linears and ``aten.mm``
calls in module order (which the policy's every-second rule counts) and the bytes one layer keeps. The stage ledger
that adds them up is :mod:`autotune.cost.activations` (which re-exports these names)."""

from __future__ import annotations

from autotune.engines.facts import MEGATRON_FACTS, ActivationFacts
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["block_linears", "block_mms", "op_sac_layer_bytes"]


def block_linears(model: ModelSpec) -> list[tuple[str, int, int, bool]]:
    """A dense block's linears in module order, as torchtitan's Llama runs them: (tp kind, input width, output
    width, has a bias) of wq, wk, wv, wo, then w1, w3, w2 (SwiGLU: two nn.Linear, torchtitan v0.2.2
    models/llama3/model/model.py lines 338-343) or fc1, fc2."""
    h, f = model.hidden_size, model.ffn_hidden_size
    qkv_bias, bias = model.linear_bias or model.qkv_bias, model.linear_bias
    o_bias = bias or model.attention_output_bias
    attention = [("col", h, model.q_width, qkv_bias), ("col", h, model.kv_width, qkv_bias),
                 ("col", h, model.v_width, qkv_bias), ("row", model.attention_output_width, h, o_bias)]
    mlp = [("col", h, f, bias), ("col", h, f, bias), ("row", f, h, bias)] if model.gated_mlp else \
        [("col", h, f, bias), ("row", f, h, bias)]
    return attention + mlp


def block_mms(model: ModelSpec) -> list[tuple[str, int, int]]:
    """A dense block's ``aten.mm`` calls in module order, as torchtitan's op-level SAC counts them: the bias-free
    linears of :func:`block_linears` (a 3-D ``F.linear`` with a bias runs ``aten.addmm``, seen in torch 2.13's
    dispatch, tests/cost/test_op_sac.py: not in the save list, not counted, rerun). The policy saves the 1st, 3rd,
    5th... mm outputs (``[0::2]``) and reruns the others (``[1::2]``)."""
    return [(kind, k, n) for kind, k, n, biased in block_linears(model) if not biased]


def op_sac_layer_bytes(model: ModelSpec, plan: ParallelPlan, facts: ActivationFacts = MEGATRON_FACTS) -> float:
    """Bytes one dense layer keeps under torchtitan's op-level selective activation checkpointing.

    torchtitan ``_apply_ac_to_transformer_block`` (parallelize_llama.py, v0.1-v0.2): the block runs under
    ``create_selective_checkpoint_contexts`` with a policy that saves the outputs of the ops in ``_save_list``
    (``aten.mm``, the SDPA flash / efficient kernels, ``reduce_scatter_tensor``, ``abs``, ``max``) except every
    second ``mm`` (a per-block counter), and recomputes every other op. Kept: the block input (the checkpoint's
    argument), the 1st, 3rd, 5th... mm outputs in module order (wq, wk, wv, wo, w1, w3, w2: wq, wv, w1, w2; only
    bias-free linears run ``aten.mm``: :func:`block_mms`),
    the attention output and its fp32 log-sum-exp, and with SP the row-parallel reduce-scatter outputs. A
    row-parallel mm's local output is the full-width partial sum. Under Float8 the linears run
    ``aten._scaled_mm`` (not in the list, recomputed) and the ``abs`` of each cast input is saved instead, one
    per distinct input (the block is compiled in every Float8 run: torch.compile's CSE shares wq/wk/wv's and
    w1/w3's), in bf16. MoE layers are not covered (they keep the attention-core policy).
    """
    sb = plan.seq_len / plan.cp * plan.micro_batch_size
    h, t = model.hidden_size, plan.tp
    t_seq = t if plan.sequence_parallel else 1
    f = model.ffn_hidden_size
    out = 2 * sb * h / t_seq  # the checkpointed block input
    out += 2 * sb * model.attention_output_width / t + 4 * sb * model.num_attention_heads / t  # SDPA out, LSE
    if plan.precision == "fp8" and facts.selective == "op-sac-0.3":
        # torchtitan 0.3.0 (PyPI wheel) distributed/activation_checkpoint.py: _get_default_save_ops (line 31) adds
        # torch's get_default_op_list().compute_intensive_ops (lines 87-90), which hold aten._scaled_mm
        # (torch/_functorch/partitioners.py get_default_op_list), and aten.max; SelectiveAC's every-second rule
        # (line 271) covers mm_ops = (aten.mm, aten.linear) only (line 241), so every Float8 GEMM's bf16 output is
        # kept. 0.2.2's _op_sac_save_list (models/llama3/infra/parallelize.py lines 36-51) had no _scaled_mm: rerun.
        # The amax outputs are one number per tensor or row: left out.
        out += sum(2 * sb * (width / t if kind == "col" else width) for kind, _, width, _ in block_linears(model))
    elif plan.precision == "fp8":
        t_in = t_seq  # torchao Float8ColwiseParallel casts (and takes abs of) the SP shard before the gather
        out += 2 * sb * (h / t_in + model.attention_output_width / t + h / t_in + f / t)
    else:
        for kind, _, width in block_mms(model)[0::2]:
            out += 2 * sb * (width / t if kind == "col" else width)
    if plan.sequence_parallel and t > 1:
        out += 2 * (2 * sb * h / t)  # reduce_scatter_tensor outputs of wo and w2
    return out
