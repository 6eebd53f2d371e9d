"""The files a launch script reads in with ``source FILE`` / ``. FILE``, read as if their lines stood there.

Launch scripts keep their sizes in a settings file (``source ./config.sh`` then ``--tensor-model-parallel-size
$TP``); without it the flags would read ``$TP``. :class:`SourcingReader` gives the commands of a file with each
sourced file's commands in place of its ``source`` line (after it), sharing the variables, as bash runs them: a
sourced file is not a subshell. Its words carry the ``source`` line's number, the line the user can find in the
file they gave.

Where the file is, without running a shell: a relative name is taken from the folder of the script the user gave
(bash takes it from the working directory: scripts are run from their own folder, ``bash train.sh``); a leading
command substitution with ``dirname`` (``$(dirname "$0")/config.sh``, ``$(cd "$(dirname "${BASH_SOURCE[0]}")" &&
pwd)/config.sh``) is that folder too (``BASH_SOURCE``: the sourcing file's own folder). A file that is not there or
not readable as text (``source ~/.bashrc``, ``source /opt/conda/bin/activate``, a path the shell computes) is left
out, as before this reader: what it would set stays unset, and the flags that need it say so. A file sourced again
inside itself is read once (bash would loop), and at most :data:`MAX_DEPTH` files deep.
"""

from __future__ import annotations

import re
from pathlib import Path

from autotune.emit.bash_reader import BashReader, ShellState, Value, check_line_lengths
from autotune.errors import InputError
from autotune.inputs import read_text

__all__ = ["SourcingReader", "MAX_DEPTH", "MAX_SOURCED_BYTES"]

MAX_DEPTH = 8
"""Sourced files within sourced files read at most this deep."""

MAX_SOURCED_BYTES = 1 << 20
"""A larger sourced file is left out (no settings file is that large)."""

_DIRNAME_PREFIX = re.compile(r"^\$\(.*\bdirname\b.*\)(/.*)$", re.S)


class SourcingReader:
    """:class:`BashReader`'s commands, each sourced file's commands following its ``source`` line."""

    def __init__(self, text: str, state: ShellState, path: str | Path | None, *, folder: Path | None = None,
                 chain: tuple[Path, ...] = ()) -> None:
        """``path``: the file ``text`` is (None: a text of no file, which sources nothing)."""
        self._reader = BashReader(text, state)
        self._state = state
        own = Path(path).resolve() if path is not None else None
        self._own_folder = own.parent if own is not None else None  # this file's folder (BASH_SOURCE)
        self._folder = folder or self._own_folder  # where relative names are found: the given script's folder
        self._chain = (*chain, own) if own is not None else chain
        self._sourced: SourcingReader | None = None
        self._sourced_line = 0

    @property
    def redirects(self) -> list[tuple[str, str]]:
        """The last command's redirections (:attr:`BashReader.redirects`), from whichever file it came."""
        return self._sourced.redirects if self._sourced is not None else self._reader.redirects

    def command(self) -> list[Value | str] | None:
        """The next simple command (:meth:`BashReader.command`), a sourced file's commands after its ``source``."""
        while self._sourced is not None:
            tokens = self._sourced.command()
            if tokens is not None:
                line = self._sourced_line
                return [t if isinstance(t, str) else (t[0], (line,) * len(t[0])) for t in tokens]
            self._sourced = None
        tokens = self._reader.command()
        if tokens and self._folder is not None:
            self._sourced = self._open_sourced(tokens)
        return tokens

    def _open_sourced(self, tokens: list[Value | str]) -> SourcingReader | None:
        words = [t for t in tokens if not isinstance(t, str)]
        if len(words) < 2 or words[0][0] not in ("source", ".") or len(self._chain) >= MAX_DEPTH:
            return None
        path = self._path(words[1][0])
        if path is None or path in self._chain:
            return None
        try:
            text = read_text(path, subject="sourced file", max_bytes=MAX_SOURCED_BYTES)
            check_line_lengths(text)
        except InputError:
            return None
        self._sourced_line = words[0][1][0] if words[0][1] else 0
        return SourcingReader(text, self._state, path, folder=self._folder, chain=self._chain)

    def _path(self, word: str) -> Path | None:
        """The file a ``source`` word names (module docstring), None where it cannot be told or is not a file."""
        m = _DIRNAME_PREFIX.match(word)
        if m:
            folder = self._own_folder if "BASH_SOURCE" in word[: len(word) - len(m.group(1))] else self._folder
            path = Path(folder or ".") / m.group(1).lstrip("/")
        elif "$" in word or "`" in word or word.startswith("~"):
            return None
        else:
            path = Path(word) if word.startswith("/") else Path(self._folder or ".") / word
        try:
            return path.resolve() if path.is_file() else None
        except OSError:
            return None
