"""GitLab CI's ``rules:if`` expression language: parsed once at config load, evaluated per request.

Grammar (``||`` binds loosest, then ``&&``, then the comparisons, as in GitLab)::

    expr       := and ( "||" and )*
    and        := primary ( "&&" primary )*
    primary    := "(" expr ")" | operand [ ("==" | "!=") operand | ("=~" | "!~") (regex | variable) ]
    operand    := variable | string | "null"
    variable   := "$" [A-Za-z0-9_]+
    string     := '"' any but '"' and newline '"'  |  "'" any but "'" and newline "'"
    regex      := "/" RE2 source, "\\/" for "/" "/" [imsU]*

Read from GitLab's ``lib/gitlab/ci/pipeline/expression/``: its lexer (``lexer.rb``: at most 100
tokens), the lexemes (``string.rb`` has no escape sequences: a string simply ends at its first
closing quote), the shunting-yard parser (``parser.rb``) and ``statement.rb``.

Where kasd differs from GitLab, it does so to be predictable where an authorization depends on it:

* A bare value is true when it is defined and non-empty, wherever it stands. GitLab decides that
  only for the whole expression; inside ``&&``/``||`` it uses Ruby's truthiness, where ``""`` is
  true (gitlab-org/gitlab#321371: ``$EMPTY && $CI_COMMIT_BRANCH`` is true there, false here).
* A comparison's operands are values: ``($A == "x") == "y"`` and ``$A == /re/`` are syntax errors.
* ``$A =~ $PATTERN`` needs ``$PATTERN`` to hold ``/re/flags``. Undefined or empty, it matches nothing
  (``=~`` false, ``!~`` true, as GitLab). Anything else is an ``ExprEvaluationError``, which a rule
  list turns into a denial; GitLab would compare it as a plain string (gitlab-org/gitlab#426313).
* Regexes are RE2 itself (``kasd.authz.regex``, google-re2): the patterns RE2 refuses are syntax
  errors here, at load, with RE2's message.
"""

from __future__ import annotations

import abc
import functools
import re
import types
from collections.abc import Mapping
from typing import Literal

import attrs

from kasd.authz.regex import (
    FLAGS,
    MAX_PATTERN_LENGTH,
    Regex,
    RegexError,
    RegexInputTooLong,
    compile_regex,
)

__all__ = [
    "MAX_DEPTH",
    "MAX_LENGTH",
    "MAX_TOKENS",
    "And",
    "Compare",
    "Expr",
    "ExprEvaluationError",
    "ExprSyntaxError",
    "Match",
    "Null",
    "Operand",
    "Or",
    "Pattern",
    "String",
    "Variable",
    "parse",
    "print_expr",
]

MAX_LENGTH = 1024
"""Characters in one expression."""
MAX_TOKENS = 100
"""Tokens in one expression: GitLab's ``Lexer::MAX_TOKENS``."""
MAX_DEPTH = 16
"""Parentheses nested in one expression."""

_NAME = re.compile(r"[A-Za-z0-9_]+")


class ExprSyntaxError(ValueError):
    """Text that is not an expression. ``message`` says what was expected, ``column`` (1-based) where.

    ``str(error)`` is ``"<message> at column <column>"``; a loader adds the file, line and key. The
    column is within the text, or one past its end when the text ended too soon.
    """

    def __init__(self, message: str, column: int) -> None:
        super().__init__(f"{message} at column {column}")
        self.message = message
        self.column = column


class ExprEvaluationError(ValueError):
    """A value an expression cannot use: a ``$PATTERN`` holding no valid ``/regex/``, or text longer
    than a regex may be matched against. Callers deny (``kasd.authz.rules`` does)."""


def _truthy(value: str | None) -> bool:
    return value is not None and value != ""


class Expr(abc.ABC):
    """A parsed expression. Nodes are frozen and compare by value: ``parse(print_expr(e)) == e``."""

    __slots__ = ()

    @abc.abstractmethod
    def evaluate(self, variables: Mapping[str, str]) -> bool:
        """Whether the expression holds for these variables (an absent variable is ``null``).

        Raises ``ExprEvaluationError`` for a value it cannot use (see the class).
        """


def _check_name(_: object, __: attrs.Attribute[str], name: str) -> None:
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a variable name ([A-Za-z0-9_]+)")


def _check_string(_: object, __: attrs.Attribute[str], value: str) -> None:
    if "\n" in value:
        raise ValueError("a string cannot hold a newline")
    if '"' in value and "'" in value:
        raise ValueError("a string cannot hold both quote characters: the language has no escapes")


