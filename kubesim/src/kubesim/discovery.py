"""Discovery documents: /api, /apis, per group-version lists and aggregated discovery (v2)."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from kubesim.resources import Kind, Registry

# Subresource → (verbs, response kind group, version, kind). "" group/version = the parent's.
SUBRESOURCES: dict[str, tuple[tuple[str, ...], str, str, str]] = {
    "status": (("get", "patch", "update"), "", "", ""),
    "scale": (("get", "patch", "update"), "autoscaling", "v1", "Scale"),
    "log": (("get",), "", "", "Pod"),
    "exec": (("create", "get"), "", "", "PodExecOptions"),
    "attach": (("create", "get"), "", "", "PodAttachOptions"),
    "portforward": (("create", "get"), "", "", "PodPortForwardOptions"),
    "binding": (("create",), "", "", "Binding"),
    "eviction": (("create",), "policy", "v1", "Eviction"),
    "token": (("create",), "authentication.k8s.io", "v1", "TokenRequest"),
    "finalize": (("update",), "", "", "Namespace"),
}


def _hash(kind: Kind) -> str:
    digest = hashlib.sha256(f"{kind.group}/{kind.version}/{kind.kind}".encode()).digest()
    return base64.b64encode(digest[:8]).decode()


def api_versions(server_address: str) -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


def _group_entry(group: str, versions: list[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(registry: Registry) -> dict[str, Any]:
    groups = [_group_entry(g, vs) for g, vs in registry.groups() if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(registry: Registry, group: str) -> dict[str, Any] | None:
    for name, versions in registry.groups():
        if name == group and group:
            return {"kind": "APIGroup", "apiVersion": "v1", **_group_entry(group, versions)}
    return None


def api_resource_list(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    kinds = registry.in_group_version(group, version)
    if not kinds:
        return None
    resources: list[dict[str, Any]] = []
    for kind in sorted(kinds, key=lambda k: k.plural):
        entry: dict[str, Any] = {
            "name": kind.plural, "singularName": kind.singular, "namespaced": kind.namespaced,
            "kind": kind.kind, "verbs": list(kind.verbs),
        }
        if kind.short_names:
            entry["shortNames"] = list(kind.short_names)
        if kind.categories:
            entry["categories"] = list(kind.categories)
        if not kind.custom:
            entry["storageVersionHash"] = _hash(kind)
        resources.append(entry)
        for sub in kind.subresources:
            verbs, sub_group, sub_version, sub_kind = SUBRESOURCES[sub]
            sub_entry: dict[str, Any] = {"name": f"{kind.plural}/{sub}", "singularName": "",
                                         "namespaced": kind.namespaced, "kind": sub_kind or kind.kind,
                                         "verbs": list(verbs)}
            if sub_group:
                sub_entry["group"] = sub_group
                sub_entry["version"] = sub_version
            resources.append(sub_entry)
    group_version = f"{group}/{version}" if group else version
    body: dict[str, Any] = {"kind": "APIResourceList", "groupVersion": group_version, "resources": resources}
    if group:
        body["apiVersion"] = "v1"
    return body


def _discovery_resource(kind: Kind) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "resource": kind.plural,
        "responseKind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
        "scope": "Namespaced" if kind.namespaced else "Cluster",
        "singularResource": kind.singular,
        "verbs": list(kind.verbs),
    }
    if kind.short_names:
        entry["shortNames"] = list(kind.short_names)
    if kind.categories:
        entry["categories"] = list(kind.categories)
    subs = []
    for sub in kind.subresources:
        verbs, sub_group, sub_version, sub_kind = SUBRESOURCES[sub]
        subs.append({
            "subresource": sub,
            "responseKind": {"group": sub_group or kind.group, "version": sub_version or kind.version,
                             "kind": sub_kind or kind.kind},
            "verbs": list(verbs),
        })
    if subs:
        entry["subresources"] = subs
    return entry


def aggregated(registry: Registry, *, core: bool, api_version: str) -> dict[str, Any]:
    """An APIGroupDiscoveryList: /api (core only) or /apis (every other group)."""
    items = []
    for group, versions in registry.groups():
        if core != (group == ""):
            continue
        metadata: dict[str, Any] = {"creationTimestamp": None}
        if group:
            metadata["name"] = group
        items.append({
            "metadata": metadata,
            "versions": [
                {"version": version,
                 "resources": [_discovery_resource(k) for k in sorted(
                     registry.in_group_version(group, version), key=lambda k: k.plural)],
                 "freshness": "Current"}
                for version in versions
            ],
        })
    return {"kind": "APIGroupDiscoveryList", "apiVersion": api_version, "metadata": {}, "items": items}


def wants_aggregated(accept: str) -> str | None:
    """The aggregated discovery version the Accept header asks for, if any."""
    for part in accept.split(","):
        params = {p.strip() for p in part.split(";")[1:]}
        if "as=APIGroupDiscoveryList" in params and "g=apidiscovery.k8s.io" in params:
            if "v=v2" in params:
                return "v2"
            if "v=v2beta1" in params:
                return "v2beta1"
    return None
