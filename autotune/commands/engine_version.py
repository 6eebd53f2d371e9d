"""``--engine-version``: which release of each engine's package a command models (``autotune.specs.engine_versions``).

``--engine-version 0.18`` when one engine is in play, ``--engine-version megatron=0.18,fsdp=0.2`` for several.
Unset: the installed release where the package is installed and modelled, else the newest modelled. emit's older
``--torchtitan-version V`` is ``--engine-version fsdp=V``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace

from autotune.specs.engine_versions import parse_engine_version_flag, resolve_version
from autotune.errors import InputError

__all__ = ["add_engine_version", "engine_releases", "options_for_versions", "print_versions", "recorded_releases",
           "release_cost_settings", "release_run_settings", "search_releases"]


def add_engine_version(p) -> None:
    p.add_argument("--engine-version", metavar="[ENGINE=]VERSION",
                   help="the engine release to model, e.g. 0.18 (one engine) or megatron=0.18,fsdp=0.2: Megatron-core "
                        "0.16-0.19 (its flag table), torchtitan 0.2 (TOML) / 0.3 (config module), DeepSpeed 0.19, "
                        "transformers 5.x (default: the installed release where modelled, else the newest)")


def engine_releases(args: argparse.Namespace, engines: Sequence[str], *,
                    recorded: Mapping[str, str] | None = None) -> dict[str, tuple[str, str]]:
    """{engine: (release, why)} for ``engines`` from ``--engine-version`` (and emit's ``--torchtitan-version``);
    ``recorded``: the releases a plan JSON was made for (``recorded_releases``), where the flags name none."""
    from autotune.engines import ENGINES

    declared = {name: engine.versions for name, engine in ENGINES.items()}
    in_play = list(dict.fromkeys(engines))
    asked = parse_engine_version_flag(getattr(args, "engine_version", None), in_play, declared)
    titan = getattr(args, "torchtitan_version", None)
    if titan is not None:
        if asked.get("fsdp", titan) != titan:
            raise InputError([f"--torchtitan-version {titan} and --engine-version fsdp={asked['fsdp']} disagree: "
                              "give one (--torchtitan-version V is --engine-version fsdp=V)"],
                             subject="--engine-version")
        asked["fsdp"] = titan
    kept = {name: release for name, release in (recorded or {}).items()
            if name in in_play and name not in asked and release in declared[name].modelled}
    return {name: (kept[name], "as the plan JSON records") if name in kept else
            resolve_version(declared[name], asked.get(name), engine=name) for name in in_play}


def recorded_releases(doc: Mapping) -> dict[str, str]:
    """The releases a plan JSON was made for: ``plan --json``'s ``engine_versions``, a bundle plan.json's
    ``engine_version``; {} where it names none (written before they were recorded)."""
    one = doc.get("engine_version")
    out = dict(doc.get("engine_versions") or {})
    if isinstance(one, Mapping) and isinstance(one.get("engine"), str):
        out[one["engine"]] = one.get("release")
    return {k: v for k, v in out.items() if isinstance(k, str) and isinstance(v, str)}


def search_releases(args: argparse.Namespace, engines: Sequence[str]) -> dict[str, str]:
    """{engine: release} for a search (``SearchConstraints.engine_versions``: each engine's plans get its release's
    own defaults): every engine in play where ``--engine-version`` is given, else those whose modelled releases
    have defaults of their own (``Engine.release_defaults``); the others' packages are not looked up (milliseconds
    each), their plans are the same under every release."""
    from autotune.engines import ENGINES

    from autotune.commands import run_setting_args

    if not getattr(args, "engine_version", None):
        engines = [e for e in engines if any(ENGINES[e].release_defaults(r) for r in ENGINES[e].versions.modelled)]
    out = {name: release for name, (release, _) in engine_releases(args, engines).items()}
    for name, release in out.items():
        _refuse_settings_the_release_lacks(name, release, run_setting_args(args))
    return out


# Run settings that only some modelled releases of an engine have: (engine, setting) -> the flag of its files whose
# presence in a release's flag table says the release has it.
_RELEASE_FLAGS = {("megatron", "fp8_output_proj"): "--fp8-output-proj"}  # core_v0.18.0+ (NVIDIA/Megatron-LM 3f6a2ed844)


def _refuse_settings_the_release_lacks(engine: str, release: str, asked: Mapping[str, object]) -> None:
    """InputError naming each asked run setting ``release`` of ``engine`` lacks (a Megatron-core release whose
    parser has no ``--fp8-output-proj`` has no TransformerConfig.fp8_output_proj either) and the releases that have
    it."""
    from autotune.emit.megatron_flags import releases_with_flag
    from autotune.emit.megatron_versions import releases_text

    problems = []
    for (name, setting), flag in _RELEASE_FLAGS.items():
        if name != engine or not asked.get(setting):
            continue
        has = releases_with_flag(flag)
        if release not in has:
            problems.append(f"--{setting.replace('_', '-')}: Megatron-core {release} has no {setting} (its "
                            f"arguments.py has no {flag}; Megatron-core {releases_text(has)} has it): use "
                            f"--engine-version megatron={has[-1]}, or drop --{setting.replace('_', '-')}")
    if problems:
        raise InputError(problems, subject="--engine-version")


def print_versions(releases: dict[str, tuple[str, str]], *, command: str) -> None:
    """One stderr line naming the release modelled for each engine and why."""
    from autotune.engines import ENGINES

    if releases:
        said = "; ".join(f"{name}: {ENGINES[name].versions.label} {ENGINES[name].versions.shown(release)} ({why})"
                         for name, (release, why) in releases.items())
        print(f"autotune {command}: engine versions modelled: {said}", file=sys.stderr)


def options_for_versions(options, releases: dict[str, tuple[str, str]]):
    """EmitOptions with the file formats of the releases in use (torchtitan TOML vs module, Megatron flag table)."""
    changes = {}
    if "fsdp" in releases:
        changes["torchtitan_version"] = releases["fsdp"][0]
    if "megatron" in releases:
        changes["megatron_version"] = releases["megatron"][0]
    return replace(options, **changes) if changes else options


def release_run_settings(args: argparse.Namespace, engine: str, precisions: Sequence[str], *,
                         command: str, model=None) -> dict[str, object]:
    """The run settings of a plan the command line builds for ``engine``: the release's own defaults
    (``Engine.release_defaults``: torchtitan 0.3's chunked loss and rowwise Float8) under the flags given, said on
    stderr when one is taken. ``precisions``: the plan's (``fp8_recipe`` only where FP8 is among them)."""
    from autotune.commands import run_setting_args
    from autotune.engines import ENGINES

    asked = run_setting_args(args)
    release = engine_releases(args, [engine])[engine][0]
    _refuse_settings_the_release_lacks(engine, release, asked)
    taken = {k: v for k, v in ENGINES[engine].release_defaults(release, model).items()
             if k not in asked and (k != "fp8_recipe" or "fp8" in precisions)}
    if taken and not getattr(args, "json", False):
        flags = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in taken.items())
        print(f"autotune {command}: {ENGINES[engine].versions.label} {release} runs {flags} unless told otherwise: "
              "estimated so", file=sys.stderr)
    return taken | asked


def release_cost_settings(args: argparse.Namespace, engine: str) -> dict[str, object]:
    """The cost-model settings of ``engine``'s release in use (``Engine.release_cost_settings``: torchtitan 0.3's
    selective-recompute save set), for both ``MemorySettings`` and ``TimeSettings``."""
    from autotune.engines import ENGINES

    return ENGINES[engine].release_cost_settings(engine_releases(args, [engine])[engine][0])
