"""The FSDP trainer's model: the project's transformer cut into stage modules, then TP, AC and FSDP2 applied.

Order as torchtitan applies it (torchtitan v0.2 ``models/llama3/infra/parallelize.py``): DTensor tensor
parallelism first, then activation checkpointing, then ``fully_shard`` per block and on the root, so each
block's all-gather / reduce-scatter is its own.

- :class:`StageModule` holds a contiguous run of the blocks of a
  :class:`~autotune.workloads.transformer.DecoderLM` (plus the embedding on the first stage and the final
  norm and output on the last), so the same module serves one pipeline stage or the whole model. Its
  ``forward`` returns hidden states, or logits on the last stage; the loss is taken outside
  (:func:`lm_loss`) as ``torch.distributed.pipelining`` needs. With ``skip_head`` the last stage returns the
  final norm's output and :func:`chunked_lm_loss` runs the output layer and the loss chunk by chunk (the plan's
  ``loss_chunks``, torchtitan 0.3's ``ChunkedLossWrapper``).
- :func:`apply_tp`: ``parallelize_module`` with ColwiseParallel for q/k/v and fc1, RowwiseParallel for o and fc2,
  the vocabulary-sharded embedding (RowwiseParallel) and output (ColwiseParallel, logits gathered); the
  per-rank head counts are divided by tp. SwiGLU's fused [gate | up] fc1 is re-ordered so each TP rank's
  row block is its own [gate_r | up_r] (otherwise rank 0 would get all gates and rank 1 all ups).
- :func:`apply_fsdp`: ``fully_shard`` with ``reshard_after_forward`` = (zero_stage == 3),
  ``MixedPrecisionPolicy(param_dtype=bf16|fp16, reduce_dtype=fp32)`` and ``CPUOffloadPolicy`` when the plan
  offloads. zero_stage 0 is FSDP2 on a (dp, 1) replicate x shard mesh: every replica holds whole states and
  gradients are all-reduced, as DDP does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autotune.workloads.transformer import DecoderLM, bool_dropout, cap_logits, scale_embeddings, soft_cap

__all__ = ["StageModule", "lm_loss", "chunked_lm_loss", "apply_tp", "apply_ac", "apply_fsdp", "op_sac_save_ops",
           "op_sac_context_fn"]


class StageModule(nn.Module):
    """Blocks ``first .. first+count-1`` of ``full`` (and the embedding / head where this stage has them)."""

    def __init__(self, full: DecoderLM, first: int, count: int, *, has_embedding: bool, has_head: bool) -> None:
        super().__init__()
        self.spec, self.has_embedding, self.has_head = full.spec, has_embedding, has_head
        self.embed = full.embed if has_embedding or (has_head and full.output is None) else None
        self.pos = full.pos if has_embedding else None
        self.embed_norm = full.embed_norm if has_embedding else None
        # ModuleDict keyed by the global layer index: checkpoints name a block the same way on every stage.
        self.layers = nn.ModuleDict({str(i): full.layers[i] for i in range(first, first + count)})
        self.final_norm = full.final_norm if has_head else None
        self.output = full.output if has_head else None
        self.skip_head = False  # True: the last stage returns the final norm's output (chunked_lm_loss runs the head)
        for name in ("rope_cos", "rope_sin", "causal_mask"):
            t = getattr(full, name)
            if t is None:
                setattr(self, name, None)
            else:
                self.register_buffer(name, t, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.has_embedding:
            s = x.shape[1]
            x = scale_embeddings(self.spec, self.embed(x))
            if self.pos is not None:
                x = x + self.pos.weight[:s]
            if self.embed_norm is not None:
                x = self.embed_norm(x)
            x = bool_dropout(x, self.spec.dropout, self.training)
        for layer in self.layers.values():
            x = layer(x, self.rope_cos, self.rope_sin, self.causal_mask)
        if not self.has_head:
            return x
        x = self.final_norm(x)
        if self.skip_head:
            from torch.distributed.tensor import DTensor

            # torchtitan 0.3 feeds the chunks replicated over tp (ChunkedLossWrapper, components/loss.py): under
            # sequence parallelism the final norm's Shard(1) output is gathered first
            return x.full_tensor() if isinstance(x, DTensor) else x
        if self.output is None:  # tied embeddings: the embedding's weight (gathered by the root's FSDP group)
            return cap_logits(self.spec, F.linear(x, self.embed.weight))
        return cap_logits(self.spec, self.output(x))


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over fp32 logits (as DecoderLM.forward computes it)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


class _HiddenGrad(torch.autograd.Function):
    """The loss value, with the hidden states' gradient the chunks accumulated as its backward (torchtitan 0.3's
    ``_DecoderOutputGradientBackProp``, components/loss.py): the trunk's backward runs once, from the loss."""

    @staticmethod
    def forward(ctx, hidden, grad, loss):
        ctx.save_for_backward(grad)
        return loss.detach()

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return (grad * grad_output).to(grad.dtype), None, None


