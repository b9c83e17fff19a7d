"""What a Kubernetes API request is, for the audit line: its verb, resource and namespace, read from
the method and target as kube-apiserver's ``RequestInfoFactory`` reads them
(k8s.io/apiserver/pkg/endpoints/request/requestinfo.go), without ever looking at the body.

    /api/v1/namespaces/ns/pods/p?watch=1  GET    → verb watch, resource pods, namespace ns, name p
    /apis/apps/v1/deployments             GET    → verb list, resource deployments
    /api/v1/namespaces/ns                 DELETE → verb delete, resource namespaces, namespace ns
    /version                              GET    → verb get, non-resource

Pure: no I/O, no trio.
"""

from __future__ import annotations

from urllib.parse import parse_qs, unquote

import attrs

__all__ = ["RequestInfo", "request_info"]

_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
#: the subresources kube-apiserver names a verb after the method of (``exec`` is ``create`` on pods/exec)
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


@attrs.frozen(kw_only=True)
class RequestInfo:
    #: ``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``,
    #: ``deletecollection``; for a non-resource path the lower-case method
    verb: str
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    #: ``/version``, ``/healthz``, ``/openapi/v2``…: not a resource
    resource_request: bool = True


def request_info(method: str, target: str) -> RequestInfo:
    path, _, query = target.partition("?")
    parts = [unquote(p) for p in path.strip("/").split("/")] if path.strip("/") else []
    # /api/{version}/… and /apis/{group}/{version}/…; discovery (/api/v1, /apis/apps/v1) is not a resource
    if len(parts) >= 4 and parts[0] == "apis":
        rest = parts[3:]
    elif len(parts) >= 3 and parts[0] == "api":
        rest = parts[2:]
    else:
        return RequestInfo(verb=method.lower(), resource_request=False)
    verb = _VERBS.get(method.upper(), method.lower())
    namespace = ""
    if len(rest) >= 2 and rest[0] == "namespaces":
        if len(rest) == 2 or (len(rest) == 3 and rest[2] in _NAMESPACE_SUBRESOURCES):
            # the namespace object itself (or its status/finalize): kube names it the namespace too
            namespace = rest[1]
        else:
            namespace, rest = rest[1], rest[2:]
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) >= 2 else ""
    subresource = rest[2] if len(rest) >= 3 else ""
    if not name and verb in ("get", "delete"):
        verb = "list" if verb == "get" else "deletecollection"
    if verb in ("get", "list") and "watch" in query:  # (most requests have no watch: no query parsing)
        values = parse_qs(query).get("watch", [])
        if values and values[0].lower() in ("1", "true"):
            verb = "watch"
    return RequestInfo(verb=verb, resource=resource, subresource=subresource, namespace=namespace, name=name)
