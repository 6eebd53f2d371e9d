"""The job a training checkpoint states: Megatron-LM's arguments, DeepSpeed's config or a Trainer's arguments, read
from the checkpoint directory a job saves, for ``--from`` (``autotune.job_files``).

Where each engine keeps them:

* **Megatron-LM** (megatron/training/checkpointing.py at core_v0.19.0): the save directory holds
  ``latest_checkpointed_iteration.txt`` (an iteration or ``release``, :340-343, :1012) and one folder per save,
  ``iter_{:07d}`` or ``release`` (:209-211). Every format keeps the parsed arguments, ``state_dict['args']`` (an
  ``argparse.Namespace``, :1311): ``torch_dist`` in its common state, a ShardedObject ``common_state`` inside the
  torch.distributed.checkpoint files (megatron/core/dist_checkpointing/serialization.py:206-237 of megatron-core
  0.19.2: read with ``no_dist=True`` and ``torch.load(weights_only=True)``) or, before that, a ``common.pt``
  (strategies/common.py:15, :20-29); ``torch`` in ``mp_rank_{tp:02d}[_{pp:03d}]/model_optim_rng.pt`` (:232-235);
  ``torch_dcp`` and ``fsdp_dtensor`` as the ``args`` entry of their torch.distributed.checkpoint files (:1744-1764).
* **DeepSpeed** (deepspeed/runtime/engine.py of 0.19.8): ``save_checkpoint`` writes ``latest`` (the tag) and
  ``<tag>/mp_rank_00_model_states.pt`` (``zero_pp_rank_0_mp_rank_00_model_states.pt`` under ZeRO-3, :4336-4358),
  whose state holds ``ds_config`` (the config the engine was given), ``dp_world_size`` and ``mp_world_size``
  (``_common_checkpoint_state`` :5017-5038) and the caller's ``client_state`` (:5400): Megatron-DeepSpeed puts its
  ``args`` there. A Hugging Face Trainer checkpoint (``checkpoint-N/``) keeps the DeepSpeed folders and ``latest``
  beside the model's ``config.json`` (transformers trainer.py ``_save_checkpoint``: ``save_model`` then
  ``engine.save_checkpoint`` into the same folder).
* **Megatron-Bridge**: Megatron-LM's layout, each save with its ``run_config.yaml`` (``CheckpointLayout.run_config``),
  which ``--from`` reads as Bridge's own file.
* **Hugging Face Trainer**: ``checkpoint-N/training_args.bin``, the run's ``TrainingArguments``
  (``autotune.job_trainer_args``): the whole plan of an FSDP or DDP run; beside DeepSpeed's folders, the engine
  (the Trainer driving DeepSpeed) and its activation checkpointing.

The files are read without running code from them (``autotune.job_checkpoint_load``).
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from autotune.emit.job_args import FROM_SUBJECT as _SUBJECT
from autotune.emit.megatron_flags import FlagSpec, megatron_deepspeed_flag_table, megatron_flag_table
from autotune.emit.torchtitan_module_read import module_function
from autotune.errors import InputError
from autotune.inputs import _os_problem
from autotune.job_checkpoint_load import COMMON_STATE_KEY, StandIn, dcp_entry, safe_load
from autotune.job_trainer_args import TRAINER_ARGS, trainer_fields

__all__ = ["CheckpointJob", "CheckpointLayout", "checkpoint_folder", "locate", "read_checkpoint", "namespace_argv",
           "inspect_path"]

MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
DEEPSPEED_TRACKER = "latest"
MODELLED_DEEPSPEED = "0.19.8"
"""The DeepSpeed release the engine models (autotune.engines.deepspeed)."""
_MODEL_STATES = re.compile(r"^(zero_pp_rank_0_)?mp_rank_00_model_states\.pt$")
_MEGATRON_TORCH = re.compile(r"^mp_rank_00(_000)?$")
_ITERATION = re.compile(r"^iter_\d{7}$")

# Megatron-core's enums the arguments hold, by value (megatron/core/transformer/enums.py at core_v0.19.0)
_ENUM_NAMES = {
    "AttnBackend": {1: "flash", 2: "fused", 3: "unfused", 4: "local", 5: "auto"},
    "CudaGraphModule": {1: "attn", 2: "mlp", 3: "moe", 4: "moe_router", 5: "moe_preprocess", 6: "mamba"},
    "CudaGraphScope": {1: "full_iteration", 2: "attn", 3: "mlp", 4: "moe", 5: "moe_router", 6: "moe_preprocess",
                       7: "mamba", 8: "full_iteration_inference"},
}


_MOE_DESTS = ("moe_", "expert_")
"""Options a dense model's arguments hold at their MoE defaults, which validate_args fills in (expert TP = tp,
arguments.py of core_v0.19.0) and Megatron does not use without --num-experts: left out for a dense model."""
_ENUM_FLAGS = ("--attention-backend", "--cuda-graph-modules", "--cuda-graph-scope")
"""The options autotune reads whose values are Megatron enums (others of classes it does not know, a signal or a
dtype, are left out unsaid: autotune reads none of them)."""


@dataclass(frozen=True)
class CheckpointJob:
    """What a checkpoint states: Megatron arguments (as a command line), a DeepSpeed config, the world size."""

    source: str
    """The file the job was read from."""
    argv: list[str] | None = None
    ds_config: dict | None = None
    world_size: int | None = None
    model_config: str | None = None
    """A Hugging Face config.json beside a Trainer checkpoint's DeepSpeed folders."""
    fields: dict = field(default_factory=dict)
    """The plan fields of a Trainer's FSDP / DDP run (``job_trainer_args``)."""
    deepspeed_run: dict = field(default_factory=dict)
    """How a Trainer ran the DeepSpeed config: its engine (``hf``) and recompute."""
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CheckpointLayout:
    """Where a checkpoint folder keeps the job: found once (:func:`locate`), read by :func:`read_checkpoint`."""

    folder: Path
    """The folder given."""
    megatron_save: Path | None = None
    """The Megatron-LM / Megatron-Bridge save to read (``iter_NNNNNNN/`` or ``release/``, or the folder itself)."""
    run_config: Path | None = None
    """A Megatron-Bridge save's ``run_config.yaml`` (the whole ConfigContainer, model included: Bridge 0.6
    training/checkpointing.py:1434, utils/checkpoint_utils.py:34): the folder reads as that file."""
    deepspeed_states: Path | None = None
    """Rank 0's DeepSpeed model-states file of the save ``latest`` names (or of the tag folder given)."""
    trainer_args: Path | None = None
    """A Hugging Face Trainer checkpoint's ``training_args.bin``."""