def chunked_lm_loss(head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor, chunks: int, *,
                    scale: float = 1.0, cap: float | None = None) -> torch.Tensor:
    """Mean cross-entropy over fp32 logits (what :func:`lm_loss` returns) with the output layer and the loss run
    in ``chunks`` pieces of the sequence, each piece's backward at once, as torchtitan 0.3's ``ChunkedLossWrapper``
    (components/loss.py) runs them: the hidden states detached, each chunk a leaf, its gradient written into an
    fp32 buffer of the whole sequence (``GradAccumulator(..., dtype=torch.float32)``), which the returned loss's
    backward hands to the trunk (:class:`_HiddenGrad`). One chunk's logits live at a time. ``head``: the output
    layer, its own FSDP group (:func:`apply_fsdp`), kept gathered across the chunks and its gradient reduced at the
    last one, as torchtitan does. The head's weight gradient is taken here, in the forward: give the loss's scale
    (``scale``: 1 / accumulation steps) here and back-propagate the result as it is (a pipeline schedule scales every
    gradient after, the head's too)."""
    from torch.distributed.fsdp import FSDPModule

    seq = hidden.shape[1]
    if seq % chunks:
        raise ValueError(f"the sequence ({seq}) does not split into {chunks} loss chunks")
    tokens = labels.numel()
    grad = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    fsdp = isinstance(head, FSDPModule)
    if fsdp:
        head.set_reshard_after_forward(False)
        head.set_reshard_after_backward(False)
        head.set_requires_gradient_sync(False, recurse=False)
        head.unshard()
    width = seq // chunks
    for i in range(chunks):
        part = slice(i * width, (i + 1) * width)
        leaf = hidden[:, part].detach().requires_grad_(hidden.requires_grad)
        if fsdp and i == chunks - 1:
            head.set_requires_gradient_sync(True, recurse=False)
        logits = soft_cap(head(leaf), cap)  # cap: the model's final_logit_softcap (Gemma 2)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels[:, part].reshape(-1),
                               reduction="sum") * (scale / tokens)
        total += loss.detach()
        if hidden.requires_grad:
            loss.backward()
            grad[:, part] = leaf.grad
    if fsdp:
        head.set_reshard_after_forward(True)
        head.set_reshard_after_backward(True)
        head.reshard()
    if not hidden.requires_grad:
        return total
    return _HiddenGrad.apply(hidden, grad.to(hidden.dtype), total)


def _interleave_swiglu_rows(fc1: nn.Linear, tp: int) -> None:
    """Re-order fc1's [gate | up] rows so that row block r (TP rank r's ColwiseParallel shard) is [gate_r | up_r]."""
    rows = fc1.weight.shape[0]
    half, chunk = rows // 2, rows // 2 // tp
    order = []
    for r in range(tp):
        order += list(range(r * chunk, (r + 1) * chunk))
        order += list(range(half + r * chunk, half + (r + 1) * chunk))
    idx = torch.tensor(order)
    with torch.no_grad():
        fc1.weight.copy_(fc1.weight[idx])
        if fc1.bias is not None:
            fc1.bias.copy_(fc1.bias[idx])