@attrs.frozen
class Variable(Expr):
    """``$NAME``: its value, or ``null`` when it is not defined."""

    name: str = attrs.field(validator=_check_name)

    def resolve(self, variables: Mapping[str, str]) -> str | None:
        return variables.get(self.name)

    def evaluate(self, variables: Mapping[str, str]) -> bool:
        return _truthy(self.resolve(variables))


@attrs.frozen
class String(Expr):
    """``"text"`` or ``'text'``; true when non-empty."""

    value: str = attrs.field(validator=_check_string)

    def resolve(self, variables: Mapping[str, str]) -> str | None:
        return self.value

    def evaluate(self, variables: Mapping[str, str]) -> bool:
        return self.value != ""


@attrs.frozen
class Null(Expr):
    """``null``: what an undefined variable is; never true."""

    def resolve(self, variables: Mapping[str, str]) -> str | None:
        return None

    def evaluate(self, variables: Mapping[str, str]) -> bool:
        return False


Operand = Variable | String | Null


def _canonical_source(source: str) -> str:
    r"""``\/`` and ``/`` mean the same to RE2; the tree holds ``/`` so that equal patterns are equal."""
    out = []
    i = 0
    while i < len(source):
        if source[i] == "\\" and i + 1 < len(source):
            out.append("/" if source[i + 1] == "/" else source[i:i + 2])
            i += 2
        else:
            out.append(source[i])
            i += 1
    return "".join(out)


def _canonical_flags(flags: str) -> str:
    unknown = set(flags) - set("imsU")
    if unknown:
        raise ValueError(f"unknown regex flag {sorted(unknown)[0]!r} (RE2 has i, m, s, U)")
    return "".join(f for f in "imsU" if f in flags)


@attrs.frozen
class Pattern:
    """``/source/flags``, compiled when constructed (``RegexError`` if RE2 would refuse it)."""

    source: str = attrs.field(converter=_canonical_source)
    flags: str = attrs.field(default="", converter=_canonical_flags)
    regex: Regex = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.source:
            raise RegexError("empty regex", 0)
        object.__setattr__(self, "regex", compile_regex(self.source, self.flags))


@attrs.frozen
class Compare(Expr):
    """``left == right`` or ``left != right``; ``null`` equals only ``null`` (not ``""``)."""

    op: Literal["==", "!="]
    left: Operand
    right: Operand

    def evaluate(self, variables: Mapping[str, str]) -> bool:
        equal = self.left.resolve(variables) == self.right.resolve(variables)
        return equal if self.op == "==" else not equal


@attrs.frozen
class Match(Expr):
    """``left =~ /re/`` (or a variable holding ``/re/``); ``!~`` is its negation. ``null`` is ``""``."""

    op: Literal["=~", "!~"]
    left: Operand
    right: Pattern | Variable

    def evaluate(self, variables: Mapping[str, str]) -> bool:
        if isinstance(self.right, Pattern):
            regex = self.right.regex
        else:
            held = self.right.resolve(variables)
            if not held:  # GitLab: no pattern, no match
                return self.op == "!~"
            regex = _pattern_in_variable(self.right.name, held)
        try:
            found = regex.search(self.left.resolve(variables) or "")
        except RegexInputTooLong as e:
            raise ExprEvaluationError(f"{print_expr(self.left)} is too long to match: {e}") from None
        return found if self.op == "=~" else not found


@attrs.frozen
class And(Expr):
    """``left && right``."""

    left: Expr
    right: Expr

    def evaluate(self, variables: Mapping[str, str]) -> bool:
        return self.left.evaluate(variables) and self.right.evaluate(variables)


@attrs.frozen
class Or(Expr):
    """``left || right``."""

    left: Expr
    right: Expr

    def evaluate(self, variables: Mapping[str, str]) -> bool:
        return self.left.evaluate(variables) or self.right.evaluate(variables)


def _pattern_in_variable(name: str, held: str) -> Regex:
    regex = _compile_held(held)
    if isinstance(regex, str):
        raise ExprEvaluationError(f"${name} does not hold a /regex/: {regex}")
    return regex