def locate(path: str | Path) -> CheckpointLayout | None:
    """The checkpoint the folder ``path`` holds: a Megatron-LM save (the one its tracker names, the folder itself,
    or the latest ``iter_*``; Bridge keeps Megatron-LM's tracker), a DeepSpeed save, a Trainer checkpoint; None
    where ``path`` is no folder or holds none; InputError where a tracker names a save that is not there."""
    p = Path(path)
    if not p.is_dir():
        return None
    save = _megatron_save(p)
    if save is not None:
        config = save / "run_config.yaml"
        return CheckpointLayout(p, megatron_save=save, run_config=config if config.is_file() else None)
    trainer = p / TRAINER_ARGS
    layout = CheckpointLayout(p, deepspeed_states=_deepspeed_states(p), trainer_args=trainer if trainer.is_file()
                              else None, run_config=p / "run_config.yaml" if (p / "run_config.yaml").is_file() else None)
    return layout if layout.deepspeed_states or layout.trainer_args or layout.run_config else None


def checkpoint_folder(path: str) -> str:
    """The checkpoint folder to read for one of its files given alone (``common.pt``, ``mp_rank_00/
    model_optim_rng.pt``, ``*mp_rank_00_model_states.pt``, ``training_args.bin``); any other path as it is."""
    p = Path(path)
    if p.name == "model_optim_rng.pt" and _MEGATRON_TORCH.match(p.parent.name):
        return str(p.parent.parent)
    if p.name in ("common.pt", TRAINER_ARGS) or _MODEL_STATES.match(p.name):
        return str(p.parent)
    return path


