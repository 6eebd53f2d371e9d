"""Checkpoints of the built-in trainers, as the bundle's checkpoint policy says (issue 19).

The policy is the ``checkpoint`` block of ``plan.json`` (``CheckpointPolicy.to_dict``; a
``checkpoint_policy.json`` beside plan.json wins when there is one): ``save_dir`` (a relative path is
relative to the bundle, the folder of plan.json; for the fallback plan in a bundle's ``fallback/`` folder,
relative to the bundle, whose checkpoints it resumes), ``interval_steps``, ``keep_last``, ``async_save`` and
``format``. A plan.json without one (the tuner's trials) saves nothing unless ``--save-dir`` or
``--save-interval`` asks. Flags override the policy: ``--save-dir``, ``--save-interval``, ``--keep-last``,
``--no-save``; ``--hold-after-step N`` makes every rank wait, after step N and its save have completed,
to be killed (kill-and-resume tests).

- DeepSpeed (:class:`DeepSpeedCheckpointer`): ``engine.save_checkpoint(save_dir, tag="global_stepN",
  client_state={"step", "data"})``, its LR scheduler inside the engine; DeepSpeed writes ``latest`` once
  every rank has written its files, so a killed save is never resumed. Resume: ``engine.load_checkpoint``
  from ``latest`` (``latest_universal`` when the config says ``checkpoint.load_universal``, after
  ``python -m deepspeed.checkpoint.ds_to_universal``). The module carries DeepSpeed's
  ``universal_checkpoint_info`` so ds_to_universal accepts the tags without ``--inject_missing_state``.
- FSDP2 (:class:`DcpCheckpointer`): torch DCP, ``step-N`` folders holding ``get_state_dict`` of the
  model and optimizer, the LR scheduler, the step and the data position; ``dcp.async_save`` on its own
  gloo group when the policy saves asynchronously, else ``dcp.save``. Once a save has finished (DCP's
  coordinator has written ``.metadata`` after every rank's files), rank 0 writes :data:`MARKER` in the
  folder; resume loads the newest marked folder (DCP reshards on load: another mesh resumes from it).

Data position: the number of micro-batches each data stream has drawn; a resumed run skips that many
(:func:`autotune.train.token_batches` ``skip``), so it sees the batches an uninterrupted run sees.
After each completed save rank 0 keeps the newest ``keep_last`` (``autotune.emit.checkpoint.prune_old_tags``).
Rank 0 prints ``CHECKPOINT {json}`` per save (step, folder, ``blocked_s``: the save call,
``total_s``: until the checkpoint is complete) and ``RESUMED {json}`` when it loads one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass

from autotune.train import rank0

__all__ = ["CheckpointPolicy", "add_arguments", "policy_for", "trainer_policy", "hold", "DeepSpeedCheckpointer", "DcpCheckpointer",
           "MARKER", "complete_steps"]

MARKER = "autotune_complete"
"""File in a DCP ``step-N`` folder once the save has finished on every rank."""
POLICY_FILE = "checkpoint_policy.json"


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    save_dir: str
    """Absolute."""
    interval_steps: int
    keep_last: int
    async_save: bool


def add_arguments(ap) -> None:
    ap.add_argument("--save-dir", help="checkpoint folder (default: the policy's save_dir, relative to the bundle)")
    ap.add_argument("--save-interval", type=int, help="save every N optimizer steps (default: the policy's)")
    ap.add_argument("--keep-last", type=int, help="checkpoints kept (default: the policy's, else 3)")
    ap.add_argument("--sync-save", action="store_true", help="FSDP2: dcp.save even where the policy says async")
    ap.add_argument("--no-save", action="store_true", help="neither save nor resume")
    ap.add_argument("--hold-after-step", type=int, help="after this step and its save, wait to be killed (tests)")


def _policy_doc(plan_path: str) -> dict | None:
    side = os.path.join(os.path.dirname(os.path.abspath(plan_path)), POLICY_FILE)
    path = side if os.path.isfile(side) else plan_path
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    return doc if path == side else doc.get("checkpoint")


def policy_for(plan_path: str, extra) -> CheckpointPolicy | None:
    """The policy to follow (None: no checkpoints); a bad value raises ValueError naming it."""
    if extra.no_save:
        return None
    doc = _policy_doc(plan_path) or {}
    if not doc and extra.save_dir is None and extra.save_interval is None:
        return None
    bundle = os.path.dirname(os.path.abspath(plan_path))
    if os.path.basename(bundle) == "fallback" and os.path.isfile(os.path.join(bundle, "..", "plan.json")):
        bundle = os.path.dirname(bundle)  # a bundle's fallback plan resumes the bundle's own checkpoints
    save_dir = os.path.join(bundle, extra.save_dir or doc.get("save_dir") or "checkpoints")
    interval = extra.save_interval if extra.save_interval is not None else int(doc.get("interval_steps") or 0)
    keep = extra.keep_last if extra.keep_last is not None else int(doc.get("keep_last") or 3)
    if interval < 1 or keep < 1:
        raise ValueError(f"checkpoint interval_steps and keep_last must be >= 1, got {interval} and {keep}")
    async_save = bool(doc.get("async_save")) and doc.get("format", "dcp") == "dcp" and not extra.sync_save
    return CheckpointPolicy(save_dir=os.path.abspath(save_dir), interval_steps=interval, keep_last=keep,
                            async_save=async_save)


def trainer_policy(plan_path: str, extra) -> CheckpointPolicy | None:
    """:func:`policy_for` for a trainer's ``main``: a bad value ends the run as UNSUPPORTED, naming it."""
    from autotune.train import Unsupported

    try:
        return policy_for(plan_path, extra)
    except ValueError as err:
        raise Unsupported(f"checkpoint policy: {err}") from None


