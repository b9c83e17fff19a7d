"""The RE2 subset ``=~`` matches with: what it accepts, what it refuses, and that it never backtracks."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kasd.authz.regex import MAX_TEXT_LENGTH, RegexError, RegexInputTooLong, compile_regex


@pytest.mark.parametrize(("pattern", "text", "matches"), [
    (r"^v[0-9](?:\.[0-9]){2,3}", "v1.2.3", True),
    (r"^feature/", "feature/login", True),
    (r"^feature/", "my-feature/login", False),
    (r"^main$", "main\n", False),  # RE2's $ without m is the end of the text, not before a last \n
    (r"(?m)^b$", "a\nb\nc", True),
    (r"^b$", "a\nb\nc", False),
    (r"a.c", "a\nc", False),
    (r"(?s)a.c", "a\nc", True),
    (r"(?i)^MAIN", "main", True),
    (r"(?i:a)b", "Ab", True),
    (r"(?i:a)b", "AB", False),
    (r"\bfoo\b", "a foo b", True),
    (r"\bfoo\b", "afoo", False),
    (r"[^a-c]", "abc", False),
    (r"[[:digit:]]+x", "12x", True),
    (r"[\d-]", "-", True),
    (r"[]a]", "]", True),
    (r"a{2,}", "aaa", True),
    (r"a{2}", "a", False),
    (r"x{0}y", "y", True),
    (r"a{,2}", "a{,2}", True),  # not a valid count: RE2 reads the brace literally
    (r"\Qa.b\E", "axb", False),
    (r"\Qa.b\E", "a.b", True),
    (r"\x41\x{42}\101", "ABA", True),
    (r"a|b|", "zzz", True),
    (r"\d+\z", "build 12", True),
    (r"\s", "\v", False),  # RE2's \s has no vertical tab
    (r"a*?b", "aab", True),
    ("(?U)a+b", "aab", True),
])
def test_matches_as_re2_does(pattern: str, text: str, matches: bool) -> None:
    assert compile_regex(pattern).search(text) is matches


@pytest.mark.parametrize(("pattern", "reason", "offset"), [
    (r"(a)\1", "backreference \\1 is not supported by RE2", 3),
    (r"(?=a)", "(?= (lookahead) is not supported by RE2", 0),
    (r"x(?<!a)b", "(?<! (negative lookbehind) is not supported by RE2", 1),
    (r"(?>a)", "(?> (an atomic group) is not supported by RE2", 0),
    (r"(?P=n)", "(?P= (a backreference) is not supported by RE2", 0),
    (r"a**", "bad repetition operator 'a**'", 2),
    (r"a*+", "bad repetition operator 'a*+'", 2),
    (r"*a", "missing argument to repetition operator '*'", 0),
    (r"\Z", "\\Z is not supported by RE2; use \\z", 0),
    (r"\pL", "Unicode classes \\p are not supported here", 0),
    (r"(a", "missing ')'", 0),
    (r"a)", "unmatched ')'", 1),
    (r"[a", "missing ']'", 0),
    (r"a{1001}", "repetition count above 1000 in {1001}", 1),
    (r"[z-a]", "bad character class range z-a", 1),
    (r"\k", "invalid escape \\k", 0),
    (r"(?x)a", "unknown flag 'x' (RE2 has i, m, s, U)", 2),
])
def test_refuses_what_re2_refuses(pattern: str, reason: str, offset: int) -> None:
    with pytest.raises(RegexError) as caught:
        compile_regex(pattern)
    assert (caught.value.reason, caught.value.offset) == (reason, offset)


def test_size_caps() -> None:
    with pytest.raises(RegexError, match="too large"):
        compile_regex("(a{100}){100}")
    with pytest.raises(RegexError, match="nested deeper"):
        compile_regex("(" * 40 + ")" * 40)
    with pytest.raises(RegexError, match="longer than"):
        compile_regex("a" * 513)
    with pytest.raises(RegexInputTooLong):
        compile_regex("a").search("b" * (MAX_TEXT_LENGTH + 1))


@pytest.mark.parametrize("pattern", [r"(a+)+$", r"(a|aa)*c", r"\d*\d*\d*\d*\d*\d*x", r"(.*a){12}"])
def test_catastrophic_patterns_take_linear_time(pattern: str) -> None:
    # Each of these takes Python's backtracking re seconds to centuries on this input.
    regex = compile_regex(pattern)
    started = time.perf_counter()
    regex.search("a" * 1000 + "!")
    assert time.perf_counter() - started < 1.0


# Small patterns on which RE2 and Python's re agree (no $, whose meanings differ), matched both ways.
_atoms = st.sampled_from(["a", "b", ".", "[ab]", "[^a]", r"\d", r"\w", "x", r"\.", "^", r"\b"])


def _regexes() -> st.SearchStrategy[str]:
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.builds(lambda a, b: a + b, inner, inner),
            st.builds(lambda a, b: f"(?:{a}|{b})", inner, inner),
            st.builds(lambda a, q: f"(?:{a}){q}", inner, st.sampled_from(["*", "+", "?", "{2}", "{1,3}", "*?"])),
        )
    return st.recursive(_atoms, extend, max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(_regexes(), st.text(alphabet="ab1x. \n", max_size=12), st.booleans())
def test_agrees_with_python_re_where_their_syntaxes_agree(pattern: str, text: str, fold: bool) -> None:
    python = re.compile(pattern, re.IGNORECASE | re.ASCII if fold else re.ASCII)
    assert compile_regex(pattern, "i" if fold else "").search(text) is (python.search(text) is not None)
