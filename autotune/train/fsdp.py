"""The ``fsdp`` engine's built-in trainer: the plan with PyTorch's own APIs (torch 2.13).

``python -m autotune.train --plan plan.json`` dispatches here for ``engine: fsdp`` plans. One device mesh
``(pp, dp_replicate, dp_shard, tp)`` (``init_device_mesh``) carries every dimension:

- data parallelism: FSDP2 ``fully_shard`` per block and on the root over ``dp_shard`` (zero_stage 3:
  ``reshard_after_forward=True``; 2: ``False``), HSDP over the 2-D ``(dp_replicate, dp_shard)`` mesh when
  ``dp_replicate > 1``; zero_stage 0 is the same call on a ``(dp, 1)`` mesh (replicate: DDP semantics);
- ``MixedPrecisionPolicy(param_dtype=bf16 (fp16 for fp16 plans), reduce_dtype=fp32)``: fp32 sharded master
  parameters, 16-bit compute. On CPU/gloo this runs as on GPUs (bf16 all-gathers, fp32 reduce-scatters);
  fp16 runs without a loss scaler here (a few-step trial);
- ``CPUOffloadPolicy`` with offload_param = offload_optimizer = cpu (parameters, gradients, optimizer step on
  the host);
- activation checkpointing: full (every block, or ``recompute_num_layers`` of each stage, via
  ``checkpoint_wrapper``) or selective: torchtitan 0.2.2's op-level SAC on every block, what the emitted torchtitan
  files run (``selective_ac_option = "op"``; :func:`autotune.train.fsdp_model.apply_ac`);
- tensor parallelism: DTensor ``parallelize_module`` (:mod:`autotune.train.fsdp_model`) on the ``tp`` mesh,
  composed with FSDP2 (2-D); every TP rank of a data-parallel group draws the same batches;
- the plan's ``loss_chunks``: the output layer and the loss in that many chunks of the sequence, each chunk's
  backward at once, as torchtitan 0.3's ``ChunkedLossWrapper`` (:func:`autotune.train.fsdp_model.chunked_lm_loss`);
- pipeline parallelism: ``torch.distributed.pipelining`` (:mod:`autotune.train.pipelining`), 1F1B or
  interleaved 1F1B with vpp > 1, the engine's (uneven) layer split.

Refused with a reason (``UNSUPPORTED``, exit 2): cp > 1, ep > 1, fp8, adamw8bit, MLA, NVMe offload, and
shapes the TP / pipeline split cannot take (:func:`unsupported_reason`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autotune.engines.builtin_trainer import CP_REFUSED, fsdp_trainer_problem
from autotune.train import (StepLog, Unsupported, checkpointing, phase, pick_device, teardown, token_batches,
                            torch_dtype, world_size_problem)

__all__ = ["main", "unsupported_reason", "CP_REFUSED"]


def unsupported_reason(model, plan, scheme: str | None = None) -> str | None:
    """Why this trainer cannot run ``plan`` (None when it can); ``scheme``: the layer split (the engine's). The
    engines layer decides it (the fsdp engine's plan.md says it too)."""
    from autotune.engines import engine_for

    return fsdp_trainer_problem(model, plan, scheme or engine_for(plan).layer_split_of(plan, model.num_layers))


def _optimizer(name: str, params, lr: float):
    import torch

    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=lr)
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)


