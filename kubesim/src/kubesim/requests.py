"""What the cluster saw: one frozen record per request, for tests to assert who called."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class RecordedRequest:
    method: str
    path: str
    query: str
    bearer_token: str | None
    impersonate: Mapping[str, str]
    user_agent: str
    http_version: str = ""
    #: the caller's ``X-Request-Id`` ("" without one); like kube-apiserver, kubesim acts on it in no way
    request_id: str = ""


def header_map(scope: Mapping[str, Any]) -> dict[str, str]:
    """Lower-cased header names; repeated headers joined with ", " as HTTP allows."""
    headers: dict[str, str] = {}
    for name, value in header_pairs(scope):
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def header_pairs(scope: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(lower-cased name, value) of each header as sent, repeated ones apart."""
    return [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in scope.get("headers") or []]


def record(scope: Mapping[str, Any], headers: Mapping[str, str]) -> RecordedRequest:
    auth = headers.get("authorization", "")
    token = auth[7:].strip() if auth[:7].lower() == "bearer " else None
    impersonate = {name: value for name, value in headers.items() if name.startswith("impersonate-")}
    # A WebSocket (exec, attach) is an upgraded GET.
    method = scope.get("method") or "GET"
    return RecordedRequest(
        method=method, path=scope.get("path", ""),
        query=scope.get("query_string", b"").decode("latin-1"), bearer_token=token,
        impersonate=impersonate, user_agent=headers.get("user-agent", ""),
        http_version=str(scope.get("http_version", "")), request_id=headers.get("x-request-id", ""))