def _say(kind: str, doc: dict) -> None:
    if rank0():
        print(f"{kind} {json.dumps(doc)}", flush=True)


def hold(step: int, extra, checkpointer=None) -> None:
    """``--hold-after-step``: finish the pending save, then sleep (up to 10 min) until killed."""
    if extra.hold_after_step != step:
        return
    if checkpointer is not None:
        checkpointer.wait()
    _say("HOLD", {"step": step})
    time.sleep(600)


def _prune(save_dir: str, keep_last: int) -> list[str]:
    from autotune.emit.checkpoint import prune_old_tags

    return prune_old_tags(save_dir, keep_last)


class DeepSpeedCheckpointer:
    """Saves and resumes a DeepSpeed engine (collective calls: every rank)."""

    def __init__(self, policy: CheckpointPolicy | None, engine, dist, cfg: dict) -> None:
        self.policy, self.engine, self.dist = policy, engine, dist
        self.universal = bool((cfg.get("checkpoint") or {}).get("load_universal"))
        if policy is not None:
            from deepspeed.checkpoint.constants import (UNIVERSAL_CHECKPOINT_INFO, UNIVERSAL_CHECKPOINT_VERSION_KEY,
                                                        UNIVERSAL_CHECKPOINT_VERSION_VALUE)

            if getattr(engine.module, UNIVERSAL_CHECKPOINT_INFO, None) is None:
                setattr(engine.module, UNIVERSAL_CHECKPOINT_INFO,
                        {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE})

    def resume(self) -> tuple[int, dict]:
        """(last completed step, data position) of the checkpoint loaded; (0, {}) when there is none."""
        p = self.policy
        latest = os.path.join(p.save_dir, "latest_universal" if self.universal else "latest") if p else None
        if latest is None or not os.path.isfile(latest):
            return 0, {}
        t0 = time.perf_counter()
        load_path, client = self.engine.load_checkpoint(p.save_dir)
        if load_path is None:
            raise RuntimeError(f"DeepSpeed could not load the checkpoint {latest} names")
        step = int(client["step"])
        _say("RESUMED", {"step": step, "path": load_path, "universal": self.universal,
                         "load_s": round(time.perf_counter() - t0, 4), "data": client.get("data", {})})
        return step, dict(client.get("data") or {})

    def after_step(self, step: int, data: dict) -> None:
        p = self.policy
        if p is None or step % p.interval_steps:
            return
        t0 = time.perf_counter()
        tag = f"global_step{step}"
        self.engine.save_checkpoint(p.save_dir, tag=tag, client_state={"step": step, "data": data})
        self.dist.barrier()  # every rank's files (and 'latest') are written before rank 0 prunes
        seconds = time.perf_counter() - t0
        pruned = _prune(p.save_dir, p.keep_last) if rank0() else []
        self.dist.barrier()
        _say("CHECKPOINT", {"step": step, "path": os.path.join(p.save_dir, tag), "blocked_s": round(seconds, 4),
                            "total_s": round(seconds, 4), "async": False, "pruned": pruned})

    def wait(self) -> None:
        pass


def complete_steps(save_dir: str) -> list[int]:
    """Steps of the finished DCP checkpoints in ``save_dir`` (``step-N`` folders holding :data:`MARKER`), sorted."""
    if not os.path.isdir(save_dir):
        return []
    out = []
    for name in os.listdir(save_dir):
        m = re.fullmatch(r"step-(\d+)", name)
        if m and os.path.isfile(os.path.join(save_dir, name, MARKER)):
            out.append(int(m[1]))
    return sorted(out)


