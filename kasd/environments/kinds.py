"""Which kinds an environment's discovery lists, read from the cluster's discovery documents.

A real API server (1.27+) and kubesim answer ``/api`` and ``/apis`` with aggregated discovery
(``APIGroupDiscoveryList``, ``apidiscovery.k8s.io/v2``, or ``v2beta1`` before 1.30) when asked for it
in ``Accept``, as kubectl does; an older one answers the legacy ``APIVersions`` / ``APIGroupList``,
and each group version's ``APIResourceList`` is then read apart. Both are parsed here (pure).

Listed: every namespaced kind whose verbs include ``list`` and ``watch``, CRDs included, in each
group's preferred version (the first listed; a kind only an older version serves is taken from it),
subresources left out, and not in ``SKIPPED``: kinds controllers and the control plane write, which
no one deploys (their objects are reached as dependents where they matter).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

#: ``Accept`` for ``/api`` and ``/apis``: aggregated discovery (v2, then v2beta1), else the legacy list
DISCOVERY_ACCEPT = ("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
                    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,"
                    "application/json")

#: (group, resource) never listed by label: what controllers and the control plane write
SKIPPED: Mapping[tuple[str, str], str] = {
    ("", "events"): "written by controllers; an object's events are read apart",
    ("events.k8s.io", "events"): "the same Events",
    ("", "endpoints"): "the Endpoints controller's copy of a Service's EndpointSlices",
    ("apps", "controllerrevisions"): "StatefulSet and DaemonSet history, written by their controllers",
    ("coordination.k8s.io", "leases"): "leader election and node heartbeats",
    ("storage.k8s.io", "csistoragecapacities"): "written by CSI drivers",
    ("", "bindings"): "a write-only subresource-like kind",
}

#: kinds whose objects usually carry no labels of their own but belong to a labelled owner: listed
#: whole in each namespace (and watched so), and kept when an owner is in the environment
DEPENDENT: frozenset[tuple[str, str]] = frozenset({
    ("apps", "replicasets"), ("", "pods"), ("batch", "jobs"), ("discovery.k8s.io", "endpointslices"),
})


@attrs.frozen
class ApiKind:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    verbs: tuple[str, ...]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def dependent(self) -> bool:
        return (self.group, self.plural) in DEPENDENT

    def path(self, namespace: str | None, name: str | None = None) -> str:
        """The collection's path (in ``namespace`` when namespaced), or one object's."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        where = f"{prefix}/namespaces/{namespace}/{self.plural}" if self.namespaced and namespace else \
            f"{prefix}/{self.plural}"
        return f"{where}/{name}" if name else where


class DiscoveryError(ValueError):
    """A discovery document kasd cannot read (the message says which and why)."""


def is_aggregated(doc: Mapping[str, Any]) -> bool:
    return doc.get("kind") == "APIGroupDiscoveryList"


def from_aggregated(doc: Mapping[str, Any]) -> list[ApiKind]:
    """The kinds of an ``APIGroupDiscoveryList`` (``/api`` or ``/apis``), every version."""
    kinds: list[ApiKind] = []
    for item in _list(doc.get("items")):
        group = str((item.get("metadata") or {}).get("name") or "")
        for version in _list(item.get("versions")):
            name = str(version.get("version") or "")
            for resource in _list(version.get("resources")):
                response = resource.get("responseKind") or {}
                plural, kind = resource.get("resource"), response.get("kind") if isinstance(response, dict) else None
                if isinstance(plural, str) and isinstance(kind, str) and name:
                    kinds.append(ApiKind(group, name, kind, plural, resource.get("scope") == "Namespaced",
                                         _verbs(resource.get("verbs"))))
    return kinds


def legacy_group_versions(api_versions: Mapping[str, Any], group_list: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(group, version) of each ``APIResourceList`` to read: the core ``APIVersions``' versions and
    every version of each group of the ``APIGroupList``, preferred first."""
    out = [("", str(v)) for v in api_versions.get("versions") or () if isinstance(v, str)]
    for group in _list(group_list.get("groups")):
        name = group.get("name")
        if not isinstance(name, str):
            continue
        preferred = (group.get("preferredVersion") or {}).get("version")
        versions = [str(v.get("version")) for v in _list(group.get("versions")) if isinstance(v.get("version"), str)]
        versions.sort(key=lambda v: v != preferred)
        out += [(name, v) for v in versions]
    return out


def from_resource_list(group: str, version: str, doc: Mapping[str, Any]) -> list[ApiKind]:
    """The kinds of one legacy ``APIResourceList`` (subresources, ``pods/log``, left out)."""
    kinds = []
    for resource in _list(doc.get("resources")):
        plural, kind = resource.get("name"), resource.get("kind")
        if isinstance(plural, str) and "/" not in plural and isinstance(kind, str):
            kinds.append(ApiKind(group, version, kind, plural, bool(resource.get("namespaced")),
                                 _verbs(resource.get("verbs"))))
    return kinds


def listable(kinds: Iterable[ApiKind]) -> list[ApiKind]:
    """The kinds an environment's discovery lists: namespaced, list and watch, not ``SKIPPED``;
    one version per (group, kind): the first seen (discovery lists the preferred version first)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for kind in kinds:
        if (kind.group, kind.kind) in seen:
            continue
        seen.add((kind.group, kind.kind))
        if kind.namespaced and {"list", "watch"} <= set(kind.verbs) and (kind.group, kind.plural) not in SKIPPED:
            out.append(kind)
    return sorted(out, key=lambda k: (k.group, k.kind))


def served(kinds: Iterable[ApiKind]) -> dict[tuple[str, str], ApiKind]:
    """(group, plural) → the kind, first version seen, every scope: for the GETs of dependents."""
    out: dict[tuple[str, str], ApiKind] = {}
    for kind in kinds:
        out.setdefault((kind.group, kind.plural), kind)
    return out


def _list(value: object) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _verbs(value: object) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


__all__ = ["DEPENDENT", "DISCOVERY_ACCEPT", "SKIPPED", "ApiKind", "DiscoveryError", "from_aggregated",
           "from_resource_list", "is_aggregated", "legacy_group_versions", "listable", "served"]
