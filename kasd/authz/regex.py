"""The regular expressions ``=~`` and ``!~`` use: RE2's syntax, matched in time linear in the input.

GitLab compiles ``rules:if`` patterns with RE2 (``Gitlab::UntrustedRegexp``), whose matching time is
linear in the text. Python's ``re`` backtracks: ``(a+)+$`` or ``\\d*\\d*\\d*x`` take exponential or
polynomial time, and a branch name is chosen by whoever pushes it. So the pattern is parsed here, by
RE2's rules, into a small program that a Pike VM (Thompson's simulation, no backtracking) runs: its
cost is at most ``len(text) × len(program)`` steps, and both are capped.

``=~`` only asks whether the pattern matches somewhere (GitLab's ``scan(text).present?``), so there
are no captures and greediness cannot change an answer: ``*?`` and the ``U`` flag are accepted and
ignored.

Supported, as RE2 has them: literals, ``.``, ``[...]`` (ranges, negation, ``[:alpha:]`` classes),
``\\d \\w \\s`` and their negations (ASCII, as RE2), ``\\b \\B \\A \\z ^ $``, ``\\n \\t \\r \\f \\v \\a``,
``\\x7f \\x{10FFFF}``, octal ``\\0`` and ``\\12``, ``\\Q...\\E``, groups ``(...) (?:...) (?P<n>...)
(?<n>...)``, flags ``(?ims)`` and ``(?i-m:...)``, ``* + ? {n} {n,} {n,m}`` (counts ≤ 1000), ``|``.

Rejected, because RE2 rejects them (and Python would accept some, at a price): backreferences
``\\1 (?P=n)``, lookaround ``(?= (?! (?<= (?<!``, atomic groups ``(?>``, possessive and doubled
quantifiers ``a*+ a**``, conditionals, ``\\Z``, and (not yet supported here) ``\\p{...}`` classes
and ``\\C``.

Case-insensitive matching compares a character, its lower- and its upper-case form; RE2 folds by
Unicode's simple case-folding orbits, which agrees for every cased script but a few oddities
(the Kelvin sign, the long s).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs

__all__ = [
    "MAX_PATTERN_LENGTH",
    "MAX_PROGRAM_SIZE",
    "MAX_REPEAT",
    "MAX_TEXT_LENGTH",
    "Regex",
    "RegexError",
    "RegexInputTooLong",
    "compile_regex",
]

MAX_PATTERN_LENGTH = 512
"""Characters of pattern source, flags excluded."""
MAX_REPEAT = 1000
"""The largest count in ``{n,m}``: RE2's limit."""
MAX_PROGRAM_SIZE = 2000
"""Instructions after counted repetition is unrolled: ``(a{100}){100}`` is too large."""
MAX_TEXT_LENGTH = 1024
"""Characters of text a pattern is matched against; a longer value is an error, never a guess."""

_MAX_CODE_POINT = 0x10FFFF


