"""Linting an accelerate config YAML for a world size: unknown keys (nearest key, line), values, and the
contradictions accelerate 1.16 raises on at launch or in its plugins (file:line in the 1.16.0 wheel).

Keys: ``accelerate_keys.json`` (``scripts/extract_accelerate_keys.py``: ``ClusterConfig``'s fields, on which
``from_yaml_file`` raises for any other top-level key, and the ``accelerate launch`` option groups that the
nested blocks' keys are copied onto; a nested key not among them is dropped silently). Where accelerate is
installed, its own loader (``ClusterConfig.from_yaml_file``) reads the file too. SageMaker configs:
``autotune.emit.accelerate_sagemaker``.
"""

from __future__ import annotations

import difflib
import functools
import importlib.resources
import json
from pathlib import Path
from typing import Any

import yaml

from autotune.emit.accelerate import CPU_FSDP_PROBLEM
from autotune.emit.accelerate_sagemaker import is_sagemaker, sagemaker_problems, sagemaker_world_size
from autotune.emit.problems import JobSizes, Problem, Severity, problem_at
from autotune.errors import InputError
from autotune.inputs import parse_yaml, read_text

__all__ = ["accelerate_key_table", "accelerate_config_problems", "accelerate_job_sizes", "read_accelerate_config"]

_KEYS_FILE = "accelerate_keys.json"
# DeepSpeedPlugin._deepspeed_config_checks (utils/dataclasses.py:1386): with deepspeed_config_file these may not
# come from the accelerate config; commands/launch.py:1421-1423 adds mixed_precision whenever the file has one.
_DS_FILE_EXCLUSIVE = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
                      "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path",
                      "zero3_save_16bit_model")
_BLOCK_OF = {"DEEPSPEED": "deepspeed_config", "FSDP": "fsdp_config", "MEGATRON_LM": "megatron_lm_config"}
# Nested keys accelerate 1.16 reads that are no launch option (so not in the key table): launch copies every
# fsdp_config key onto its args, and utils/launch.py:304 reads getattr(args, "fsdp_ignored_modules") into
# FSDP_IGNORED_MODULES (FullyShardedDataParallelPlugin.ignored_modules); accelerate's own
# tests/test_configs/latest_fsdp.yaml has it.
_READ_BESIDE_OPTIONS = {"fsdp_config": {"fsdp_ignored_modules": {"type": "str", "choices": None}}}


# fp8_backend: launch's --fp8_backend lists "ao" / "te", but launch exports the value unchanged and
# Accelerator.__init__ reads it back as FP8BackendType (upper case), raising on "te" (scripts/extract_accelerate_keys.py).
_CASE_NOTE = {("fp8_config", "fp8_backend"): " (accelerate 1.16's Accelerator reads it as FP8BackendType, case "
              "sensitive: a lower-case value raises \"ValueError: 'te' is not a valid FP8BackendType\" when the "
              "script creates its Accelerator, whatever `accelerate launch --help` lists)"}


def _also_read(block: str, key: str, value: Any) -> bool:
    """Values outside a key's listed choices that accelerate still takes: FSDP1's sharding strategy in any case, as
    torch's ShardingStrategy number 1-5 or its member name _HYBRID_SHARD_ZERO2 (FullyShardedDataParallelPlugin,
    utils/dataclasses.py:1722-1728, accelerate 1.16.0)."""
    if (block, key) != ("fsdp_config", "fsdp_sharding_strategy"):
        return False
    text = str(value).upper()
    names = accelerate_key_table()["blocks"]["fsdp_config"]["fsdp_sharding_strategy"]["choices"]  # its constants
    return text in ("1", "2", "3", "4", "5", "_HYBRID_SHARD_ZERO2") or text in names


def _as_read(value: Any, spec: dict) -> str:
    """A nested value as accelerate compares it: upper- or lower-cased first where it normalises (``spec["case"]``)."""
    text = str(value)
    return {"upper": text.upper(), "lower": text.lower()}.get(spec.get("case", ""), text)


@functools.cache
def accelerate_key_table() -> dict:
    """``{"version", "source", "top": {key: {...}}, "blocks": {block: {key: {"type", "choices"}}}}``."""
    return json.loads((importlib.resources.files("autotune.emit") / _KEYS_FILE).read_text(encoding="utf-8"))


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """1-based line of every mapping key, by its path (the text already parsed as YAML)."""
    out: dict[tuple[str, ...], int] = {}
    stack = [((), yaml.compose(text, Loader=yaml.SafeLoader))]
    while stack:
        parts, node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    out[parts + (key.value,)] = key.start_mark.line + 1
                    stack.append((parts + (key.value,), value))
    return out


