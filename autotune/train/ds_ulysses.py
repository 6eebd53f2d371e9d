"""DeepSpeed-Ulysses for cp > 1: each rank holds seq_len / cp tokens of a sequence; attention runs on the
whole sequence for heads / cp heads after DeepSpeed's all-to-all (``deepspeed.sequence.layer.DistributedAttention``).

The sequence-parallel groups are DeepSpeed's own (``runtime/sequence_parallel/parallel_state_sp.py``,
consecutive ranks), passed to ``deepspeed.initialize`` as the mpu, so ZeRO shards and reduces over
dp x cp ranks (``seq_data_parallel_group``) and the config's batch check counts dp only (config.py:459-462).
RoPE positions are offset by the shard's start. Each rank's loss is its tokens' mean / cp: ZeRO sums the
gradients over the cp ranks of a sequence and averages over dp (stage_1_and_2.py:1506), so the update is
the whole sequence's mean.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autotune.workloads.transformer import bool_dropout, cap_logits, scale_embeddings

__all__ = ["ulysses_model"]


class _UlyssesCore:
    """Replaces Attention.core: q/k/v [b, heads, s/cp, d] -> DistributedAttention (batch-first) -> back. Between the
    all-to-alls each rank runs the layer's own core over the whole sequence for its heads / cp heads: its scale
    (Gemma's query_pre_attn_scalar), logit soft-capping (Gemma 2), causal mask and GQA, as on one process."""

    def __init__(self, core, group) -> None:
        from deepspeed.sequence.layer import DistributedAttention

        def local_attention(q, k, v, *args, **kwargs):  # [b, s, heads / cp, d], the whole sequence
            out = core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None)
            return out.transpose(1, 2)

        self.dist_attn = DistributedAttention(local_attention, group, scatter_idx=2, gather_idx=1)

    def __call__(self, q, k, v, mask):
        del mask  # the layer's core masks causally over the gathered sequence
        out = self.dist_attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0)
        return out.transpose(1, 2)


class UlyssesLM(nn.Module):
    """DecoderLM run on one sequence shard (the layers and weights are the DecoderLM's)."""

    def __init__(self, lm, cp: int, sp_rank) -> None:
        super().__init__()
        self.lm, self.cp, self.sp_rank = lm, cp, sp_rank

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        lm, spec = self.lm, self.lm.spec
        s = input_ids.shape[1]
        start = self.sp_rank() * s
        x = scale_embeddings(spec, lm.embed(input_ids))
        if lm.pos is not None:
            x = x + lm.pos.weight[start:start + s]
        if lm.embed_norm is not None:
            x = lm.embed_norm(x)
        x = bool_dropout(x, spec.dropout, self.training)
        cos = lm.rope_cos[start:start + s] if lm.rope_cos is not None else None
        sin = lm.rope_sin[start:start + s] if lm.rope_sin is not None else None
        for layer in lm.layers:
            if lm.recompute == "full":
                x = torch.utils.checkpoint.checkpoint(layer, x, cos, sin, None, use_reentrant=False)
            else:
                x = layer(x, cos, sin, None)
        x = lm.final_norm(x)
        weight = lm.embed.weight if lm.output is None else lm.output.weight
        logits = cap_logits(spec, F.linear(x, weight))
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))
        return loss / self.cp


def ulysses_model(spec, plan, dtype):
    """(model, mpu for deepspeed.initialize, shard(ids, labels) -> this rank's sequence slice)."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp as sp

    from autotune.workloads.transformer import build_model

    sp.initialize_sequence_parallel(plan.cp)
    group = sp.get_sequence_parallel_group()
    lm = build_model(spec, seq_len=plan.seq_len, recompute=plan.recompute, flash_attention=True, dtype=dtype)
    for block in lm.layers:
        # batch-first [b, s, h, d]: scatter the heads (2), gather the sequence (1)
        block.attn.core = _UlyssesCore(block.attn.core, group)
    local = plan.seq_len // plan.cp

    def shard(ids, labels):
        r = sp.get_sequence_parallel_rank()
        return ids[:, r * local:(r + 1) * local].contiguous(), labels[:, r * local:(r + 1) * local].contiguous()

    return UlyssesLM(lm, plan.cp, sp.get_sequence_parallel_rank), sp, shard
