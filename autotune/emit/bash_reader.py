"""bash's word splitting of a file, without running a shell: one simple command at a time.

Quotes, ``\\`` continuations, comments, ``$VAR`` / ``${VAR}`` / ``${VAR:-default}`` and ``${ARRAY[@]}`` expansions
(with the variables and arrays set so far, :class:`ShellState`), integer ``$(( ))`` arithmetic over known
variables (``WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))``), word splitting of unquoted expansions, here-documents
(their bodies, expanded, among a command's redirections); every character keeps its file line. ``autotune.emit.shell_args`` reads Megatron argument files with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from autotune.emit.shell_arithmetic import integer_expression
from autotune.errors import InputError

__all__ = ["ASSIGN", "BashReader", "ShellState", "Value", "check_line_lengths", "MAX_LINE_CHARS"]

MAX_LINE_CHARS = 1 << 16
"""A longer physical line is refused: no Megatron arguments file has one."""

Value = tuple[str, tuple[int, ...]]
"""A word or a variable's value: its text and the 1-based file line of each character."""

ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)$", re.S)
_ASSIGN_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\+?=")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(?:\[([@*])\])?(?:(:?[-=])(.*))?$", re.S)
_BLANKS = " \t\n"
_HEREDOC = re.compile(r"<<(-?)[ \t]*(?:'([^'\n]*)'|\"([^\"\n]*)\"|([^\s;&|<>()'\"]+))")
"""``<<EOT``, ``<<-EOT``, ``<< 'EOT'``: a here-document's operator and delimiter (quoted: its body unexpanded)."""


@dataclass
class ShellState:
    """The variables and arrays a file has set so far (what its expansions read)."""

    variables: dict[str, Value] = field(default_factory=dict)
    arrays: dict[str, list[Value]] = field(default_factory=dict)


class _Words:
    """The words of one simple command as they are built (word splitting of unquoted expansions included)."""

    def __init__(self) -> None:
        self.words: list[Value] = []
        self.chars: list[str] = []
        self.lines: list[int] = []
        self.started = False

    def add(self, text: str, lines: tuple[int, ...] | list[int], *, split: bool) -> None:
        split = split and not _ASSIGN_PREFIX.match("".join(self.chars))  # bash does not split assignments
        depth, prev = 0, ""  # inside an unrun $( ) or ` ` kept in a value: one word, as the command's output is
        for ch, line in zip(text, lines):
            if ch == "(" and (prev == "$" or depth):
                depth += 1
            elif ch == ")" and depth:
                depth -= 1
            elif ch == "`":
                depth = 0 if depth else 1
            prev = ch
            if split and ch in _BLANKS and not depth:
                self.end()
            else:
                self.chars.append(ch)
                self.lines.append(line)
                self.started = True

    def end(self) -> None:
        if self.started:
            self.words.append(("".join(self.chars), tuple(self.lines)))
        self.chars, self.lines, self.started = [], [], False


