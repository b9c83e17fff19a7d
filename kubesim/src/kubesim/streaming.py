"""The kubelet's SPDY streaming endpoints, transport-independent: protocol negotiation, the
upgrade, and the handlers of the pod subresources that speak SPDY (exec, attach; port-forward).

A subresource is a `SpdySubresource`: the `X-Stream-Protocol-Version` values it accepts, a
`check` that raises an `ApiError` before anything is upgraded (the container exists and runs,
the query makes sense), and `serve(request, session)`, which runs on an accepted `SpdySession`.
`app.SPDY_SUBRESOURCES` maps subresource names to them. The same object serves both ways in:

* `serve_raw_spdy`: a plain HTTP/1.1 `Upgrade: SPDY/3.1` request (hyperraw's raw upgrade):
  negotiate as `httpstream.Handshake` does, answer `101` with the chosen version, then SPDY on
  the connection's bytes.
* `serve_websocket_spdy`: a WebSocket whose binary messages carry SPDY (kubectl's WebSocket
  port-forward, subprotocol `SPDY/3.1+portforward.k8s.io`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs

from kubesim.asgi import Query, Receive, Reply, Scope, Send, send_reply
from kubesim.controllers import Controllers
from kubesim.paths import Target
from kubesim.spdy_session import (
    AsgiRawTransport,
    AsgiWebSocketTransport,
    SpdySession,
    accept_raw_upgrade,
    serve_spdy,
)
from kubesim.store import Store

#: k8s.io/apimachinery httpstream's header names.
PROTOCOL_HEADER = "x-stream-protocol-version"
ACCEPTED_HEADER = "x-accepted-stream-protocol-versions"


@attrs.frozen(kw_only=True)
class PodStreamRequest:
    """What a SPDY handler is given: the pod request and the negotiated protocol."""

    store: Store
    controllers: Controllers
    target: Target
    query: Query
    #: The negotiated X-Stream-Protocol-Version (for a WebSocket: the subprotocol's inner one).
    protocol: str


@attrs.frozen(kw_only=True)
class SpdySubresource:
    #: The X-Stream-Protocol-Version values served; the client's order picks among them.
    protocols: tuple[str, ...]
    #: Raises an ApiError (answered as a Status, before any upgrade) when the request is bad.
    check: Callable[[PodStreamRequest], None]
    #: Serves one session (the driver closes it when this returns).
    serve: Callable[[PodStreamRequest, SpdySession], Awaitable[None]]


def offered_protocols(scope: Scope) -> list[str]:
    """Every X-Stream-Protocol-Version value, in order: repeated headers and comma lists alike."""
    offered: list[str] = []
    for name, value in scope.get("headers") or []:
        if bytes(name).lower() == PROTOCOL_HEADER.encode():
            offered += [p.strip() for p in bytes(value).decode("latin-1").split(",") if p.strip()]
    return offered


def negotiate(offered: Sequence[str], served: Sequence[str]) -> str | None:
    """The first offered protocol that is served (httpstream.negotiateProtocol), else None."""
    return next((p for p in offered if p in served), None)


async def _plain_error(send: Send, status: int, message: str,
                       headers: Sequence[tuple[str, str]] = ()) -> None:
    # Go's http.Error, which the kubelet's handshake uses: text, not a Status.
    await send_reply(send, Reply(status=status, body=(message + "\n").encode(),
                                 content_type="text/plain; charset=utf-8",
                                 headers=(("x-content-type-options", "nosniff"), *headers)))


async def serve_raw_spdy(subresource: SpdySubresource, store: Store, controllers: Controllers,
                         target: Target, query: Query, scope: Scope, receive: Receive,
                         send: Send) -> None:
    """An `Upgrade: SPDY/3.1` request on hyperraw's raw upgrade: check, negotiate, 101, serve.

    An ApiError from the check propagates (the app answers it as a Status, no upgrade).
    """
    offered = offered_protocols(scope)
    request = PodStreamRequest(store=store, controllers=controllers, target=target, query=query,
                               protocol="")
    subresource.check(request)
    if not offered:
        await _plain_error(send, 400, "unable to upgrade: X-Stream-Protocol-Version is required")
        return
    protocol = negotiate(offered, subresource.protocols)
    if protocol is None:
        await _plain_error(
            send, 403,
            f"unable to upgrade: unable to negotiate protocol: client supports "
            f"[{' '.join(offered)}], server accepts [{' '.join(subresource.protocols)}]",
            [(ACCEPTED_HEADER, p) for p in subresource.protocols])
        return
    request = attrs.evolve(request, protocol=protocol)
    await accept_raw_upgrade(send, [(PROTOCOL_HEADER.encode(), protocol.encode())])

    async def handler(session: SpdySession) -> None:
        await subresource.serve(request, session)

    await serve_spdy(AsgiRawTransport(receive, send), handler)


async def serve_websocket_spdy(subresource: SpdySubresource, request: PodStreamRequest,
                               subprotocol: str, receive: Receive, send: Send) -> None:
    """A WebSocket carrying SPDY: accept it with `subprotocol`, then serve the session.

    The caller has read `websocket.connect`, chosen `subprotocol` and set `request.protocol`;
    `subresource.check(request)` runs here, before the accept (a refusal is an HTTP Status).
    """
    subresource.check(request)
    accept: dict[str, Any] = {"type": "websocket.accept", "subprotocol": subprotocol}
    await send(accept)

    async def handler(session: SpdySession) -> None:
        await subresource.serve(request, session)

    await serve_spdy(AsgiWebSocketTransport(receive, send), handler)

