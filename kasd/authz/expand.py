"""``namespace:`` templates: ``$VAR`` expansion, and the check that the result is a namespace name.

Expansion is GitLab's ``ExpandVariables.expand`` (``lib/expand_variables.rb``): ``$NAME``,
``${NAME}`` and ``%NAME%`` (NAME is ``[A-Za-z_][A-Za-z0-9_]*``) are replaced by the variable's value,
an undefined variable by nothing. GitLab's server side has no ``$$`` escape (the runner's shell
does), so neither has this: ``$$NAME`` is a ``$`` and then ``$NAME``'s value; a ``$`` not followed
by a name stays as it is.

A namespace must be a DNS-1123 label: lowercase letters, digits and ``-``, starting and ending with a
letter or digit, 1 to 63 characters.

A rule's ``roles:`` entry is ``<name>`` or ``ClusterRole/<name>`` (a ClusterRole) or ``Role/<name>`` (a
Role in the managed namespace); the kind is read as written, only the name is expanded, and the
result must be an RBAC role name kasd accepts: a letter or digit, then letters, digits, ``:``,
``.``, ``_`` and ``-``, at most ``MAX_ROLE_LENGTH`` characters (the binding's name holds it).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Literal

import attrs

__all__ = [
    "MAX_LABEL_LENGTH",
    "MAX_ROLE_LENGTH",
    "NamespaceError",
    "OnOverflow",
    "RoleError",
    "RoleRef",
    "expand",
    "is_dns1123_label",
    "resolve_namespace",
    "resolve_role",
    "role_template_problem",
    "to_dns1123_label",
]

MAX_LABEL_LENGTH = 63

OnOverflow = Literal["fail", "truncate"]

_REFERENCE = re.compile(
    r"\$([A-Za-z_][A-Za-z0-9_]*)|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|%([A-Za-z_][A-Za-z0-9_]*)%")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_INVALID = re.compile(r"[^a-z0-9]+")
_DIGEST_LENGTH = 8
#: the longest role name: ``gitlab-job-access-<24-character slug>.clusterrole.<name>`` stays within the
#: 253 characters of an object name
MAX_ROLE_LENGTH = 190
_ROLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._-]*")
RoleKind = Literal["ClusterRole", "Role"]


@attrs.frozen
class RoleRef:
    """What a managed namespace's RoleBinding grants: a ClusterRole, or a Role in that namespace."""

    kind: RoleKind
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


class RoleError(ValueError):
    """A ``roles:`` entry resolved to something that is not a role name; says which rule and value."""


def _split_role(template: str) -> tuple[RoleKind, str]:
    kind, slash, name = template.partition("/")
    if not slash:
        return "ClusterRole", template
    if kind not in ("ClusterRole", "Role"):
        raise RoleError(f"{kind!r} is not a kind of role (write <name> or ClusterRole/<name> for a ClusterRole, "
                        "Role/<name> for a Role in the managed namespace)")
    return ("Role" if kind == "Role" else "ClusterRole"), name


def _role_name_problem(name: str) -> str | None:
    if not name:
        return "is empty"
    if len(name) > MAX_ROLE_LENGTH:
        return f"is longer than {MAX_ROLE_LENGTH} characters"
    if not _ROLE_NAME.fullmatch(name):
        return "is not a role name (a letter or digit, then letters, digits, ':', '.', '_' and '-')"
    return None


def role_template_problem(template: str) -> str | None:
    """What is wrong with a ``roles:`` entry as written (its kind, the literal parts of its name),
    None when nothing is: a name made of variables is checked once they are expanded."""
    try:
        _, name = _split_role(template)
    except RoleError as exc:
        return str(exc)
    if not name:
        return f"{template!r} names no role"
    problem = _role_name_problem(_REFERENCE.sub("a", name))  # each variable as some valid value
    return f"{template!r} {problem}" if problem else None


def resolve_role(template: str, variables: Mapping[str, str], *, rule_name: str = "rule") -> RoleRef:
    """The role a ``roles:`` entry names for these variables; ``RoleError`` naming the rule and value."""
    kind, name = _split_role(template)
    value = expand(name, variables)
    problem = _role_name_problem(value)
    if problem:
        raise RoleError(f"{rule_name}: role {template!r} resolved to {value!r}, which {problem}")
    return RoleRef(kind, value)


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
