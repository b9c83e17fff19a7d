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

import json
import re
from urllib.parse import parse_qs, unquote

import attrs

__all__ = ["NAMESPACE_CREATE_PATH", "RequestInfo", "created_namespace", "request_info", "written_namespace"]

#: where a Namespace is created (its name is in the body, not the path)
NAMESPACE_CREATE_PATH = "/api/v1/namespaces"
_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: a namespace's name (DNS-1123 label)
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

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
    parts = [unquote(p) if "%" in p else p for p in path.strip("/").split("/")] if path.strip("/") else []
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


def written_namespace(method: str, target: str) -> str:
    """The namespace a POST/PUT/PATCH/DELETE to ``target`` writes into (``/api/v1/namespaces/NS/…``,
    ``/apis/G/V/namespaces/NS/…``, the namespace object itself); "" for a read, a dry run, a
    cluster-scoped object, or a namespace create (its name is in the body: ``created_namespace``)."""
    if method.upper() not in _WRITES:
        return ""
    path, _, query = target.partition("?")
    if "dryRun" in query:
        return ""
    namespace = request_info(method, path).namespace
    return namespace if _NAMESPACE.fullmatch(namespace) else ""


def created_namespace(body: bytes) -> str:
    """The name of the Namespace a create's body makes, JSON or Kubernetes protobuf (kubectl 1.35+
    sends ``kubectl create namespace`` as protobuf); "" if it says none. Never raises: it runs in
    the pipeline's ``finally``, on bytes the job chose (the API server accepts JSON nested 10,000
    deep in an unknown field; Python's parser gives up at about 1,000 with a RecursionError)."""
    if body.startswith(_PROTOBUF_MAGIC):
        return _protobuf_namespace(body[len(_PROTOBUF_MAGIC):])
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):  # (16 KiB of `[` nest deeper than the interpreter's stack)
        return ""
    metadata = obj.get("metadata") if isinstance(obj, dict) and obj.get("kind") == "Namespace" else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) and _NAMESPACE.fullmatch(name) else ""


#: the envelope of a Kubernetes protobuf body (``runtime.Unknown`` follows)
_PROTOBUF_MAGIC = b"k8s\x00"


def _protobuf_namespace(unknown: bytes) -> str:
    """The name in a protobuf ``runtime.Unknown`` whose type is v1 Namespace: ``typeMeta`` (1:
    apiVersion, 2: kind) and ``raw`` (2), the Namespace, whose ``metadata`` (1) has ``name`` (1)."""
    envelope = _fields(unknown)
    type_meta = _fields(envelope.get(1, b""))
    if type_meta.get(2) != b"Namespace" or type_meta.get(1) != b"v1":
        return ""
    name = _fields(_fields(envelope.get(2, b"")).get(1, b"")).get(1, b"")
    try:
        text = name.decode("ascii")
    except UnicodeDecodeError:
        return ""
    return text if _NAMESPACE.fullmatch(text) else ""


def _fields(message: bytes) -> dict[int, bytes]:
    """The length-delimited fields of one protobuf message (the first of each number); {} when it
    does not parse. Linear in the message's length."""
    out: dict[int, bytes] = {}
    at, end = 0, len(message)
    while at < end:
        key, at = _varint(message, at)
        if key < 0:
            return {}
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, at = _varint(message, at)
            if at < 0:
                return {}
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            size, at = _varint(message, at)
            if size < 0 or at + size > end:
                return {}
            out.setdefault(number, message[at:at + size])
            at += size
        else:
            return {}
    return out if at == end else {}


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """A varint at ``at`` (at most 10 bytes) and where it ends; (-1, -1) when it does not parse."""
    value = shift = 0
    for i in range(at, min(at + 10, len(data))):
        value |= (data[i] & 0x7F) << shift
        if not data[i] & 0x80:
            return value, i + 1
        shift += 7
    return -1, -1
