"""The DeepSpeed config a Megatron-DeepSpeed launch script writes before it launches and names with
``--deepspeed_config``: a here-document's JSON, or a template filled by sed (``autotune.emit.shell_files`` reads
both), as the fork would load it, or why it cannot be read. ``estimate --from`` takes it as the job's config
(``autotune.job_megatron_deepspeed``); ``validate`` checks the flags against it
(``autotune.emit.megatron_deepspeed_pair.written_pair_problems``).

Source: deepspeedai/Megatron-DeepSpeed@4efb479d megatron/training.py:77-79 (the fork's json.load of the config).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.emit.job_args import FROM_SUBJECT
from autotune.errors import InputError

__all__ = ["WrittenConfig", "written_deepspeed_config", "config_name", "template_given"]

_FORK = "deepspeedai/Megatron-DeepSpeed@4efb479d"


@dataclass(frozen=True)
class WrittenConfig:
    """The config a script writes to ``name`` from its ``line``: ``data`` where it reads (``what``: how the script
    writes it, and where), else ``unread`` (why not, a clause naming the file) and ``fix`` (how to have it read);
    ``template``: the name of the sed template where it is what was not found."""

    name: str
    line: int
    what: str
    data: dict | None = None
    unread: str | None = None
    fix: str | None = None
    template: str | None = None


def config_name(argv: Sequence[str]) -> str | None:
    """The file an argument list names with ``--deepspeed_config`` / ``--deepspeed-config`` (the last one)."""
    name = None
    for i, a in enumerate(argv):
        flag, eq, value = a.partition("=")
        if flag in ("--deepspeed_config", "--deepspeed-config"):
            name = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return name


def template_given(path: str, name: str | None, paths: Sequence[str]) -> str | None:
    """Which of ``paths`` is the template the script at ``path`` fills with sed into ``name`` (its file name the
    one the sed reads, as :func:`written_deepspeed_config` takes a ``given`` one); None: none is."""
    from autotune.emit.shell_files import read_written_files

    written = read_written_files(path).get(name) if isinstance(name, str) and Path(path).is_file() else None
    if written is None or written.text is not None or not written.template:
        return None
    return next((p for p in paths if Path(p).name == Path(written.template).name), None)


def written_deepspeed_config(path: str, name: str | None, given: str | None = None, *, give: str = "with --from",
                             subject: str = FROM_SUBJECT) -> WrittenConfig | None:
    """The DeepSpeed config the script at ``path`` writes to ``name`` (None: it writes none by that name). A sed
    template is ``given`` (its name matching the script's), else the one next to the script, where the fork's
    examples keep it (estimate --from and validate take one given). ``give``: how the caller takes a file (in the
    fixes). InputError (of ``subject``) where the filled text is not a JSON object, which the fork's json.load
    refuses."""
    from autotune.emit.shell_files import read_written_files, substituted
    from autotune.inputs import read_text

    written = read_written_files(path).get(name) if isinstance(name, str) and Path(path).is_file() else None
    if written is None:
        return None
    where = f"{path}:{written.line}"
    if written.text is not None:
        text, what = written.text, f"the DeepSpeed config its here-document writes to {name} ({where})"
    else:
        what = f"the DeepSpeed config its sed commands write to {name} from {written.template} ({where})"
        sed = f"--deepspeed_config {name} is written by sed ({where}) from {written.template or 'a template'}"
        if written.unread:
            return WrittenConfig(name, written.line, what, unread=f"{sed}, with {written.unread}, which autotune "
                                 "does not apply", fix=f"give the filled config {give}")
        beside = Path(path).parent / written.template
        template = given if given and Path(given).name == Path(written.template).name else \
            str(beside) if beside.is_file() else None
        if template is None:
            return WrittenConfig(name, written.line, what, unread=f"{sed}, which is neither next to the script nor "
                                 "given", fix=f"give {Path(written.template).name} {give}",
                                 template=Path(written.template).name)
        text = substituted(read_text(template, subject="DeepSpeed config template", max_bytes=1 << 20), written.subs)
        what = f"the DeepSpeed config its sed commands write to {name} from {template} ({where})"
    unset = sorted(set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", text))) + (["(...)"] if "$(" in text else [])
    if unset:  # a command substitution is not run: what it prints is unknown
        return WrittenConfig(name, written.line, what, unread=f"{what} uses ${', $'.join(unset)}, which the script "
                             "does not set (the run's environment, or a command not run)",
                             fix=f"set them in the script or give the config {give}")
    try:
        ds = json.loads(text)
    except ValueError as err:
        left = sorted(set(re.findall(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b", text)))
        raise InputError([f"{path}: {what} is not JSON ({err.msg}, its line {err.lineno}"
                          f"{'; placeholders left: ' + ', '.join(left) if left else ''}), so the fork's json.load "
                          f"of it fails ({_FORK} megatron/training.py:77-79): substitute them in the script (a sed "
                          f"s command each) or give the filled config {give}"], subject=subject) from None
    if not isinstance(ds, dict):
        raise InputError([f"{path}: {what} is not a JSON object"], subject=subject)
    return WrittenConfig(name, written.line, what, data=ds)
