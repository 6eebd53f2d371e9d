"""What a shell script's ``accelerate launch`` lines pass on the command line, which takes precedence over the
config file they name: accelerate 1.16.0 fills from the file only the arguments the command line left at their
defaults (accelerate/commands/launch.py ``_validate_launch_command``: ``if not args.main_process_ip`` and the
like, and its loop over the config's keys, "if getattr(args, name) is None or ... == default"). So a multi-machine
config without ``main_process_ip`` is complete when every script that launches it passes ``--main_process_ip``
(autotune's launch_accelerate.sh does: ``--main_process_ip "${MASTER_ADDR:?...}"``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune.emit.bash_reader import BashReader, ShellState
from autotune.errors import InputError
from autotune.inputs import read_text

__all__ = ["AccelerateLaunch", "accelerate_launches"]


@dataclass(frozen=True)
class AccelerateLaunch:
    """One ``accelerate launch`` command of a script: the config file it names (its file name: the folder part is
    often a variable), and the long options it passes before the training program."""

    config_name: str | None
    options: frozenset[str]


def accelerate_launches(path: str | Path) -> list[AccelerateLaunch]:
    """The ``accelerate launch`` commands of the shell file at ``path`` (no shell is run: autotune.emit.bash_reader);
    [] where it has none or cannot be read as bash words."""
    text = read_text(path, subject=f"launch script {str(path)!r}")
    reader, out = BashReader(text, ShellState()), []
    try:
        while (command := reader.command()) is not None:
            words = [w if isinstance(w, str) else w[0] for w in command]
            at = next((i for i in range(len(words) - 1) if words[i].rsplit("/", 1)[-1] == "accelerate"
                       and words[i + 1] == "launch"), None)
            if at is not None:
                out.append(_launch(words[at + 2:]))
    except InputError:
        return out
    return out


def _launch(args: list[str]) -> AccelerateLaunch:
    """The options before the program (``-m module`` or the first word that is not an option or its value)."""
    options, config, i = set(), None, 0
    while i < len(args) and args[i].startswith("--"):
        name, eq, value = args[i].partition("=")
        options.add(name)
        if not eq and i + 1 < len(args) and not args[i + 1].startswith("-"):
            value, i = args[i + 1], i + 1
        if name == "--config_file":
            config = value.rsplit("/", 1)[-1] or None
        i += 1
    return AccelerateLaunch(config_name=config, options=frozenset(options))