class _AppState:
    """What one DCP checkpoint holds (``Stateful``): model and optimizer state (``get_state_dict``, sharded
    DTensors), and as one JSON string the LR scheduler, the step and the data position."""

    def __init__(self, model, optimizer, scheduler, meta: dict) -> None:
        self.model, self.optimizer, self.scheduler, self.meta = model, optimizer, scheduler, meta

    @staticmethod
    def _options():
        # Flattened optimizer state: each parameter's hyperparameters (lr, betas...) stored under its own FQN, not
        # as per-rank param_groups lists, which a pipeline stage cannot match with another stage's (torchtitan
        # saves optimizers this way too).
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(flatten_optimizer_state_dict=True)

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self._options())
        meta = {**self.meta, "scheduler": self.scheduler.state_dict()}
        return {"model": model_sd, "optim": optim_sd, "meta": json.dumps(meta)}

    def load_state_dict(self, sd: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"],
                       options=self._options())
        meta = json.loads(sd["meta"])
        self.scheduler.load_state_dict(meta.pop("scheduler"))
        self.meta.clear()
        self.meta.update(meta)


class DcpCheckpointer:
    """Saves and resumes an FSDP2 model, its optimizer and LR scheduler with torch DCP (every rank calls)."""

    def __init__(self, policy: CheckpointPolicy | None, model, optimizer, scheduler, dist) -> None:
        self.policy, self.model, self.optimizer, self.scheduler, self.dist = policy, model, optimizer, scheduler, dist
        self.pending = None  # (future, step, folder, t0, blocked_s) of the save in flight
        # A save in a background thread must not share the training collectives' group (gloo or NCCL).
        self.group = dist.new_group(backend="gloo") if policy is not None and policy.async_save else None

    def _folder(self, step: int) -> str:
        return os.path.join(self.policy.save_dir, f"step-{step}")

    def resume(self) -> tuple[int, dict]:
        p = self.policy
        steps = complete_steps(p.save_dir) if p else []
        if not steps:
            return 0, {}
        import torch.distributed.checkpoint as dcp

        step, t0 = steps[-1], time.perf_counter()
        self.dist.barrier()  # every rank has listed the folder before rank 0 clears unfinished ones
        if rank0():  # folders of saves that never finished (a killed run): overwritten or never read
            for name in os.listdir(p.save_dir):
                m = re.fullmatch(r"step-(\d+)", name)
                if m and int(m[1]) > step:
                    shutil.rmtree(os.path.join(p.save_dir, name), ignore_errors=True)
        meta: dict = {}
        state = _AppState(self.model, self.optimizer, self.scheduler, meta)
        dcp.load({"app": state}, checkpoint_id=self._folder(step))
        if int(meta["step"]) != step:
            raise RuntimeError(f"{self._folder(step)} holds step {meta['step']}")
        _say("RESUMED", {"step": step, "path": self._folder(step), "load_s": round(time.perf_counter() - t0, 4),
                         "data": meta.get("data", {})})
        return step, dict(meta.get("data") or {})

    def after_step(self, step: int, data: dict) -> None:
        p = self.policy
        if p is None:
            return
        self._poll()
        if step % p.interval_steps:
            return
        import torch.distributed.checkpoint as dcp

        self.wait()  # one save in flight at a time
        folder = self._folder(step)
        state = {"app": _AppState(self.model, self.optimizer, self.scheduler, {"step": step, "data": data})}
        self.dist.barrier()
        t0 = time.perf_counter()
        if p.async_save:
            fut = dcp.async_save(state, checkpoint_id=folder, process_group=self.group)
            fut = getattr(fut, "upload_completion", fut)  # AsyncSaveResponse with an asynchronous stager
            self.pending = (fut, step, folder, t0, time.perf_counter() - t0)
        else:
            dcp.save(state, checkpoint_id=folder)
            seconds = time.perf_counter() - t0
            self.pending = (None, step, folder, t0, seconds)
            self._finish()

    def _poll(self) -> None:
        if self.pending is not None and self.pending[0] is not None and self.pending[0].done():
            self._finish()

    def wait(self) -> None:
        if self.pending is not None:
            self._finish()

    def _finish(self) -> None:
        """Wait for the save in flight, then (rank 0) mark it complete and prune. Local: no collective, since the
        coordinator's future resolves only after every rank's files and the metadata are written."""
        fut, step, folder, t0, blocked = self.pending
        self.pending = None
        if fut is not None:
            fut.result()
        total = time.perf_counter() - t0
        pruned = []
        if rank0():
            with open(os.path.join(folder, MARKER), "w", encoding="utf-8") as f:
                f.write(json.dumps({"step": step}) + "\n")
            pruned = _prune(self.policy.save_dir, self.policy.keep_last)
        _say("CHECKPOINT", {"step": step, "path": folder, "blocked_s": round(blocked, 6),
                            "total_s": round(total, 6), "async": fut is not None, "pruned": pruned})