class BashReader:
    """bash's word splitting of a file, one simple command at a time (expansions use the variables set so far)."""

    def __init__(self, text: str, state: ShellState) -> None:
        self.text = text
        self.state = state
        self.i = 0
        self.line = 1
        self.redirects: list[tuple[str, str]] = []
        """The last command's redirections: (operator, target word), ``("<<", body)`` for a here-document."""
        self._pending: list[tuple[str, bool, bool]] = []  # here-documents whose bodies follow the line

    # ---- characters ------------------------------------------------------------------------------
    def _peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.text[j] if j < len(self.text) else ""

    def _next(self) -> str:
        ch = self.text[self.i]
        self.i += 1
        if ch == "\n":
            self.line += 1
        return ch

    def _balanced(self, open_: str, close: str) -> str:
        """The raw text up to the ``close`` matching an already consumed ``open_`` (quotes skipped), consumed."""
        depth, out, quote = 1, [], ""
        while self.i < len(self.text):
            ch = self._next()
            out.append(ch)
            if quote:
                if ch == "\\" and quote == '"' and self.i < len(self.text):
                    out.append(self._next())
                elif ch == quote:
                    quote = ""
            elif ch in "'\"":
                quote = ch
            elif ch == "\\" and self.i < len(self.text):
                out.append(self._next())
            elif ch == open_:
                depth += 1
            elif ch == close:
                depth -= 1
                if depth == 0:
                    return "".join(out[:-1])
        return "".join(out)

    # ---- expansions ------------------------------------------------------------------------------
    def _expand(self, words: _Words, quoted: bool) -> bool:
        """Expand the ``$`` at the cursor into ``words``; False (nothing consumed) when it is a literal ``$``.
        Returns True when a quoted ``"${A[@]}"`` made its own words (so an empty array makes none)."""
        line = self.line
        nxt = self._peek(1)
        if nxt == "(":
            self.i += 2
            inner = self._balanced("(", ")")
            raw = "$(" + inner + ")"
            value = self._arithmetic(inner[1:-1]) if inner.startswith("(") and inner.endswith(")") else None
            text = raw if value is None else str(value)  # a command substitution is not run: kept as written
            words.add(text, [line] * len(text), split=value is not None and not quoted)
            return False
        if nxt == "{":
            self.i += 2
            inner = self._balanced("{", "}")
            return self._braced(words, inner, quoted, line)
        if nxt in ("@", "*"):
            self.i += 2
            return True  # the script's own arguments: none when the file is read ("$@" makes no word)
        if nxt == "#":  # their count: 0
            self.i += 2
            words.add("0", [line], split=False)
            return False
        m = _NAME.match(self.text, self.i + 1)
        if not m:
            return False
        self.i = m.end()
        self._scalar(words, m.group(0), "$" + m.group(0), quoted, line)
        return False

    def _arithmetic(self, expr: str) -> int | None:
        """The integer value of a ``$(( ))`` expression whose names are all known integers, else None."""
        def name(m: re.Match) -> str:
            value = self.state.variables.get(m.group(1) or m.group(2) or m.group(3), ("",))[0].strip()
            return value if re.fullmatch(r"-?[0-9]+", value) else "?"
        text = re.sub(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)|\b([A-Za-z_]\w*)\b", name, expr)
        try:
            return integer_expression(text.replace("/", "//").strip())
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, OverflowError):
            return None

    def _scalar(self, words: _Words, name: str, raw: str, quoted: bool, line: int) -> None:
        value = self.state.variables.get(name)
        if value is None and name in self.state.arrays:
            first = self.state.arrays[name][:1]
            value = first[0] if first else ("", ())
        if value is None:
            words.add(raw, [line] * len(raw), split=False)  # unknown: kept as written
        else:
            words.add(*value, split=not quoted)

    def _braced(self, words: _Words, inner: str, quoted: bool, line: int) -> bool:
        m = _BRACED.match(inner)
        raw = "${" + inner + "}"
        if not m:
            words.add(raw, [line] * len(raw), split=False)
            return False
        name, at, op, default = m.groups()
        if at:
            elements = self.state.arrays.get(name)
            if elements is None:
                elements = [self.state.variables[name]] if name in self.state.variables else None
            if elements is None:
                words.add(raw, [line] * len(raw), split=False)
                return False
            # In an assignment (`CMD="python pretrain_gpt.py ${ARGS[@]}"`) bash joins the elements with blanks
            assigning = bool(_ASSIGN_PREFIX.match("".join(words.chars)))
            for n, element in enumerate(elements):
                if n and assigning:
                    words.add(" ", [line], split=False)
                elif n:
                    words.end()
                    words.started = quoted
                words.add(*element, split=not quoted)
                if quoted:
                    words.started = True
            return quoted and not assigning
        if op:
            value = self.state.variables.get(name)
            if value is None or (op.startswith(":") and not value[0]):
                text = default.replace('"', "").replace("'", "")
                text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?",
                              lambda v: self.state.variables.get(v.group(1), (v.group(0),))[0], text)
                words.add(text, [line] * len(text), split=not quoted)
                return False
            words.add(*value, split=not quoted)
            return False
        self._scalar(words, name, raw, quoted, line)
        return False

    # ---- words -----------------------------------------------------------------------------------
    def command(self) -> list[Value | str] | None:
        """The next simple command: its words, with ``"("`` / ``")"`` markers for array parentheses and the
        control operator (``|``, ``||``, ``&&``, ``;``) that ends it early, as a string. None at the end of the file."""
        if self.i >= len(self.text):
            return None
        words = _Words()
        out: list[Value | str] = []
        depth = 0
        skip_next = False  # the target of a redirection
        self.redirects, operator = [], ""

        def end_word() -> None:
            nonlocal skip_next
            before = len(words.words)
            words.end()
            if skip_next and len(words.words) > before:
                self.redirects.append((operator, words.words.pop()[0]))
                skip_next = False
            out.extend(words.words)
            words.words.clear()

        while self.i < len(self.text):
            ch = self._peek()
            if ch == "\\":
                if self._peek(1) == "\n":
                    self.i += 1
                    self._next()
                    continue
                line = self.line
                self.i += 1
                if self.i < len(self.text):
                    words.add(self._next(), [line], split=False)
                continue
            if ch == "\n":
                self._next()
                if depth > 0:
                    end_word()
                    continue
                while self._pending:  # the bodies of the line's here-documents follow it
                    self.redirects.append(("<<", self._heredoc(*self._pending.pop(0))))
                break
            if ch in " \t\r":
                self.i += 1
                end_word()
                continue
            if ch == "#" and not words.started:
                while self.i < len(self.text) and self._peek() != "\n":
                    self.i += 1
                continue
            if ch == "'":
                line = self.line
                self.i += 1
                start = self.i
                while self.i < len(self.text) and self._peek() != "'":
                    self._next()
                body = self.text[start:self.i]
                self.i += 1
                words.started = True
                words.add(body, _char_lines(body, line), split=False)
                continue
            if ch == '"':
                self.i += 1
                self._double_quoted(words)
                continue
            if ch == "$":
                before = self.i
                self._expand(words, quoted=False)
                if self.i == before:  # a literal $
                    words.add(self._next(), [self.line], split=False)
                continue
            if ch in "()":
                self.i += 1
                end_word()
                out.append(ch)
                depth += 1 if ch == "(" else -1
                continue
            if ch in ";|&":
                end_word()
                start = self.i
                while self._peek() in (";", "|", "&") and self._peek():
                    self.i += 1
                if depth > 0:
                    continue
                out.append(self.text[start:self.i])
                break
            if ch == "<" and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=$", "".join(words.chars)) and \
                    ">" in self.text[self.i:self.text.find("\n", self.i) % (len(self.text) + 1)]:
                # X=<Specify path>: a placeholder of Megatron's older examples, read as one word (blanks as _)
                line = self.line
                end = self.text.index(">", self.i) + 1
                placeholder = re.sub(r"\s", "_", self.text[self.i:end])
                words.add(placeholder, [line] * len(placeholder), split=False)
                self.i = end
                continue
            if (heredoc := _HEREDOC.match(self.text, self.i)) and not self.text.startswith("<<<", self.i):
                end_word()
                quoted = heredoc.group(4) is None
                self._pending.append((next(g for g in heredoc.groups()[1:] if g is not None), quoted,
                                      bool(heredoc.group(1))))
                self.i = heredoc.end()
                continue
            if ch in "<>":
                start = self.i
                if words.chars and all(c.isdigit() for c in words.chars):
                    words.chars, words.lines, words.started = [], [], False
                else:
                    end_word()
                while self._peek() in ("<", ">", "&") and self._peek():
                    self.i += 1
                skip_next, operator = True, self.text[start:self.i]
                if self._peek().isdigit() or self._peek() == "-":  # 2>&1, >&-
                    while self._peek().isdigit() or self._peek() == "-":
                        self.i += 1
                    skip_next = False
                continue
            words.add(self._next(), [self.line], split=False)
        end_word()
        return out

    def _heredoc(self, delimiter: str, quoted: bool, strip_tabs: bool) -> str:
        """A here-document's body up to its delimiter line, consumed: ``$VAR``, ``${VAR}`` and ``$(( ))`` expanded
        with the variables set so far unless the delimiter is quoted (no word splitting; ``$(...)`` kept)."""
        lines = []
        while self.i < len(self.text):
            end = self.text.find("\n", self.i)
            end = len(self.text) if end < 0 else end
            raw = self.text[self.i:end].lstrip("\t") if strip_tabs else self.text[self.i:end]
            self.i, self.line = min(end + 1, len(self.text)), self.line + 1
            if raw.rstrip("\r") == delimiter:
                break
            lines.append(raw + "\n")
        if quoted:
            return "".join(lines)
        body = BashReader("".join(lines), self.state)
        words = _Words()
        words.started = True
        while body.i < len(body.text):
            ch = body._peek()
            if ch == "\\" and body._peek(1) in ("$", "`", "\\", "\n"):
                body.i += 1
                if (escaped := body._next()) != "\n":
                    words.add(escaped, [0], split=False)
                continue
            before = body.i
            if ch == "$":
                body._expand(words, quoted=True)
            if body.i == before:  # not an expansion: the character as written
                words.add(body._next(), [0], split=False)
        words.end()
        return " ".join(w for w, _ in words.words)

    def _double_quoted(self, words: _Words) -> None:
        made_words = False
        while self.i < len(self.text):
            ch = self._peek()
            if ch == '"':
                self.i += 1
                break
            if ch == "\\" and self._peek(1) in ('"', "\\", "$", "`", "\n"):
                self.i += 1
                line = self.line
                escaped = self._next()
                if escaped != "\n":
                    words.add(escaped, [line], split=False)
                continue
            if ch == "$":
                before = self.i
                made_words = self._expand(words, quoted=True) or made_words
                if self.i == before:
                    words.add(self._next(), [self.line], split=False)
                continue
            line = self.line
            words.add(self._next(), [line], split=False)
        if not made_words:
            words.started = True


def _char_lines(text: str, first: int) -> list[int]:
    out, line = [], first
    for ch in text:
        out.append(line)
        if ch == "\n":
            line += 1
    return out


def check_line_lengths(text: str) -> None:
    for number, raw in enumerate(text.splitlines(), start=1):
        if len(raw) > MAX_LINE_CHARS:
            raise InputError([f"line {number} is longer than {MAX_LINE_CHARS} characters: not a Megatron arguments "
                              "line"], subject="Megatron arguments file")