def apply_tp(stage: StageModule, tp_mesh, *, tied: bool, sequence_parallel: bool = False,
             chunked_loss: bool = False) -> None:
    """DTensor TP over ``tp_mesh`` (torch.distributed.tensor.parallel). With ``sequence_parallel`` (torchtitan's
    plan): norms are ``SequenceParallel`` (activations Shard(1) on the sequence between blocks), attention and
    MLP inputs all-gathered by ``PrepareModuleInput``, o / fc2 reduce-scattered back to Shard(1). ``chunked_loss``:
    the output layer takes replicated chunks (``StageModule.skip_head`` gathers the final norm's output)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    tp = tp_mesh.size()
    sp = sequence_parallel
    row_out = {"output_layouts": Shard(1)} if sp else {}
    for block in stage.layers.values():
        attn, mlp = block.attn, block.mlp
        plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
                "attn.o": RowwiseParallel(**row_out), "mlp.fc1": ColwiseParallel(),
                "mlp.fc2": RowwiseParallel(**row_out)}
        if sp:
            plan |= {"norm1": SequenceParallel(), "norm2": SequenceParallel(),
                     "attn": PrepareModuleInput(input_layouts=(Shard(1), None, None, None),
                                                desired_input_layouts=(Replicate(), None, None, None)),
                     "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))}
        if mlp.swiglu or mlp.geglu:  # a gated MLP: [gate | up] rows per rank
            _interleave_swiglu_rows(mlp.fc1, tp)
        parallelize_module(block, tp_mesh, plan)
        attn.heads //= tp
        attn.kv_heads //= tp
    if tied:  # the head reuses the embedding's weight as a plain tensor: both stay replicated over tp
        return
    if stage.has_embedding:
        parallelize_module(stage.embed, tp_mesh, RowwiseParallel(input_layouts=Replicate(),
                                                                 output_layouts=Shard(1) if sp else Replicate()))
    if stage.has_head:
        if sp:
            parallelize_module(stage.final_norm, tp_mesh, SequenceParallel())
        parallelize_module(stage.output, tp_mesh, ColwiseParallel(input_layouts=Shard(1) if sp and not chunked_loss
                                                                  else Replicate(),
                                                                  output_layouts=Replicate()))


def op_sac_save_ops() -> set:
    """The ops whose outputs torchtitan 0.2.2's op-level SAC keeps (``_op_sac_save_list``,
    torchtitan/models/llama3/infra/parallelize.py lines 36-51 at tag v0.2.2): ``aten.mm``, the SDPA kernels
    (efficient, flash, cudnn, math, fused-overrideable), ``_c10d_functional.reduce_scatter_tensor``, ``aten.max``,
    flex attention, varlen attention and inductor-compiled code (the last three where this torch has them).
    Added here: ``aten._scaled_dot_product_flash_attention_for_cpu``, the kernel SDPA runs on CPU, so a CPU run
    keeps the attention output and log-sum-exp as a GPU run keeps its flash kernel's."""
    import torch

    aten = torch.ops.aten
    ops = {aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
           aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_cudnn_attention.default,
           aten._scaled_dot_product_attention_math.default,
           aten._scaled_dot_product_fused_attention_overrideable.default,
           torch.ops._c10d_functional.reduce_scatter_tensor.default, aten.max.default,
           aten._scaled_dot_product_flash_attention_for_cpu.default}
    hops = torch._higher_order_ops
    ops |= {op for op in (getattr(hops, "flex_attention", None), getattr(hops, "inductor_compiled_code", None))
            if op is not None}
    if hasattr(torch.ops, "torch_attn") and hasattr(torch.ops.torch_attn, "_varlen_attn"):
        ops.add(torch.ops.torch_attn._varlen_attn.default)
    return ops