def read_accelerate_config(path: str | Path, repeated: list[tuple[str, int]] | None = None
                           ) -> tuple[dict, dict[tuple[str, ...], int]]:
    """(config, line of each key); InputError when the file is not a YAML mapping. A key given twice keeps its last
    value, as accelerate's loader (yaml.safe_load) does; ``repeated`` gets each (key, line)."""
    subject = f"accelerate config {str(path)!r}"
    text = read_text(path, subject="accelerate config")
    data = parse_yaml(text, subject=subject, repeated=[] if repeated is None else repeated)
    if not isinstance(data, dict):
        raise InputError([f"expected a mapping of accelerate settings, got {type(data).__name__}"], subject=subject)
    return data, _key_lines(text)


def _near(key: str, known) -> str | None:
    found = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6) if len(str(key)) <= 100 else []
    return found[0] if found else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def accelerate_job_sizes(path: str | Path):
    """The world size (num_processes) and tp/cp the config states; InputError when num_processes is there but
    not a process count (accelerate launch cannot start 0 processes)."""
    data, lines = read_accelerate_config(path)
    if is_sagemaker(data):
        return JobSizes(world_size=sagemaker_world_size(data)[0])
    pc = data.get("parallelism_config") if isinstance(data.get("parallelism_config"), dict) else {}
    world = _int(data.get("num_processes"))
    if data.get("num_processes") is None and str(data.get("distributed_type")) == "NO":
        world = 1  # the loader sets num_processes 1 for NO (config_args.py:111-112, 1.16.0)
    if data.get("num_processes") is not None and not (world and world >= 1):
        line = lines.get(("num_processes",))
        raise InputError([f"num_processes{f' (line {line})' if line else ''} must be an integer >= 1 (the processes "
                          f"of all machines together: the world size), got {data['num_processes']!r}: write "
                          f"num_processes: N with N the job's GPU count"], subject=f"accelerate config {str(path)!r}")
    return JobSizes(world_size=world,
                    tp=_int(pc.get("parallelism_config_tp_size")), cp=_int(pc.get("parallelism_config_cp_size")))


def _accelerate_own(path: str | Path) -> list[Problem]:
    """accelerate's own loader, when accelerate is installed (it raises on unknown top-level keys)."""
    try:
        from accelerate.commands.config.config_args import load_config_from_file
    except ImportError:
        return []
    try:
        load_config_from_file(str(path))
    except (ValueError, TypeError, KeyError) as err:
        return [Problem(path="$", severity="error", source="accelerate", message=f"accelerate's loader: {err}",
                        fix="fix the config as the message says")]
    return []


_LEGACY_TOP = {"dynamo_backend": "dynamo_config: {dynamo_backend: ...}", "fp16": "mixed_precision: fp16"}
"""Top-level keys of older configs that accelerate 1.16.0's loader still converts (config_args.py:113-119)."""