def _scheduler(optimizer, extra):
    """DeepSpeed's WarmupCosineLR as the DeepSpeed bundles write it (autotune.emit.deepspeed): the learning rate
    of step s (1-based) is lr * (s - 1) / warmup during the warm-up, then a cosine to min_lr at train_steps."""
    import math

    import torch

    warm, total, floor = extra.lr_warmup_steps, extra.lr_decay_steps, extra.min_lr / extra.lr

    def factor(i: int) -> float:
        if i < warm:
            return i / warm
        done = min(1.0, (i - warm) / max(1, total - warm))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * done))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def build(est, device, seed: int):
    """(mesh, this rank's stage modules, their virtual stage ids, number of stages) with TP, AC and FSDP2 applied."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from autotune.engines import engine_for
    from autotune.train.fsdp_model import StageModule, apply_ac, apply_fsdp, apply_tp
    from autotune.train.pipelining import virtual_stages
    from autotune.workloads.transformer import build_model

    spec, plan = est.model, est.plan
    dp_rep = plan.dp if plan.zero_stage == 0 else plan.dp_replicate
    mesh = init_device_mesh(device.type, (plan.pp, dp_rep, plan.dp // dp_rep, plan.tp),
                            mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp"))
    dp_mesh = mesh["dp_replicate", "dp_shard"] if dp_rep > 1 else mesh["dp_shard"]
    torch.manual_seed(seed)
    # fp32 parameters: FSDP2's sharded parameters are the master weights; MixedPrecisionPolicy casts for compute.
    # No recompute of the model's own: apply_ac wraps the blocks (full: checkpoint_wrapper; selective: op-level SAC).
    full = build_model(spec, seq_len=plan.seq_len, recompute="none", flash_attention=plan.flash_attention,
                       dtype=torch.float32)
    stages = virtual_stages(spec.num_layers, plan.pp, plan.vpp, engine_for(plan).layer_split_of(plan, spec.num_layers))
    chunked = (plan.loss_chunks or 1) > 1
    pp_rank = mesh["pp"].get_local_rank()
    stage_ids = [pp_rank + i * plan.pp for i in range(plan.vpp)] if plan.pp > 1 else [0]
    modules = []
    for s in stage_ids:
        first, count = stages[s]
        m = StageModule(full, first, count, has_embedding=s == 0, has_head=s == len(stages) - 1)
        m.skip_head = m.has_head and chunked  # the head and loss run in chunks after the stage (chunked_lm_loss)
        if plan.tp > 1:
            apply_tp(m, mesh["tp"], tied=spec.tied_embeddings, sequence_parallel=plan.sequence_parallel,
                     chunked_loss=m.skip_head)
        apply_ac(m, plan.recompute, plan.recompute_num_layers)
        if device.type == "cuda" and plan.offload_param == "none":
            m.to(device)
        apply_fsdp(m, dp_mesh, reshard_after_forward=plan.zero_stage == 3, param_dtype=torch_dtype(plan),
                   offload=plan.offload_param == "cpu", chunked_loss=m.skip_head)
        modules.append(m)
    del full
    return mesh, modules, stage_ids, len(stages)


def _emitted_optimizer(plan_path: str, options_type):
    """The optimizer settings emit wrote into plan.json (``--lr``, ``--warmup-steps``, ``--train-steps``), else
    the defaults: this trainer's schedule flags start from them."""
    import dataclasses
    import json

    try:
        given = json.loads(Path(plan_path).read_text(encoding="utf-8")).get("optimizer") or {}
    except (OSError, ValueError, AttributeError):
        given = {}
    known = {f.name for f in dataclasses.fields(options_type)}
    try:
        return options_type(**{k: v for k, v in given.items() if k in known})
    except (TypeError, ValueError):
        return options_type()


