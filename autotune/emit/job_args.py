"""What a job's shell files say as ``--flag value`` words, and the world size of their launch line (``torchrun
--nnodes N --nproc-per-node G ... pretrain_gpt.py``, the DeepSpeed launcher's ``--num_nodes`` / ``--num_gpus`` or
``--include host:0,1,...``):
for ``autotune.job_files`` (``estimate --from`` / ``plan --from``). Nothing is run."""

from __future__ import annotations

import re
from typing import NamedTuple

from autotune.emit.bash_reader import ASSIGN, ShellState
from autotune.emit.shell_source import SourcingReader
from autotune.errors import InputError
from autotune.inputs import read_text

__all__ = ["FROM_SUBJECT", "LaunchSizes", "flags_of", "whole", "number", "launch_sizes"]

FROM_SUBJECT = "--from files"
_LAUNCHERS = ("torchrun", "deepspeed", "torch.distributed.run", "torch.distributed.launch")


def flags_of(argv: list[str]) -> dict[str, str | None]:
    """The last value of each ``--flag`` (argparse keeps the last); a switch maps to None."""
    out: dict[str, str | None] = {}
    for i, a in enumerate(argv):
        if not a.startswith("--"):
            continue
        name, eq, value = a.partition("=")
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        out[name.replace("_", "-")] = value if eq else (nxt if nxt is not None and not nxt.startswith("--") else None)
    return out


def whole(text, what: str, path: str) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except (TypeError, ValueError):
        raise InputError([f"{path}: {what} is {str(text)[:40]!r}, not a number (a shell expansion autotune does not "
                          f"run?): give it as a number"], subject=FROM_SUBJECT) from None


def number(text, what: str, path: str) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        raise InputError([f"{path}: {what} is {str(text)[:40]!r}, not a number: give it as a number"],
                         subject=FROM_SUBJECT) from None


class LaunchSizes(NamedTuple):
    """A launch line's sizes, each None where it does not state it as a number (or there is no launch line)."""

    nodes: int | None
    per_node: int | None
    nodes_default: str | None = None
    """The ``${VAR:-N}`` the node count falls back to where the file leaves it to the run's environment
    (``NNODES=${SLURM_NNODES:-1}``, Megatron-LM's Mixtral example): ``nodes`` is its default, not a stated size."""


_DEFAULTED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?-[^}]*\}")


def _environment_default(text: str, lines: tuple[int, ...]) -> str | None:
    """The ``${VAR:-N}`` on the source lines a word came from whose VAR the file never sets (the environment's)."""
    source = text.splitlines()
    for line in sorted(set(lines)):
        for m in _DEFAULTED.finditer(source[line - 1] if 0 < line <= len(source) else ""):
            if not re.search(rf"^\s*(?:export\s+)?{m.group(1)}=", text, re.MULTILINE):
                return m.group(0)
    return None


def _included(spec: str | None) -> tuple[int, int] | None:
    """(nodes, GPUs per node) of the DeepSpeed launcher's ``--include NAME:SLOT,SLOT@NAME:SLOT,...`` where every host
    lists its slots, as many each (deepspeed 0.19.8 launcher/runner.py:292-352, parse_resource_filter: the listed
    slots are the ones run; a host without slots runs all of its hostfile's, which the line does not state)."""
    if not spec:
        return None
    counts = []
    for node in spec.split("@"):
        _, colon, slots = node.partition(":")
        if not colon or not all(s.strip().isdigit() for s in slots.split(",")):
            return None
        counts.append(len(set(s.strip() for s in slots.split(","))))
    return (len(counts), counts[0]) if len(set(counts)) == 1 else None


def launch_sizes(path: str) -> LaunchSizes:
    """(nodes, GPUs per node, the environment default of the nodes) of the file's launch line (torchrun / deepspeed
    launcher), each None where the line does not state it as a number (or there is no launch line)."""
    state = ShellState()
    text = read_text(path, subject="launch script", max_bytes=1 << 20)
    reader = SourcingReader(text, state, path)
    while (tokens := reader.command()) is not None:
        words = [t for t in tokens if not isinstance(t, str)]
        if not words:
            continue
        m = ASSIGN.match(words[0][0])
        if m and "(" in tokens and not m.group(3):
            opened = tokens.index("(")
            closed = tokens.index(")") if ")" in tokens else len(tokens)
            elements = [t for t in tokens[opened + 1:closed] if not isinstance(t, str)]
            state.arrays.setdefault(m.group(1), []) if m.group(2) else state.arrays.__setitem__(m.group(1), [])
            state.arrays[m.group(1)].extend(elements)
            continue
        while words and (m := ASSIGN.match(words[0][0])):
            state.variables[m.group(1)] = (m.group(3), words[0][1][len(words[0][0]) - len(m.group(3)):])
            words = words[1:]
        texts = [w for w, _ in words]
        launcher = next((i for i, w in enumerate(texts) if w.rsplit("/", 1)[-1] in _LAUNCHERS), None)
        if launcher is None:
            continue
        end = next((i for i, w in enumerate(texts) if i > launcher and (w.endswith(".py") or w in ("-m", "--module"))),
                   len(texts))
        f = flags_of(texts[launcher + 1:end])
        nodes = str(f.get("--nnodes") or f.get("--num-nodes") or ("1" if "--nnodes" not in f and "--num-nodes" not in f
                                                                  else "")).split(":")[-1]
        per_node = f.get("--nproc-per-node") or f.get("--num-gpus")
        named = next((i for i, w in enumerate(texts) if i > launcher and w.replace("_", "-").split("=")[0] in (
            "--nnodes", "--num-nodes")), None)
        word = words[named] if named is not None and "=" in texts[named] else (
            words[named + 1] if named is not None and named + 1 < len(words) else None)
        if (included := _included(f.get("--include"))) is not None:  # the DeepSpeed launcher's hosts and slots
            return LaunchSizes(*included)
        # A size the shell computes at run time ($SLURM_NNODES, $(nvidia-smi ...)) is not stated: the flags say it.
        return LaunchSizes(int(nodes) if nodes.isdigit() else None,
                           int(per_node) if per_node and per_node.isdigit() else None,
                           _environment_default(text, word[1]) if word is not None else None)
    return LaunchSizes(None, None)