class RegexError(ValueError):
    """A pattern RE2 would reject, or one larger than the caps; ``offset`` is 0-based in the source."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.offset = offset


class RegexInputTooLong(ValueError):
    """The text is longer than ``MAX_TEXT_LENGTH``: matching would cost more than is budgeted."""


# --- character sets -------------------------------------------------------------------------------

Ranges = tuple[tuple[int, int], ...]


def _ranges(*pairs: tuple[str, str]) -> Ranges:
    return tuple((ord(lo), ord(hi)) for lo, hi in pairs)


_DIGIT = _ranges(("0", "9"))
_WORD = _ranges(("0", "9"), ("A", "Z"), ("_", "_"), ("a", "z"))
_SPACE = _ranges(("\t", "\n"), ("\f", "\r"), (" ", " "))  # RE2's \s: no \v
_POSIX: dict[str, Ranges] = {
    "alnum": _ranges(("0", "9"), ("A", "Z"), ("a", "z")),
    "alpha": _ranges(("A", "Z"), ("a", "z")),
    "ascii": ((0, 0x7F),),
    "blank": _ranges(("\t", "\t"), (" ", " ")),
    "cntrl": ((0, 0x1F), (0x7F, 0x7F)),
    "digit": _DIGIT,
    "graph": ((0x21, 0x7E),),
    "lower": _ranges(("a", "z")),
    "print": ((0x20, 0x7E),),
    "punct": ((0x21, 0x2F), (0x3A, 0x40), (0x5B, 0x60), (0x7B, 0x7E)),
    "space": _ranges(("\t", "\r"), (" ", " ")),
    "upper": _ranges(("A", "Z")),
    "word": _WORD,
    "xdigit": _ranges(("0", "9"), ("A", "F"), ("a", "f")),
}


def _negate(ranges: Iterable[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    nxt = 0
    for lo, hi in sorted(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = max(nxt, hi + 1)
    if nxt <= _MAX_CODE_POINT:
        out.append((nxt, _MAX_CODE_POINT))
    return tuple(out)


def _in(ranges: Ranges, ch: str) -> bool:
    c = ord(ch)
    return any(lo <= c <= hi for lo, hi in ranges)


def _is_word(ch: str | None) -> bool:
    return ch is not None and _in(_WORD, ch)


# --- the parsed tree ------------------------------------------------------------------------------

Matcher = Callable[[str], bool]

_BOT, _BOL, _EOT, _EOL, _WORD_B, _NOT_WORD_B = range(6)


@attrs.frozen
class _Char:
    match: Matcher


@attrs.frozen
class _Assert:
    kind: int


@attrs.frozen
class _Cat:
    items: tuple[_Node, ...]


@attrs.frozen
class _Alt:
    branches: tuple[_Node, ...]


@attrs.frozen
class _Rep:
    inner: _Node
    lo: int
    hi: int | None


_Node = _Char | _Assert | _Cat | _Alt | _Rep


def _literal(ch: str, fold: bool) -> Matcher:
    if not fold or ch.lower() == ch.upper():
        return ch.__eq__
    variants = {ch, ch.lower(), ch.upper()}
    return lambda c: c in variants or c.lower() in variants or c.upper() in variants


def _class(ranges: Ranges, negated: bool, fold: bool) -> Matcher:
    if fold:
        def folded(c: str) -> bool:
            return (_in(ranges, c) or _in(ranges, c.lower()) or _in(ranges, c.upper())) != negated
        return folded

    def exact(c: str) -> bool:
        return _in(ranges, c) != negated
    return exact


@attrs.define
class _Flags:
    fold: bool = False
    multiline: bool = False
    dotall: bool = False


_MAX_GROUP_DEPTH = 32
_LOOKAROUND_AND_FRIENDS = (
    ("=", "lookahead"), ("!", "negative lookahead"), ("<=", "lookbehind"), ("<!", "negative lookbehind"),
    (">", "an atomic group"), ("P=", "a backreference"), ("P>", "recursion"), ("#", "a comment group"),
    ("(", "a conditional"),
)


class _Parser:
    """Recursive descent over RE2's grammar; positions are 0-based offsets into the source."""

    def __init__(self, source: str, flags: _Flags) -> None:
        self.src = source
        self.pos = 0
        self.flags = flags
        self.depth = 0

    def fail(self, reason: str, at: int | None = None) -> RegexError:
        return RegexError(reason, self.pos if at is None else at)

    def peek(self, n: int = 1) -> str:
        return self.src[self.pos:self.pos + n]

    def parse(self) -> _Node:
        node = self.alternation()
        if self.pos < len(self.src):  # only a ')' stops an alternation early
            raise self.fail("unmatched ')'")
        return node

    def alternation(self) -> _Node:
        branches = [self.concatenation()]
        while self.peek() == "|":
            self.pos += 1
            branches.append(self.concatenation())
        return branches[0] if len(branches) == 1 else _Alt(tuple(branches))

    def concatenation(self) -> _Node:
        items: list[_Node] = []
        while self.pos < len(self.src) and self.peek() not in "|)":
            items.extend(self.repetition())
        return _Cat(tuple(items))

    def repetition(self) -> list[_Node]:
        start = self.pos
        if self.peek() in ("*", "+", "?") or (self.peek() == "{" and self._counts(consume=False)):
            raise self.fail(f"missing argument to repetition operator {self.peek()!r}")
        atoms = self.atom()
        if not atoms:  # (?i) and an empty \Q\E: nothing to repeat
            return atoms
        node = atoms[-1]  # \Qab\E* repeats the b alone, as RE2 does
        repeated = False
        while True:
            at = self.pos
            c = self.peek()
            counts: tuple[int, int | None] | None
            if c in ("*", "+", "?"):
                self.pos += 1
                counts = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            else:
                counts = self._counts(consume=True) if c == "{" else None
            if counts is None:
                return [*atoms[:-1], node]
            if repeated:
                raise self.fail(f"bad repetition operator {self.src[start:self.pos]!r}", at)
            repeated = True
            node = _Rep(node, *counts)
            if self.peek() == "?":  # non-greedy: the same answer to "is there a match?"
                self.pos += 1

    def _counts(self, *, consume: bool) -> tuple[int, int | None] | None:
        """``{n}``, ``{n,}`` or ``{n,m}`` at pos, else None: RE2 reads any other ``{`` literally."""
        end = self.src.find("}", self.pos)
        if end < 0:
            return None
        body = self.src[self.pos + 1:end]
        lo_text, comma, hi_text = body.partition(",")
        if not _is_number(lo_text) or (hi_text and not _is_number(hi_text)):
            return None
        lo = int(lo_text)
        hi = int(hi_text) if hi_text else (None if comma else lo)
        if lo > MAX_REPEAT or (hi is not None and hi > MAX_REPEAT):
            raise self.fail(f"repetition count above {MAX_REPEAT} in {{{body}}}")
        if hi is not None and hi < lo:
            raise self.fail(f"bad repetition {{{body}}}: the maximum is below the minimum")
        if consume:
            self.pos = end + 1
        return lo, hi

    def atom(self) -> list[_Node]:
        c = self.src[self.pos]
        flags = self.flags
        if c == "(":
            return self.group()
        if c == "[":
            return [self.bracket()]
        self.pos += 1
        if c == ".":
            everything = ((0, _MAX_CODE_POINT),)
            return [_Char(_class(everything if flags.dotall else _negate([(0x0A, 0x0A)]), False, False))]
        if c == "^":
            return [_Assert(_BOL if flags.multiline else _BOT)]
        if c == "$":
            return [_Assert(_EOL if flags.multiline else _EOT)]
        if c == "\\":
            self.pos -= 1
            return self.escape()
        return [_Char(_literal(c, flags.fold))]

    def group(self) -> list[_Node]:
        open_at = self.pos
        self.pos += 1
        saved = attrs.evolve(self.flags)
        if self.peek() == "?":
            self.pos += 1
            rest = self.src[self.pos:]
            for prefix, what in _LOOKAROUND_AND_FRIENDS:
                if rest.startswith(prefix):
                    raise self.fail(f"(?{prefix} ({what}) is not supported by RE2", open_at)
            if rest.startswith(("P<", "<")):
                self.pos += 2 if rest.startswith("P<") else 1
                end = self.src.find(">", self.pos)
                name = self.src[self.pos:end] if end >= 0 else ""
                if not (name.isidentifier() and name.isascii()):
                    raise self.fail("bad group name", open_at)
                self.pos = end + 1
            elif not self._flag_group(open_at):  # (?i): changes the rest of the enclosing group
                return []
        self.depth += 1
        if self.depth > _MAX_GROUP_DEPTH:
            raise self.fail(f"groups nested deeper than {_MAX_GROUP_DEPTH}", open_at)
        node = self.alternation()
        if self.peek() != ")":
            raise self.fail("missing ')'", open_at)
        self.pos += 1
        self.depth -= 1
        self.flags = saved
        return [node]

    def _flag_group(self, open_at: int) -> bool:
        """Reads ``ims-U)`` or ``ims-U:``; True for a scoped group (``:``), whose body follows."""
        negate = False
        seen_since_dash = False
        seen = False
        while self.pos < len(self.src):
            c = self.src[self.pos]
            self.pos += 1
            if c in ":)":
                if (c == ")" and not seen) or (negate and not seen_since_dash):
                    raise self.fail("bad flag group", open_at)
                return c == ":"
            if c == "-" and not negate:
                negate = True
                continue
            if c == "i":
                self.flags.fold = not negate
            elif c == "m":
                self.flags.multiline = not negate
            elif c == "s":
                self.flags.dotall = not negate
            elif c != "U":  # ungreedy: no effect on whether a match exists
                raise self.fail(f"unknown flag {c!r} (RE2 has i, m, s, U)", self.pos - 1)
            seen = True
            seen_since_dash = negate
        raise self.fail("missing ')'", open_at)

    def escape(self) -> list[_Node]:
        """An escape outside brackets, at pos (the backslash)."""
        c = self.src[self.pos + 1:self.pos + 2]
        fold = self.flags.fold
        assertion = {"A": _BOT, "z": _EOT, "b": _WORD_B, "B": _NOT_WORD_B}.get(c)
        if assertion is not None:
            self.pos += 2
            return [_Assert(assertion)]
        if c == "Q":
            end = self.src.find("\\E", self.pos + 2)
            end = len(self.src) if end < 0 else end
            text = self.src[self.pos + 2:end]
            self.pos = min(len(self.src), end + 2)
            return [_Char(_literal(ch, fold)) for ch in text]
        member = self.class_escape()
        if isinstance(member, int):
            return [_Char(_literal(chr(member), fold))]
        return [_Char(_class(member, False, fold))]

    def class_escape(self) -> int | Ranges:
        """An escape at pos (the backslash) that stands for characters: one code point, or a set."""
        at = self.pos
        c = self.src[self.pos + 1:self.pos + 2]
        self.pos += 2
        if not c:
            raise self.fail("trailing backslash", at)
        perl = {"d": _DIGIT, "w": _WORD, "s": _SPACE}.get(c.lower())
        if perl is not None:
            return _negate(perl) if c.isupper() else perl
        simple = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}.get(c)
        if simple is not None:
            return ord(simple)
        if c == "x":
            return self._hex(at)
        if c in "01234567":
            # RE2: \0, and \1..\7 followed by an octal digit, are octal; a lone \1..\9 is a backreference
            if c != "0" and not (self.peek() and self.peek() in "01234567"):
                raise self.fail(f"backreference \\{c} is not supported by RE2", at)
            digits = c
            while len(digits) < 3 and self.peek() and self.peek() in "01234567":
                digits += self.peek()
                self.pos += 1
            return int(digits, 8)
        if c in "89":
            raise self.fail(f"backreference \\{c} is not supported by RE2", at)
        if c == "Z":
            raise self.fail("\\Z is not supported by RE2; use \\z", at)
        if c in "pP":
            raise self.fail(f"Unicode classes \\{c} are not supported here", at)
        if c.isascii() and not c.isalnum():
            return ord(c)
        raise self.fail(f"invalid escape \\{c}", at)

    def _hex(self, at: int) -> int:
        if self.peek() == "{":
            end = self.src.find("}", self.pos)
            digits = self.src[self.pos + 1:end] if end >= 0 else ""
            self.pos = end + 1 if end >= 0 else self.pos
        else:
            digits = self.peek(2) if len(self.peek(2)) == 2 else ""
            self.pos += 2
        if not digits or len(digits) > 8 or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise self.fail("bad hexadecimal escape", at)
        code = int(digits, 16)
        if code > _MAX_CODE_POINT:
            raise self.fail("bad hexadecimal escape", at)
        return code

    def bracket(self) -> _Node:
        open_at = self.pos
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        parts: list[tuple[int, int]] = []
        first = True
        while True:
            if self.pos >= len(self.src):
                raise self.fail("missing ']'", open_at)
            if self.peek() == "]" and not first:
                self.pos += 1
                return _Char(_class(tuple(sorted(parts)), negated, self.flags.fold))
            first = False
            if self.peek(2) == "[:":
                end = self.src.find(":]", self.pos + 2)
                name = self.src[self.pos + 2:end] if end >= 0 else ""
                posix = _POSIX.get(name.removeprefix("^"))
                if posix is None:
                    raise self.fail(f"unknown class [:{name}:]")
                parts.extend(_negate(posix) if name.startswith("^") else posix)
                self.pos = end + 2
                continue
            lo_at = self.pos
            lo = self._member()
            if not isinstance(lo, int):
                parts.extend(lo)
                continue
            if self.peek() == "-" and self.peek(2) != "-]" and self.pos + 1 < len(self.src) \
                    and self.src[self.pos + 1] != "]":
                self.pos += 1
                hi = self._member()
                if not isinstance(hi, int) or hi < lo:
                    raise self.fail(f"bad character class range {self.src[lo_at:self.pos]}", lo_at)
                parts.append((lo, hi))
            else:
                parts.append((lo, lo))

    def _member(self) -> int | Ranges:
        if self.peek() == "\\":
            return self.class_escape()
        self.pos += 1
        return ord(self.src[self.pos - 1])


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


