"""Kubernetes ``Status`` errors, the only error body kubectl shows its user verbatim."""

from __future__ import annotations

import json

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    408: "Timeout",
    413: "RequestEntityTooLarge",
    414: "RequestURITooLong",
    429: "TooManyRequests",
    422: "Invalid",
    431: "RequestHeaderFieldsTooLarge",
    500: "InternalError",
    502: "BadGateway",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ProxyError(Exception):
    """Answer the client with ``status`` and a Status body carrying ``message``."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def status_body(status: int, message: str) -> bytes:
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": REASONS.get(status, "Unknown"),
            "code": status,
        }
    ).encode()


def status_headers(body: bytes, extra: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
    return [("content-type", "application/json"), ("content-length", str(len(body))), ("cache-control", "no-store"), *extra]
