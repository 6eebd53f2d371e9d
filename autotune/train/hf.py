"""The ``hf`` engine's built-in trainer: a transformers model of the spec (:mod:`autotune.train.hf_models`)
trained on synthetic tokens, two ways:

- ``--hf-config ds_config_hf.json``: the Hugging Face ``Trainer`` with ``TrainingArguments(deepspeed=...)``,
  which fills the file's ``"auto"`` values (transformers ``integrations/deepspeed.py``
  ``trainer_config_process`` / ``trainer_config_finalize``) from the arguments set here from the plan:
  ``per_device_train_batch_size`` = micro-batch, ``gradient_accumulation_steps``, ``bf16``/``fp16``,
  ``max_steps``, ``gradient_checkpointing`` (recompute full), the optimizer values of the emit defaults;
- ``--accelerate``: under ``accelerate launch --config_file accelerate_config.yaml``, an ``Accelerator``
  whose DeepSpeed plugin reads the concrete ``ds_config_accelerate.json``; the optimizer and scheduler are
  accelerate's ``DummyOptim`` / ``DummyScheduler`` (the JSON has both blocks: ``Accelerator._prepare_deepspeed``).

Both print the :mod:`autotune.train` protocol; a step is one optimizer update (``grad_accum_steps``
micro-batches). On CPU without offload the AdamW is ``torch.optim.AdamW`` (``torch_adam``), as in the
deepspeed trainer.
"""

from __future__ import annotations

import argparse
import json
import tempfile

from autotune.train import (
    StepLog,
    Unsupported,
    world_size_problem,
    phase,
    pick_device,
    teardown,
)

__all__ = ["main", "unsupported_reason"]


def unsupported_reason(model, plan) -> str | None:
    """Why this trainer cannot run ``plan`` (None when it can), as the engines layer decides it."""
    from autotune.engines.builtin_trainer import hf_trainer_problem

    return hf_trainer_problem(model, plan)