# --- the program ----------------------------------------------------------------------------------
# (op, a, b): CHAR(matcher), SPLIT(x, y), JMP(x), ASSERT(kind), MATCH

_CHAR, _SPLIT, _JMP, _ASSERT, _MATCH = range(5)
_Instruction = tuple[int, Any, Any]


def _size(node: _Node) -> int:
    """An upper bound on the instructions ``node`` compiles to, computed before unrolling anything."""
    if isinstance(node, _Char | _Assert):
        return 1
    if isinstance(node, _Cat):
        return sum(_size(n) for n in node.items)
    if isinstance(node, _Alt):
        return sum(_size(n) + 2 for n in node.branches)
    copies = node.lo + 1 if node.hi is None else max(node.hi, 1)
    return (_size(node.inner) + 2) * copies


class _Compiler:
    def __init__(self) -> None:
        self.prog: list[list[Any]] = []

    def emit(self, op: int, a: Any = None, b: Any = None) -> int:
        self.prog.append([op, a, b])
        return len(self.prog) - 1

    def here(self) -> int:
        return len(self.prog)

    def node(self, node: _Node) -> None:
        if isinstance(node, _Char):
            self.emit(_CHAR, node.match)
        elif isinstance(node, _Assert):
            self.emit(_ASSERT, node.kind)
        elif isinstance(node, _Cat):
            for item in node.items:
                self.node(item)
        elif isinstance(node, _Alt):
            jumps: list[int] = []
            for branch in node.branches[:-1]:
                split = self.emit(_SPLIT, self.here() + 1)
                self.node(branch)
                jumps.append(self.emit(_JMP))
                self.prog[split][2] = self.here()
            self.node(node.branches[-1])
            for jump in jumps:
                self.prog[jump][1] = self.here()
        else:
            for _ in range(node.lo):
                self.node(node.inner)
            if node.hi is None:
                loop = self.emit(_SPLIT, self.here() + 1)
                self.node(node.inner)
                self.emit(_JMP, loop)
                self.prog[loop][2] = self.here()
            else:
                splits = []
                for _ in range(node.hi - node.lo):
                    splits.append(self.emit(_SPLIT, self.here() + 1))
                    self.node(node.inner)
                for split in splits:
                    self.prog[split][2] = self.here()