def main(est, args, rest: list[str]) -> int:
    from autotune.emit.options import OptimizerOptions

    ap = argparse.ArgumentParser(prog="python -m autotune.train (fsdp)")
    opt = _emitted_optimizer(args.plan, OptimizerOptions)
    ap.add_argument("--lr", type=float, default=opt.lr, help=f"peak learning rate (default {opt.lr:g})")
    ap.add_argument("--min-lr", type=float, default=opt.min_lr, help=f"final learning rate (default {opt.min_lr:g})")
    ap.add_argument("--lr-warmup-steps", type=int, default=opt.warmup_steps,
                    help=f"linear warm-up steps (default {opt.warmup_steps})")
    ap.add_argument("--lr-decay-steps", type=int, default=opt.train_steps,
                    help=f"step where the cosine reaches --min-lr (default {opt.train_steps})")
    checkpointing.add_arguments(ap)
    extra = ap.parse_args(rest)
    policy = checkpointing.trainer_policy(args.plan, extra)
    if not (extra.lr > 0 and 0 <= extra.min_lr <= extra.lr and 0 <= extra.lr_warmup_steps <= extra.lr_decay_steps):
        raise Unsupported("need --lr > 0, 0 <= --min-lr <= --lr and 0 <= --lr-warmup-steps <= --lr-decay-steps")
    model_spec, plan = est.model, est.plan
    if reason := unsupported_reason(model_spec, plan):
        raise Unsupported(reason)

    import torch
    import torch.distributed as dist

    from autotune.train.fsdp_model import chunked_lm_loss, lm_loss
    from autotune.workloads.moe_balancing import set_backward_scale

    phase("initialising the process group")
    device = pick_device(args.device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    world = dist.get_world_size()
    if (why := world_size_problem(plan, world)) is not None:
        teardown()
        raise Unsupported(why)
    phase("building the model (DTensor TP, activation checkpointing, fully_shard)")
    mesh, modules, stage_ids, num_stages = build(est, device, args.seed)
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    optimizer = _optimizer(plan.optimizer, params, extra.lr)
    scheduler = _scheduler(optimizer, extra)
    if policy is not None and len(modules) > 1:
        # One stage per rank saves under the global layer names (StageModule): DCP writes each stage's own
        # tensors. Several virtual stages per rank would need one state dict over all of them.
        phase("no checkpoints: the built-in trainer saves interleaved pipeline stages (vpp > 1) not yet")
        policy = None
    ckpt = checkpointing.DcpCheckpointer(policy, modules[0], optimizer, scheduler, dist)
    start, data = ckpt.resume()
    drawn = int(data.get("micro_batches_per_stream", 0))
    chunks = plan.loss_chunks or 1
    head = next((m.output for m in modules if m.skip_head), None)

    def loss_fn(out, labels):  # the last stage's output: logits, or the final norm's output with chunks
        return lm_loss(out, labels) if head is None else chunked_lm_loss(head, out, labels, chunks,
                                                                          cap=model_spec.final_logit_softcap)

    schedule = None
    if plan.pp > 1:
        from autotune.train.pipelining import build_schedule

        schedule = build_schedule(modules, stage_ids, num_stages, mesh["pp"].get_group(), device,
                                  n_microbatches=plan.num_microbatches, loss_fn=loss_fn)
    # The MoE balancing loss's gradient carries the main loss's factor: 1/accumulation steps where each
    # micro-batch's loss is divided before backward; 1 where the schedule scales the gradients afterwards.
    set_backward_scale(1.0 if schedule is not None else 1 / plan.grad_accum_steps)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()

    dp_shard = mesh["dp_shard"].size()
    stream = mesh["dp_replicate"].get_local_rank() * dp_shard + mesh["dp_shard"].get_local_rank()
    batches = token_batches(model_spec.vocab_size, plan.micro_batch_size, plan.seq_len, seed=args.seed,
                            stream=stream, device=device, skip=drawn)
    log = StepLog(warmup=args.warmup_steps, tokens_per_step=plan.global_batch_size * plan.seq_len, device=device,
                  barrier=dist.barrier, first_step=start)
    has_first, has_last = 0 in stage_ids, num_stages - 1 in stage_ids
    for step in range(start + 1, args.warmup_steps + args.steps + 1):
        micro = [next(batches) for _ in range(plan.grad_accum_steps)]
        log.start()
        if schedule is None:
            loss_sum = torch.zeros((), device=device)
            for ids, labels in micro:
                if head is None:
                    loss = lm_loss(modules[0](ids), labels) / plan.grad_accum_steps
                    loss.backward()
                else:  # the head's gradient is taken in the chunks: they scale it
                    loss = chunked_lm_loss(head, modules[0](ids), labels, chunks, scale=1 / plan.grad_accum_steps,
                                           cap=model_spec.final_logit_softcap)
                    loss.backward()
                loss_sum += loss.detach()
        else:  # the schedule splits the batch into n_microbatches and scales the gradients by 1/n
            ids, labels = torch.cat([m[0] for m in micro]), torch.cat([m[1] for m in micro])
            losses: list = []
            schedule.step(*((ids,) if has_first else ()), **({"target": labels, "losses": losses} if has_last
                                                               else {}))
            loss_sum = (torch.stack(losses).float().mean().detach() if has_last
                        else torch.zeros((), device=device))
            dist.all_reduce(loss_sum, group=mesh["pp"].get_group())  # only the last stage has the loss
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        log.stop(loss_sum.float(), lr=lr)
        drawn += plan.grad_accum_steps
        ckpt.after_step(step, {"micro_batches_per_stream": drawn, "world_size": world})
        checkpointing.hold(step, extra, ckpt)
    ckpt.wait()
    log.result(world_size=world, num_params=model_spec.num_params, all_gather_object=dist.all_gather_object,
               extra={"engine": "fsdp", "device": device.type, "mesh": dict(zip(mesh.mesh_dim_names, mesh.shape)),
                      "reshard_after_forward": plan.zero_stage == 3, "param_dtype": str(torch_dtype(plan)),
                      "reduce_dtype": "torch.float32", "cpu_offload": plan.offload_param == "cpu",
                      "recompute": plan.recompute, "loss_chunks": chunks,
                      "pipeline_schedule": None if schedule is None else type(schedule).__name__,
                      "stage_ids": stage_ids})
    teardown()
    return 0
