"""`sh`'s syntax: words with quoting and expansions, redirects, simple commands, pipelines,
`&&`/`||` lists and scripts, as frozen values; `parse_script` turns text into a `Script` or
raises `ShellSyntaxError` (`incomplete` when more input could complete it). No I/O.
"""

from __future__ import annotations

import re

import attrs


class ShellSyntaxError(Exception):
    """A script this shell cannot parse; `incomplete` when more input could complete it."""

    def __init__(self, message: str, *, incomplete: bool = False) -> None:
        super().__init__(message)
        self.incomplete = incomplete


@attrs.frozen
class Lit:
    text: str
    quoted: bool


@attrs.frozen
class Param:
    name: str
    quoted: bool


@attrs.frozen
class Subst:
    script: Script
    quoted: bool


Part = Lit | Param | Subst


@attrs.frozen
class Word:
    parts: tuple[Part, ...]

    def literal(self) -> str | None:
        """The word's text if it involves no expansion and no quoting."""
        if all(isinstance(p, Lit) and not p.quoted for p in self.parts):
            return "".join(p.text for p in self.parts)  # type: ignore[union-attr]
        return None


@attrs.frozen
class Redirect:
    fd: int
    op: str  # ">", ">>", "<", ">&", "<&"
    target: Word


@attrs.frozen
class Simple:
    assignments: tuple[tuple[str, Word], ...]
    words: tuple[Word, ...]
    redirects: tuple[Redirect, ...]


@attrs.frozen
class Pipeline:
    commands: tuple[Simple, ...]
    negate: bool = False


@attrs.frozen
class AndOr:
    first: Pipeline
    rest: tuple[tuple[str, Pipeline], ...]  # ("&&" | "||", pipeline)
    background: bool = False


@attrs.frozen
class Script:
    items: tuple[AndOr, ...]


NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPECIAL_PARAMS = set("?$#@*!0123456789-")
_OPERATORS = ("&&", "||", ";;", ";", "|", "&", "\n", "(", ")")
_UNSUPPORTED_WORDS = {"if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done",
                      "case", "esac", "function"}


_REDIRECT = re.compile(r"(\d?)(>>|>&|<&|>|<)")


class _Lexer:
    """Splits a script into words, operators and redirects, the way a POSIX shell does."""

    def __init__(self, source: str) -> None:
        self.src = source
        self.pos = 0

    def tokens(self) -> list[Word | str | Redirect]:
        out: list[Word | str | Redirect] = []
        while True:
            self._skip_blanks()
            if self.pos >= len(self.src):
                return out
            char = self.src[self.pos]
            if char == "#":
                while self.pos < len(self.src) and self.src[self.pos] != "\n":
                    self.pos += 1
                continue
            op = next((o for o in _OPERATORS if self.src.startswith(o, self.pos)), None)
            if op is not None:
                self.pos += len(op)
                out.append(op)
                continue
            redirect = self._redirect()
            if redirect is not None:
                out.append(redirect)
                continue
            out.append(self._word())

    def _skip_blanks(self) -> None:
        while self.pos < len(self.src):
            if self.src[self.pos] in " \t":
                self.pos += 1
            elif self.src.startswith("\\\n", self.pos):
                self.pos += 2
            else:
                return

    def _redirect(self) -> Redirect | None:
        match = _REDIRECT.match(self.src, self.pos)
        if match is None:
            return None
        fd_text, op = match.groups()
        self.pos = match.end()
        fd = int(fd_text) if fd_text else (0 if op[0] == "<" else 1)
        self._skip_blanks()
        if self.pos >= len(self.src):
            raise ShellSyntaxError("syntax error: unexpected end of file")
        if self.src[self.pos] in ";&|\n()<>":
            near = "newline" if self.src[self.pos] == "\n" else self.src[self.pos]
            raise ShellSyntaxError(f'syntax error: unexpected "{near}"')
        return Redirect(fd=fd, op=op, target=self._word())

    def _word(self) -> Word:
        parts: list[Part] = []
        literal: list[str] = []

        def flush(quoted: bool = False) -> None:
            if literal:
                parts.append(Lit("".join(literal), quoted))
                literal.clear()

        src = self.src
        while self.pos < len(src):
            char = src[self.pos]
            if char in " \t\n;&|()<>":
                break
            if char == "\\":
                if self.pos + 1 < len(src):
                    if src[self.pos + 1] != "\n":
                        flush()
                        parts.append(Lit(src[self.pos + 1], True))
                    self.pos += 2
                else:
                    literal.append("\\")
                    self.pos += 1
            elif char == "'":
                end = src.find("'", self.pos + 1)
                if end < 0:
                    raise ShellSyntaxError("syntax error: unterminated quoted string", incomplete=True)
                flush()
                parts.append(Lit(src[self.pos + 1 : end], True))
                self.pos = end + 1
            elif char == '"':
                flush()
                self.pos += 1
                parts.extend(self._double_quoted())
            elif char == "$" or char == "`":
                part = self._dollar()
                if part is None:
                    literal.append(char)
                    self.pos += 1
                else:
                    flush()
                    parts.append(part)
            else:
                literal.append(char)
                self.pos += 1
        flush()
        if not parts:  # only a line continuation: nothing
            parts.append(Lit("", False))
        return Word(tuple(parts))

    def _double_quoted(self) -> list[Part]:
        parts: list[Part] = []
        literal: list[str] = []
        src = self.src
        while True:
            if self.pos >= len(src):
                raise ShellSyntaxError("syntax error: unterminated quoted string", incomplete=True)
            char = src[self.pos]
            if char == '"':
                self.pos += 1
                break
            if char == "\\" and self.pos + 1 < len(src) and src[self.pos + 1] in '$`"\\\n':
                if src[self.pos + 1] != "\n":
                    literal.append(src[self.pos + 1])
                self.pos += 2
            elif char in "$`":
                part = self._dollar(quoted=True)
                if part is None:
                    literal.append(char)
                    self.pos += 1
                else:
                    if literal:
                        parts.append(Lit("".join(literal), True))
                        literal.clear()
                    parts.append(part)
            else:
                literal.append(char)
                self.pos += 1
        # An empty "" still makes a (quoted, empty) word.
        parts.append(Lit("".join(literal), True))
        return parts

    def _dollar(self, *, quoted: bool = False) -> Part | None:
        src, start = self.src, self.pos
        if src[start] == "`":
            end = src.find("`", start + 1)
            if end < 0:
                raise ShellSyntaxError("syntax error: unterminated `", incomplete=True)
            self.pos = end + 1
            return Subst(parse_script(src[start + 1 : end]), quoted)
        nxt = src[start + 1 : start + 2]
        if nxt == "(":
            if src.startswith("$((", start):
                raise ShellSyntaxError("arithmetic expansion $((...)) is not supported")
            end = _matching_paren(src, start + 2)
            self.pos = end + 1
            return Subst(parse_script(src[start + 2 : end]), quoted)
        if nxt == "{":
            end = src.find("}", start + 2)
            if end < 0:
                raise ShellSyntaxError("syntax error: missing '}'", incomplete=True)
            name = src[start + 2 : end]
            if not (NAME.fullmatch(name) or name in _SPECIAL_PARAMS or name.isdigit()):
                raise ShellSyntaxError(f"{src[start:end + 1]}: bad substitution")
            self.pos = end + 1
            return Param(name, quoted)
        if nxt and nxt in _SPECIAL_PARAMS:
            self.pos = start + 2
            return Param(nxt, quoted)
        match = NAME.match(src, start + 1)
        if match is None:
            return None
        self.pos = match.end()
        return Param(match.group(0), quoted)