@functools.lru_cache(maxsize=64)
def _compile_held(held: str) -> Regex | str:
    """A variable's ``/re/flags`` compiled, or why it is not one. Cached: the same few recur."""
    if len(held) > MAX_PATTERN_LENGTH + 2 + len(FLAGS):
        return f"a pattern is at most {MAX_PATTERN_LENGTH} characters"
    found = re.fullmatch(r"/(.+)/([ismU]*)", held)
    if found is None or "\n" in held:
        return "expected /pattern/ with flags among i, m, s, U"
    try:
        return Pattern(found.group(1), found.group(2)).regex
    except RegexError as e:
        return e.reason


# --- printing -------------------------------------------------------------------------------------

def print_expr(expr: Expr | Pattern) -> str:
    """The canonical text of ``expr``: single spaces around operators, parentheses only where the
    precedence needs them, ``"`` unless the string holds one. ``parse(print_expr(e)) == e``."""
    if isinstance(expr, Variable):
        return f"${expr.name}"
    if isinstance(expr, String):
        quote = "'" if '"' in expr.value else '"'
        return f"{quote}{expr.value}{quote}"
    if isinstance(expr, Null):
        return "null"
    if isinstance(expr, Pattern):
        return f"/{_escape_slashes(expr.source)}/{expr.flags}"
    if isinstance(expr, Compare | Match):
        return f"{print_expr(expr.left)} {expr.op} {print_expr(expr.right)}"
    if isinstance(expr, And):
        # left-associative: a right operand of the same operator keeps its parentheses
        return f"{_wrap(expr.left, Or)} && {_wrap(expr.right, Or | And)}"
    if isinstance(expr, Or):
        return f"{print_expr(expr.left)} || {_wrap(expr.right, Or)}"
    raise TypeError(f"not an expression: {expr!r}")


def _wrap(expr: Expr, kinds: type | types.UnionType) -> str:
    text = print_expr(expr)
    return f"({text})" if isinstance(expr, kinds) else text


def _escape_slashes(source: str) -> str:
    out = []
    i = 0
    while i < len(source):
        if source[i] == "\\" and i + 1 < len(source):
            out.append(source[i:i + 2])
            i += 2
        else:
            out.append("\\/" if source[i] == "/" else source[i])
            i += 1
    return "".join(out)


# --- lexing ---------------------------------------------------------------------------------------

_OPERATORS = ("==", "!=", "=~", "!~", "&&", "||")


@attrs.frozen
class _Token:
    kind: str  # "(" ")" "var" "str" "re" "null" "end" or an operator
    text: str
    column: int
    node: Expr | Pattern | None = None

    @property
    def shown(self) -> str:
        return "the end" if self.kind == "end" else repr(self.text) if self.kind != "str" else self.text


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i = 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        column = i + 1
        if i == len(text):
            tokens.append(_Token("end", "the end", column))
            return tokens
        if len(tokens) == MAX_TOKENS:
            raise ExprSyntaxError(f"more than {MAX_TOKENS} tokens", column)
        c = text[i]
        two = text[i:i + 2]
        if c in "()":
            tokens.append(_Token(c, c, column))
            i += 1
        elif two in _OPERATORS:
            tokens.append(_Token(two, two, column))
            i += 2
        elif c == "$":
            name = _NAME.match(text, i + 1)
            if name is None:
                raise ExprSyntaxError("expected a variable name after '$'", column + 1)
            tokens.append(_Token("var", f"${name.group()}", column, Variable(name.group())))
            i = name.end()
        elif c in "\"'":
            end = text.find(c, i + 1)
            newline = text.find("\n", i + 1)
            if end < 0 or 0 <= newline < end:
                raise ExprSyntaxError(f"unterminated string (no closing {c} on the line)", column)
            tokens.append(_Token("str", text[i:end + 1], column, String(text[i + 1:end])))
            i = end + 1
        elif c == "/":
            i = _regex(text, i, tokens)
        elif c.isalpha() or c == "_":
            word = re.compile(r"\w+").match(text, i)
            assert word is not None
            if word.group() != "null":
                raise ExprSyntaxError(
                    f"unexpected word {word.group()!r} (variables start with '$', strings are quoted)", column)
            tokens.append(_Token("null", "null", column, Null()))
            i = word.end()
        elif c in "=!&|":
            expected = {"=": "'==' or '=~'", "!": "'!=' or '!~'", "&": "'&&'", "|": "'||'"}[c]
            raise ExprSyntaxError(f"expected {expected}", column)
        else:
            raise ExprSyntaxError(f"unexpected character {c!r}", column)