def accelerate_config_problems(path: str | Path, *, world_size: int, tp: int = 1, cp: int = 1,
                               launch_options: frozenset[str] = frozenset()) -> list[Problem]:
    """Every problem of an accelerate config file for a job of ``world_size`` ranks (tp, cp: the plan's), launched
    with ``launch_options`` on the command line (autotune.emit.accelerate_launch: they take precedence over the
    file's keys)."""
    table = accelerate_key_table()
    version = table["version"]
    repeated: list[tuple[str, int]] = []
    data, lines = read_accelerate_config(path, repeated)
    out: list[Problem] = [Problem(path=f"$.{key}", line=line, severity="warning", source="rules",
                                  message=f"{key} is given twice: accelerate's loader keeps the last value",
                                  fix="keep one") for key, line in repeated]

    def bad(parts: tuple[str, ...], message: str, fix: str, severity: Severity = "error") -> None:
        out.append(problem_at(parts, lines, message=message, fix=fix, severity=severity))

    if is_sagemaker(data):  # a SageMakerConfig: its own keys and distributed types (autotune.emit.accelerate_sagemaker)
        sagemaker_problems(data, table, world_size, bad, _near)
        return out + ([] if any(p.severity == "error" for p in out) else _accelerate_own(path))
    for key in data:
        if key in _LEGACY_TOP:  # config_args.py:110-119 (1.16.0): converted by the loader, so accepted
            bad((str(key),), f"{key} is a legacy key: accelerate converts it ({_LEGACY_TOP[key]})",
                f"write it as {_LEGACY_TOP[key]}", "warning")
        elif key not in table["top"]:
            near = _near(key, table["top"])
            bad((str(key),), f"unknown key {key!r}: accelerate {version} refuses the file (ClusterConfig)",
                f"did you mean {near!r}?" if near else "remove it")
    for block, known in table["blocks"].items():
        value = data.get(block)
        if value is None:
            continue
        if not isinstance(value, dict):
            bad((block,), f"{block} must be a mapping, got {type(value).__name__}", "write key: value lines under it")
            continue
        known = {**known, **_READ_BESIDE_OPTIONS.get(block, {})}
        for key, setting in value.items():
            # launch prefixes fsdp_config / fp8_config keys with fsdp_ / fp8_ (commands/launch.py:1320-1323, 1.16.0)
            prefix = {"fsdp_config": "fsdp_", "fp8_config": "fp8_"}.get(block)
            spec = known.get(key) or (known.get(f"{prefix}{key}") if prefix else None)
            if spec is None:
                near = _near(key, known)
                bad((block, str(key)), f"unknown key {key!r} in {block}: accelerate {version} launch drops it "
                    "silently, so it has no effect", f"did you mean {near!r}? rename it" if near else "remove it",
                    "warning")
            elif spec.get("choices") and _as_read(value[key], spec) not in spec["choices"] \
                    and not _also_read(block, str(key), value[key]):
                bad((block, str(key)), f"{key} is {value[key]!r}, not one of {', '.join(spec['choices'])}"
                    f"{_CASE_NOTE.get((block, str(key)), '')}", f"use one of {', '.join(spec['choices'])}")
    _yaml_boolean_problems(data, bad)
    for key in ("distributed_type", "mixed_precision"):
        choices = table["top"][key].get("choices")
        if key in data and data[key] is not None and not isinstance(data[key], bool) and choices \
                and str(data[key]) not in choices:
            bad((key,), f"{key} is {data[key]!r}, not one of {', '.join(choices)}", f"use one of {', '.join(choices)}")
    _shape_problems(data, world_size, bad, launch_options)
    _engine_problems(data, tp, cp, world_size, bad)
    _referenced_problems(path, data, world_size, bad)
    if not any(p.severity == "error" for p in out):
        out += _accelerate_own(path)
    return out


def _yaml_boolean_problems(data: dict, bad) -> None:
    """distributed_type / mixed_precision written bare as NO / no (or yes, on, off, true, false): YAML 1.1 reads a
    boolean, and accelerate 1.16.0 does not turn it back into a word. What it does then (1.16.0 wheel):

    - commands/config/config_args.py, BaseConfig.__post_init__ (lines 169-173): only a str distributed_type
      becomes DistributedType(...), so load_config_from_file keeps False / True; BaseConfig.process_config
      (line 111) sets num_processes = 1 only when distributed_type == DistributedType.NO, which False is not.
    - commands/launch.py, _validate_launch_command: lines 1278-1296 compare distributed_type with DEEPSPEED,
      the MULTI_* types, XLA, FSDP, MEGATRON_LM; a boolean matches none, so launch_command takes
      simple_launcher, as for NO. Without num_processes, lines 1355-1356 raise "You need to manually pass in
      `--num_processes` using this config yaml." (num_processes stayed -1).
    - mixed_precision: lines 1337-1342 copy the config's False (it is not None) onto args.mixed_precision, and
      utils/launch.py, prepare_simple_launcher_cmd_env line 151 (prepare_multi_gpu_env line 250,
      prepare_deepspeed_cmd_env line 511) calls args.mixed_precision.lower(): "AttributeError: 'bool' object
      has no attribute 'lower'", unless `accelerate launch --mixed_precision` overrides the file.
    """
    kind = data.get("distributed_type")
    if isinstance(kind, bool):
        if kind is False and _int(data.get("num_processes")) and data["num_processes"] >= 1:
            bad(("distributed_type",), "distributed_type is the YAML boolean false (a bare NO, no, off or false): "
                "accelerate 1.16 keeps False and launches it as NO (one process, no distributed setup)",
                'quote it: distributed_type: "NO"', "warning")
        elif kind is False:
            bad(("distributed_type",), "distributed_type is the YAML boolean false (a bare NO, no, off or false) "
                "and there is no num_processes: accelerate 1.16 sets num_processes 1 only for the string NO, so "
                "`accelerate launch` raises 'You need to manually pass in `--num_processes` using this config "
                "yaml.'", 'quote it: distributed_type: "NO"')
        else:
            bad(("distributed_type",), "distributed_type is the YAML boolean true (a bare yes, on or true): "
                "accelerate 1.16 matches it with no DistributedType and launches one process, as for NO",
                'write the type you mean, quoted where it is a YAML word: distributed_type: "NO" or MULTI_GPU, '
                "FSDP, DEEPSPEED, ...")
    precision = data.get("mixed_precision")
    if isinstance(precision, bool):
        bad(("mixed_precision",), f"mixed_precision is the YAML boolean {str(precision).lower()} (a bare "
            f"{'no, off or false' if precision is False else 'yes, on or true'}): accelerate 1.16 loads it, then "
            "`accelerate launch` raises \"AttributeError: 'bool' object has no attribute 'lower'\"",
            'quote it: mixed_precision: "no"' if precision is False else
            'write the precision you mean: mixed_precision: "no", fp16, bf16 or fp8')


