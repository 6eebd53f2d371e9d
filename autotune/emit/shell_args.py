"""Reading a shell file of Megatron arguments without running a shell.

The file is split into words as bash does (quotes, ``\\`` continuations, comments, ``$VAR`` / ``${VAR}`` /
``${VAR:-default}`` and ``${ARRAY[@]}`` expansions, word splitting of unquoted expansions), with the variables and
arrays (``ARGS=( ... )``, ``ARGS+=( ... )``) the file sets before the point of use. Nothing is run: command
substitutions (``$(...)``) stay as written. Of an ``if``, the branch a test of known words selects is read
(``[ "$X" = 1 ]``, ``[[ "$DTYPE" == "fp8" ]]``, ``-z`` / ``-n``); with an unknown test, the first branch.
A file the script reads in with ``source`` / ``.`` (its settings) is read in place (``autotune.emit.shell_source``).

The arguments are those given to the training script on a launch line (``torchrun ${DISTRIBUTED_ARGS[@]}
pretrain_gpt.py ${GPT_ARGS[@]}``: the words after ``pretrain_gpt.py``, never the launcher's own
``--nproc_per_node`` / ``--master_addr``). A file with no launch line (``autotune emit``'s ``megatron_args.sh``,
a bare list of flags) gives the contents of its arrays and its ``--flag value`` lines, in order.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from autotune.emit.bash_reader import ASSIGN, BashReader, ShellState, Value, check_line_lengths
from autotune.emit.megatron_flags import is_flag
from autotune.emit.shell_source import SourcingReader
from autotune.inputs import read_text

__all__ = ["SHELL_SUFFIXES", "parse_shell_args", "parse_shell_args_with_lines", "parse_shell_launch",
           "read_megatron_launch", "read_megatron_args_file", "read_megatron_args_file_with_env",
           "read_megatron_args_file_with_lines", "MAX_ARGS_FILE_BYTES"]

SHELL_SUFFIXES = (".sh", ".bash", ".sbatch", ".slurm")
"""The names of the shell files a job's launch lives in (scripts, SLURM batch files)."""

_LAUNCHERS = ("torchrun", "python", "python3", "deepspeed", "srun", "mpirun", "exec", "nohup")
MAX_ARGS_FILE_BYTES = 1 << 20
"""A Megatron argument file is a few KB; Megatron's own examples are under 10 KB."""


def _is_launch(words: list[Value]) -> int | None:
    """The index of the training script on a launch line (``torchrun ... pretrain_gpt.py``, ``uv run python -m
    torch.distributed.run ... pretrain_gpt.py``, ``$LAUNCHER pretrain_gpt.py``), or None."""
    script = next((i for i, (w, _) in enumerate(words) if w.endswith(".py")), None)
    if script is None:
        return None
    first = words[0][0]
    before = {w.rsplit("/", 1)[-1] for w, _ in words[:script]}
    return script if script == 0 or first.startswith("$") or before & set(_LAUNCHERS) else None


def _shell_c(words: list[Value]) -> int | None:
    """The index of the command string of ``bash -c STRING`` / ``bash -x -c STRING`` / ``sh -ec STRING``, or None."""
    for i, (word, _) in enumerate(words):
        if word.rsplit("/", 1)[-1] not in ("bash", "sh"):
            continue
        j = i + 1
        while j < len(words) - 1 and re.fullmatch(r"-[a-z]+", words[j][0]):
            if "c" in words[j][0]:
                return j + 1
            j += 1
    return None


_INTEGER_TESTS = {"-eq": lambda a, b: a == b, "-ne": lambda a, b: a != b, "-lt": lambda a, b: a < b,
                  "-le": lambda a, b: a <= b, "-gt": lambda a, b: a > b, "-ge": lambda a, b: a >= b}