def op_sac_context_fn(save_ops: set):
    """``context_fn`` for ``torch.utils.checkpoint``: torchtitan 0.2.2's op-level SAC policy
    (torchtitan/distributed/activation_checkpoint.py ``_apply_op_sac``, lines 98-128 at v0.2.2): a fresh per-call
    count of ``aten.mm`` (forward and recompute counted apart, ``ctx.is_recompute``); an op in ``save_ops`` is
    MUST_SAVE except every second mm (the 2nd, 4th, ... of the block), every other op PREFER_RECOMPUTE; a
    device-to-host ``_to_copy`` is always saved. (torchtitan's per-FQN forced-recompute mm shapes are empty by
    default and left out.)"""
    from collections import defaultdict

    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    mm = torch.ops.aten.mm.default

    def context_fn():
        counts: defaultdict = defaultdict(int)

        def policy(ctx, func, *args, **kwargs):
            if (func == torch.ops.aten._to_copy.default and "cuda" in str(args[0].device)
                    and str(kwargs.get("device", "")) == "cpu"):
                return CheckpointPolicy.MUST_SAVE
            key = "recompute" if ctx.is_recompute else "forward"
            if func == mm:
                counts[key] += 1
            save = func in save_ops and not (func == mm and counts[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return context_fn


class _GateThenUp(nn.Linear):
    """SwiGLU's fused [gate | up] fc1 run as two GEMMs, gate then up, as torchtitan's Llama ``FeedForward`` runs
    ``w1`` and ``w3`` (two ``nn.Linear``; torchtitan/models/llama3/model/model.py), so op-level SAC's mm count
    (every second mm recomputed) meets the same sequence: wq, wk, wv, wo, w1, w3, w2. Same parameters and result.
    Under TP (``ColwiseParallel``) the local weight rows are this rank's [gate_r | up_r]
    (:func:`_interleave_swiglu_rows`): the GEMMs run on the local shards and the output is this rank's Shard(-1)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, Partial, Shard

        w, b, mesh = self.weight, self.bias, None
        if isinstance(w, DTensor):
            mesh = w.device_mesh
            x = x.to_local(grad_placements=(Partial(),))  # replicated input: its gradient is a partial sum
            w, b = w.to_local(), None if b is None else b.to_local()
        half = w.shape[0] // 2
        gate = F.linear(x, w[:half], None if b is None else b[:half])
        up = F.linear(x, w[half:], None if b is None else b[half:])
        y = torch.cat([gate, up], dim=-1)
        return y if mesh is None else DTensor.from_local(y, mesh, (Shard(-1),), run_check=False)


def apply_ac(stage: StageModule, recompute: str, num_layers: int | None) -> None:
    """Full recompute: each block (or the first ``num_layers`` of the stage) wrapped in a non-reentrant checkpoint
    (``checkpoint_wrapper``). Selective: torchtitan 0.2.2's op-level SAC (``selective_ac_option = "op"``, the
    torchtitan files autotune emits) on every block: ``checkpoint_wrapper(block, context_fn=...)`` with
    :func:`op_sac_context_fn` over :func:`op_sac_save_ops`; build the model without its own attention-core
    checkpoint (``recompute="none"``)."""
    if recompute not in ("full", "selective"):
        return
    from functools import partial

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    wrap = partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    if recompute == "selective":
        wrap = partial(wrap, context_fn=op_sac_context_fn(op_sac_save_ops()))
        for block in stage.layers.values():
            if getattr(block.mlp, "swiglu", False) or getattr(block.mlp, "geglu", False):
                block.mlp.fc1.__class__ = _GateThenUp
    for i, key in enumerate(list(stage.layers)):
        if recompute == "selective" or num_layers is None or i < num_layers:
            stage.layers[key] = wrap(stage.layers[key])


def apply_fsdp(stage: StageModule, dp_mesh, *, reshard_after_forward: bool, param_dtype: torch.dtype,
               offload: bool, chunked_loss: bool = False) -> None:
    """``fully_shard`` every block, then the stage itself (embedding, final norm, output: the root group).
    ``chunked_loss``: the output layer is a group of its own (torchtitan 0.3's ``lm_head``, which
    ``ChunkedLossWrapper`` keeps gathered across the chunks), the head :func:`chunked_lm_loss` runs after the stage's
    forward."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kw = {"mesh": dp_mesh, "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)}
    if offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for block in stage.layers.values():
        fully_shard(block, reshard_after_forward=reshard_after_forward, **kw)
    if chunked_loss and stage.output is not None:
        fully_shard(stage.output, reshard_after_forward=reshard_after_forward, **kw)
    # The root's parameters are used last in forward and first in backward: torchtitan keeps them gathered
    # (reshard_after_forward=False on the root); we follow the plan's setting for fewer surprises in bytes.
    fully_shard(stage, reshard_after_forward=reshard_after_forward, **kw)
