"""The ``deepspeed`` engine's built-in trainer: the plan with DeepSpeed 0.19.8's own APIs.

The one built-in DeepSpeed trainer: emitted DeepSpeed bundles launch it (``python -m autotune.train
--plan plan.json``) and so does every ``--workload builtin`` trial of a DeepSpeed plan, data parallel or
not, with ``--deepspeed-config`` naming the trial's own DeepSpeed config (the tuner's, e.g. its bucket
sizes); without that flag the plan's config is made as ``autotune emit`` writes it. Output protocol,
per-rank peak memory and teardown: :mod:`autotune.train`.

- ZeRO 0-3 (+ optimizer / parameter offload) from ``ds_config.json`` on the project's transformer
  (:func:`autotune.workloads.transformer.build_model`) through ``deepspeed.initialize``;
- AutoTP (``tensor_parallel.autotp_size`` = tp): a transformers Llama model of the spec's sizes
  (:mod:`autotune.train.hf_models`), which ``deepspeed.initialize`` shards; every rank of a TP group
  draws the same batches (DeepSpeed checks that on the first forward, engine.py
  ``check_dataloader_inputs_same_across_ranks``);
- PipelineModule for pp > 1 (:mod:`autotune.train.ds_pipe`): DeepSpeed's own uneven split;
- Ulysses for cp > 1 (:mod:`autotune.train.ds_ulysses`): ``DistributedAttention`` over
  DeepSpeed's sequence-parallel groups (``runtime/sequence_parallel/parallel_state_sp.py``).

On CPU without optimizer offload, AdamW runs as ``torch.optim.AdamW`` (``torch_adam: true``): DeepSpeed's
CPU FusedAdam is a JIT build of about a minute on a 2-core machine (68 s measured) computing the same update.
"""

from __future__ import annotations

import argparse
import json

from autotune.train import checkpointing
from autotune.train import (
    StepLog,
    Unsupported,
    world_size_problem,
    phase,
    pick_device,
    teardown,
    token_batches,
    torch_dtype,
)

__all__ = ["main", "unsupported_reason"]


def unsupported_reason(model, plan) -> str | None:
    """Why this trainer cannot run ``plan`` (None when it can), as the engines layer decides it."""
    from autotune.engines.builtin_trainer import deepspeed_trainer_problem

    return deepspeed_trainer_problem(model, plan)


def _config(path: str | None, est, device) -> dict:
    plan = est.plan
    if path is None:
        from autotune.emit.deepspeed import deepspeed_config

        cfg = deepspeed_config(est.model, est.cluster, plan)
    else:
        try:
            with open(path, encoding="utf-8") as f:
                cfg = json.load(f)
        except (OSError, ValueError) as err:
            raise Unsupported(f"--deepspeed-config {path!r} cannot be read as JSON: {err}") from None
    opt = cfg.get("optimizer") or {}
    if device.type == "cpu" and opt.get("type") in ("Adam", "AdamW") and plan.offload_optimizer == "none":
        opt.setdefault("params", {})["torch_adam"] = True
    return cfg


def _sequence_loss(loss, mpu, dist):
    """The whole sequence's mean loss: the sum of the cp ranks' (mean / cp) losses."""
    total = loss.detach().float().clone()
    dist.all_reduce(total, group=mpu.get_sequence_parallel_group())
    return total


def _main_loss_factor(engine, cp: int) -> float:
    """What the main loss's gradient is multiplied by in ``engine.backward``: 1/GAS, then the loss scale the ZeRO /
    bf16 optimizer or the autocast scaler applies (DeepSpeedEngine.backward, runtime/engine.py in 0.19.8), over cp
    where each Ulysses rank's loss is its slice's mean / cp. The MoE balancing loss's gradient follows it
    (autotune.workloads.moe_balancing)."""
    import torch
    from deepspeed.runtime.base_optimizer import ZeROOptimizer

    probe = torch.ones((), requires_grad=True) * 1.0  # a loss-like scalar (one element, with a grad_fn)
    if isinstance(engine.optimizer, ZeROOptimizer):
        probe = engine.optimizer.scale_if_loss(probe)
    elif engine.torch_autocast_z0_gradscaler:
        probe = engine.torch_autocast_z0_gradscaler.scale(probe)
    return float(probe.detach()) / engine.gradient_accumulation_steps() / cp