def _test(words: list[str], operator: str) -> bool | None:
    """The value of ``[ A = B ]`` / ``[[ A == B ]]`` / ``!=`` / ``-z A`` / ``-n A`` / ``A -eq B`` (and ``-ne -lt
    -le -gt -ge`` on integers) with every word known (followed by ``operator``), or None: unknown."""
    if len(words) < 2 or (words[0], words[-1]) not in (("[", "]"), ("[[", "]]")):
        return None
    inner = words[1:-1]
    negate = bool(inner) and inner[0] == "!"
    inner = inner[1:] if negate else inner
    # the script's own arguments are none when the file is read (as `$#` is 0): `[ "$1" = "-d" ]` is false
    inner = [re.sub(r"\$(?:[0-9]|\{[0-9]+\})", "", w) for w in inner]
    if any("$" in w or "`" in w for w in inner):
        return None
    if len(inner) == 3 and inner[1] in ("=", "==", "!="):
        value = (inner[0] == inner[2]) == (inner[1] != "!=")
    elif len(inner) == 3 and inner[1] in _INTEGER_TESTS and all(re.fullmatch(r"-?[0-9]+", w) for w in inner[::2]):
        value = _INTEGER_TESTS[inner[1]](int(inner[0]), int(inner[2]))
    elif len(inner) == 2 and inner[0] in ("-z", "-n"):
        value = (inner[1] == "") == (inner[0] == "-z")
    elif len(inner) == 1 and inner[0] in ("-z", "-n"):
        value = inner[0] == "-n"
    else:
        return None
    value = value != negate
    if (value and operator == "&&") or (not value and operator == "||"):
        return None  # decided by the next test
    return value


class _Cases:
    """The open ``case WORD in PATTERN) ... ;; esac`` statements: a clause is read where its pattern matches a known
    word (the first match only, as bash runs it); with an unknown word, the first clause (as an unknown ``if``)."""

    def __init__(self) -> None:
        self.open: list[dict] = []  # per case: its word (None: unknown), a clause matched, reading, expecting a pattern

    @property
    def reading(self) -> bool:
        return all(c["reading"] for c in self.open)

    def step(self, tokens: list) -> list | None:
        """``tokens`` less what the case syntax takes (None: the whole command was case syntax)."""
        words = [t for t in tokens if not isinstance(t, str)]
        head = words[0][0] if words else ""
        if head == "case" and len(words) >= 3 and words[-1][0] == "in":
            word = words[1][0]
            self.open.append({"word": None if "$" in word or "`" in word else word, "matched": False,
                              "reading": False, "expect": True, "alternatives": []})
            return None
        if head == "esac" and self.open:
            self.open.pop()
            return None
        if not self.open or not self.open[-1]["expect"]:
            return tokens
        c = self.open[-1]
        if tokens and tokens[-1] == "|":  # one alternative of a pattern list (``a|b)``)
            c["alternatives"] += [w for w, _ in words]
            return None
        if ")" not in tokens:
            return tokens
        close = tokens.index(")")
        patterns = c["alternatives"] + [t[0] for t in tokens[:close] if not isinstance(t, str)]
        hit = c["word"] is None or any(fnmatch.fnmatchcase(c["word"], p) for p in patterns)
        c.update(reading=not c["matched"] and hit, alternatives=[], expect=False)
        c["matched"] = c["matched"] or c["reading"]
        return tokens[close + 1:]

    def end_clause(self, tokens: list) -> None:
        if self.open and ";;" in tokens:
            self.open[-1].update(reading=False, expect=True)


def parse_shell_args_with_lines(text: str, path: str | Path | None = None) -> tuple[list[str], list[int],
                                                                                  dict[str, str]]:
    """(arguments, each argument's 1-based line, exported variables) of a shell file of Megatron
    arguments (no shell is run): see :func:`parse_shell_args`."""
    argv, lines, env, _ = parse_shell_launch(text, path)
    return argv, lines, env