def _regex(text: str, start: int, tokens: list[_Token]) -> int:
    """Lexes ``/source/flags`` at ``start``; returns the index after it."""
    i = start + 1
    body: list[str] = []
    at: list[int] = []  # the text index of each body character, for error columns
    while True:
        if i >= len(text):
            raise ExprSyntaxError("unterminated regex (no closing '/')", start + 1)
        c = text[i]
        if c == "/":
            break
        if c == "\\" and i + 1 < len(text):
            pair = "/" if text[i + 1] == "/" else text[i:i + 2]
            body.append(pair)
            at.extend([i + (len(pair) == 1)] * len(pair))
            i += 2
            continue
        body.append(c)
        at.append(i)
        i += 1
    end = i + 1
    flags = re.compile(r"[A-Za-z]*").match(text, end)
    assert flags is not None
    bad = [f for f in flags.group() if f not in "imsU"]
    if bad:
        raise ExprSyntaxError(f"unknown regex flag {bad[0]!r} (RE2 has i, m, s, U)",
                              end + flags.group().index(bad[0]) + 1)
    source = "".join(body)
    if not source:
        raise ExprSyntaxError("empty regex", start + 1)
    try:
        node = Pattern(source, flags.group())
    except RegexError as e:
        index = at[e.offset] if e.offset < len(at) else i
        raise ExprSyntaxError(f"invalid regex: {e.reason}", index + 1) from None
    tokens.append(_Token("re", text[start:flags.end()], start + 1, node))
    return flags.end()


# --- parsing --------------------------------------------------------------------------------------

class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.i = 0
        self.depth = 0

    @property
    def token(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def expression(self) -> Expr:
        node = self.conjunction()
        while self.token.kind == "||":
            self.take()
            node = Or(node, self.conjunction())
        return node

    def conjunction(self) -> Expr:
        node = self.primary()
        while self.token.kind == "&&":
            self.take()
            node = And(node, self.primary())
        return node

    def primary(self) -> Expr:
        token = self.token
        if token.kind == "(":
            self.take()
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ExprSyntaxError(f"parentheses nested deeper than {MAX_DEPTH}", token.column)
            node = self.expression()
            if self.token.kind != ")":
                raise ExprSyntaxError(
                    f"expected ')' to close the '(' at column {token.column}, found {self.token.shown}",
                    self.token.column)
            self.take()
            self.depth -= 1
            return node
        left = self.operand(after=self.tokens[self.i - 1] if self.i else None)
        op = self.token.kind
        if op in ("==", "!="):
            self.take()
            return Compare(op, left, self.operand(after=self.tokens[self.i - 1]))  # type: ignore[arg-type]
        if op in ("=~", "!~"):
            self.take()
            right = self.take()
            if right.kind not in ("re", "var"):
                self.i -= 1
                raise ExprSyntaxError(f"expected a /regex/ or a variable after '{op}', found {right.shown}",
                                      right.column)
            return Match(op, left, right.node)  # type: ignore[arg-type]
        return left

    def operand(self, after: _Token | None) -> Operand:
        token = self.token
        if token.kind in ("var", "str", "null"):
            self.take()
            return token.node  # type: ignore[return-value]
        where = f" after '{after.text}'" if after is not None else ""
        if token.kind == "re":
            raise ExprSyntaxError(f"a /regex/ may only follow '=~' or '!~'; expected a value{where}",
                                  token.column)
        found = "" if token.kind == "end" else f", found {token.shown}"
        raise ExprSyntaxError(f"expected a value{where}{found}", token.column)


def parse(text: str) -> Expr:
    """Parses a ``rules:if`` expression. Raises ``ExprSyntaxError`` (message and 1-based column)."""
    if len(text) > MAX_LENGTH:
        raise ExprSyntaxError(f"expression longer than {MAX_LENGTH} characters", MAX_LENGTH + 1)
    tokens = _tokens(text)
    if tokens[0].kind == "end":
        raise ExprSyntaxError("empty expression", 1)
    parser = _Parser(tokens)
    node = parser.expression()
    token = parser.token
    if token.kind == ")":
        raise ExprSyntaxError("unmatched ')'", token.column)
    if token.kind != "end":
        if token.kind in ("==", "!=", "=~", "!~"):
            raise ExprSyntaxError(f"expected '&&', '||' or the end, found {token.shown} "
                                  "(comparisons do not chain)", token.column)
        raise ExprSyntaxError(f"expected '&&', '||' or the end, found {token.shown}", token.column)
    return node
