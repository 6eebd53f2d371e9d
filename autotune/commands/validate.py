"""``autotune validate FILE...``: lint the files of a job (every file ``autotune emit`` writes) for a world size.

Each file's kind comes from its name (``--kind`` overrides): a DeepSpeed JSON (``*_hf.json``: for the HF
Trainer), Megatron-LM or Megatron-DeepSpeed arguments (a shell file; ``--deepspeed`` in it means the latter),
an accelerate config YAML, a torchtitan TOML or 0.3 config module, Megatron-Bridge overrides or a Bridge checkpoint's
whole ``run_config.yaml`` (told by its first line under any name); a checkpoint folder given alone, by what it saved
(``autotune.commands.validate_checkpoint``). Beyond each format's checks, the model and plan
a Megatron, Megatron-DeepSpeed, Bridge or torchtitan file states are asked of its engine's own rules
(``autotune.lint.engine_rule_problems``). Exit 0: no problems; 1: any problem (warnings included); 2: unusable input
(the CLI's main turns the InputError into a message on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autotune.errors import InputError

__all__ = ["register", "run"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if not 1 <= value <= 2**20:
        raise argparse.ArgumentTypeError(f"expected a positive integer up to {2**20}, got {value}")
    return value


def register(subparsers) -> argparse.ArgumentParser:
    from autotune.commands import LazyChoices

    p = subparsers.add_parser("validate", help="lint a job's config files (DeepSpeed JSON, Megatron-LM / "
                                               "Megatron-DeepSpeed arguments, accelerate YAML, torchtitan TOML)",
                              description="Check each file against its engine's keys or flags, the engine's own "
                                          "parser where it is installed, and cross-field rules for a world size; "
                                          "report every problem with its line and fix.")
    p.add_argument("files", metavar="FILE", nargs="+", help="the files to check (kind from the name; see --kind)")
    LazyChoices("autotune.emit.validate_files", "FILE_KINDS").attach(
        p.add_argument("--kind", help="the kind of every FILE (default: from each file's name)"))
    p.add_argument("--world-size", type=_positive_int,
                   help="ranks of the job (default: what a file states: accelerate num_processes, torchtitan "
                        "degrees, else DeepSpeed's train_batch_size / (micro-batch x accumulation) x tp x pp x cp)")
    for dim in ("tp", "pp", "cp"):
        p.add_argument(f"--{dim}", type=_positive_int,
                       help=f"{dim} size of the job (default: from a Megatron / accelerate file given, else 1)")
    p.add_argument("--hf", action="store_true",
                   help="the DeepSpeed JSON is a Hugging Face Trainer config: fill 'auto' first (default for *_hf.json)")
    p.add_argument("--megatron-args", metavar="FILE",
                   help="a shell file of Megatron-LM or Megatron-DeepSpeed arguments to check as well")
    m = p.add_argument_group("memory check (--gpu: of the job a Megatron / Bridge / torchtitan file or a checkpoint "
                             "folder states; with --model: of a DeepSpeed JSON or an accelerate config)")
    m.add_argument("--model", help="model preset, Hugging Face config.json or model YAML (a DeepSpeed JSON or an "
                                   "accelerate config states none; a job file's own model otherwise)")
    m.add_argument("--gpu", help="GPU preset name: check that the job fits its memory")
    m.add_argument("--gpus-per-node", type=_positive_int, help="GPUs per node (default: the GPU preset's)")
    m.add_argument("--seq-len", type=_positive_int,
                   help="the sequence length of a DeepSpeed JSON, an accelerate config or a Trainer checkpoint "
                        "(default 4096); a job file states its own, and this checks it at another, as estimate "
                        "--from takes it")
    m.add_argument("--recompute", choices=("none", "selective", "full"),
                   help="the DeepSpeed JSON's activation recompute (default: full if the config configures "
                        "activation checkpoints; a job file states its own)")
    p.add_argument("--engine-version", metavar="ENGINE=VERSION",
                   help="check against this engine release, e.g. megatron=0.16 (Megatron-core's flag table of that "
                        "release) or fsdp=0.3 (torchtitan); default: the installed release where modelled, else the "
                        "release the file is for, else the newest modelled")
    p.add_argument("--json", action="store_true", help="print the problems as a JSON list only (each with its file)")
    p.set_defaults(handler=run)
    return p


_NOT_CONFIGS = {".md": "notes", ".py": "a Python module", ".log": "a log", ".png": "a plot", ".db": "a study"}
"""What a job folder holds beside its configs, by suffix: skipped when several files are given (``job/*``)."""


def _inputs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(path, kind) of every file to check."""
    from autotune.emit.shell_args import read_megatron_args_file
    from autotune.emit.validate_files import file_kind, megatron_file_kind

    files = list(args.files)
    if args.kind is None and len(files) > 1:  # a job folder's notes (job/*): said, not checked
        notes = [f for f in files if Path(f).suffix.lower() in _NOT_CONFIGS]
        for f in notes:
            print(f"autotune validate: skipped {f}: {_NOT_CONFIGS[Path(f).suffix.lower()]}, not a config", file=sys.stderr)
        folders = [f for f in files if Path(f).is_dir()]  # job/fallback/: another plan, another world size
        for f in folders:
            print(f"autotune validate: skipped {f}: a folder (its files are another job's: autotune validate "
                  f"{f.rstrip('/')}/*)", file=sys.stderr)
        files = [f for f in files if f not in notes and f not in folders]
    from autotune.commands.validate_checkpoint import checkpoint_input

    # a checkpoint folder given alone: the config it saved (a DeepSpeed save's, a Bridge save's run_config.yaml)
    out = [checkpoint_input(f, memory_check=args.gpu is not None) if args.kind is None and Path(f).is_dir()
           else (f, args.kind or file_kind(f))
           for f in files]
    if args.megatron_args:
        out.append((args.megatron_args, megatron_file_kind(read_megatron_args_file(args.megatron_args))))
    return out


def _deepspeed_world_size(path: str, tp: int, pp: int, cp: int) -> int | None:
    """The world size a DeepSpeed JSON's batch triple implies (``batch_triple_world``), or None."""
    from autotune.emit.validate import batch_triple_world, read_deepspeed_config

    return batch_triple_world(read_deepspeed_config(path)[0] or {}, tp, pp, cp)


def _job(args: argparse.Namespace, inputs: list[tuple[str, str]]) -> tuple[int, int, int, int]:
    """(world size, tp, pp, cp): the flags, else what the files state."""
    from autotune.commands.validate_checkpoint import CHECKPOINT_KINDS, checkpoint_sizes
    from autotune.emit.validate_files import sizes_from_file

    stated = [(path, checkpoint_sizes(path, kind) if kind in CHECKPOINT_KINDS else sizes_from_file(path, kind))
              for path, kind in inputs]
    sizes = {}
    for dim in ("tp", "pp", "cp"):
        given = getattr(args, dim)
        sizes[dim] = given or next((getattr(s, dim) for _, s in stated if getattr(s, dim)), 1)
    world = args.world_size or next((s.world_size for _, s in stated if s.world_size), None)
    if world and not args.world_size:
        print(f"autotune validate: no --world-size: assuming {world} (as "
              f"{next(p for p, s in stated if s.world_size == world)} states)", file=sys.stderr)
    if world is None:
        for path, kind in inputs:
            if kind == "deepspeed":
                world = _deepspeed_world_size(path, sizes["tp"], sizes["pp"], sizes["cp"])
                if world:
                    print(f"autotune validate: no --world-size: assuming {world} (train_batch_size / (micro-batch "
                          f"x accumulation) x tp x pp x cp of {path})", file=sys.stderr)
                    break
    if not world:
        shells = [path for path, kind in inputs if kind in ("megatron", "megatron-deepspeed")]
        read = (f" ({', '.join(shells)}: no launch line with numeric --nnodes / --nproc-per-node, or the DeepSpeed "
                "launcher's --num_nodes / --num_gpus or --include HOST:SLOTS)") if shells else ""
        raise InputError([f"give --world-size N: the files do not say it{read}"], subject="validate request")
    if world % (sizes["tp"] * sizes["pp"] * sizes["cp"]):
        # Degrees read from a file that do not divide the world: that file's own check reports it.
        sizes = {dim: getattr(args, dim) or 1 for dim in sizes}
    return world, sizes["tp"], sizes["pp"], sizes["cp"]


def _memory(args, path: str | dict, world: int, tp: int, pp: int, cp: int, problems: list) -> list:
    from autotune.emit.validate import has_errors
    from autotune.lint import memory_problems
    from autotune.specs.loading import load_cluster, load_model

    model = load_model(args.model)
    cluster = load_cluster(gpu=args.gpu, num_gpus=world, gpus_per_node=args.gpus_per_node)
    if has_errors(problems):
        print("autotune validate: memory check skipped: fix the errors first", file=sys.stderr)
        return []
    return memory_problems(path, model=model, cluster=cluster, tp=tp, pp=pp, cp=cp, seq_len=args.seq_len or 4096,
                           recompute=args.recompute)


def _job_memory(args, path: str, world: int, problems: list, seq_len: int | None = None, **sizes) -> list:
    """The memory check of the job a file states (``autotune.lint.job_memory_problems``: as ``estimate --from``
    reads it; ``sizes``: tp / pp / cp / recompute for a DeepSpeed save, which states none), after its errors."""
    from autotune.emit.validate import has_errors
    from autotune.lint import job_memory_problems

    if has_errors(problems):
        print(f"autotune validate: {path}: memory check skipped: fix the errors first", file=sys.stderr)
        return []
    try:
        return job_memory_problems(path, gpu=args.gpu, world_size=world, model=args.model,
                                   gpus_per_node=args.gpus_per_node, seq_len=seq_len, **sizes)
    except InputError as err:  # the job does not read from this file alone (a DeepSpeed save without its model, ...)
        print(f"autotune validate: {path}: memory check not made: {'; '.join(map(str, err.problems))}",
              file=sys.stderr)
        return []


_JOB_KINDS = ("megatron", "megatron-bridge", "megatron-deepspeed", "torchtitan", "torchtitan-module",
              "megatron-checkpoint", "trainer-checkpoint")
"""The kinds of input whose file states a whole job (model, plan, batch): ``--gpu`` checks its memory."""
_MODEL_LESS = ("deepspeed", "accelerate")
"""The kinds whose file states a plan but no model: their memory check needs ``--model`` too."""

_KIND_ENGINE = {"megatron": "megatron", "torchtitan": "fsdp", "deepspeed": "deepspeed",
                "deepspeed-checkpoint": "deepspeed", "megatron-checkpoint": "megatron",
                "megatron-deepspeed": "megatron-deepspeed"}
"""The engine whose release a file kind's check follows (a bare --engine-version applies when only one is given)."""


def _asked_versions(args: argparse.Namespace, inputs: list[tuple[str, str]]) -> dict[str, str]:
    """--engine-version as {engine: release}: ENGINE=VERSION, or a bare VERSION when the files are of one engine."""
    from autotune.specs.engine_versions import parse_engine_version_flag
    from autotune.engines import ENGINES

    engines = list(dict.fromkeys(_KIND_ENGINE[kind] for _, kind in inputs if kind in _KIND_ENGINE))
    return parse_engine_version_flag(args.engine_version, engines, {n: e.versions for n, e in ENGINES.items()})


def _templates(inputs: list[tuple[str, str]]) -> dict[str, str]:
    """The sed template given beside each Megatron-DeepSpeed script that fills it into its --deepspeed_config (a
    DeepSpeed-kind file of the name the script's sed reads: ``written_deepspeed_config.template_given``), by script:
    read as that script's config, not linted as a JSON (its placeholders, CONFIG_BATCH_SIZE ..., are not JSON), as
    ``estimate --from SCRIPT TEMPLATE`` takes it."""
    from autotune.emit.shell_args import read_megatron_args_file
    from autotune.emit.written_deepspeed_config import config_name, template_given

    jsons = [path for path, kind in inputs if kind == "deepspeed"]
    out: dict[str, str] = {}
    for path, kind in inputs:
        if kind == "megatron-deepspeed" and jsons:
            found = template_given(path, config_name(read_megatron_args_file(path)), jsons)
            if found is not None:
                out[path] = found
    return out


def _pairs(inputs: list[tuple[str, str]]) -> dict[str, list[str]]:
    """The DeepSpeed JSONs given that each Megatron-DeepSpeed argument file runs with: the one its --deepspeed_config
    names, else the one JSON given, else none (it is checked with the config it writes itself)."""
    from autotune.emit.shell_args import read_megatron_args_file
    from autotune.emit.written_deepspeed_config import config_name

    jsons = [path for path, kind in inputs if kind == "deepspeed"]
    out: dict[str, list[str]] = {}
    for path, kind in inputs:
        if kind == "megatron-deepspeed":
            named = config_name(read_megatron_args_file(path))
            match = [j for j in jsons if named is not None and Path(j).name == Path(named).name]
            out[path] = match or (jsons if len(jsons) == 1 else [])
    return out


def _client_optimizers(pairs: dict[str, list[str]]) -> dict[str, str]:
    """The optimizer each DeepSpeed JSON's program passes to deepspeed.initialize, where every argument file run with
    it says the same (``megatron_deepspeed_pair.client_optimizer``: DeepSpeedCPUAdam for --cpu-optimizer), by path."""
    from autotune.emit.megatron_deepspeed_pair import client_optimizer, flags_given
    from autotune.emit.shell_args import read_megatron_args_file

    said: dict[str, set] = {}
    for script, jsons in pairs.items():
        optimizer = client_optimizer(flags_given(read_megatron_args_file(script)))
        for ds_path in jsons:
            said.setdefault(ds_path, set()).add(optimizer)
    return {ds_path: next(iter(names)) for ds_path, names in said.items() if len(names) == 1 and None not in names}


def _pair_problems(pairs: dict[str, list[str]], world: int, tp: int, pp: int, cp: int,
                   templates: dict[str, str]) -> list[tuple[str, object]]:
    """What a Megatron-DeepSpeed argument file and the DeepSpeed JSON it runs with show together
    (autotune.emit.megatron_deepspeed_pair; ``pairs``: :func:`_pairs`); an argument file without a JSON given, with
    the config it writes itself (a here-document, a sed template: ``templates``, the one given beside it, else the
    one next to it), checked for the job's sizes as a given JSON is."""
    from autotune.emit.megatron_deepspeed_pair import megatron_deepspeed_pair_problems, written_pair_problems

    out: list[tuple[str, object]] = []
    for path, jsons in pairs.items():
        for ds_path in jsons:
            out += [(ds_path, p) for p in megatron_deepspeed_pair_problems(path, ds_path)]
        if not jsons:
            problems, checked = written_pair_problems(path, world_size=world, tp=tp, pp=pp, cp=cp,
                                                      template=templates.get(path))
            out += [(path, p) for p in problems]
            if checked:
                print(f"autotune validate: {path}: its flags checked with {checked}", file=sys.stderr)
    return out


def _launch_options(inputs: list[tuple[str, str]]) -> dict[str, frozenset[str]]:
    """The command-line options every launch script given passes to ``accelerate launch`` with each accelerate config
    given (named by its file name: :mod:`autotune.emit.accelerate_launch`), by config path; configs no script
    launches are left out."""
    from autotune.emit.accelerate_launch import accelerate_launches

    launches = [launch for path, kind in inputs if kind == "launch" for launch in accelerate_launches(path)]
    out: dict[str, frozenset[str]] = {}
    for path, kind in inputs:
        named = [launch.options for launch in launches
                 if kind == "accelerate" and launch.config_name == Path(path).name]
        if named:
            out[path] = frozenset.intersection(*named)
    return out


def run(args: argparse.Namespace) -> int:
    from autotune.commands.validate_checkpoint import CHECKPOINT_KIND, CHECKPOINT_KINDS, checkpoint_problems
    from autotune.lint import lint_file

    if args.model is not None and args.gpu is None:
        raise InputError(["the memory check needs --gpu (and --model for a DeepSpeed JSON or an accelerate config, "
                          "which state no model)"], subject="validate request")
    inputs = _inputs(args)
    templates = _templates(inputs)
    for script, template in templates.items():
        print(f"autotune validate: {template}: the template {script} fills with sed: read as its DeepSpeed config, "
              "not checked alone", file=sys.stderr)
    inputs = [(path, kind) for path, kind in inputs if path not in templates.values()]
    asked = _asked_versions(args, inputs)
    world, tp, pp, cp = _job(args, inputs)
    pairs = _pairs(inputs)
    clients = _client_optimizers(pairs)  # a JSON run by a script that passes DeepSpeedCPUAdam
    launched = _launch_options(inputs)  # an accelerate config's options on the scripts' launch lines
    found: list[tuple[str, object]] = []
    for path, kind in inputs:
        config = path
        if kind in CHECKPOINT_KINDS:  # a DeepSpeed save's config dict (problems by JSON path), a Megatron-LM save's
            problems, config = checkpoint_problems(path, kind, world_size=world, tp=tp, pp=pp, cp=cp,  # arguments
                                                   megatron_release=asked.get("megatron"))
        else:
            problems = lint_file(path, world_size=world, tp=tp, pp=pp, cp=cp, kind=kind,
                                 hf=True if args.hf and kind == "deepspeed" else None, engine_versions=asked,
                                 client_optimizer=clients.get(path), launch_options=launched.get(path, frozenset()))
        if args.model is not None and kind == "deepspeed":  # the JSON's plan ("auto" resolved) with the model
            problems += _memory(args, config, world, tp, pp, cp, problems)
        elif args.gpu is not None and kind in _JOB_KINDS:  # the job the file states, as estimate --from reads it
            problems += _job_memory(args, path, world, problems, seq_len=args.seq_len)  # given: a what-if
        elif args.model is not None and kind == "accelerate":  # its plan, with the model and sequence it omits
            problems += _job_memory(args, path, world, problems, seq_len=args.seq_len)
        elif args.gpu is not None and kind == CHECKPOINT_KIND:  # the save's job as estimate --from reads it: a
            # Megatron-DeepSpeed save's arguments (sizes, sequence, recompute), else --model or the config.json beside
            # it, --seq-len, and the --tp / --pp / --cp / --recompute a DeepSpeed config does not state
            problems += _job_memory(args, path, world, problems, seq_len=args.seq_len, tp=tp, pp=pp, cp=cp,
                                    recompute=args.recompute)
        found += [(path, p) for p in problems]
    found += _pair_problems(pairs, world, tp, pp, cp, templates)
    if args.gpu is not None and not any(kind in (*_JOB_KINDS, *_MODEL_LESS, CHECKPOINT_KIND) for _, kind in inputs):
        raise InputError(["the memory check (--gpu) reads a file that states a job: Megatron-LM or Megatron-DeepSpeed "
                          "arguments, Bridge overrides, a torchtitan config, a checkpoint folder, or a DeepSpeed JSON "
                          "or accelerate config with --model: give one"], subject="validate request")
    if args.gpu is not None and args.model is None and any(kind in _MODEL_LESS for _, kind in inputs):
        print("autotune validate: the memory check of a DeepSpeed or accelerate config needs --model (it states no "
              "model): not made", file=sys.stderr)
    several = len(inputs) > 1
    if args.json:
        print(json.dumps([p.to_dict() | {"file": path} for path, p in found], indent=2))
    elif found:
        for path, p in found:
            print(f"{path}: {p.render()}" if several else p.render())
        errors = sum(p.severity == "error" for _, p in found)
        names = ", ".join(path for path, _ in inputs)
        print(f"{names}: {errors} error(s), {len(found) - errors} warning(s) for world size {world}")
    else:
        print(f"{', '.join(path for path, _ in inputs)}: no problems for world size {world}")
    return 1 if found else 0
