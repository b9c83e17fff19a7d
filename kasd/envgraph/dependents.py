"""Which objects that do not carry the environment's labels discovery should fetch as well.

``dependents_to_fetch(objects)`` is a function over the objects fetched so far: it returns the
requests whose answers would add the next layer of dependents. The shell calls it with what the
labelled lists returned, makes the requests it has not made yet, adds the answers (keeping, for a
request with ``owner_uid``, only the objects whose ``ownerReferences`` name that uid), and calls it
again with the union, until it returns no request it has not made (at most four rounds reach the
end of every chain here: Deployment → ReplicaSet → Pod → ConfigMap/Secret/PVC/ServiceAccount,
CronJob → Job → Pod → …, PVC → PV). ``FetchRequest`` is frozen and hashable, so "made" is a set.

What each object asks for:

=====================================  ==========================================================
Deployment                             its ReplicaSets (its ``spec.selector``; owned by its uid)
ReplicaSet, StatefulSet, DaemonSet,    their Pods (``spec.selector``; owned by its uid)
Job
CronJob                                its Jobs (the job template's labels when it has some; owned
                                       by its uid)
Service                                its EndpointSlices (``kubernetes.io/service-name=<name>``)
Ingress                                the Services it routes to (by name)
Pod                                    the ConfigMaps, Secrets, PVCs and ServiceAccount it uses
                                       (by name)
PersistentVolumeClaim                  its PersistentVolume (by name; cluster-scoped)
=====================================  ==========================================================

Nothing already in ``objects`` is asked for by name. A namespace, name or label that the API server
would not accept (``..``, ``a?b``) makes no request: they come from the cluster's answers and go into
a path or a query. Secrets are asked for because a pod's
dependence on one is worth drawing; the shell should keep only their metadata (the graph reads no
more). Cost: linear in the size of ``objects``; at most one request per (object, reference).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from kasd.envgraph.identity import identity, mapping, text
from kasd.envgraph.references import (
    SERVICE_NAME_LABEL,
    ingress_services,
    pod_uses,
    selector_string,
)

__all__ = ["FetchRequest", "dependents_to_fetch"]


@attrs.frozen(kw_only=True)
class FetchRequest:
    """One GET: ``name`` set → that object; else a list, filtered by ``label_selector`` (a
    ``labelSelector`` query value) and then, by the shell, by ``owner_uid``."""

    group: str
    version: str
    kind: str
    resource: str  # the plural the path names: /api/v1/namespaces/NS/<resource>[/name]
    namespace: str  # "" for cluster-scoped
    name: str | None = None
    label_selector: str | None = None
    owner_uid: str | None = None

    def path(self) -> str:
        """The API path of this request, without the query (``label_selector`` goes in it)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        scope = f"/namespaces/{self.namespace}" if self.namespace else ""
        return f"{base}{scope}/{self.resource}" + (f"/{self.name}" if self.name else "")


# Kind → (group, version, resource) of what can be asked for
_KINDS = {
    "Pod": ("", "v1", "pods"),
    "ReplicaSet": ("apps", "v1", "replicasets"),
    "Job": ("batch", "v1", "jobs"),
    "EndpointSlice": ("discovery.k8s.io", "v1", "endpointslices"),
    "Service": ("", "v1", "services"),
    "ConfigMap": ("", "v1", "configmaps"),
    "Secret": ("", "v1", "secrets"),
    "PersistentVolumeClaim": ("", "v1", "persistentvolumeclaims"),
    "ServiceAccount": ("", "v1", "serviceaccounts"),
    "PersistentVolume": ("", "v1", "persistentvolumes"),
}

# (group, Kind) of an owner → Kind of the dependents it makes
_OWNS = {
    ("apps", "Deployment"): "ReplicaSet",
    ("apps", "ReplicaSet"): "Pod",
    ("apps", "StatefulSet"): "Pod",
    ("apps", "DaemonSet"): "Pod",
    ("batch", "Job"): "Pod",
}


# What the API server accepts as a namespace and as an object name (RFC 1123 label / subdomain).
# Names come from objects the cluster answered with; one that could not be a name (``..``, ``a?b``,
# ``%2F``) would change the path it is put in, so no request is made for it.
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def valid_namespace(namespace: str) -> bool:
    """Whether ``namespace`` could be a namespace's name (so it may go into a request's path)."""
    return _NAMESPACE.fullmatch(namespace) is not None


def valid_name(name: str) -> bool:
    """Whether ``name`` could be an object's name (so it may go into a request's path)."""
    return _NAME.fullmatch(name) is not None


def _request(kind: str, namespace: str, **kw: str | None) -> FetchRequest | None:
    if namespace and not valid_namespace(namespace):
        return None
    if (name := kw.get("name")) is not None and not valid_name(name):
        return None
    group, version, resource = _KINDS[kind]
    return FetchRequest(group=group, version=version, kind=kind, resource=resource,
                        namespace=namespace, **kw)


def dependents_to_fetch(objects: Iterable[Mapping[str, Any]]) -> list[FetchRequest]:
    """The requests for the next layer of unlabelled dependents of ``objects``, sorted, no repeats."""
    objs = [o for o in objects if isinstance(o, Mapping)]
    present = set()
    for obj in objs:
        group, _version, kind, namespace, name = identity(obj)
        present.add((group, kind, namespace, name))
    wanted: set[FetchRequest] = set()

    def want(request: FetchRequest | None) -> None:
        if request is not None:
            wanted.add(request)

    def by_name(kind: str, namespace: str, name: str) -> None:
        if name and (_KINDS[kind][0], kind, namespace, name) not in present:
            want(_request(kind, namespace, name=name))

    for obj in objs:
        group, _version, kind, namespace, name = identity(obj)
        if not name or not kind:
            continue
        meta, spec = mapping(obj.get("metadata")), mapping(obj.get("spec"))
        uid = text(meta.get("uid")) or None
        if (made := _OWNS.get((group, kind))) is not None and namespace:
            selector = selector_string(mapping(spec.get("selector")))
            if selector is not None:  # no selector: it owns nothing we could ask for without a list of all
                want(_request(made, namespace, label_selector=selector, owner_uid=uid))
        elif (group, kind) == ("batch", "CronJob") and namespace:
            labels = mapping(mapping(mapping(spec.get("jobTemplate")).get("metadata")).get("labels"))
            selector = selector_string({"matchLabels": labels}) if labels else None
            want(_request("Job", namespace, label_selector=selector, owner_uid=uid))
        elif (group, kind) == ("", "Service") and namespace:
            if _NAME.fullmatch(name):
                want(_request("EndpointSlice", namespace, label_selector=f"{SERVICE_NAME_LABEL}={name}"))
        elif kind == "Ingress" and group in ("networking.k8s.io", "extensions") and namespace:
            for service in ingress_services(obj):
                by_name("Service", namespace, service)
        elif (group, kind) == ("", "Pod") and namespace:
            for used_kind, used in pod_uses(obj):
                by_name(used_kind, namespace, used)
        elif (group, kind) == ("", "PersistentVolumeClaim"):
            by_name("PersistentVolume", "", text(spec.get("volumeName")))
    return sorted(wanted, key=lambda r: (r.kind, r.namespace, r.name or "", r.label_selector or "",
                                         r.owner_uid or ""))
