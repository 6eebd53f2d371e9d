"""DeepSpeed's PipelineModule for pp > 1: the project's transformer as a list of LayerSpecs.

Layers: the embedding (``EmbedPipe``), one ``BlockPipe`` per transformer layer, the final norm and the
output layer (tied to the embedding through ``TiedLayerSpec`` when the spec ties them). The stages are
DeepSpeed's own split, ``partition_method="type:BlockPipe"`` (``runtime/pipe/module.py`` _partition_layers:
``partition_balanced`` over a 0/1 weight per layer, which for 0/1 weights gives the first L % pp stages one
layer more, as ``partition_uniform`` does); the trainer checks that the counts DeepSpeed chose equal
``autotune.specs.layout.layer_counts(L, pp, "uniform")``, the split the planner and the ledger assumed.
The engine runs DeepSpeed's 1F1B ``TrainSchedule`` through ``engine.train_batch(data_iter)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autotune.train import StepLog, Unsupported, checkpointing, phase, teardown, token_batches
from autotune.workloads.transformer import Block, _norm, _rope_tables, bool_dropout, cap_logits, scale_embeddings

__all__ = ["pipeline_layers", "stage_block_counts", "train_pipeline"]


class EmbedPipe(nn.Module):
    def __init__(self, spec, dtype) -> None:
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.pos = nn.Embedding(spec.max_position_embeddings + spec.position_offset, spec.hidden_size) \
            if spec.position_embedding == "learned" else None
        self.embed_norm = _norm(spec, spec.hidden_size) if spec.embedding_norm else None
        self.to(dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = scale_embeddings(self.spec, self.embed(ids))
        if self.pos is not None:
            first = self.spec.position_offset  # OPT's table: positions from row 2
            x = x + self.pos.weight[first:first + ids.shape[1]]
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        return bool_dropout(x, self.spec.dropout, self.training)


class BlockPipe(nn.Module):
    """One transformer layer with the RoPE tables / causal mask it reads (buffers, not parameters)."""

    def __init__(self, spec, index: int, seq_len: int, recompute: str, flash: bool, dtype) -> None:
        super().__init__()
        self.block = Block(spec, index, flash=flash, selective=recompute == "selective").to(dtype)
        if spec.position_embedding == "rope":
            cos, sin = _rope_tables(seq_len, spec.rotary_dim, spec.rope_theta, spec)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)
        else:
            self.cos = self.sin = None
        mask = None if flash else torch.full((seq_len, seq_len), float("-inf")).triu(1).to(dtype)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x, self.cos, self.sin, self.mask)


class FinalNormPipe(nn.Module):
    def __init__(self, spec, dtype) -> None:
        super().__init__()
        self.norm = _norm(spec, spec.hidden_size).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class HeadPipe(nn.Module):
    def __init__(self, spec, dtype) -> None:
        super().__init__()
        self.spec = spec
        self.output = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cap_logits(self.spec, self.output(x))


def _tied_head(module: EmbedPipe, x: torch.Tensor) -> torch.Tensor:
    return cap_logits(module.spec, F.linear(x, module.embed.weight))


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))


def pipeline_layers(spec, plan, dtype) -> list:
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    if spec.tied_embeddings:
        first = TiedLayerSpec("embed", EmbedPipe, spec, dtype, tied_weight_attr="embed.weight")
        last = TiedLayerSpec("embed", EmbedPipe, spec, dtype, forward_fn=_tied_head, tied_weight_attr="embed.weight")
    else:
        first, last = LayerSpec(EmbedPipe, spec, dtype), LayerSpec(HeadPipe, spec, dtype)
    blocks = [LayerSpec(BlockPipe, spec, i, plan.seq_len, plan.recompute, plan.flash_attention, dtype)
              for i in range(spec.num_layers)]
    return [first, *blocks, LayerSpec(FinalNormPipe, spec, dtype), last]


def stage_block_counts(module) -> list[int]:
    """Transformer layers DeepSpeed put on each stage (from the module's global partition boundaries)."""
    is_block = [getattr(layer, "typename", None) is BlockPipe for layer in module._layer_specs]
    parts = module.parts
    return [sum(is_block[parts[s]:parts[s + 1]]) for s in range(len(parts) - 1)]


def train_pipeline(est, args, cfg: dict, device, dtype, policy=None, extra=None) -> int:
    """Train ``est``'s plan as a PipelineModule; ``policy`` (autotune.train.checkpointing): save and resume as the
    bundle says (``engine.save_checkpoint`` writes each stage's layer files; resume skips the batches drawn)."""
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.pipe import PipelineModule

    from autotune.specs.layout import layer_counts

    spec, plan = est.model, est.plan
    if spec.is_moe:
        raise Unsupported("PipelineModule here builds dense layers only: MoE layers need DeepSpeed-MoE modules")
    expected = layer_counts(spec.num_layers, plan.pp, "uniform")
    if expected is None:
        raise Unsupported(f"{spec.num_layers} layers over pp={plan.pp}: a stage would hold no transformer layer")
    module = PipelineModule(layers=pipeline_layers(spec, plan, dtype), num_stages=plan.pp, loss_fn=lm_loss,
                            partition_method="type:BlockPipe",
                            activation_checkpoint_interval=1 if plan.recompute == "full" else 0)
    counts = stage_block_counts(module)
    if tuple(counts) != expected:  # the planner's split is not what DeepSpeed made: the estimate is off
        raise SystemExit(f"DeepSpeed split {spec.num_layers} layers as {counts}, the planner assumed {list(expected)}")
    phase("initialising the engine")
    engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=[p for p in module.parameters()
                                                                           if p.requires_grad], config=cfg)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ckpt = checkpointing.DeepSpeedCheckpointer(policy, engine, dist, cfg)
    start, data = ckpt.resume()
    drawn = int(data.get("micro_batches_per_stream", 0))
    batches = token_batches(spec.vocab_size, plan.micro_batch_size, plan.seq_len, seed=args.seed,
                            stream=engine.grid.get_data_parallel_id(), device=device, skip=drawn)
    log = StepLog(warmup=args.warmup_steps, tokens_per_step=plan.global_batch_size * plan.seq_len, device=device,
                  barrier=dist.barrier, first_step=start)
    for step in range(start + 1, args.warmup_steps + args.steps + 1):
        log.start()
        lr = engine.get_lr()[0]  # the rate this step's update uses (the scheduler steps after it)
        loss = engine.train_batch(data_iter=batches)  # grad_accum_steps micro-batches through 1F1B, one update
        log.stop(loss.detach().float(), lr=lr)
        drawn += plan.grad_accum_steps
        ckpt.after_step(step, {"micro_batches_per_stream": drawn, "world_size": dist.get_world_size()})
        if extra is not None:
            checkpointing.hold(step, extra, ckpt)
    log.result(world_size=dist.get_world_size(), num_params=spec.num_params, all_gather_object=dist.all_gather_object,
               extra={"engine": "deepspeed", "pipeline_stage_layers": counts,
                      "dp_world_size": engine.grid.get_data_parallel_world_size(),
                      "torch_adam": bool((cfg.get("optimizer") or {}).get("params", {}).get("torch_adam"))})
    teardown(engine)
    return 0
