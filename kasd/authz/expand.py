"""``namespace:`` templates: ``$VAR`` expansion, and the check that the result is a namespace name.

Expansion is GitLab's ``ExpandVariables.expand`` (``lib/expand_variables.rb``): ``$NAME``,
``${NAME}`` and ``%NAME%`` (NAME is ``[A-Za-z_][A-Za-z0-9_]*``) are replaced by the variable's value,
an undefined variable by nothing. GitLab's server side has no ``$$`` escape (the runner's shell
does), so neither has this: ``$$NAME`` is a ``$`` and then ``$NAME``'s value; a ``$`` not followed
by a name stays as it is.

A namespace must be a DNS-1123 label: lowercase letters, digits and ``-``, starting and ending with a
letter or digit, 1 to 63 characters.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Literal

__all__ = [
    "MAX_LABEL_LENGTH",
    "NamespaceError",
    "OnOverflow",
    "expand",
    "is_dns1123_label",
    "resolve_namespace",
    "to_dns1123_label",
]

MAX_LABEL_LENGTH = 63

OnOverflow = Literal["fail", "truncate"]

_REFERENCE = re.compile(
    r"\$([A-Za-z_][A-Za-z0-9_]*)|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|%([A-Za-z_][A-Za-z0-9_]*)%")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_INVALID = re.compile(r"[^a-z0-9]+")
_DIGEST_LENGTH = 8


class NamespaceError(ValueError):
    """A template resolved to something that is not a namespace name; says which rule and what value."""

    def __init__(self, rule_name: str, template: str, value: str, problem: str) -> None:
        super().__init__(f"{rule_name}: namespace {template!r} resolved to {value!r}, which {problem}")
        self.rule_name = rule_name
        self.template = template
        self.value = value
        self.problem = problem


def expand(template: str, variables: Mapping[str, str]) -> str:
    """``template`` with each ``$NAME``, ``${NAME}`` and ``%NAME%`` replaced; undefined ones by ``""``."""
    return _REFERENCE.sub(lambda m: variables.get(m.group(1) or m.group(2) or m.group(3), ""), template)


def is_dns1123_label(value: str) -> bool:
    """Whether ``value`` is a Kubernetes namespace name (an RFC 1123 label)."""
    return len(value) <= MAX_LABEL_LENGTH and _LABEL.fullmatch(value) is not None


def _problem(value: str) -> str:
    if not value:
        return "is empty"
    if len(value) > MAX_LABEL_LENGTH:
        return f"is longer than {MAX_LABEL_LENGTH} characters"
    return "is not a DNS-1123 label (lowercase letters, digits and '-', starting and ending alphanumeric)"


def to_dns1123_label(value: str) -> str:
    """A valid label for any ``value``: ``value`` itself when it is one; otherwise lowercased, each run
    of other characters made one ``-``, trimmed, cut to leave room for ``-`` and the first 8 hex
    digits of the SHA-256 of ``value`` (so that values that read alike stay apart). Deterministic."""
    if is_dns1123_label(value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:_DIGEST_LENGTH]
    readable = _INVALID.sub("-", value.lower()).strip("-")
    readable = readable[:MAX_LABEL_LENGTH - _DIGEST_LENGTH - 1].rstrip("-")
    return f"{readable}-{digest}" if readable else digest


def resolve_namespace(
    template: str,
    variables: Mapping[str, str],
    *,
    on_overflow: OnOverflow = "fail",
    rule_name: str = "rule",
) -> str:
    """The namespace ``template`` names for these variables.

    With ``on_overflow="fail"`` a result that is not a DNS-1123 label raises ``NamespaceError``
    (naming ``rule_name`` and the value); with ``"truncate"`` it is made into one by
    ``to_dns1123_label``. Never returns an invalid label.
    """
    value = expand(template, variables)
    if is_dns1123_label(value):
        return value
    if on_overflow == "truncate":
        return to_dns1123_label(value)
    raise NamespaceError(rule_name, template, value, _problem(value))
