"""``autotune validate CHECKPOINT_FOLDER``: the config a checkpoint holds, linted as the file it came from.

A checkpoint folder (``autotune.job_checkpoint.locate``) holds a config file's worth of the job in two layouts:

* a Megatron-Bridge save keeps the whole ``run_config.yaml`` (Bridge 0.6 training/checkpointing.py:1434): linted
  as that file (``megatron-bridge``);
* a DeepSpeed save keeps, in rank 0's model states, the config dict the engine was given (``ds_config``, runtime/
  engine.py of 0.19.8 :5017-5038), and its world size (``dp_world_size`` x ``mp_world_size``): linted as that
  DeepSpeed config for that world size, its problems named by their JSON path (a dict has no lines); a
  Megatron-DeepSpeed save's ``args`` beside it (its client state) as Megatron-DeepSpeed arguments, alone and with
  that config (``autotune.emit.megatron_deepspeed_pair``: micro-batch, ZeRO-3's build, MoE pipeline partitioning).

* a Megatron-LM save keeps the parsed ``argparse.Namespace`` (``args`` in its common state, checkpointing.py of
  core_v0.19.0 :1310-1314): read back to the command line that parses to it (``job_checkpoint.namespace_argv``: each
  option of the release's parser whose value is not the parser's default) and linted as a Megatron-LM argument list
  for the world size it saved (``args.world_size``), then asked of megatron-core's rules as ``validate
  megatron_args.sh`` asks them. What ``validate_args`` derived from the options written is set in the Namespace too
  (``--recompute-granularity`` from ``--recompute-activations``, ``--kv-channels``, the eval batch sizes, ...): values
  the release's own checks produced, so they pass the same checks (the real save of tests/test_job_checkpoint_real.py
  validates clean). The save holds no environment: the ``CUDA_DEVICE_MAX_CONNECTIONS`` check is not made. Against
  another release (``--engine-version megatron=X``) what the saving release derived reads as set: megatron-core
  0.19.2's save checked for 0.16 shows four of 0.19's derived options (``--tensor-parallel-num-weight-shards``, the
  eval batch sizes, ``--async-strategy``) as version mismatches, the save's own record of what wrote it.

A Trainer's ``training_args.bin`` is no config file: nothing to lint, so without ``--gpu`` it is refused, pointing to
``estimate --from FOLDER``; with ``--gpu`` its job (as ``--from`` reads it: the TrainingArguments' batch,
checkpointing and FSDP settings, ``config.json`` as the model) gets the memory check alone.
"""

from __future__ import annotations

import sys

from autotune.emit.problems import JobSizes
from autotune.errors import InputError

__all__ = ["CHECKPOINT_KIND", "MEGATRON_CHECKPOINT_KIND", "TRAINER_CHECKPOINT_KIND", "CHECKPOINT_KINDS",
           "checkpoint_input", "checkpoint_sizes", "checkpoint_problems"]

CHECKPOINT_KIND = "deepspeed-checkpoint"
"""The input kind of a DeepSpeed checkpoint folder (its saved config is linted as a DeepSpeed JSON)."""
MEGATRON_CHECKPOINT_KIND = "megatron-checkpoint"
"""The input kind of a Megatron-LM checkpoint folder (its saved arguments are linted as an argument list)."""
TRAINER_CHECKPOINT_KIND = "trainer-checkpoint"
"""The input kind of a Trainer's FSDP / DDP checkpoint folder (no config file: its job's memory check alone)."""
CHECKPOINT_KINDS = (CHECKPOINT_KIND, MEGATRON_CHECKPOINT_KIND, TRAINER_CHECKPOINT_KIND)


def checkpoint_input(folder: str, memory_check: bool = False) -> tuple[str, str]:
    """(path, kind) to lint for the checkpoint folder ``folder``; InputError where it holds no checkpoint, or one
    whose saved job is not a config file and no ``memory_check`` (``--gpu``) is asked of it."""
    from autotune.job_checkpoint import inspect_path

    why, layout = inspect_path(folder)
    if layout is None:
        raise InputError([f"{folder!r}: {why or 'a folder'}: validate checks config files, and the config a DeepSpeed, "
                          f"Megatron-Bridge or Megatron-LM checkpoint folder saved"], subject="validate request")
    if layout.run_config is not None:
        print(f"autotune validate: {folder}: the Megatron-Bridge save's {layout.run_config}", file=sys.stderr)
        return str(layout.run_config), "megatron-bridge"
    if layout.deepspeed_states is not None:
        return folder, CHECKPOINT_KIND
    if layout.megatron_save is not None:
        return folder, MEGATRON_CHECKPOINT_KIND
    if memory_check:
        print(f"autotune validate: {folder}: a Trainer checkpoint holds no config file: its job's memory check alone",
              file=sys.stderr)
        return folder, TRAINER_CHECKPOINT_KIND
    raise InputError([f"{folder!r}: a Trainer checkpoint holds its TrainingArguments, no config file: `autotune "
                      f"validate {folder} --gpu GPU` checks whether its job fits, `autotune estimate --from {folder} "
                      f"--gpu GPU` reads it and applies the engine's rules; validate the job's own files (its "
                      f"accelerate or DeepSpeed config)"], subject="validate request")


