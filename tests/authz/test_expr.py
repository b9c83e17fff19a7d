"""The rules:if language: GitLab's syntax, kasd's documented semantics, exact errors, a canonical printer."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kasd.authz.expr import (
    MAX_TOKENS,
    And,
    Compare,
    Expr,
    ExprEvaluationError,
    ExprSyntaxError,
    Match,
    Null,
    Operand,
    Or,
    Pattern,
    String,
    Variable,
    parse,
    print_expr,
)
from kasd.authz.regex import RegexError

# --- parsing and printing -------------------------------------------------------------------------


def test_precedence_is_gitlabs_and_binds_tighter_than_or() -> None:
    a, b, c = Variable("A"), Variable("B"), Variable("C")
    assert parse("$A && $B || $C") == Or(And(a, b), c)
    assert parse("$A || $B && $C") == Or(a, And(b, c))
    assert parse("$A && ($B || $C)") == And(a, Or(b, c))
    assert parse("$A || $B || $C") == Or(Or(a, b), c)  # left-associative
    assert parse('$A == "x" && $B =~ /^v\\d/i') == And(
        Compare("==", a, String("x")), Match("=~", b, Pattern("^v\\d", "i")))


def test_the_lexemes() -> None:
    assert parse("$CI_COMMIT_REF_NAME") == Variable("CI_COMMIT_REF_NAME")
    assert parse("$1abc") == Variable("1abc")  # GitLab's \w+
    assert parse("'a\\' == $A") == Compare("==", String("a\\"), Variable("A"))  # no escapes, as GitLab
    assert parse("""'say "hi"' == $A""") == Compare("==", String('say "hi"'), Variable("A"))
    assert parse('"" == null') == Compare("==", String(""), Null())
    assert parse("$A =~ /a\\/b/") == Match("=~", Variable("A"), Pattern("a/b"))
    assert parse("$A !~ $PATTERN") == Match("!~", Variable("A"), Variable("PATTERN"))
    assert parse("  (\t$A\n)  ") == Variable("A")


@pytest.mark.parametrize(("text", "message", "column"), [
    ("", "empty expression", 1),
    ("$CI_COMMIT ==", "expected a value after '=='", 14),
    ('$A == "x" == "y"', "expected '&&', '||' or the end, found '==' (comparisons do not chain)", 11),
    ("$A $B", "expected '&&', '||' or the end, found '$B'", 4),
    ("($A", "expected ')' to close the '(' at column 1, found the end", 4),
    ("$A)", "unmatched ')'", 3),
    ("$A == /x/", "a /regex/ may only follow '=~' or '!~'; expected a value after '=='", 7),
    ('$A =~ "x"', "expected a /regex/ or a variable after '=~', found \"x\"", 7),
    ('$A == "abc', 'unterminated string (no closing " on the line)', 7),
    ("$A == 'a\nb'", "unterminated string (no closing ' on the line)", 7),
    ("$A =~ /abc", "unterminated regex (no closing '/')", 7),
    ("$A =~ /ab(?=c)/", "invalid regex: invalid perl operator: (?= (RE2 has no lookahead)", 10),
    ("$A =~ /(x)\\1/", "invalid regex: invalid escape sequence: \\1 (RE2 has no backreferences)", 11),
    ("$A =~ /x/q", "unknown regex flag 'q' (RE2 has i, m, s, U)", 10),
    ("$A =~ //", "empty regex", 7),
    ("true", "unexpected word 'true' (variables start with '$', strings are quoted)", 1),
    ('$A = "x"', "expected '==' or '=~'", 4),
    ("$A & $B", "expected '&&'", 4),
    ("$ == 1", "expected a variable name after '$'", 2),
    ("$A && ", "expected a value after '&&'", 7),
    ("()", "expected a value after '(', found ')'", 2),
    ("$A == #", "unexpected character '#'", 7),
    ("(" * 17 + "$A" + ")" * 17, "parentheses nested deeper than 16", 17),
    ("$A && " * 60 + "$A", f"more than {MAX_TOKENS} tokens", 301),
    ("$A == " + '"' + "x" * 1100 + '"', "expression longer than 1024 characters", 1025),
])
def test_syntax_errors_say_what_was_expected_and_where(text: str, message: str, column: int) -> None:
    with pytest.raises(ExprSyntaxError) as caught:
        parse(text)
    assert (caught.value.message, caught.value.column) == (message, column)
    assert str(caught.value) == f"{message} at column {column}"


def test_the_printer_is_canonical() -> None:
    assert print_expr(parse("(($A))&&('x'==$B)")) == '$A && $B == "x"'.replace('$B == "x"', '"x" == $B')
    assert print_expr(parse("$A && ($B && $C)")) == "$A && ($B && $C)"
    assert print_expr(parse("($A || $B) && $C")) == "($A || $B) && $C"
    assert print_expr(parse("$A =~ /a\\/b/smi")) == "$A =~ /a\\/b/ims"
    assert print_expr(parse("""$A == 'say "hi"'""")) == """$A == 'say "hi"'"""


def test_nodes_refuse_what_the_language_cannot_write() -> None:
    with pytest.raises(ValueError, match="both quote"):
        String("""it's "x" """)
    with pytest.raises(ValueError, match="newline"):
        String("a\nb")
    with pytest.raises(ValueError, match="variable name"):
        Variable("A-B")
    with pytest.raises(RegexError):
        Pattern("(?<=x)")


