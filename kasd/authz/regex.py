"""The regular expressions ``=~`` and ``!~`` use: RE2 itself, as GitLab's ``Gitlab::UntrustedRegexp``.

GitLab compiles ``rules:if`` patterns with RE2 (``RE2::Regexp.new(pattern, log_errors: false)``),
whose matching time is linear in the text, and a branch name is chosen by whoever pushes it. kasd
uses the same library (``google-re2``, RE2's own Python binding, in C++), so a pattern means here
what it means in GitLab: the syntax RE2 accepts (``\\pL`` and ``\\p{Greek}`` included), what it refuses
(backreferences, lookaround, atomic groups, possessive quantifiers, ``\\Z``) and how it matches.

As GitLab does (``Gitlab::UntrustedRegexp::RubySyntax``), ``/source/flags`` becomes
``(?flags)source`` with RE2's default options: ``i`` folds case (Unicode simple folding), ``m`` lets
``^`` and ``$`` match at line breaks, ``s`` lets ``.`` match a newline, ``U`` swaps greediness (no
effect on whether a match exists). Without ``m``, ``$`` is the end of the text, not "before a final
newline" as in Perl and Python.

``=~`` asks only whether the pattern matches somewhere in the text (GitLab's
``regexp.scan(text.to_s).present?``): an unanchored search, without captures.

Bounds, on top of RE2's own (counted repetition at most ``{1000}``, nested or not):

* a pattern is at most ``MAX_PATTERN_LENGTH`` characters, its RE2 program at most
  ``MAX_PROGRAM_SIZE`` instructions, and RE2 may use ``MAX_MEMORY`` bytes for it (program and DFA
  cache; past that it falls back to its NFA, still linear). A search costs at most about
  ``len(text) × program size`` steps in C++, holding the GIL: ``[a-z]{600}x`` against 1,024
  characters takes ~20 ms the first time (RE2 builds its DFA) and ~0.03 ms after; the worst
  patterns under the caps, ~0.1 s the first time (the Pike VM this replaced: 0.1-0.4 s each time);
* a text longer than ``MAX_TEXT_LENGTH`` characters is not matched (``RegexInputTooLong``);
* each compiled pattern remembers its last ``MEMO_SIZE`` answers, so a job whose request is refused
  and which asks again costs a dictionary lookup (~1 µs), not a search.

This module is the one place that touches ``re2`` (which ships no type information): it relies on
``re2.Options`` (the attributes set in ``_options``), ``re2.compile(pattern, options)`` raising
``re2.error`` whose first argument is RE2's message ``"<what>: <fragment of the pattern>"``, the
compiled object's ``programsize`` and ``search(bytes)``, and ``re2.purge()``.
``tests/authz/test_regex.py`` pins each.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol, cast

import attrs
import re2  # google-re2: no type information, fenced here

__all__ = [
    "FLAGS",
    "MAX_MEMORY",
    "MAX_PATTERN_LENGTH",
    "MAX_PROGRAM_SIZE",
    "MAX_REPEAT",
    "MAX_TEXT_LENGTH",
    "MEMO_SIZE",
    "Regex",
    "RegexError",
    "RegexInputTooLong",
    "compile_regex",
]

MAX_PATTERN_LENGTH = 512
"""Characters of pattern source, flags excluded."""
MAX_REPEAT = 1000
"""The largest count in ``{n,m}``, and of nested counts multiplied: RE2's own limit."""
MAX_PROGRAM_SIZE = 2000
"""Instructions of the compiled RE2 program (``[a-z]{600}x`` has 605, ``\\pL+`` 1201)."""
MAX_MEMORY = 8 << 20
"""Bytes RE2 may use for one pattern, program and DFA cache together: RE2's (and GitLab's) default."""
MAX_TEXT_LENGTH = 1024
"""Characters of text a pattern is matched against; a longer value is an error, never a guess."""
MEMO_SIZE = 64
"""Answers each compiled pattern remembers (text → matched), most recently used kept."""

FLAGS = "imsU"
"""The flags GitLab's ``/pattern/flags`` accepts, each RE2's inline flag of that letter."""