def _saved(folder: str, kind: str = CHECKPOINT_KIND):  # read at each use: a cache by path would answer for a folder
    from autotune.job_checkpoint import read_checkpoint  # since rewritten

    job = read_checkpoint(folder)
    if kind == CHECKPOINT_KIND and job.ds_config is None:
        raise InputError([f"{folder!r}: its DeepSpeed model states hold no config (ds_config): validate the job's "
                          f"ds_config.json instead"], subject="validate request")
    return job


def checkpoint_sizes(folder: str, kind: str = CHECKPOINT_KIND) -> JobSizes:
    """The world size the save states (DeepSpeed: ``dp_world_size`` x ``mp_world_size``; Megatron-LM: its
    ``args.world_size``), and the tensor / pipeline / context sizes of its arguments (a Megatron-LM save's, a
    Megatron-DeepSpeed save's ``args`` in the client state; read back to a command line)."""
    job = _saved(folder, kind)
    argv = job.argv or []

    def size(flag: str) -> int | None:
        value = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag), None)
        return int(value) if value is not None and value.isdigit() and int(value) > 0 else None
    return JobSizes(world_size=job.world_size, tp=size("--tensor-model-parallel-size"),
                    pp=size("--pipeline-model-parallel-size"), cp=size("--context-parallel-size"))


def checkpoint_problems(folder: str, kind: str, *, world_size: int, tp: int, pp: int, cp: int,
                        megatron_release: str | None = None) -> tuple[list, dict | None]:
    """(the problems of what the save holds, the DeepSpeed config it holds, for the memory check: None for a
    Megatron-LM save); stderr says which file was read. ``megatron_release``: the release asked for
    (``--engine-version megatron=X``), else the installed or newest modelled one."""
    job = _saved(folder, kind)
    if kind == TRAINER_CHECKPOINT_KIND:  # no config file to lint (module docstring)
        return [], None
    if kind == CHECKPOINT_KIND:
        from autotune.emit.megatron_deepspeed_pair import client_optimizer, flags_given
        from autotune.emit.validate import validate_deepspeed_config

        print(f"autotune validate: {folder}: the DeepSpeed config saved in {job.source}", file=sys.stderr)
        client = client_optimizer(flags_given(job.argv)) if job.argv is not None else None  # --cpu-optimizer saved
        problems = validate_deepspeed_config(job.ds_config, world_size=world_size, tp=tp, pp=pp, cp=cp,
                                             client_optimizer=client)
        if job.argv is not None:  # a Megatron-DeepSpeed save: its arguments, alone and with the config
            from autotune.emit.megatron_deepspeed_lint import megatron_deepspeed_args_problems
            from autotune.emit.megatron_deepspeed_pair import pair_problems

            print(f"autotune validate: {folder}: and the Megatron-DeepSpeed arguments saved beside it, read back as "
                  f"the command line that parses to them ({len(job.argv)} words)", file=sys.stderr)
            problems += megatron_deepspeed_args_problems(job.argv, world_size)
            problems += pair_problems(job.argv, job.ds_config, args_name="the saved arguments")
        return problems, job.ds_config
    from autotune.emit.megatron_lint import megatron_args_problems
    from autotune.emit.megatron_versions import release_in_use
    from autotune.emit.validate import has_errors
    from autotune.lint import engine_rule_problems

    print(f"autotune validate: {folder}: the arguments saved in {job.source}, read back as the command line that "
          f"parses to them ({len(job.argv or [])} words; the save holds no environment: CUDA_DEVICE_MAX_CONNECTIONS "
          f"not checked)", file=sys.stderr)
    release, installed = release_in_use(megatron_release, None)
    problems = megatron_args_problems(job.argv or [], world_size, release=release, installed=installed)
    if not has_errors(problems):
        problems += engine_rule_problems(folder, world_size)
    return problems, None