def inspect_path(path: str) -> tuple[str | None, CheckpointLayout | None]:
    """(why ``--from`` cannot read ``path``, the checkpoint it holds): (None, None) for a file, (None, layout) for a
    checkpoint folder; never raises an OSError (a name too long for the file system is one that Path.is_file
    passes on); InputError where a folder's tracker names a save that is not there."""
    try:
        if Path(path).is_dir():
            layout = locate(path)
            return (None if layout else f"a folder without a Megatron-LM, DeepSpeed or Trainer checkpoint "
                    f"({MEGATRON_TRACKER}, {DEEPSPEED_TRACKER}, {TRAINER_ARGS})"), layout
        return (None if Path(module_function(path)[0]).is_file() else "no such file"), None  # FILE.py:NAME too
    except OSError as err:
        return _os_problem(err), None


def read_checkpoint(path: str | Path | CheckpointLayout) -> CheckpointJob:
    """The job the checkpoint folder ``path`` (or the layout :func:`locate` found in it) states; InputError where
    it holds no engine's state."""
    layout = path if isinstance(path, CheckpointLayout) else locate(path)
    if layout is None:
        raise InputError([f"{path}: no Megatron-LM ({MEGATRON_TRACKER}, iter_*/), DeepSpeed ({DEEPSPEED_TRACKER}, "
                          f"*/mp_rank_00_model_states.pt) or Trainer ({TRAINER_ARGS}) checkpoint in this folder: give "
                          f"the checkpoint's save directory or the job's config files"], subject=_SUBJECT)
    p, save = layout.folder, layout.megatron_save
    if save is not None:
        state = _load_megatron_state(save)
        args = state.get("args") if isinstance(state, dict) else None
        if not isinstance(args, argparse.Namespace):
            raise InputError([f"{save}: a Megatron-LM checkpoint without its arguments ('args'): give the job's "
                              f"argument file to --from instead"], subject=_SUBJECT)
        notes: list[str] = [f"{p}: the arguments saved with {save.name}"] if save != p else []
        return CheckpointJob(str(save), argv=namespace_argv(args, notes), world_size=_positive(args, "world_size"),
                             notes=notes)
    states, notes = layout.deepspeed_states, []
    trainer = _trainer_state(layout.trainer_args) if layout.trainer_args else None
    hf = (p / "config.json") if (p / "config.json").is_file() else None  # a Trainer's checkpoint-N/config.json
    if states is None and trainer is not None:  # a Trainer's FSDP / DDP checkpoint
        world = _trainer_world(trainer)
        return CheckpointJob(str(layout.trainer_args), world_size=world, model_config=str(hf) if hf else None,
                             fields=trainer_fields(trainer, world, str(layout.trainer_args), notes), notes=notes)
    if states is None:  # a Bridge save folder with its run_config.yaml and no Megatron-LM files
        raise InputError([f"{p}: a Megatron-Bridge save folder without Megatron-LM's files: give its "
                          f"run_config.yaml to --from"], subject=_SUBJECT)
    state = safe_load(states)
    if states.parent != p:
        notes.append(f"{p}: the DeepSpeed state saved with {states.parent.name}")
    if not isinstance(state, dict):
        raise InputError([f"{states}: not a DeepSpeed model-states file (no state dictionary)"], subject=_SUBJECT)
    args = state.get("args")
    argv = namespace_argv(args, notes) if isinstance(args, argparse.Namespace) else None
    saved_by = state.get("ds_version")
    if isinstance(saved_by, str) and saved_by.split(".")[:2] != MODELLED_DEEPSPEED.split(".")[:2]:
        notes.append(f"{states}: saved by DeepSpeed {saved_by[:20]}; estimated as DeepSpeed {MODELLED_DEEPSPEED}, the "
                     f"release autotune models (an older one may bucket and prefetch otherwise)")
    ds = _ds_config(state.get("ds_config"), states)
    dp, mp = state.get("dp_world_size"), state.get("mp_world_size")
    world = dp * mp if isinstance(dp, int) and isinstance(mp, int) and dp > 0 and mp > 0 else None
    if isinstance(args, argparse.Namespace):
        world = _positive(args, "world_size") or world
    # given a tag folder (global_stepN/) of a Trainer's checkpoint-N/: the model beside it
    hf = hf or next((c for c in (states.parent.parent / "config.json",) if c.is_file() and p != c.parent), None)
    run = {}
    if trainer is not None and ds is not None:  # the Trainer drove DeepSpeed: the hf engine, its recompute
        got = trainer_fields(trainer, world, str(layout.trainer_args), notes)
        run = {"engine": "hf", "recompute": got["recompute"]}
    return CheckpointJob(str(states), argv=argv, ds_config=ds, world_size=world,
                         model_config=str(hf) if hf else None, deepspeed_run=run, notes=notes)


