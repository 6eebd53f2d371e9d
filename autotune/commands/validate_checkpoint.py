"""``autotune validate CHECKPOINT_FOLDER``: the config a checkpoint holds, linted as the file it came from.

A checkpoint folder (``autotune.job_checkpoint.locate``) holds a config file's worth of the job in two layouts:

* a Megatron-Bridge save keeps the whole ``run_config.yaml`` (Bridge 0.6 training/checkpointing.py:1434): linted
  as that file (``megatron-bridge``);
* a DeepSpeed save keeps, in rank 0's model states, the config dict the engine was given (``ds_config``, runtime/
  engine.py of 0.19.8 :5017-5038), and its world size (``dp_world_size`` x ``mp_world_size``): linted as that
  DeepSpeed config for that world size, its problems named by their JSON path (a dict has no lines).

A Megatron-LM save keeps the parsed ``argparse.Namespace`` (with what ``validate_args`` derived from the arguments
written: the linter would flag those as if the user had written them) and a Trainer's ``training_args.bin`` no config
file: both are refused, pointing to ``estimate --from FOLDER``, which reads them and applies the engine's rules.
"""

from __future__ import annotations

import sys

from autotune.emit.problems import JobSizes
from autotune.errors import InputError

__all__ = ["CHECKPOINT_KIND", "checkpoint_input", "checkpoint_sizes", "checkpoint_config"]

CHECKPOINT_KIND = "deepspeed-checkpoint"
"""The input kind of a DeepSpeed checkpoint folder (its saved config is linted as a DeepSpeed JSON)."""


def checkpoint_input(folder: str) -> tuple[str, str]:
    """(path, kind) to lint for the checkpoint folder ``folder``; InputError where it holds no checkpoint, or one
    whose saved job is not a config file."""
    from autotune.job_checkpoint import inspect_path

    why, layout = inspect_path(folder)
    if layout is None:
        raise InputError([f"{folder!r}: {why or 'a folder'}: validate checks config files, and the config a DeepSpeed "
                          f"or Megatron-Bridge checkpoint folder saved"], subject="validate request")
    if layout.run_config is not None:
        print(f"autotune validate: {folder}: the Megatron-Bridge save's {layout.run_config}", file=sys.stderr)
        return str(layout.run_config), "megatron-bridge"
    if layout.deepspeed_states is not None:
        return folder, CHECKPOINT_KIND
    what = "a Megatron-LM save holds its parsed arguments, with what validate_args derived from the ones written" \
        if layout.megatron_save is not None else "a Trainer checkpoint holds its TrainingArguments, no config file"
    raise InputError([f"{folder!r}: {what}: `autotune estimate --from {folder} --gpu GPU` reads it and applies the "
                      f"engine's rules; validate the job's own files (its argument script, its config)"],
                     subject="validate request")


def _saved(folder: str):  # read at each use (two): a cache by path would answer for a folder since rewritten
    from autotune.job_checkpoint import read_checkpoint

    job = read_checkpoint(folder)
    if job.ds_config is None:
        raise InputError([f"{folder!r}: its DeepSpeed model states hold no config (ds_config): validate the job's "
                          f"ds_config.json instead"], subject="validate request")
    return job


def checkpoint_sizes(folder: str) -> JobSizes:
    """The world size the DeepSpeed save states (``dp_world_size`` x ``mp_world_size``), and a Megatron-DeepSpeed
    save's tensor / pipeline / context sizes (its ``args`` in the client state, read back to a command line)."""
    job = _saved(folder)
    argv = job.argv or []

    def size(flag: str) -> int | None:
        value = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag), None)
        return int(value) if value is not None and value.isdigit() and int(value) > 0 else None
    return JobSizes(world_size=job.world_size, tp=size("--tensor-model-parallel-size"),
                    pp=size("--pipeline-model-parallel-size"), cp=size("--context-parallel-size"))


def checkpoint_config(folder: str) -> dict:
    """The DeepSpeed config the save holds (said on stderr: which file it came from)."""
    job = _saved(folder)
    print(f"autotune validate: {folder}: the DeepSpeed config saved in {job.source}", file=sys.stderr)
    return job.ds_config
