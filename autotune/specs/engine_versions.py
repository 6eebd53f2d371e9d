"""The releases each engine models, and which one a run uses (``--engine-version``).

An engine declares an :class:`EngineVersions` record: the pip distribution whose release picks the rules, flag
tables, file formats and defaults (``megatron-core``, ``torchtitan``, ...), the releases modelled (oldest first, the
newest last) and the companion packages its files are written for. A release is written as its leading version
components: ``"0.19"`` stands for every 0.19.x, ``"5"`` for every transformers 5.x.

Which release a run uses (:func:`resolve_version`): the one asked for; else the installed one, where the package is
importable and its release is modelled; else the newest modelled. An unmodelled release is an :class:`InputError`
naming the modelled ones and the nearest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.errors import InputError

__all__ = ["EngineVersions", "installed_version", "release_of", "nearest_release", "resolve_version",
           "parse_engine_version_flag"]


@dataclass(frozen=True, slots=True)
class EngineVersions:
    """The releases of one engine's package that autotune models."""

    package: str
    """The pip distribution (``importlib.metadata`` name) whose release is modelled."""
    label: str
    """How users call it: "Megatron-core", "torchtitan"."""
    modelled: tuple[str, ...]
    """Releases modelled, oldest first; the last is the default where the package is not installed."""
    companions: tuple[tuple[str, str], ...] = ()
    """(package, release) pairs the engine's files are also written for (accelerate 1.16 for an FSDP2 config)."""

    def __post_init__(self) -> None:
        assert self.modelled, "an engine models at least one release"
        assert list(self.modelled) == sorted(self.modelled, key=_key), f"{self.modelled}: oldest first"

    @property
    def newest(self) -> str:
        return self.modelled[-1]

    def shown(self, release: str) -> str:
        """``5`` -> ``5.x``; ``0.19`` -> ``0.19``."""
        return f"{release}.x" if "." not in release else release

    def describe(self) -> str:
        """``Megatron-core 0.16, 0.17, 0.18, 0.19`` (+ companions)."""
        text = f"{self.label} {', '.join(self.shown(r) for r in self.modelled)}"
        return text + "".join(f" / {p} {r}" for p, r in self.companions)


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


def _numeric(version: str) -> tuple[int, ...] | None:
    """(0, 19, 2) of "0.19.2" / "0.19.2rc1" / "v0.19"; None when it does not start with a number."""
    parts = []
    for piece in version.strip().lstrip("vV").split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits or len(digits) > 9:  # no release number runs to ten digits (and int() refuses 4,300)
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(parts) or None


_ASK_METADATA = object()  # _dist_info_version cannot tell: importlib.metadata decides


def _dist_info_version(package: str):
    """The version in the name of ``package``'s ``NAME-VERSION.dist-info`` folder in the first folder of sys.path that
    has one (where importlib.metadata looks: the first found wins), None where no folder has one; _ASK_METADATA
    where an ``.egg-info`` / ``.egg`` of it comes first (its version is inside). A folder listing per sys.path entry
    (~1 ms) instead of importing importlib.metadata and the email parser it reads METADATA with (~20-30 ms of
    every plan / estimate / emit)."""
    import os
    import re
    import sys

    def normal(name: str) -> str:
        return re.sub(r"[-_.]+", "_", name).lower()  # PEP 503 names, as importlib.metadata compares them

    want = normal(package)
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip file, a missing folder
            continue
        for name in names:
            stem, dot, kind = name.rpartition(".")
            if kind not in ("dist-info", "egg-info", "egg") or not dot:
                continue
            dist, _, version = stem.partition("-")
            if normal(dist) == want:
                return version if kind == "dist-info" and version else _ASK_METADATA
    return None


def installed_version(package: str) -> str | None:
    """The installed release of a pip distribution, or None where it is not installed."""
    quick = _dist_info_version(package)
    if quick is not _ASK_METADATA:
        return quick
    import importlib.metadata  # here, not at import: 18 ms of every command's start-up otherwise

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a broken install's metadata: treated as not installed
        return None


def release_of(version: str, versions: EngineVersions) -> str | None:
    """The modelled release a version belongs to ("0.19.2" -> "0.19"), or None."""
    number = _numeric(version)
    if number is None:
        return None
    for release in versions.modelled:
        want = _key(release)
        if number[:len(want)] == want:
            return release
    return None


def nearest_release(version: str, versions: EngineVersions) -> str:
    """The modelled release closest to ``version``, comparing major x 1000 + minor (1.0 is nearer 0.19 than
    0.16; ties go to the newer)."""
    number = (_numeric(version) or (0,)) + (0,)

    def position(parts: tuple[int, ...]) -> int:
        return parts[0] * 1000 + (parts[1] if len(parts) > 1 else 0)

    return min(reversed(versions.modelled), key=lambda r: abs(position(_key(r)) - position(number)))


def resolve_version(versions: EngineVersions, requested: str | None, *, engine: str) -> tuple[str, str]:
    """(release, why) for an engine: ``requested``, else the installed release where modelled, else the newest."""
    if requested is not None:
        release = release_of(requested, versions)
        if release is None:
            raise InputError([unmodelled_message(requested, versions, engine=engine)], subject="--engine-version")
        return release, "asked for"
    installed = installed_version(versions.package)
    if installed is not None and release_of(installed, versions) is not None:
        return release_of(installed, versions), f"installed {versions.package} {installed}"
    if installed is not None:
        return versions.newest, (f"the newest modelled; the installed {versions.package} {installed} is not "
                                 f"modelled (nearest {versions.shown(nearest_release(installed, versions))})")
    return versions.newest, "the newest modelled"


def unmodelled_message(version: str, versions: EngineVersions, *, engine: str) -> str:
    """What to say about a release autotune does not model: the ones it does, and the nearest."""
    near = versions.shown(nearest_release(version, versions))
    return (f"{engine}: {versions.label} {version} is not a release autotune models (it models "
            f"{', '.join(versions.shown(r) for r in versions.modelled)}); the nearest is {near}: "
            f"--engine-version {engine}={near}")


def parse_engine_version_flag(text: str | None, engines: Sequence[str],
                              declared: Mapping[str, EngineVersions]) -> dict[str, str]:
    """``--engine-version`` as {engine: release asked for}: ``ENGINE=VER[,ENGINE=VER]``, or a bare ``VER`` when
    exactly one engine is in play. Unknown engines, unmodelled releases: an InputError naming the way out."""
    if not text:
        return {}
    problems: list[str] = []
    asked: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        name, sep, version = item.rpartition("=")
        if not sep:
            if len(engines) != 1:
                problems.append(f"{item!r} names no engine and {len(engines)} engines are in play "
                                f"({', '.join(engines) or 'none'}): write ENGINE=VERSION (megatron=0.18)")
                continue
            name, version = engines[0], item
        if name not in declared:
            problems.append(f"{name!r} is not an engine (known: {', '.join(declared)})")
            continue
        if release_of(version, declared[name]) is None:
            problems.append(unmodelled_message(version, declared[name], engine=name))
            continue
        asked[name] = release_of(version, declared[name])
    if problems:
        raise InputError(problems, subject="--engine-version")
    return asked
