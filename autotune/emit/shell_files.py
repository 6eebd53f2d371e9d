"""The files a launch script writes before its launch line, as read without running it: a here-document
(``cat <<EOT > $DS_CONFIG ... EOT``, its body expanded with the script's variables as
:class:`autotune.emit.bash_reader.BashReader` expands them) or a template passed through ``sed`` substitutions
(``sed "s/CONFIG_BATCH_SIZE/${GLOBAL_BATCH_SIZE}/" ${template_json} | sed ... > ${config_json}``), the two forms
Megatron-DeepSpeed's examples write their DeepSpeed config in (examples_deepspeed/azure/run-1t.sh:66-111,
examples_deepspeed/MoE/ds_pretrain_gpt_1.3B_PR-MoE64or128.sh:305-315 at deepspeedai/Megatron-DeepSpeed@4efb479d).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from autotune.emit.shell_args import MAX_ARGS_FILE_BYTES, parse_shell_launch
from autotune.inputs import read_text

__all__ = ["Written", "WrittenFiles", "read_written_files", "substituted"]


@dataclass(frozen=True)
class Written:
    """A file the script writes: a here-document's ``text``, or ``template`` through ``subs`` (sed's ``s``
    commands: pattern, replacement, every match); ``line``: where the writing command starts."""

    line: int
    text: str | None = None
    template: str | None = None
    subs: tuple[tuple[str, str, bool], ...] = ()
    unread: str | None = None
    """Why the sed pipeline could not be read (an option or command other than ``-e`` and ``s///``)."""


_SUB = re.compile(r"^s(.)((?:\\.|(?!\1).)*)\1((?:\\.|(?!\1).)*)\1([gI0-9]*)$", re.S)


def _sed(words: list[str]) -> tuple[list[tuple[str, str, bool]], list[str], str | None]:
    """(substitutions, input files, why not read) of one ``sed`` command's words (after ``sed``)."""
    exprs, files, scripted, why = [], [], False, None
    i = 0
    while i < len(words):
        w = words[i]
        if w in ("-e", "--expression") and i + 1 < len(words):
            exprs.append(words[i + 1])
            scripted, i = True, i + 2
            continue
        if w.startswith("-") and w != "-":
            why = why or f"sed option {w}"
        elif not scripted and not exprs:
            exprs.append(w)
        else:
            files.append(w)
        i += 1
    subs = []
    for expr in exprs:
        for part in filter(None, (p.strip() for p in expr.split(";"))):
            m = _SUB.match(part)
            if not m or set(m.group(4)) - {"g"}:
                why = why or f"sed command {part!r}"
                continue
            subs.append((m.group(2), m.group(3), "g" in m.group(4)))
    return subs, files, why


def substituted(text: str, subs: tuple[tuple[str, str, bool], ...]) -> str:
    """``text`` through sed's ``s`` commands (basic regular expressions as Python's, ``&`` the match)."""
    for pattern, replacement, every in subs:
        regex = re.sub(r"\\([(){}+?|])", r"\1", pattern)  # BRE's \( \) \{ \}: groups and counts
        repl = re.sub(r"\\(\d)", r"\\g<\1>", replacement.replace("\\&", "\0")).replace("&", r"\g<0>")
        try:
            text = re.sub(regex, repl.replace("\0", "&"), text, count=0 if every else 1)
        except re.error:  # a pattern Python's re does not take: the text as written
            text = text.replace(pattern, replacement, -1 if every else 1)
    return text


class WrittenFiles:
    """What :func:`autotune.emit.shell_args.parse_shell_launch` calls on each command it reads (``take``)."""

    def __init__(self) -> None:
        self.files: dict[str, Written] = {}
        self._pipe: list[tuple[list, list, str | None, int]] = []  # the sed commands of an open pipeline

    def take(self, words: list, operator: str, redirects: list[tuple[str, str]]) -> None:
        names = [w for w, _ in words]
        line = words[0][1][0] if words and words[0][1] else 0
        target = next((t for op, t in redirects if op in (">", ">|", "&>")), None)
        body = next((t for op, t in redirects if op == "<<"), None)
        if body is not None and target:
            self.files[target] = Written(line=line, text=body)
            return
        if not names or names[0].rsplit("/", 1)[-1] != "sed":
            self._pipe = []
            return
        subs, files, why = _sed(names[1:])
        if "-i" in names[1:] and files:  # in place: the file is its own template
            self.files[files[-1]] = Written(line=line, template=files[-1], subs=tuple(subs))
            return
        self._pipe.append((subs, files, why, line))
        if operator == "|":
            return
        pipe, self._pipe = self._pipe, []
        if target:
            first = pipe[0]
            why = next((w for _, _, w, _ in pipe if w), None)
            template = first[1][0] if len(first[1]) == 1 and all(not f for _, f, _, _ in pipe[1:]) else None
            self.files[target] = Written(line=first[3], template=template,
                                         subs=tuple(s for p in pipe for s in p[0]),
                                         unread=why or (None if template else "no single template file"))


def read_written_files(path: str | Path) -> dict[str, Written]:
    """The files the shell script at ``path`` writes with a here-document or a sed template, by the name it writes
    them to (its variables expanded)."""
    written = WrittenFiles()
    parse_shell_launch(read_text(path, subject="Megatron arguments file", max_bytes=MAX_ARGS_FILE_BYTES), path,
                       written)
    return written.files