def _trainer_state(path: Path) -> dict:
    """The attributes of the TrainingArguments a Trainer checkpoint saved."""
    state = getattr(safe_load(path), "state", None)
    if not isinstance(state, dict):
        raise InputError([f"{path}: not a Trainer's TrainingArguments (no attributes saved): give the job's files to "
                          f"--from instead"], subject=_SUBJECT)
    return state


def _trainer_world(state: dict) -> int | None:
    """The processes the Trainer ran in (accelerate's PartialState.num_processes), None where it did not say."""
    dist = state.get("distributed_state")
    value = getattr(dist, "state", {}).get("num_processes") if isinstance(getattr(dist, "state", None), dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


# ---- finding the files ---------------------------------------------------------------------------------------
def _megatron_save(p: Path) -> Path | None:
    """The folder of the save to read: the tracker's, the given ``iter_*`` / ``release`` folder, the latest
    ``iter_*`` where the tracker is missing, or None."""
    tracker = p / MEGATRON_TRACKER
    if tracker.is_file():
        text = tracker.read_text(encoding="utf-8", errors="replace").strip()
        name = "release" if text == "release" else f"iter_{int(text):07d}" if text.isdigit() and len(text) < 10 \
            else None
        if name is None or not (p / name).is_dir():
            raise InputError([f"{tracker}: names {text[:40]!r}, which is no save in {p} (iter_NNNNNNN/ or release/): "
                              f"give one save's folder"], subject=_SUBJECT)
        return p / name
    if _megatron_files(p):
        return p
    saves = sorted(c for c in p.iterdir() if _ITERATION.match(c.name) and c.is_dir() and _megatron_files(c))
    return saves[-1] if saves else None  # no tracker (a copied folder): its latest save


def _megatron_files(save: Path) -> bool:
    return (save / "common.pt").is_file() or (save / ".metadata").is_file() or any(
        _MEGATRON_TORCH.match(c.name) and (c / "model_optim_rng.pt").is_file() for c in save.iterdir() if c.is_dir())


def _deepspeed_states(p: Path) -> Path | None:
    """Rank 0's model-states file of the save the ``latest`` file names, or of the given tag folder."""
    # a universal checkpoint's tracker where there is no other (deepspeed/checkpoint/ds_to_universal.py:1355-1372 of
    # 0.19.8 copies the model-states files into the universal folder it names)
    tracker = next((t for t in (p / DEEPSPEED_TRACKER, p / "latest_universal") if t.is_file()), p / DEEPSPEED_TRACKER)
    folder = p
    if tracker.is_file():
        tag = tracker.read_text(encoding="utf-8", errors="replace").strip()
        folder = p / tag
        if not tag or not folder.is_dir():
            raise InputError([f"{tracker}: names {tag[:40]!r}, which is no folder in {p}: give one save's folder"],
                             subject=_SUBJECT)
    return next((c for c in sorted(folder.iterdir()) if _MODEL_STATES.match(c.name)), None)


# ---- reading them --------------------------------------------------------------------------------------------
def _load_megatron_state(save: Path) -> object:
    """The saved state holding ``args``, by format (``_get_checkpoint_format``, checkpointing.py:1613-1630 at
    core_v0.19.0): torch_dist (metadata.json; its common state, or a legacy common.pt), torch (mp_rank_00*/), or
    torch_dcp / fsdp_dtensor (a torch.distributed.checkpoint whose entries are the state's keys, ``args`` among
    them: :1744-1764)."""
    if (save / "common.pt").is_file():
        return safe_load(save / "common.pt")
    if (save / "metadata.json").is_file():
        common = dcp_entry(save, COMMON_STATE_KEY)
        if common is None:
            raise InputError([f"{save}: a Megatron torch_dist save without its common state ({COMMON_STATE_KEY}): "
                              f"give the job's argument file to --from instead"], subject=_SUBJECT)
        return common[0] if isinstance(common, list | tuple) and common else common
    rank0 = next((c for c in sorted(save.iterdir()) if _MEGATRON_TORCH.match(c.name)), None)
    if rank0 is not None:
        return safe_load(rank0 / "model_optim_rng.pt")
    args = dcp_entry(save, "args")
    if args is None:
        raise InputError([f"{save}: a torch.distributed.checkpoint save without Megatron-LM's arguments ('args'): a "
                          f"torchtitan or other checkpoint? give the job's config file to --from instead"],
                         subject=_SUBJECT)
    return {"args": args}


def _ds_config(value: object, states: Path) -> dict | None:
    """The DeepSpeed config the engine was given: a dict, or the path of a JSON file (read where it still is)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        path = Path(value)
        if not path.is_absolute():
            path = states.parent / path
        if path.is_file():
            from autotune.inputs import read_json

            doc = read_json(path, subject="DeepSpeed config")
            return doc if isinstance(doc, dict) else None
        raise InputError([f"{states}: its DeepSpeed config was the file {value!r}, which is not there now: give "
                          f"that ds_config.json to --from beside the checkpoint"], subject=_SUBJECT)
    return None


def _positive(args: argparse.Namespace, name: str) -> int | None:
    value = getattr(args, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


# ---- arguments back to a command line --------------------------------------------------------------------------
def namespace_argv(args: argparse.Namespace, notes: list[str]) -> list[str]:
    """The Megatron-LM (or Megatron-DeepSpeed) command line that parses to ``args``: each option of the release's
    parser (``megatron_flag_table``; Megatron-DeepSpeed's where the arguments name DeepSpeed) whose value is set. A
    value of a class autotune does not know is left out (with a note where autotune reads the option)."""
    table = megatron_deepspeed_flag_table() if hasattr(args, "deepspeed") else megatron_flag_table()
    argv: list[str] = []
    skipped: list[str] = []
    dense = not getattr(args, "num_experts", None)
    for spec in {id(s): s for s in table.values()}.values():
        if not hasattr(args, spec.dest) or (dense and spec.dest.startswith(_MOE_DESTS)):
            continue
        value = getattr(args, spec.dest)
        if spec.action in ("_StoreAction", "BooleanOptionalAction") and spec.default == _default_text(value):
            continue  # the parser's own default: as a file that leaves the option out
        tokens = _option(spec, value)
        if tokens is None:
            skipped.append(spec.name)
        else:
            argv += tokens
    unread = [name for name in skipped if name in _ENUM_FLAGS]
    if unread:
        notes.append(f"checkpoint arguments with a value autotune does not know, left out: {', '.join(unread)}")
    return argv


def _default_text(value: object) -> str:
    """``value`` as the flag tables write a default (``str``; an enum as ``Class.member``)."""
    if isinstance(value, StandIn) and len(value.args) == 1:
        cls = value.qualified_name.rsplit(".", 1)[-1]
        return f"{cls}.{_ENUM_NAMES.get(cls, {}).get(value.args[0])}"
    return str(value)


def _option(spec: FlagSpec, value: object) -> list[str] | None:
    """The tokens that set ``value`` with ``spec`` ([] where it is the parser's own unset state), None: unreadable."""
    action = spec.action
    if action == "_StoreTrueAction":
        return [spec.name] if value is True else []
    if action == "_StoreFalseAction":
        return [spec.name] if value is False else []
    if action == "BooleanOptionalAction":
        negative = next((n for n in spec.names if n.startswith("--no-")), None)
        return [spec.name] if value is True else [negative] if value is False and negative else []
    if action != "_StoreAction" or value is None or value is False:
        return []
    items = list(value) if isinstance(value, list | tuple) and spec.nargs in ("+", "*") else [value]
    words = [_word(v) for v in items]
    if any(w is None for w in words):
        return None
    return [spec.name, *words] if words else []


def _word(value: object) -> str | None:
    if isinstance(value, StandIn):
        names = _ENUM_NAMES.get(value.qualified_name.rsplit(".", 1)[-1], {})
        return names.get(value.args[0]) if len(value.args) == 1 else None
    if isinstance(value, bool | int | float | str):
        return str(value)
    if isinstance(value, list | tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        # a window (tuple_type: "W,0", as the argument reader takes it) or a per-layer pattern (moe_freq_type)
        return ",".join(map(str, value)) if isinstance(value, tuple) else json.dumps(list(value))
    return None