@attrs.frozen(kw_only=True, eq=False)
class Regex:
    """A compiled pattern: ``search(text)`` says whether it matches anywhere in ``text``."""

    source: str
    flags: str
    program: tuple[_Instruction, ...] = attrs.field(repr=False)

    def search(self, text: str) -> bool:
        """Whether the pattern matches somewhere in ``text``; cost ≤ len(text) × len(program) steps.

        Raises ``RegexInputTooLong`` when ``text`` is longer than ``MAX_TEXT_LENGTH``.
        """
        if len(text) > MAX_TEXT_LENGTH:
            raise RegexInputTooLong(f"{len(text)} characters; at most {MAX_TEXT_LENGTH} are matched")
        prog = self.program
        current: set[int] = set()
        visited: set[int] = set()
        n = len(text)
        for pos in range(n + 1):
            if self._add(current, visited, 0, text, pos):  # a match may start at any position
                return True
            if pos == n:
                break
            ch = text[pos]
            following: set[int] = set()
            visited = set()
            for pc in current:
                if prog[pc][1](ch) and self._add(following, visited, pc + 1, text, pos + 1):
                    return True
            current = following
        return False

    def _add(self, threads: set[int], visited: set[int], pc: int, text: str, pos: int) -> bool:
        """Follows jumps, splits and assertions from ``pc`` at ``pos``; True on reaching MATCH."""
        prog = self.program
        stack = [pc]
        while stack:
            pc = stack.pop()
            if pc in visited:
                continue
            visited.add(pc)
            op, a, b = prog[pc]
            if op == _CHAR:
                threads.add(pc)
            elif op == _MATCH:
                return True
            elif op == _JMP:
                stack.append(a)
            elif op == _SPLIT:
                stack.append(b)
                stack.append(a)
            elif _holds(a, text, pos):
                stack.append(pc + 1)
        return False