def parse_shell_launch(text: str, path: str | Path | None = None, written=None
                       ) -> tuple[list[str], list[int], dict[str, str], str | None]:
    """:func:`parse_shell_args_with_lines` and the training script its first launch line runs (None: no launch
    line), whose own flags the linter then knows (``autotune.emit.megatron_scripts``). ``path``: the file ``text``
    is, whose ``source``d files are read in place (``autotune.emit.shell_source``); None: none are. ``written``: a
    :class:`autotune.emit.shell_files.WrittenFiles` told each command read (the files the script writes)."""
    check_line_lengths(text)
    state = ShellState()
    env: dict[str, str] = {}
    listed: list[Value] = []     # array contents and --flag lines, for a file with no launch line
    branches: list[list[bool]] = []  # per open `if` or loop: [this branch is read, a branch was read]
    loops: list[str] = []  # the open loops (their branch entries end at `done`)
    runs: list[tuple[str, list[Value]]] = []  # each launch line: its training script and the words after it
    cases = _Cases()
    reader = SourcingReader(text, state, path)
    while (tokens := reader.command()) is not None:
        tokens = cases.step(tokens)
        if tokens is None:
            continue
        read = cases.reading  # this command's; a ";;" after it ends the clause for the next
        cases.end_clause(tokens)
        words = [t for t in tokens if not isinstance(t, str)]
        while words and words[0][0] in ("then", "do", "{", "}", "done", "!"):
            if words[0][0] == "done" and loops and branches:  # a loop's end: its branch entry goes
                loops.pop()
                branches.pop()
            words = words[1:]
        if not words:
            continue
        head = words[0][0]
        operator = tokens[-1] if tokens and isinstance(tokens[-1], str) and tokens[-1] not in "()" else ""
        if head in ("while", "until", "for"):
            # A loop's body as a branch: a `while` whose test is known false (`while [[ $# -gt 0 ]]` over the
            # script's arguments, none when read) is skipped; any other body is read once.
            value = _test([w for w, _ in words[1:]], operator) if head == "while" else None
            loops.append(head)
            branches.append([value is not False, True])
            continue
        if head in ("echo", "printf"):  # prints a command line (`echo $run_cmd; eval $run_cmd`): runs nothing
            continue
        shell_c = _shell_c(words)  # `srun ... bash -c "$LAUNCHER $CMD"`: its string
        if (head == "eval" and len(words) > 1) or shell_c is not None:
            # eval's words joined, or bash -c's string, read again as command lines, as the shell does: of
            # several (`bash -c "cd $DIR; python pretrain_gpt.py ..."`), the launch line
            sub = BashReader(" ".join(w for w, _ in words[1:]) if shell_c is None else words[shell_c][0], state)
            commands = [c for c in iter(sub.command, None) if any(not isinstance(w, str) for w in c)]
            again = next((c for c in commands if _is_launch([w for w in c if not isinstance(w, str)]) is not None),
                         commands[0] if commands else [])
            line = tuple(words[0][1][:1]) or (0,)  # every word at the eval's line
            words = [(w[0], line * len(w[0])) for w in again if not isinstance(w, str)]
            if not words:
                continue
            head = words[0][0]
        if head in ("if", "elif"):
            # A condition with known words is evaluated; an unknown one reads the first branch not yet excluded.
            value = _test([w for w, _ in words[1:]], operator)
            if head == "if" or not branches:
                branches.append([value is not False, value is not False])
            else:
                done = branches[-1][1]
                branches[-1] = [not done and value is not False, done or value is not False]
            continue
        if head == "else":
            if branches:
                branches[-1] = [not branches[-1][1], True]
            words = words[1:]  # `else X=1` on one line: X=1 is the branch's first command
            if not words:
                continue
            head = words[0][0]
        if head == "fi":
            if branches:
                branches.pop()
            continue
        if not read or not all(taken for taken, _ in branches):
            continue
        if written is not None:
            written.take(words, operator, reader.redirects)
        if head == "export":
            for word, lines in words[1:]:
                m = ASSIGN.match(word)
                if m:
                    state.variables[m.group(1)] = (m.group(3), lines[len(word) - len(m.group(3)):])
                    env[m.group(1)] = m.group(3)
                elif word in state.variables:
                    env[word] = state.variables[word][0]
            continue
        m = ASSIGN.match(head)
        if m and "(" in tokens and not m.group(3) and tokens.index("(") == tokens.index(words[0]) + 1:
            opened = tokens.index("(")
            closed = tokens.index(")") if ")" in tokens else len(tokens)
            elements = [t for t in tokens[opened + 1:closed] if not isinstance(t, str)]
            if m.group(2):
                state.arrays.setdefault(m.group(1), []).extend(elements)
            else:  # a new value (`ARGS=( "${ARGS[@]}" --more )`): the old one is no longer listed
                old = {id(v) for v in state.arrays.get(m.group(1), ())}
                listed[:] = [v for v in listed if id(v) not in old]
                state.arrays[m.group(1)] = list(elements)
            listed.extend(elements)
            continue
        while words and (m := ASSIGN.match(words[0][0])):
            word, lines = words[0]
            value = (m.group(3), lines[len(word) - len(m.group(3)):])
            if m.group(2) and m.group(1) in state.variables:
                old = state.variables[m.group(1)]
                value = (old[0] + value[0], old[1] + value[1])
            state.variables[m.group(1)] = value
            words = words[1:]
        if not words:
            continue
        if is_flag(words[0][0]):
            listed.extend(words)
            continue
        script = _is_launch(words)
        if script is not None:
            runs.append((words[script][0], words[script + 1:]))
    # The training script's lines: the first pretrain_*.py's where one runs (a data-preparation or helper script
    # launched beside it is not the job), else the first script's
    scripts = [name for name, _ in runs]
    # (Bridge's run_recipe.py too: a checkpoint conversion run_conversion.py before it is not the job)
    script_name = next((n for n in scripts if n.rsplit("/", 1)[-1].startswith("pretrain_")
                        or n.rsplit("/", 1)[-1] == "run_recipe.py"), scripts[0]) if runs else None
    launched = [w for name, after in runs if name == script_name for w in after]
    kept = launched if runs else listed
    return [w for w, _ in kept], [lines[0] if lines else 0 for _, lines in kept], env, script_name


