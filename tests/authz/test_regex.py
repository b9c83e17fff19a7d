"""The RE2 subset ``=~`` matches with: what it accepts, what it refuses, and that it never backtracks."""

from __future__ import annotations

import re

import pytest
import re2
from hypothesis import given, settings
from hypothesis import strategies as st

from kasd.authz.regex import (
    MAX_PROGRAM_SIZE,
    MAX_TEXT_LENGTH,
    RegexError,
    RegexInputTooLong,
    compile_regex,
)


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
    # Unicode classes: RE2 (and so GitLab) has them; the Pike VM this replaced refused them.
    (r"^\pL+$", "éλa", True),
    (r"^\p{Greek}", "λ", True),
    (r"^\p{Greek}", "l", False),
    ("(?i)é", "É", True),
    ("a.b", "a\udc80b", True),  # a lone surrogate (JSON's "\udc80") is one character, not an error
])
def test_matches_as_re2_does(pattern: str, text: str, matches: bool) -> None:
    assert compile_regex(pattern).search(text) is matches


@pytest.mark.parametrize(("pattern", "reason", "offset"), [
    # RE2's own messages (the Pike VM this replaced worded them its own way), with a hint where RE2
    # names only the operator; the offset is where the fragment RE2 quotes starts.
    (r"(a)\1", "invalid escape sequence: \\1 (RE2 has no backreferences)", 3),
    (r"(?=a)", "invalid perl operator: (?= (RE2 has no lookahead)", 0),
    (r"x(?<!a)b", "invalid perl operator: (?<! (RE2 has no lookbehind)", 1),
    (r"(?>a)", "invalid perl operator: (?> (RE2 has no atomic groups)", 0),
    (r"(?P=n)", "invalid perl operator: (?P (RE2 has no backreferences)", 0),
    (r"a**", "bad repetition operator: **", 1),
    (r"a*+", "bad repetition operator: *+", 1),
    (r"*a", "no argument for repetition operator: *", 0),
    (r"\Z", "invalid escape sequence: \\Z (RE2 has no \\Z; use \\z)", 0),
    (r"(a", "missing ): (a", 0),
    (r"a)", "unexpected ): a)", 0),  # RE2 quotes the whole pattern for an unbalanced parenthesis
    (r"[a", "missing ]: [a", 0),
    (r"a{1001}", "invalid repetition size: {1001}", 1),
    (r"[z-a]", "invalid character class range: z-a", 1),
    (r"\k", "invalid escape sequence: \\k", 0),
    (r"(?x)a", "invalid perl operator: (?x", 0),
    (r"x(?i)(a", "missing ): x(?i)(a", 0),
])
def test_refuses_what_re2_refuses(pattern: str, reason: str, offset: int) -> None:
    with pytest.raises(RegexError) as caught:
        compile_regex(pattern)
    assert (caught.value.reason, caught.value.offset) == (reason, offset)


def test_size_caps() -> None:
    with pytest.raises(RegexError, match="invalid repetition size"):  # RE2: nested counts multiply
        compile_regex("(a{100}){100}")
    with pytest.raises(RegexError, match="its RE2 program has 2629 instructions, at most 2000"):
        compile_regex(r"\pL\pN\pL")
    with pytest.raises(RegexError, match="pattern too large - compile failed"):  # RE2's max_mem
        compile_regex(r"\pL{1000}")
    # RE2 nests groups as deep as a 512-character pattern can (the Pike VM stopped at 32); so does GitLab
    assert compile_regex("(" * 40 + ")" * 40).search("")
    with pytest.raises(RegexError, match="longer than"):
        compile_regex("a" * 513)
    with pytest.raises(RegexInputTooLong):
        compile_regex("a").search("b" * (MAX_TEXT_LENGTH + 1))


def test_flags_are_gitlabs_inline_prefix_and_errors_quote_only_the_source() -> None:
    assert compile_regex("^b$", "m").search("a\nb")
    assert compile_regex("a.b", "s").search("a\nb")
    assert compile_regex("MAIN", "iU").search("main")
    with pytest.raises(RegexError) as caught:
        compile_regex("(a", "i")  # compiled as (?i)(a; the message quotes what was written
    assert (caught.value.reason, caught.value.offset) == ("missing ): (a", 0)


def test_a_long_counted_repetition_is_a_real_search_of_each_distinct_text() -> None:
    # The figure: the Pike VM took 0.1-0.4 s for each of these evaluations; RE2 takes
    # about 0.5 ms (bench/worstcase.py measures it; docs/benchmarks.md has the figures).
    regex = compile_regex("[a-z]{600}x")
    assert regex.program_size < MAX_PROGRAM_SIZE  # the cost bound: len(text) × program size
    for c in "abcdefghijklmnopqrst":  # distinct texts: each is a real search, not a remembered answer
        assert not regex.search(c * 1024)
    assert regex.search("b" * 600 + "x")


def test_a_repeated_question_is_answered_from_memory() -> None:
    regex = compile_regex("[a-z]{600}x")
    text = "q" * 1024
    assert not regex.search(text)
    for _ in range(10_000):
        assert not regex.search(text)
    memo = regex._matches.cache_info()  # type: ignore[attr-defined]  # the memo, functools.lru_cache
    assert (memo.misses, memo.hits) == (1, 10_000)  # RE2 searched once: ~0.2 µs a remembered answer


def test_the_re2_binding_keeps_what_kasd_relies_on() -> None:
    # kasd.authz.regex fences google-re2 (no type information): these are the calls it makes.
    options = re2.Options()
    for name in ("max_mem", "log_errors", "never_capture"):
        assert hasattr(options, name), name
    with pytest.raises(re2.error) as caught:
        re2.compile(b"a(?=b)", options)
    message = caught.value.args[0]
    assert (message.decode() if isinstance(message, bytes) else message) == "invalid perl operator: (?="
    compiled = re2.compile(b"[a-z]{600}x", options)
    assert compiled.programsize == 605
    assert compiled.search(b"b" * 600 + b"x") is not None


@pytest.mark.parametrize(("pattern", "found"), [(r"(a+)+$", False), (r"(a|aa)*c", False),
                                              (r"\d*\d*\d*\d*\d*\d*x", False), (r"(.*a){12}", True)])
def test_catastrophic_patterns_are_answered(pattern: str, found: bool) -> None:
    # Each of these takes Python's backtracking re seconds to centuries on this input; RE2 answers
    # in well under a millisecond (bench/worstcase.py), and the suite's time cap bounds it here.
    regex = compile_regex(pattern)
    assert regex.search("a" * 1000 + "!") is found


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
