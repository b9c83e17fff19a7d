"""Resource paths: `/api/v1/namespaces/ns/pods/name/log` → kind, namespace, name, subresource."""

from __future__ import annotations

import attrs

from kubesim import errors
from kubesim.resources import Kind, Registry


@attrs.frozen(kw_only=True)
class Target:
    kind: Kind
    namespace: str | None
    name: str | None
    subresource: str | None


def parse_target(registry: Registry, group: str, version: str, rest: list[str]) -> Target:
    """`rest` is the path after /api/v1 or /apis/group/version, split on "/"."""
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        candidate = registry.lookup(group, version, rest[2])
        if candidate is not None and candidate.namespaced:
            namespace, rest = rest[1], rest[2:]
    kind = registry.lookup(group, version, rest[0])
    if kind is None or len(rest) > 3:
        raise errors.page_not_found()
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    if sub is not None and sub not in kind.subresources:
        raise errors.page_not_found()
    return Target(kind=kind, namespace=namespace, name=name, subresource=sub)