def _tokens(spec, plan, n: int, seed: int):
    """A map-style dataset of ``n`` synthetic sequences (input_ids and labels: HF shifts the labels)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, spec.vocab_size, (n, plan.seq_len), generator=gen)
    return [{"input_ids": row, "labels": row} for row in ids]


def _torch_adam(cfg: dict, plan, device) -> bool:
    opt = cfg.get("optimizer") or {}
    if device.type == "cpu" and opt.get("type") in ("Adam", "AdamW") and plan.offload_optimizer == "none":
        opt.setdefault("params", {})["torch_adam"] = True
        return True
    return False


def _read(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise Unsupported(f"{path!r} cannot be read as JSON: {err}") from None


def main(est, args, rest: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m autotune.train (hf)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--hf-config", help="ds_config_hf.json: train with the Hugging Face Trainer (the default, "
                                          "with the plan's own ds_config_hf as emit writes it when not given)")
    mode.add_argument("--accelerate", action="store_true",
                      help="train with accelerate (run under accelerate launch --config_file accelerate_config.yaml)")
    extra = ap.parse_args(rest)
    if problem := unsupported_reason(est.model, est.plan):
        raise Unsupported(problem)
    if extra.accelerate:
        return _accelerate(est, args)
    return _trainer(est, args, extra.hf_config)


class _Timer:
    """Trainer callback: STEP lines between barriers around each optimizer update, losses from the logs."""

    def __new__(cls, log: StepLog):
        from transformers import TrainerCallback

        class Callback(TrainerCallback):
            def on_step_begin(self, a, state, control, **kw):
                log.start()

            def on_step_end(self, a, state, control, **kw):
                log.stop(None, report_loss=False)  # the Trainer logs the step's loss after this (logging_steps 1)

            def on_log(self, a, state, control, logs=None, **kw):
                if logs and "loss" in logs and log.losses:
                    log.report_loss(float(logs["loss"]))

        return Callback()


def _trainer(est, args, config_path: str | None) -> int:
    import torch
    import torch.distributed as tdist
    from transformers import Trainer, TrainingArguments

    from autotune.emit.options import OptimizerOptions
    from autotune.train.hf_balancing import balanced_trainer
    from autotune.train.hf_models import build_hf_model

    spec, plan = est.model, est.plan
    phase("initialising the process group")
    device = pick_device(args.device)
    if config_path is None:
        from autotune.emit.deepspeed import hf_deepspeed_config

        cfg = hf_deepspeed_config(est.model, est.cluster, plan)
    else:
        cfg = _read(config_path)
    torch_adam = _torch_adam(cfg, plan, device)
    o = OptimizerOptions()
    steps = args.warmup_steps + args.steps
    with tempfile.TemporaryDirectory(prefix="autotune-hf-") as out:
        targs = TrainingArguments(
            output_dir=out, deepspeed=cfg, per_device_train_batch_size=plan.micro_batch_size,
            gradient_accumulation_steps=plan.grad_accum_steps, max_steps=steps, learning_rate=o.lr,
            adam_beta1=o.betas[0], adam_beta2=o.betas[1], adam_epsilon=o.eps, weight_decay=o.weight_decay,
            max_grad_norm=o.grad_clip, warmup_steps=1, bf16=plan.precision != "fp16", fp16=plan.precision == "fp16",
            gradient_checkpointing=plan.recompute == "full", logging_steps=1, save_strategy="no", report_to="none",
            disable_tqdm=True, dataloader_num_workers=0, seed=args.seed, use_cpu=device.type == "cpu",
            ddp_backend="gloo" if device.type == "cpu" else None)
        torch.manual_seed(args.seed)
        model = build_hf_model(spec, seq_len=plan.seq_len, dtype=None, recompute="none")
        world = tdist.get_world_size() if tdist.is_initialized() else 1
        if (why := world_size_problem(plan, world)) is not None:
            raise Unsupported(why)
        data = _tokens(spec, plan, plan.global_batch_size * steps, args.seed)
        log = StepLog(warmup=args.warmup_steps, tokens_per_step=plan.global_batch_size * plan.seq_len,
                      device=device, barrier=tdist.barrier)
        phase("initialising the engine")
        trainer_class = balanced_trainer(spec, plan.seq_len) if spec.moe is not None else Trainer
        trainer = trainer_class(model=model, args=targs, train_dataset=data, callbacks=[_Timer(log)])
        trainer.train()
        engine = trainer.model_wrapped
        log.result(world_size=world, num_params=spec.num_params, all_gather_object=tdist.all_gather_object,
                   extra={"engine": "hf", "driver": "transformers.Trainer", "torch_adam": torch_adam,
                          "zero_stage": engine.zero_optimization_stage() if hasattr(engine, "zero_optimization_stage")
                          else None})
        teardown(engine if hasattr(engine, "destroy") else None)
    return 0


def _accelerate(est, args) -> int:
    import torch
    import torch.distributed as tdist
    from accelerate import Accelerator
    from accelerate.utils import DummyOptim, DummyScheduler
    from torch.utils.data import DataLoader

    from autotune.train.hf_balancing import extra_balancing_loss
    from autotune.train.hf_models import build_hf_model

    spec, plan = est.model, est.plan
    phase("initialising the process group")
    device = pick_device(args.device)
    accelerator = Accelerator()
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        raise Unsupported("--accelerate: no DeepSpeed plugin: run under accelerate launch --config_file "
                          "accelerate_config.yaml (the bundle's launch_accelerate.sh)")
    cfg = plugin.deepspeed_config
    torch_adam = _torch_adam(cfg, plan, device)
    world = tdist.get_world_size()  # accelerate 1.16 counts processes on accelerators only (state.py:747-758)
    if (why := world_size_problem(plan, world)) is not None:
        raise Unsupported(why)
    torch.manual_seed(args.seed)
    model = build_hf_model(spec, seq_len=plan.seq_len, dtype=None, recompute=plan.recompute)
    steps = args.warmup_steps + args.steps
    rank = tdist.get_rank()
    data = _tokens(spec, plan, plan.global_batch_size * steps, args.seed)[rank::world]  # this rank's share
    loader = DataLoader(data, batch_size=plan.micro_batch_size)
    optimizer = DummyOptim(model.parameters())
    scheduler = DummyScheduler(optimizer)
    phase("initialising the engine")
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    log = StepLog(warmup=args.warmup_steps, tokens_per_step=plan.global_batch_size * plan.seq_len, device=device,
                  barrier=tdist.barrier)
    batches = iter(loader)
    for _ in range(steps):
        micro = [next(batches) for _ in range(plan.grad_accum_steps)]
        log.start()
        loss = None
        for batch in micro:
            with accelerator.accumulate(model):
                batch = {k: v.to(accelerator.device) for k, v in batch.items()}
                out = model(**batch)
                extra = extra_balancing_loss(spec, out, plan.seq_len)  # where the class adds none itself
                loss = out.loss if extra is None else out.loss + extra
                accelerator.backward(loss)  # the DeepSpeed engine's backward and step (it updates at its boundary)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
        log.stop(loss.detach().float())
    log.result(world_size=world, num_params=spec.num_params, all_gather_object=tdist.all_gather_object,
               extra={"engine": "hf", "driver": "accelerate", "torch_adam": torch_adam,
                      "distributed_type": str(accelerator.distributed_type)})
    accelerator.wait_for_everyone()
    model.destroy()  # the DeepSpeed engine, before accelerate ends the process group
    tdist.barrier()
    accelerator.end_training()
    teardown(None)  # destroy_process_group, when end_training left it
    return 0
