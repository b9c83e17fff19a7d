"""What every carrier of a tunnel session shares, whatever carries it (HTTP/2, or a WebSocket).

A carrier is one long-lived request from agentd to kasd whose two directions become the session's
byte stream. The contract, independent of the carrier's framing:

- the client asks with ``Authorization: Bearer <agent token>`` on the tunnel path (``POST`` over
  HTTP/2, ``GET`` with ``Upgrade: websocket`` over HTTP/1.1: ``wire.wscarrier``), announcing
  ``content-type: application/x-kasd-tunnel``;
- the server checks path, method and token *before* anything else (``check_tunnel_request``), asks
  its ``Authenticate`` callback for the principal, and answers a bad request with an HTTP status and
  a one-line reason (a ``TunnelRejectedError``), never starting a session for it;
- the client sees that answer as the same ``TunnelRejectedError``.

The content type is announced, and answered, but not required of a client: no check has ever
refused a request for it, and adding one would change what existing agents see.

Sans-I/O (no trio, no h2): a carrier imports this and speaks its own framing around it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "DEFAULT_PATH",
    "TUNNEL_CONTENT_TYPE",
    "Authenticate",
    "TunnelRejectedError",
    "authenticate_tunnel_request",
    "check_tunnel_request",
    "request_header_map",
    "tunnel_request_headers",
]

TUNNEL_CONTENT_TYPE = "application/x-kasd-tunnel"
DEFAULT_PATH = "/tunnel"

#: ``await authenticate(token, headers)`` → the principal (any object the session handler gets), or
#: None for "invalid token" (401); raise ``TunnelRejectedError`` to answer with another status. The
#: headers are the request's, without ``authorization``.
Authenticate = Callable[[str, dict[str, str]], Awaitable[Any]]


class TunnelRejectedError(Exception):
    """A tunnel request refused with an HTTP ``status`` and a ``message`` saying why.

    Raised to a dialing client for the server's non-200 answer (``status`` 0: no HTTP answer at
    all, e.g. no ALPN h2); raised by the server's checks and by an ``Authenticate`` callback to
    answer with ``status``, ``message`` and the extra response ``headers`` (e.g. ``allow``).
    """

    def __init__(self, status: int, message: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(f"tunnel rejected with HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.headers = tuple(headers)


def tunnel_request_headers(token: str, *, extra: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """The non-pseudo headers a client sends with its tunnel request."""
    return [("authorization", f"Bearer {token}"), ("content-type", TUNNEL_CONTENT_TYPE), *extra]


#: headers a tunnel request may hold once only (which of two a proxy in front looked at is unknowable)
_SINGLE = frozenset({"authorization", "sec-websocket-key", "sec-websocket-version"})


def request_header_map(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """A tunnel request's headers (names lower-case) by name, for both carriers alike: a name given
    more than once has its values joined by ", " (RFC 9110 5.3: ``Connection: keep-alive`` and
    ``Connection: Upgrade`` say ``keep-alive, Upgrade``), except the headers a request may hold once
    (``Authorization``, ``Sec-WebSocket-Key``, ``Sec-WebSocket-Version``): twice is 400."""
    headers: dict[str, str] = {}
    for name, value in pairs:
        if name in headers:
            if name in _SINGLE:
                raise TunnelRejectedError(400, f"more than one {name} header")
            headers[name] += ", " + value
        else:
            headers[name] = value
    return headers


def check_tunnel_request(
    method: str, target: str, headers: Mapping[str, str], *, path: str, expected_method: str = "POST"
) -> tuple[str, dict[str, str]]:
    """The bearer token and the headers to show ``Authenticate`` (without ``authorization``), or
    ``TunnelRejectedError``: 404 for another path (the query is ignored), 405 for another method,
    401 for a missing bearer token. Never puts the token in a message."""
    if target.split("?", 1)[0] != path:
        raise TunnelRejectedError(404, f"no tunnel endpoint at {target!r}; use {path!r}")
    if method != expected_method:
        raise TunnelRejectedError(
            405, f"tunnel endpoint takes {expected_method}, not {method}", [("allow", expected_method)]
        )
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise TunnelRejectedError(401, "missing bearer token", [("www-authenticate", "Bearer")])
    return token.strip(), {k: v for k, v in headers.items() if k != "authorization"}


async def authenticate_tunnel_request(
    method: str,
    target: str,
    headers: Mapping[str, str],
    *,
    path: str,
    authenticate: Authenticate,
    expected_method: str = "POST",
) -> Any:
    """``check_tunnel_request``, then ``authenticate``: the principal, or ``TunnelRejectedError``
    (401 when the callback answers None)."""
    token, public = check_tunnel_request(method, target, headers, path=path, expected_method=expected_method)
    principal = await authenticate(token, public)
    if principal is None:
        raise TunnelRejectedError(401, "invalid token", [("www-authenticate", "Bearer")])
    return principal