class RegexError(ValueError):
    """A pattern RE2 refuses, or one larger than the caps; ``offset`` is 0-based in the source."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.offset = offset


class RegexInputTooLong(ValueError):
    """The text is longer than ``MAX_TEXT_LENGTH``: matching would cost more than is budgeted."""


class _Compiled(Protocol):
    """What kasd uses of a compiled ``re2`` pattern."""

    @property
    def programsize(self) -> int: ...

    def search(self, text: bytes) -> object | None: ...


def _options() -> object:
    options = re2.Options()
    options.max_mem = MAX_MEMORY
    options.log_errors = False  # RE2 would print the pattern to stderr; the caller reports it
    options.never_capture = True  # only whether it matches counts
    return cast(object, options)


_OPTIONS = _options()

# What to say after RE2's message when the refused text starts with one of these.
_HINTS = (
    ("(?=", "RE2 has no lookahead"), ("(?!", "RE2 has no lookahead"),
    ("(?<=", "RE2 has no lookbehind"), ("(?<!", "RE2 has no lookbehind"),
    ("(?>", "RE2 has no atomic groups"), ("(?P=", "RE2 has no backreferences"),
    ("(?P>", "RE2 has no recursion"), ("(?(", "RE2 has no conditionals"), ("(?#", "RE2 has no comment groups"),
    *((f"\\{d}", "RE2 has no backreferences") for d in "123456789"),
    ("\\Z", "RE2 has no \\Z; use \\z"),
)


def _encode(text: str) -> bytes:
    # A lone surrogate (from JSON's "\udc80") has no UTF-8 form; RE2 reads the three bytes
    # surrogatepass writes as one character (matched by '.', '[^x]', '\x{dc80}'), as Python means it.
    return text.encode("utf-8", "surrogatepass")


def _error(message: str, source: str, prefix: str) -> RegexError:
    """``RegexError`` for RE2's ``"<what>: <fragment>"``, placed where the fragment is in ``source``.

    The fragment is a piece of the pattern RE2 compiled (``prefix + source``); for an unbalanced
    parenthesis it is the whole pattern, and the offset is 0.
    """
    what, _, fragment = message.partition(": ")
    if not fragment:  # "pattern too large - compile failed"
        return RegexError(what, 0)
    at = (prefix + source).find(fragment)
    offset = max(0, at - len(prefix))
    if at == 0 and prefix:
        fragment = fragment[len(prefix):] or fragment
    reason = f"{what}: {fragment}"
    for start, hint in _HINTS:
        if at >= 0 and source.startswith(start, offset):
            return RegexError(f"{reason} ({hint})", offset)
    return RegexError(reason, offset)


def _searcher(compiled: _Compiled) -> Callable[[str], bool]:
    def matches(text: str) -> bool:
        return compiled.search(_encode(text)) is not None
    return functools.lru_cache(maxsize=MEMO_SIZE)(matches)


@attrs.frozen(kw_only=True, eq=False)
class Regex:
    """A compiled pattern: ``search(text)`` says whether it matches anywhere in ``text``."""

    source: str
    flags: str
    program_size: int
    _matches: Callable[[str], bool] = attrs.field(repr=False, alias="matches")

    def search(self, text: str) -> bool:
        """Whether the pattern matches somewhere in ``text``.

        Raises ``RegexInputTooLong`` when ``text`` is longer than ``MAX_TEXT_LENGTH``.
        """
        if len(text) > MAX_TEXT_LENGTH:
            raise RegexInputTooLong(f"{len(text)} characters; at most {MAX_TEXT_LENGTH} are matched")
        return self._matches(text)


def compile_regex(source: str, flags: str = "") -> Regex:
    """Compiles ``source`` with RE2 under ``flags`` (any of ``i m s U``), as GitLab's ``/source/flags``.

    Raises ``RegexError`` (RE2's message, and a 0-based ``offset`` into ``source`` where RE2 names a
    fragment of it) for a pattern RE2 refuses or one over the caps.
    """
    if len(source) > MAX_PATTERN_LENGTH:
        raise RegexError(f"pattern longer than {MAX_PATTERN_LENGTH} characters", MAX_PATTERN_LENGTH)
    unknown = set(flags) - set(FLAGS)
    if unknown:
        raise RegexError(f"unknown flag {sorted(unknown)[0]!r} (RE2 has i, m, s, U)", len(source))
    prefix = f"(?{flags})" if flags else ""
    pattern = _encode(prefix + source)
    try:
        compiled = cast(_Compiled, re2.compile(pattern, _OPTIONS))
    except re2.error as e:
        message = e.args[0] if e.args else ""
        text = message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message)
        raise _error(text, source, prefix) from None
    finally:
        # re2.compile keeps the last 128 patterns in a module-wide cache, each with up to MAX_MEMORY
        # of DFA: patterns of a configuration long replaced would stay alive there. kasd keeps its own.
        re2.purge()
    size = compiled.programsize
    if size > MAX_PROGRAM_SIZE:
        raise RegexError(f"pattern too large: its RE2 program has {size} instructions, at most "
                         f"{MAX_PROGRAM_SIZE} are allowed", 0)
    return Regex(source=source, flags=flags, program_size=size, matches=_searcher(compiled))