# --- evaluation -----------------------------------------------------------------------------------

VARS = {"BRANCH": "main", "EMPTY": "", "SPACE": " ", "TAG": "v1.2.3", "RE": "/^MA/i", "NOT_RE": "main"}


@pytest.mark.parametrize(("text", "holds"), [
    ("$BRANCH", True),
    ("$EMPTY", False),
    ("$UNDEFINED", False),
    ("$SPACE", True),  # non-empty (GitLab's Rails present? would call it blank)
    ("$EMPTY && $BRANCH", False),  # GitLab says true here: gitlab-org/gitlab#321371
    ("$EMPTY || $BRANCH", True),  # GitLab says false here: gitlab-org/gitlab#463528
    ('$BRANCH == "main"', True),
    ("$BRANCH == 'main'", True),
    ('$BRANCH != "main"', False),
    ("$UNDEFINED == null", True),
    ('$UNDEFINED == ""', False),
    ("$EMPTY == null", False),
    ('$EMPTY == ""', True),
    ("null", False),
    ('"x"', True),
    ('""', False),
    ("$TAG =~ /^v\\d+\\.\\d+/", True),
    ("$TAG !~ /^v\\d+\\.\\d+/", False),
    ("$BRANCH =~ /^MAIN$/", False),
    ("$BRANCH =~ /^MAIN$/i", True),
    ("$UNDEFINED =~ /^$/", True),  # null is matched as ""
    ("$BRANCH =~ $RE", True),
    ("$BRANCH =~ $UNDEFINED", False),  # no pattern, no match (as GitLab)
    ("$BRANCH !~ $UNDEFINED", True),
    ("$BRANCH =~ $EMPTY", False),
    ('$BRANCH == "main" && ($TAG =~ /^v2/ || $TAG =~ /^v1/)', True),
    ('$BRANCH == "main" && $TAG =~ /^v2/ || $TAG =~ /^v1/', True),
    ('$BRANCH == "x" && ($TAG =~ /^v2/ || $TAG =~ /^v1/)', False),
])
def test_evaluation(text: str, holds: bool) -> None:
    assert parse(text).evaluate(VARS) is holds


def test_a_variable_that_holds_no_regex_is_an_error_not_a_guess() -> None:
    with pytest.raises(ExprEvaluationError, match=r"\$NOT_RE does not hold a /regex/"):
        parse("$BRANCH =~ $NOT_RE").evaluate(VARS)
    with pytest.raises(ExprEvaluationError, match="lookbehind"):
        parse("$BRANCH =~ $R").evaluate({"BRANCH": "main", "R": "/(?<=a)in/"})
    with pytest.raises(ExprEvaluationError, match="too long"):
        parse("$LONG =~ /x/").evaluate({"LONG": "a" * 5000})


# --- properties -----------------------------------------------------------------------------------

