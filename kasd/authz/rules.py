"""A ``rules:`` list, compiled at config load, and the first-match decision for one job.

Rules are tried in order; the first whose ``if`` holds (a rule without ``if`` always does) decides:
``when: always`` allows, with the rule's namespace (and ``roles:``) resolved; ``when: never`` denies. When none
matches, the entry denies. An expression that cannot be evaluated, or a namespace that resolves to
no valid name under ``on_overflow: fail``, denies too, naming the rule. An entry without ``rules:``
does not come here: what it grants is the loader's and Authority's decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import attrs

from daemonkit.yamldoc import excerpt
from kasd.authz.agentconfig import AgentConfigError, Mark, RawRule
from kasd.authz.expand import (
    NamespaceError,
    OnOverflow,
    RoleError,
    RoleRef,
    resolve_namespace,
    resolve_role,
)
from kasd.authz.expr import (
    And,
    Expr,
    ExprEvaluationError,
    ExprSyntaxError,
    Match,
    Or,
    Pattern,
    parse,
    print_expr,
)

__all__ = ["MAX_RULES", "MAX_RULES_PROGRAM", "Rule", "RuleMatch", "compile_rules", "first_match", "program_size"]


@attrs.frozen(kw_only=True)
class Rule:
    """One compiled entry of a ``rules:`` list."""

    if_: Expr | None = None
    """The parsed ``if:``; None matches every job."""
    namespace: str | None = None
    """The ``namespace:`` template, ``$VAR`` and all; None leaves the namespace to the entry."""
    when: Literal["always", "never"] = "always"
    on_overflow: OnOverflow = "fail"
    roles: tuple[str, ...] = ()
    """The ``roles:`` templates (``edit``, ``Role/deployer-$CI_PROJECT_ID``); () grants ``admin``."""
    name: str | None = None
    """Where the rule was written, for errors (``ci_access.projects[0].rules[1]``); None: ``rules[i]``."""


@attrs.frozen(kw_only=True)
class RuleMatch:
    """What a rule list decided for one job, and why, in words a 403 body or a log line can carry."""

    allowed: bool
    index: int | None
    """The deciding rule's position in the list; None when no rule matched."""
    namespace: str | None = None
    """The resolved namespace, when allowed by a rule that has one."""
    roles: tuple[RoleRef, ...] = ()
    """The resolved ``roles:`` (with the namespace); () when the rule names none."""
    reason: str


def first_match(rules: Sequence[Rule], variables: Mapping[str, str]) -> RuleMatch:
    """Tries ``rules`` in order against ``variables`` (a job's CI variables); the first match decides."""
    for index, rule in enumerate(rules):
        label = rule.name or f"rules[{index}]"
        try:
            if rule.if_ is not None and not rule.if_.evaluate(variables):
                continue
        except ExprEvaluationError as e:
            return RuleMatch(allowed=False, index=index, reason=f"{label} could not be evaluated: {e}")
        # (printed for the rule that decides only: every rule tried costs its evaluation, no more)
        condition = "" if rule.if_ is None else f" (if: {print_expr(rule.if_)})"
        if rule.when == "never":
            return RuleMatch(allowed=False, index=index, reason=f"{label} matched{condition}: when: never")
        if rule.namespace is None:
            return RuleMatch(allowed=True, index=index, reason=f"{label} matched{condition}")
        try:
            namespace = resolve_namespace(rule.namespace, variables, on_overflow=rule.on_overflow,
                                          rule_name=label)
            roles = tuple(resolve_role(role, variables, rule_name=label) for role in rule.roles)
        except (NamespaceError, RoleError) as e:
            return RuleMatch(allowed=False, index=index, reason=str(e))
        granted = f" ({', '.join(map(str, roles))})" if roles else ""
        return RuleMatch(allowed=True, index=index, namespace=namespace, roles=roles,
                         reason=f"{label} matched{condition}: namespace {namespace}{granted}")
    return RuleMatch(allowed=False, index=None, reason=f"none of the {len(rules)} rules matched")


#: rules of one agent (every entry's together): a job's request tries its entry's in order on the
#: event loop, and ``GET /api/v4/job/allowed_agents`` every agent's. A file within its YAML budget
#: held ~6,000 (one aliased 700-character ``if:`` repeated), 0.13 s for each refused request.
MAX_RULES = 128

#: RE2 instructions of every ``/regex/`` in one agent's ``rules:`` together. Rules are evaluated on
#: the event loop, and RE2 builds each pattern's DFA at its first search: ~13 µs per instruction
#: for a 1,024-character value, so 200 patterns of 605 instructions (``/[a-z]{600}x1/``, ``…x2/`` …)
#: held the loop 1.6 s at the first job a reload saw, and a file within its YAML budget could hold
#: thousands. 10,000 is a few hundred ordinary patterns (``/^release\/.*$/`` is ~20).
MAX_RULES_PROGRAM = 10_000


def program_size(expr: Expr | None) -> int:
    """RE2 instructions of the ``/regex/`` literals in ``expr``."""
    total, stack = 0, [expr]
    while stack:
        item = stack.pop()
        if isinstance(item, (And, Or)):
            stack += (item.left, item.right)
        elif isinstance(item, Match) and isinstance(item.right, Pattern):
            total += item.right.regex.program_size
    return total


def compile_rules(raw: Sequence[RawRule], key: str) -> tuple[Rule, ...]:
    """A ``rules:`` list as read from a file (``kasd.authz.agentconfig``), each ``if:`` parsed once;
    an expression that does not parse raises ``AgentConfigError`` as
    ``<file>:<line>:<column>: <key>[i].if: <what was expected>``, the column the expression's own."""
    out: list[Rule] = []
    for index, rule in enumerate(raw):
        name = f"{key}[{index}]"
        expr: Expr | None = None
        if rule.if_text is not None:
            try:
                expr = parse(rule.if_text)
            except ExprSyntaxError as exc:
                mark = _expression_mark(rule, exc.column)
                where = f"{mark}: " if mark is not None else ""
                raise AgentConfigError(f"{where}{name}.if: {exc.message} (in {excerpt(rule.if_text, 60)})", mark=mark,
                                       key=f"{name}.if", problem=exc.message) from None
        out.append(Rule(if_=expr, namespace=rule.namespace, when=rule.when, on_overflow=rule.on_overflow,
                        roles=rule.roles, name=name))
    return tuple(out)


def _expression_mark(rule: RawRule, column: int) -> Mark | None:
    """Where in the file column ``column`` of the ``if:`` text is: exact for a plain or quoted
    one-line value, the value's start for a block scalar (whose lines the text does not keep)."""
    at = rule.if_mark
    if at is None:
        return None
    if rule.if_style in (None, "", "'", '"') and "\n" not in (rule.if_text or ""):
        quoted = 1 if rule.if_style in ("'", '"') else 0
        return Mark(file=at.file, line=at.line, column=at.column + quoted + column - 1)
    return at