def _matching_paren(src: str, pos: int) -> int:
    depth, quote = 1, ""
    while pos < len(src):
        char = src[pos]
        if quote:
            if char == quote:
                quote = ""
            elif char == "\\" and quote == '"':
                pos += 1
        elif char in "'\"":
            quote = char
        elif char == "\\":
            pos += 1
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return pos
        pos += 1
    raise ShellSyntaxError("syntax error: unterminated $(", incomplete=True)


def parse_script(source: str) -> Script:
    """Parse `source`; raises ShellSyntaxError."""
    tokens = _Lexer(source).tokens()
    pos = 0

    def peek() -> Word | str | Redirect | None:
        return tokens[pos] if pos < len(tokens) else None

    def unexpected(token: object) -> ShellSyntaxError:
        if token is None:
            return ShellSyntaxError("syntax error: unexpected end of file", incomplete=True)
        shown = "newline" if token == "\n" else token
        return ShellSyntaxError(f'syntax error: unexpected "{shown}"')

    def simple() -> Simple:
        nonlocal pos
        assignments: list[tuple[str, Word]] = []
        words: list[Word] = []
        redirects: list[Redirect] = []
        while True:
            token = peek()
            if isinstance(token, Redirect):
                redirects.append(token)
            elif isinstance(token, Word):
                first = token.parts[0]
                if (
                    not words
                    and isinstance(first, Lit)
                    and not first.quoted
                    and re.match(r"[A-Za-z_][A-Za-z0-9_]*=", first.text)
                ):
                    name, _, rest = first.text.partition("=")
                    value_parts = ((Lit(rest, False),) if rest else ()) + token.parts[1:]
                    assignments.append((name, Word(value_parts or (Lit("", True),))))
                else:
                    if not words and token.literal() in _UNSUPPORTED_WORDS:
                        raise ShellSyntaxError(
                            f"'{token.literal()}' compound commands are not supported by this shell"
                        )
                    words.append(token)
            else:
                break
            pos += 1
        if not (assignments or words or redirects):
            raise unexpected(peek())
        return Simple(tuple(assignments), tuple(words), tuple(redirects))

    def pipeline() -> Pipeline:
        nonlocal pos
        negate = False
        token = peek()
        if isinstance(token, Word) and token.literal() == "!":
            negate = True
            pos += 1
        commands = [simple()]
        while peek() == "|":
            pos += 1
            while peek() == "\n":
                pos += 1
            commands.append(simple())
        return Pipeline(tuple(commands), negate)

    def and_or() -> AndOr:
        nonlocal pos
        first = pipeline()
        rest: list[tuple[str, Pipeline]] = []
        while peek() in ("&&", "||"):
            op = tokens[pos]
            assert isinstance(op, str)
            pos += 1
            while peek() == "\n":
                pos += 1
            rest.append((op, pipeline()))
        return AndOr(first, tuple(rest))

    items: list[AndOr] = []
    while True:
        while peek() in (";", "\n") and (peek() == "\n" or items):
            if peek() == ";" and pos > 0 and tokens[pos - 1] in (";", "\n", "&"):
                raise unexpected(";")
            pos += 1
        token = peek()
        if token is None:
            return Script(tuple(items))
        if isinstance(token, str) and token not in ("\n",):
            raise unexpected(token)
        item = and_or()
        if peek() == "&":
            pos += 1
            item = attrs.evolve(item, background=True)
        elif peek() not in (None, ";", "\n"):
            raise unexpected(peek())
        items.append(item)