def _shape_problems(data: dict, world_size: int, bad, launch_options: frozenset[str] = frozenset()) -> None:
    machines, processes, rank = (data.get(k) for k in ("num_machines", "num_processes", "machine_rank"))
    for key, value in (("num_machines", machines), ("num_processes", processes)):
        if value is not None and not (_int(value) and value >= 1):
            bad((key,), f"{key} must be a positive integer, got {value!r}", f"write {key}: N")
    if _int(processes) and processes >= 1 and processes != world_size:
        bad(("num_processes",), f"num_processes {processes} (all machines together) but the job has {world_size} "
            "ranks", f"set num_processes: {world_size}")
    if _int(machines) and _int(processes) and processes % machines:
        bad(("num_processes",), f"num_processes {processes} does not split over {machines} machines",
            f"use a multiple of {machines}")
    if _int(rank) is not None and _int(machines) and not 0 <= rank < machines:
        bad(("machine_rank",), f"machine_rank {rank} with {machines} machine(s)", f"use 0 to {machines - 1}")
    given_ip = data.get("main_process_ip") or "--main_process_ip" in launch_options  # the launch's flag wins
    if _int(machines) and machines > 1 and not given_ip:
        bad(("main_process_ip",), "several machines and no main_process_ip: the other machines cannot find rank 0",
            "set main_process_ip to the first node's address, or pass --main_process_ip on the accelerate launch "
            "line and validate the launch script with this file", "warning")