NAMES = ["A", "B", "C_1"]
VALUES = ["", "main", "ma", "x", "MAIN"]
LITERALS = ["ma", "in", "x", "a/b"]

_operands: st.SearchStrategy[Operand] = st.one_of(
    st.sampled_from(NAMES).map(Variable),
    st.text(alphabet="ab '\"/\\$()&|=~!", max_size=6).filter(lambda s: not ('"' in s and "'" in s)).map(String),
    st.just(Null()),
)
_patterns = st.builds(lambda lit, anchored, flags: Pattern(("^" if anchored else "") + lit, flags),
                      st.sampled_from(LITERALS), st.booleans(), st.sampled_from(["", "i", "ims"]))
_leaves: st.SearchStrategy[Expr] = st.one_of(
    _operands,
    st.builds(Compare, st.sampled_from(["==", "!="]), _operands, _operands),
    st.builds(Match, st.sampled_from(["=~", "!~"]), _operands, st.one_of(_patterns, st.just(Variable("P")))),
)
_exprs: st.SearchStrategy[Expr] = st.recursive(
    _leaves, lambda inner: st.one_of(st.builds(And, inner, inner), st.builds(Or, inner, inner)), max_leaves=10)
_variables = st.dictionaries(st.sampled_from([*NAMES, "P"]), st.sampled_from([*VALUES, "/^M/i", "/in/"]))


def _reference(expr: Expr, variables: Mapping[str, str]) -> bool:
    """The documented semantics, spelled out over the tree (patterns here are literals, maybe ^)."""
    def value(operand: Operand) -> str | None:
        if isinstance(operand, Variable):
            return variables.get(operand.name)
        return operand.value if isinstance(operand, String) else None

    def found(pattern: Pattern | str, text: str) -> bool:
        source, flags = (pattern.source, pattern.flags) if isinstance(pattern, Pattern) else (
            pattern[1:pattern.rindex("/")], pattern[pattern.rindex("/") + 1:])
        if "i" in flags:
            source, text = source.lower(), text.lower()
        return text.startswith(source[1:]) if source.startswith("^") else source in text

    if isinstance(expr, Variable | String | Null):
        return value(expr) not in (None, "")
    if isinstance(expr, Compare):
        return (value(expr.left) == value(expr.right)) == (expr.op == "==")
    if isinstance(expr, Match):
        pattern = expr.right if isinstance(expr.right, Pattern) else variables.get(expr.right.name) or None
        hit = pattern is not None and found(pattern, value(expr.left) or "")
        return hit == (expr.op == "=~")
    if isinstance(expr, And):
        return _reference(expr.left, variables) and _reference(expr.right, variables)
    assert isinstance(expr, Or)
    return _reference(expr.left, variables) or _reference(expr.right, variables)


@settings(max_examples=120, deadline=None)
@given(_exprs)
def test_print_then_parse_is_the_identity(expr: Expr) -> None:
    assert parse(print_expr(expr)) == expr


@settings(max_examples=120, deadline=None)
@given(_exprs, _variables)
def test_evaluation_agrees_with_the_reference(expr: Expr, variables: dict[str, str]) -> None:
    assume(variables.get("P", "/") .startswith("/"))  # a non-pattern $P is an error, tested above
    assert expr.evaluate(variables) is _reference(expr, variables)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="$AB_ \"'/()=!~&|nul\\x.*?[]1", max_size=30))
def test_any_text_parses_or_fails_with_a_column_inside_it(text: str) -> None:
    try:
        expr = parse(text)
    except ExprSyntaxError as e:
        assert 1 <= e.column <= len(text) + 1
    else:
        assert parse(print_expr(expr)) == expr


@settings(max_examples=80, deadline=None)
@given(_exprs, st.data())
def test_damaged_expressions_fail_with_a_column_inside_them(expr: Expr, data: st.DataObject) -> None:
    text = print_expr(expr)
    at = data.draw(st.integers(0, len(text)))
    damaged = text[:at] + data.draw(st.sampled_from(["(", ")", "=", "&", "/", "$", '"', " &&", "== "])) + text[at:]
    try:
        parse(damaged)
    except ExprSyntaxError as e:
        assert 1 <= e.column <= len(damaged) + 1
