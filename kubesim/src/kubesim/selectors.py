"""Label and field selectors, parsed from their query-string form into predicates."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from kubesim.errors import bad_request

Predicate = Callable[[dict[str, Any]], bool]

_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside a `( … )` value set."""
    terms: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [t for t in terms if t.strip()]


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return obj.get("metadata", {}).get("labels") or {}


def parse_label_selector(text: str | None) -> Predicate:
    if not text:
        return lambda obj: True
    checks: list[Predicate] = []
    for term in _split_terms(text):
        match = _EQ_RE.match(term)
        if match:
            key, op, value = match.groups()
            if op == "!=":
                checks.append(lambda o, k=key, v=value: _labels(o).get(k) != v)
            else:
                checks.append(lambda o, k=key, v=value: _labels(o).get(k) == v)
            continue
        match = _SET_RE.match(term)
        if not match:
            raise bad_request(f"unable to parse requirement: found '{term.strip()}', expected: in, notin, =, ==, !=, gt, lt")
        negate, key, op, values = match.groups()
        if op:
            allowed = {v.strip() for v in values.split(",") if v.strip()}
            if op == "in":
                checks.append(lambda o, k=key, a=allowed: _labels(o).get(k) in a)
            else:
                checks.append(lambda o, k=key, a=allowed: _labels(o).get(k) not in a)
        elif negate:
            checks.append(lambda o, k=key: k not in _labels(o))
        else:
            checks.append(lambda o, k=key: k in _labels(o))
    return lambda obj: all(check(obj) for check in checks)


def selector_from_match_labels(selector: dict[str, Any] | None) -> Predicate:
    """A predicate for a structured `LabelSelector` (matchLabels and matchExpressions)."""
    if not selector:
        return lambda obj: False
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []

    def matches(obj: dict[str, Any]) -> bool:
        labels = _labels(obj)
        if any(labels.get(k) != v for k, v in match_labels.items()):
            return False
        for expr in expressions:
            key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
            if op == "In" and labels.get(key) not in values:
                return False
            if op == "NotIn" and labels.get(key) in values:
                return False
            if op == "Exists" and key not in labels:
                return False
            if op == "DoesNotExist" and key in labels:
                return False
        return True

    return matches


def selector_string(selector: dict[str, Any] | None) -> str:
    """A LabelSelector in the text form `kubectl` prints (`app=web,tier in (a,b)`)."""
    if not selector:
        return "<none>"
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        op = expr.get("operator")
        values = ",".join(sorted(expr.get("values") or []))
        if op == "In":
            parts.append(f"{expr['key']} in ({values})")
        elif op == "NotIn":
            parts.append(f"{expr['key']} notin ({values})")
        elif op == "Exists":
            parts.append(expr["key"])
        elif op == "DoesNotExist":
            parts.append(f"!{expr['key']}")
    return ",".join(parts) if parts else "<none>"


def field_value(obj: dict[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def parse_field_selector(text: str | None) -> Predicate:
    if not text:
        return lambda obj: True
    checks: list[Predicate] = []
    for term in _split_terms(text):
        match = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not match:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        path, op, value = match.groups()
        if op == "!=":
            checks.append(lambda o, p=path, v=value: field_value(o, p) != v)
        else:
            checks.append(lambda o, p=path, v=value: field_value(o, p) == v)
    return lambda obj: all(check(obj) for check in checks)