def _engine_problems(data: dict, tp: int, cp: int, world_size: int, bad) -> None:
    kind = str(data.get("distributed_type"))
    ds = data.get("deepspeed_config") if isinstance(data.get("deepspeed_config"), dict) else {}
    fsdp = data.get("fsdp_config") if isinstance(data.get("fsdp_config"), dict) else {}
    pc = data.get("parallelism_config") if isinstance(data.get("parallelism_config"), dict) else {}
    for block, owner in (("deepspeed_config", "DEEPSPEED"), ("fsdp_config", "FSDP")):
        if data.get(block) and kind != owner:
            bad((block,), f"{block} with distributed_type {kind}: accelerate ignores it",
                f"set distributed_type: {owner}, or remove {block}", "warning")
    if kind == "FSDP" and data.get("use_cpu") is True:
        bad(("use_cpu",), f"use_cpu true with distributed_type FSDP: {CPU_FSDP_PROBLEM}",
            "on GPUs set use_cpu: false; on CPU launch with torchrun and call torch's fully_shard in the script")
    if kind == "DEEPSPEED" and ds.get("deepspeed_config_file"):
        given = [k for k in _DS_FILE_EXCLUSIVE if k in ds] + (["mixed_precision"] if data.get("mixed_precision") is not None else [])
        for key in given:
            parts = ("mixed_precision",) if key == "mixed_precision" else ("deepspeed_config", key)
            bad(parts, f"{key} next to deepspeed_config_file: accelerate raises 'When using deepspeed_config_file, "
                "the following accelerate config variables will be ignored' (DeepSpeedPlugin)",
                "delete it here; the DeepSpeed JSON says it (bf16/fp16, zero_optimization, gradient_* keys)")
    ds_sp = kind == "DEEPSPEED" and pc.get("parallelism_config_sp_backend") == "deepspeed"
    if pc and ds_sp:  # Ulysses / ALST: DeepSpeed's own groups (parallelism_config.py:361-366 skips the size check)
        _deepspeed_sp_problems(pc, world_size, bad)
    elif pc:
        # launch.py:1261 refuses --use_parallelism_config without FSDP2 (the file's parallelism_config sets it)
        if kind != "FSDP" or str(fsdp.get("fsdp_version", 1)) != "2":
            bad(("parallelism_config",), "parallelism_config needs FSDP2: accelerate launch raises 'You cannot use "
                "--use_parallelism_config without --use_fsdp and --fsdp_version=2'",
                "set distributed_type: FSDP and fsdp_config.fsdp_version: 2, or remove parallelism_config")
        sizes = {k: pc.get(f"parallelism_config_{k}_size", 1) for k in ("dp_replicate", "dp_shard", "tp", "cp", "sp")}
        if all(_int(v) and v >= 1 for v in sizes.values()):
            total = sizes["dp_replicate"] * sizes["dp_shard"] * sizes["tp"] * sizes["cp"] * sizes["sp"]
            if total != world_size:  # parallelism_config.py:368
                bad(("parallelism_config",), f"dp_replicate x dp_shard x tp x cp x sp = {total}, the job has "
                    f"{world_size} ranks (ParallelismConfig total_size must equal num_processes)",
                    "make the sizes multiply to the world size")
            # parallelism_config.py:332 (1.16 refuses CP, no longer TP, over pure replication; FSDP2 with TP there
            # still has no dimension to shard over, the check below)
            if sizes["cp"] > 1 and sizes["dp_replicate"] > 1 and sizes["dp_shard"] == 1:
                bad(("parallelism_config",), "CP with pure replication (dp_replicate > 1, dp_shard 1): "
                    "ParallelismConfig raises", "shard over dp instead (dp_shard > 1)")
            if kind == "FSDP" and sizes["dp_shard"] == 1 and sizes["cp"] == 1:
                bad(("parallelism_config",), "FSDP2 with dp_shard 1 and cp 1 has no dimension to shard across: "
                    "accelerate raises (ParallelismConfig._validate_accelerator, parallelism_config.py:377)",
                    "give dp_shard (or cp) more than 1 rank")
            if sizes["cp"] > 1 and sizes["sp"] > 1:
                bad(("parallelism_config",), "cp and sp are mutually exclusive (ParallelismConfig raises, "
                    "parallelism_config.py:325)",
                    "keep one of them")
            for dim, want in (("tp", tp), ("cp", cp)):
                if want > 1 and sizes[dim] != want:
                    bad(("parallelism_config", f"parallelism_config_{dim}_size"),
                        f"{dim} {sizes[dim]} here, the job's {dim} is {want}", f"set it to {want}")
        else:
            bad(("parallelism_config",), f"parallelism sizes must be positive integers, got {sizes}",
                "write positive integers")
    elif tp > 1 or cp > 1:
        bad(("parallelism_config",), f"the job has tp {tp} / cp {cp} but the config no parallelism_config",
            "add parallelism_config (FSDP2) with the job's sizes")
    if kind == "FSDP" and fsdp.get("fsdp_activation_checkpointing_offload") is True \
            and fsdp.get("fsdp_activation_checkpointing") is not True:  # utils/dataclasses.py:1842-1843
        bad(("fsdp_config", "fsdp_activation_checkpointing_offload"), "activation checkpointing offload without "
            "activation checkpointing: accelerate raises '`activation_checkpointing_offload=True` requires "
            "`activation_checkpointing=True`'", "set fsdp_activation_checkpointing: true, or remove the offload")
    if kind == "FSDP" and fsdp.get("fsdp_cpu_ram_efficient_loading") is True \
            and fsdp.get("fsdp_sync_module_states") is False:  # utils/launch.py:277-278
        bad(("fsdp_config", "fsdp_sync_module_states"), "fsdp_cpu_ram_efficient_loading without "
            "fsdp_sync_module_states: accelerate launch raises 'When using --fsdp_cpu_ram_efficient_loading set "
            "--fsdp_sync_module_states to True'", "set fsdp_sync_module_states: true")
    if kind == "FSDP" and str(fsdp.get("fsdp_version", 1)) == "2" and "fsdp_sharding_strategy" in fsdp:
        bad(("fsdp_config", "fsdp_sharding_strategy"), "fsdp_sharding_strategy is FSDP1's; FSDP2 uses "
            "fsdp_reshard_after_forward", "replace it by fsdp_reshard_after_forward: true (FULL_SHARD) or false",
            "warning")