def main(est, args, rest: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m autotune.train (deepspeed)")
    ap.add_argument("--deepspeed-config", help="ds_config.json of the bundle (default: the plan's own, as emit "
                                               "writes it with its default options)")
    checkpointing.add_arguments(ap)
    extra = ap.parse_args(rest)
    policy = checkpointing.trainer_policy(args.plan, extra)
    model_spec, plan = est.model, est.plan
    if reason := unsupported_reason(model_spec, plan):
        raise Unsupported(reason)

    import deepspeed
    import deepspeed.comm as dist
    import torch

    phase("initialising the process group")
    device = pick_device(args.device)
    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
    world = dist.get_world_size()
    if (why := world_size_problem(plan, world)) is not None:
        raise Unsupported(why)
    cfg = _config(extra.deepspeed_config, est, device)
    torch.manual_seed(args.seed)
    dtype = torch_dtype(plan)
    if plan.pp > 1:
        from autotune.train.ds_pipe import train_pipeline

        return train_pipeline(est, args, cfg, device, dtype, policy, extra)

    mpu = None
    if plan.cp > 1:
        from autotune.train.ds_ulysses import ulysses_model

        model, mpu, shard = ulysses_model(model_spec, plan, dtype)
    elif plan.tp > 1:
        from autotune.train.hf_models import build_hf_model

        model = build_hf_model(model_spec, seq_len=plan.seq_len, dtype=dtype, recompute=plan.recompute)
    else:
        from autotune.workloads.transformer import build_model

        model = build_model(model_spec, seq_len=plan.seq_len, recompute=plan.recompute,
                            flash_attention=plan.flash_attention, dtype=dtype)
    phase("initialising the engine")
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg, mpu=mpu)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()

    from autotune.workloads.moe_balancing import set_backward_scale

    rank = dist.get_rank()
    if plan.tp > 1:
        from deepspeed.utils import groups

        stream = groups.get_data_parallel_rank()  # one stream per TP group: same batches on its ranks
        forward = lambda ids, labels: engine(input_ids=ids, labels=ids).loss  # transformers shifts the labels
    elif plan.cp > 1:
        stream = rank // plan.cp  # parallel_state_sp: sequence-parallel groups are consecutive ranks
        forward = lambda ids, labels: engine(*shard(ids, labels))
    else:
        stream = rank
        forward = engine
    ckpt = checkpointing.DeepSpeedCheckpointer(policy, engine, dist, cfg)
    start, data = ckpt.resume()
    drawn = int(data.get("micro_batches_per_stream", 0))
    batches = token_batches(model_spec.vocab_size, plan.micro_batch_size, plan.seq_len, seed=args.seed,
                            stream=stream, device=device, skip=drawn)
    log = StepLog(warmup=args.warmup_steps, tokens_per_step=plan.global_batch_size * plan.seq_len, device=device,
                  barrier=dist.barrier, first_step=start)
    for step in range(start + 1, args.warmup_steps + args.steps + 1):
        micro = [next(batches) for _ in range(plan.grad_accum_steps)]
        log.start()
        boundaries, loss, lr = [], None, None
        for ids, labels in micro:
            set_backward_scale(_main_loss_factor(engine, plan.cp))  # dynamic fp16 scales move between steps
            loss = forward(ids, labels)
            engine.backward(loss)
            boundaries.append(engine.is_gradient_accumulation_boundary())
            if boundaries[-1]:
                lr = engine.get_lr()[0]  # the rate this step's update uses (the scheduler steps after it)
            engine.step()  # DeepSpeed updates the weights at the accumulation boundary only
        assert boundaries[-1] and not any(boundaries[:-1]), f"accumulation boundaries off: {boundaries}"
        log.stop(_sequence_loss(loss, mpu, dist) if plan.cp > 1 else loss.detach().float(), lr=lr)
        drawn += plan.grad_accum_steps
        ckpt.after_step(step, {"micro_batches_per_stream": drawn, "world_size": world})
        checkpointing.hold(step, extra, ckpt)
    log.result(world_size=world, num_params=model_spec.num_params, all_gather_object=dist.all_gather_object,
               extra={"engine": "deepspeed", "seq_dp_world_size": engine.seq_dp_world_size,
                      "sequence_parallel_size": engine.sequence_parallel_size,
                      "autotp_sharded_modules": sum(type(m).__module__.startswith("deepspeed.module_inject")
                                                    for m in engine.module.modules()),
                      "torch_adam": bool((cfg.get("optimizer") or {}).get("params", {}).get("torch_adam"))})
    teardown(engine)
    return 0