def _holds(kind: int, text: str, pos: int) -> bool:
    before = text[pos - 1] if pos > 0 else None
    after = text[pos] if pos < len(text) else None
    if kind == _BOT:
        return pos == 0
    if kind == _BOL:
        return before is None or before == "\n"
    if kind == _EOT:
        return after is None
    if kind == _EOL:
        return after is None or after == "\n"
    boundary = _is_word(before) != _is_word(after)
    return boundary if kind == _WORD_B else not boundary


def compile_regex(source: str, flags: str = "") -> Regex:
    """Parses ``source`` by RE2's rules with ``flags`` (any of ``i m s U``) into a ``Regex``.

    Raises ``RegexError`` (with a 0-based ``offset`` into ``source``) for syntax RE2 rejects, for the
    constructs listed in this module's docstring, and for patterns over the size caps.
    """
    if len(source) > MAX_PATTERN_LENGTH:
        raise RegexError(f"pattern longer than {MAX_PATTERN_LENGTH} characters", MAX_PATTERN_LENGTH)
    unknown = set(flags) - set("imsU")
    if unknown:
        raise RegexError(f"unknown flag {sorted(unknown)[0]!r} (RE2 has i, m, s, U)", len(source))
    parser = _Parser(source, _Flags(fold="i" in flags, multiline="m" in flags, dotall="s" in flags))
    tree = parser.parse()
    if _size(tree) > MAX_PROGRAM_SIZE:
        raise RegexError(f"pattern too large once repetition is unrolled (over {MAX_PROGRAM_SIZE} steps)", 0)
    compiler = _Compiler()
    compiler.node(tree)
    compiler.emit(_MATCH)
    program = tuple((op, a, b) for op, a, b in compiler.prog)
    return Regex(source=source, flags=flags, program=program)
