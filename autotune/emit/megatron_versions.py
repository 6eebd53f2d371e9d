"""Which Megatron-core release an argument list is for, and what to say when it is not the release in use.

Each modelled release has its own flag table (``autotune.emit.megatron_flags``). A flag the release in use lacks but
another modelled release has is a version mismatch, not a typo: the message names the releases that have it, the
release in use and the installed megatron-core. The files autotune writes say their release in their header
(``HEADER``); a user's file is dated by its flags (the releases whose parser has every one of them).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from autotune.emit.megatron_flags import (
    MEGATRON_CORE_RELEASES,
    is_flag,
    megatron_flag_table,
    megatron_flags_file,
    releases_with_flag,
)
from autotune.emit.problems import Problem

__all__ = ["HEADER", "header_release", "file_releases", "version_problems", "missing_flag_rules", "releases_text",
           "release_in_use"]

HEADER = "Megatron-LM pretrain_gpt.py arguments written by autotune for Megatron-core {release}"
_HEADER = re.compile(r"^#.*written by autotune for Megatron-core (\d+\.\d+)", re.MULTILINE)


def header_release(text: str) -> str | None:
    """The release an autotune-written ``megatron_args.sh`` says it is for (its header), or None."""
    found = _HEADER.search(text)
    return found.group(1) if found else None


def releases_text(releases: Sequence[str]) -> str:
    """("0.16", "0.17", "0.18") -> "0.16-0.18"; ("0.19",) -> "0.19"; gaps spelled out."""
    if not releases:
        return "none"
    indices = [MEGATRON_CORE_RELEASES.index(r) for r in releases]
    if indices == list(range(indices[0], indices[-1] + 1)) and len(indices) > 1:
        return f"{releases[0]}-{releases[-1]}"
    return ", ".join(releases)


def release_in_use(asked: str | None, declared: str | None) -> tuple[str, str | None]:
    """(the Megatron-core release whose table applies, the installed megatron-core version or None): the release
    asked for; else the installed one where modelled; else the one the file says it is for; else the newest."""
    from autotune.specs.engine_versions import installed_version

    installed = installed_version("megatron-core")
    if asked is not None:
        return asked, installed
    for release in MEGATRON_CORE_RELEASES:
        if installed is not None and (installed == release or installed.startswith(release + ".")):
            return release, installed
    if declared in MEGATRON_CORE_RELEASES:
        return declared, installed
    return MEGATRON_CORE_RELEASES[-1], installed


def _flag_names(argv: Sequence[str]) -> list[tuple[int, str]]:
    return [(i, token.partition("=")[0]) for i, token in enumerate(argv) if is_flag(token)]


def file_releases(argv: Sequence[str]) -> tuple[str, ...]:
    """The modelled releases whose parser knows every flag of ``argv`` (empty: no single release does)."""
    names = {name for _, name in _flag_names(argv)}
    return tuple(r for r in MEGATRON_CORE_RELEASES if names <= set(megatron_flag_table(r)))


def _in_use(release: str, installed: str | None) -> str:
    return f"the version in use is Megatron-core {release} (installed: {installed or 'none'})"


def version_problems(argv: Sequence[str], release: str, *, installed: str | None = None,
                     declared: str | None = None, lines: Sequence[int] | None = None) -> tuple[list[Problem], set[str]]:
    """(problems, the flags they cover) for the flags of ``argv`` that ``release``'s parser lacks but another
    modelled release has. ``declared``: the release the file says it is for (its header), else dated by its flags."""
    table = megatron_flag_table(release)
    covered: set[str] = set()
    problems: list[Problem] = []
    fits = file_releases(argv)
    file_is_for = declared or (releases_text(fits) if fits else None)
    for i, name in _flag_names(argv):
        if name in table or name in covered:
            continue
        others = releases_with_flag(name)
        if not others:
            continue  # in no modelled release: the table check reports it as an unknown flag
        covered.add(name)
        where = f"this file is for Megatron-core {file_is_for}; " if file_is_for else ""
        problems.append(Problem(
            path=name, severity="error", source="megatron-core version",
            line=lines[i] if lines is not None and i < len(lines) else None,
            message=(f"version mismatch: {name} exists in Megatron-core {releases_text(others)} but not in "
                     f"{release} ({megatron_flags_file(release)}): {where}{_in_use(release, installed)}"),
            fix=(f"run the file with Megatron-core {releases_text(others)} and validate it with --engine-version "
                 f"megatron={others[-1]}; for {release}, drop {name} (`autotune emit --engine-version "
                 f"megatron={release}` writes {release}'s flags)")))
    return problems, covered


def missing_flag_rules(argv: Sequence[str], release: str) -> list[str]:
    """The emitted flags ``release``'s parser lacks or whose value it refuses (a choice it does not have): one
    message each with its rule and source, for an InputError (a setting this Megatron-core release cannot run)."""
    from autotune.emit.argv_lint import tokenize

    table = megatron_flag_table(release)
    source = f"megatron/training/arguments.py of {release}, {megatron_flags_file(release)}"
    _, found = tokenize(list(argv), table, engine=f"Megatron-core {release}", table_file=megatron_flags_file(release))
    out = [f"{p.message}: Megatron-core {release}'s parser refuses it (source: {source}); use another --engine-version "
           f"or a plan without this setting" for p in found if not p.message.startswith("unrecognized argument")]
    for _, name in _flag_names(argv):
        if name in table:
            continue
        others = releases_with_flag(name)
        has = f"Megatron-core {releases_text(others)} has it" if others else "no modelled release has it"
        out.append(f"{name}: the plan needs it, but Megatron-core {release}'s parser has no such flag "
                   f"(source: {source}); {has}: "
                   f"use --engine-version megatron={others[-1] if others else MEGATRON_CORE_RELEASES[-1]}, or a plan "
                   f"without this setting")
    return out