def _deepspeed_sp_problems(pc: dict, world_size: int, bad) -> None:
    """DeepSpeed's sequence parallelism (accelerate's ParallelismConfig with sp_backend deepspeed): its sp size
    must split the ranks (DeepSpeed builds the SP groups over them, initialize_sequence_parallel)."""
    sp = pc.get("parallelism_config_sp_size", 1)
    if not (_int(sp) and sp >= 1):
        bad(("parallelism_config", "parallelism_config_sp_size"), f"sp size must be a positive integer, got {sp!r}",
            "write a positive integer")
    elif world_size % sp:
        bad(("parallelism_config", "parallelism_config_sp_size"), f"sp {sp} does not split the job's {world_size} "
            "ranks into sequence-parallel groups", f"choose an sp dividing {world_size}")


def deepspeed_json_path(config_path: str | Path, file: str) -> Path | None:
    """The DeepSpeed JSON an accelerate config's deepspeed_config_file names: from the working directory, where
    accelerate opens it (HfDeepSpeedConfig), else beside the config; None where neither holds it."""
    return next((c for c in (Path(file), Path(config_path).parent / file) if c.is_file()), None)


def _referenced_problems(path: str | Path, data: dict, world_size: int, bad) -> None:
    """What accelerate 1.16.0 refuses in what the config points to or sizes for another launcher: the DeepSpeed JSON
    of deepspeed_config_file (opened from the working directory, utils/deepspeed.py HfDeepSpeedConfig; its ZeRO block,
    utils/dataclasses.py:1175-1176; the JSON's own problems, its "auto" values accelerate's to fill), and Megatron-LM's
    tp x pp (megatron_lm_tp_degree / megatron_lm_pp_degree) against the processes."""
    kind = str(data.get("distributed_type"))
    ds = data.get("deepspeed_config") if isinstance(data.get("deepspeed_config"), dict) else {}
    file = ds.get("deepspeed_config_file")
    if kind == "DEEPSPEED" and isinstance(file, str) and file:
        found = deepspeed_json_path(path, file)
        if found is None:  # it may sit where the job runs: said, not refused
            bad(("deepspeed_config", "deepspeed_config_file"), f"{file} is not here (from the working directory or "
                "beside this file): not checked; accelerate raises 'Expected a string path to an existing deepspeed "
                "config' where it is not there at launch either", "validate the JSON too, or run from its folder",
                "warning")
            return
        from autotune.emit.validate import read_deepspeed_config, validate_deepspeed_config

        config = read_deepspeed_config(found)[0]
        if isinstance(config, dict) and "zero_optimization" not in config:
            bad(("deepspeed_config", "deepspeed_config_file"), f"{file} has no zero_optimization block: accelerate "
                "raises 'Please specify the ZeRO optimization config in the DeepSpeed config.'",
                "add a zero_optimization block (its stage) to the JSON")
        for p in validate_deepspeed_config(found, world_size=world_size, hf=True):
            bad(("deepspeed_config", "deepspeed_config_file"), f"{file} {p.path}: {p.message}", p.fix, p.severity)
    meg = data.get("megatron_lm_config") if isinstance(data.get("megatron_lm_config"), dict) else {}
    sizes = [meg.get(f"megatron_lm_{d}_degree", 1) for d in ("tp", "pp")]
    if kind == "MEGATRON_LM" and all(_int(v) and v >= 1 for v in sizes) and world_size % (sizes[0] * sizes[1]):
        bad(("megatron_lm_config",), f"megatron_lm_tp_degree x megatron_lm_pp_degree = {sizes[0]} x {sizes[1]} does "
            f"not divide the {world_size} processes: Megatron-LM refuses the world size", "make tp x pp divide it")