def parse_shell_args(text: str) -> tuple[list[str], dict[str, str]]:
    """Arguments and exported variables of a shell file of Megatron arguments (no shell is run).

    Words are split as bash splits them (a quoted ``"--num-layers 96 --hidden-size 12288"`` variable expanded
    unquoted gives four words). With a launch line (``torchrun ... pretrain_gpt.py ARGS``), the arguments
    are the words after the training script; without one, the contents of the file's arrays and its
    ``--flag value`` lines. ``export X=Y`` sets the environment returned.
    """
    argv, _, env = parse_shell_args_with_lines(text)
    return argv, env


def read_megatron_launch(path: str | Path) -> tuple[list[str], list[int], dict[str, str], str | None]:
    """(arguments, their lines, exported variables, the training script) of a shell file of at most 1 MiB."""
    return parse_shell_launch(read_text(path, subject="Megatron arguments file", max_bytes=MAX_ARGS_FILE_BYTES), path)


def read_megatron_args_file_with_lines(path: str | Path) -> tuple[list[str], list[int], dict[str, str]]:
    """(arguments, their lines, exported variables) of a shell file of at most 1 MiB."""
    text = read_text(path, subject="Megatron arguments file", max_bytes=MAX_ARGS_FILE_BYTES)
    return parse_shell_args_with_lines(text, path)


def read_megatron_args_file_with_env(path: str | Path) -> tuple[list[str], dict[str, str]]:
    """(arguments, exported variables) of a shell file: see :func:`parse_shell_args`."""
    argv, _, env = read_megatron_args_file_with_lines(path)
    return argv, env


def read_megatron_args_file(path: str | Path) -> list[str]:
    """The Megatron arguments in a shell file (exports: :func:`read_megatron_args_file_with_env`)."""
    return read_megatron_args_file_with_lines(path)[0]
