"""A ``--command`` trial's plan in the forms an accelerate or torchtitan trainer takes: the files behind
``{accelerate_config}`` and ``{torchtitan_config}``, written into the trial's folder by the emitters ``autotune
emit`` uses (:mod:`autotune.emit.accelerate`, :mod:`autotune.emit.torchtitan`).

``{accelerate_config}``: engine hf plans, accelerate's DeepSpeed YAML beside its concrete DeepSpeed JSON (the
YAML names the JSON by its absolute path, so the command may run accelerate from any folder); engine fsdp plans,
accelerate's FSDP2 YAML, which holds no batch sizes: the command must pass ``{micro_batch}`` and ``{grad_accum}``
too. ``{torchtitan_config}``: engine fsdp plans, torchtitan 0.2's TOML job config (0.3 takes a Python module).
A plan a named placeholder cannot carry is never run (:func:`command_plan_problem` says why).
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from autotune.emit.options import EmitOptions
from autotune.engines import engine_for
from autotune.errors import InputError
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["PLAN_FILE_PLACEHOLDERS", "named_placeholders", "plan_files", "command_plan_problem", "trial_plan_problem"]

PLAN_FILE_PLACEHOLDERS = ("accelerate_config", "torchtitan_config")
"""The placeholders that stand for a file of the plan's, written into the trial's folder."""
_BATCH_PAIR = "--per_device_train_batch_size {micro_batch} --gradient_accumulation_steps {grad_accum}"


def named_placeholders(command: str | None) -> set[str]:
    """The placeholder names a command template uses (none when it does not parse)."""
    try:
        return {field for _, field, _, _ in string.Formatter().parse(command or "") if field}
    except ValueError:
        return set()


def plan_files(name: str, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, options: EmitOptions,
               workdir: Path) -> dict[str, str]:
    """The files placeholder ``name`` stands for, the one it names first: {file name: text}. InputError naming
    what of the plan the file cannot say."""
    engine = engine_for(plan)
    if name == "accelerate_config" and engine.accelerate_distributed_type == "DEEPSPEED":
        from autotune.emit.accelerate import (ACCELERATE_DS_CONFIG, accelerate_deepspeed_config,
                                              accelerate_deepspeed_yaml)
        from autotune.engines.hf import ACCELERATE_YAML

        ds = json.dumps(accelerate_deepspeed_config(model, cluster, plan, options), indent=2) + "\n"
        return {ACCELERATE_YAML: accelerate_deepspeed_yaml(model, cluster, plan, options,
                                                           ds_config_filename=str(workdir / ACCELERATE_DS_CONFIG)),
                ACCELERATE_DS_CONFIG: ds}
    if name == "accelerate_config" and engine.accelerate_distributed_type == "FSDP":
        from autotune.emit.accelerate import accelerate_fsdp_yaml
        from autotune.engines.fsdp import ACCELERATE_FSDP_FILE

        return {ACCELERATE_FSDP_FILE: accelerate_fsdp_yaml(model, cluster, plan, options)}
    if name == "accelerate_config":
        raise InputError([f"accelerate's configs carry engine hf (DeepSpeed) and fsdp (FSDP2) plans, not engine "
                          f"{plan.engine}: tune with --engine hf,fsdp"], subject="{accelerate_config}")
    if name != "torchtitan_config":
        raise ValueError(f"{name!r} is no plan-file placeholder")
    if not engine.torchtitan_jobs:
        raise InputError([f"torchtitan runs engine fsdp plans, not engine {plan.engine}: tune with --engine fsdp"],
                         subject="{torchtitan_config}")
    if options.torchtitan_version != "0.2":
        raise InputError([f"torchtitan {options.torchtitan_version} takes a Python config module, not a TOML job "
                          "config: tune with --engine-version fsdp=0.2 for torchtitan 0.2's TOML"],
                         subject="{torchtitan_config}")
    from autotune.emit.torchtitan import torchtitan_toml
    from autotune.engines.fsdp import TORCHTITAN_FILE

    return {TORCHTITAN_FILE: torchtitan_toml(model, cluster, plan, options)}


def command_plan_problem(command: str | None, model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                         options: EmitOptions | None = None) -> str | None:
    """Why the command's plan-file placeholders cannot carry ``plan`` (the placeholder and the engine named, the
    same words for every plan refused alike), or None."""
    named = named_placeholders(command)
    for name in PLAN_FILE_PLACEHOLDERS:
        if name not in named:
            continue
        try:
            plan_files(name, model, cluster, plan, options or EmitOptions(), Path("."))
        except InputError as err:
            return f"{{{name}}} cannot carry an engine {plan.engine} plan: " + "; ".join(err.problems)
        if name == "accelerate_config" and not {"micro_batch", "grad_accum"} <= named and \
                engine_for(plan).accelerate_distributed_type == "FSDP":
            return ("{accelerate_config} of an engine fsdp plan is accelerate's FSDP2 config, which holds no batch "
                    f"sizes: pass them too, e.g. {_BATCH_PAIR}")
    return None


def trial_plan_problem(spec) -> str | None:
    """:func:`command_plan_problem` for a command trial (a :class:`autotune.tune.trialspec.TrialSpec`), the plan
    named: the study skips such plans, so a trial meets one only when started outside it."""
    why = command_plan_problem(spec.workload.command, spec.trial_model, spec.cluster, spec.plan, spec.emit_options)
    if why is None:
        return None
    from autotune.specs.notation import plan_notation

    return f"plan {plan_notation(spec.plan, engine_for(spec.plan).tag(spec.plan))}: {why}"
