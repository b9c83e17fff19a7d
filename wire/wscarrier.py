"""The WebSocket carrier: one session rides one WebSocket, for networks whose proxies pass only
HTTP/1.1 and WebSocket (no HTTP/2 end to end).

The client ``GET``s the tunnel path over HTTP/1.1 with ``Upgrade: websocket`` and
``Authorization: Bearer <token>``; once it gets ``101``, the payloads of the binary messages, both
ways, are the session's byte stream (the same session, mux and protocol as over HTTP/2). The server
answers a wrong path, method or token with the same status and one-line reason as the HTTP/2
carrier (``wire.carrier.check_tunnel_request``, ``expected_method="GET"``), as a plain HTTP/1.1
response before any upgrade; the client raises the same ``TunnelRejectedError``.

kasd accepts both carriers on the agent port and path: ``wire.h2carrier`` tells an HTTP/1.1 request
from the HTTP/2 preface by its first bytes (over TLS, ALPN offers ``h2`` and ``http/1.1``) and hands
the former to ``accept_ws_tunnel``. Over plaintext (``ws://``) only where h2c is allowed.

Messages are never reassembled: each frame's payload goes to the session as it arrives, so a message
costs no more memory than one read whatever its length. A message may still be at most
``MAX_MESSAGE`` bytes (this side sends at most that; a longer one is closed with 1009), text
messages are refused (1003). The session's own PING/PONG is the keepalive (the dialling side
pings, as over HTTP/2); a WebSocket ping from a proxy is answered.

Before a peer has authenticated, the server's side costs little: the request head is at most
``MAX_HEAD`` bytes (431 beyond), one request per connection (a rejected request closes it), nothing
is read while the token is being checked, and ``handshake_timeout`` (the HTTP/2 carrier's, around
TLS, the first bytes, the head and the check) is a hard deadline that no byte extends. Rejections
are logged at most once per ten seconds per source address and status, with a count.

Driven by wsproto and h11 directly (what trio-websocket runs on): the carrier needs the request
before the upgrade is decided (to answer 404/405/401 like the HTTP/2 carrier), a byte stream rather
than messages, and no reader task or message queue of its own.
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
import ssl
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, cast
from urllib.parse import urlsplit

import h11
import trio
import wsproto
import wsproto.connection
import wsproto.events
import wsproto.utilities
from wsproto.frame_protocol import CloseReason

from daemonkit.logs import BurstLimitedLog
from netio.fastio import fast_stream, peer_host, tls_stream
from wire.carrier import (
    TUNNEL_CONTENT_TYPE,
    Authenticate,
    TunnelRejectedError,
    check_tunnel_request,
    request_header_map,
    tunnel_request_headers,
)
from wire.session import Session, open_session

__all__ = [
    "MAX_HEAD",
    "MAX_MESSAGE",
    "WebSocketTransport",
    "accept_ws_tunnel",
    "dial_ws_tunnel",
    "looks_like_http1",
    "open_ws_session",
]

log = logging.getLogger("wire.wscarrier")
#: lines a stranger can repeat at will (a bad token, a broken head): one per source per 10 s
_strangers = BurstLimitedLog(log, interval=10.0)

#: the longest request head (request line and headers) the server reads before authentication
MAX_HEAD = 16 * 1024
#: the longest message either side sends or accepts (payloads are streamed, never reassembled)
MAX_MESSAGE = 1 << 20
_RECEIVE_SIZE = 256 * 1024
_HEAD_READ = 4096
_ERROR_BODY_LIMIT = 4096

_WS_CONNECTION = wsproto.connection.Connection | wsproto.WSConnection


#: what every HTTP/2 connection begins with (RFC 9113 §3.4)
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def looks_like_http1(first: bytes | bytearray) -> bool:
    """Whether the first bytes on a connection are an HTTP/1.x request (not the HTTP/2 preface). A
    first read may hold only part of the preface (TCP delivers it in pieces at will): any prefix
    of it is HTTP/2, however much it looks like the start of an HTTP/1.x method."""
    n = min(len(first), len(_H2_PREFACE))
    if first[:n] == _H2_PREFACE[:n]:
        return False
    return first[:8].split(b" ")[0].isalpha()


class WebSocketTransport(trio.abc.Stream):
    """The binary messages of one WebSocket, both ways, as a Trio byte stream (what a Session runs
    over). ``receive_some`` answers ``b""`` for the peer's normal close (1000) and raises
    ``BrokenResourceError`` for any other close or a connection cut without one."""

    def __init__(self, stream: trio.abc.Stream, ws: _WS_CONNECTION, *, max_message: int = MAX_MESSAGE) -> None:
        self.stream = stream
        self._ws = ws
        self._max_message = max_message
        self._send_lock = trio.StrictFIFOLock()
        self._received: deque[bytes | bytearray] = deque()
        self._message_size = 0
        self._pending_event: wsproto.events.Event | None = None
        self._ended: BaseException | None = None  # None while open; EOFError for a normal close
        self._closed = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.receive_before(math.inf, max_bytes)
        assert data is not None
        return data

    async def receive_before(self, deadline: float, max_bytes: int | None = None) -> bytes | bytearray | None:
        """``receive_some``, or None once ``deadline`` passed with nothing received: only the wait
        for bytes from the connection is cut, never a message half taken or an answer half sent
        (a session's reader keeps its timers this way, without a task of their own)."""
        if self._closed:
            raise trio.ClosedResourceError("transport closed")
        while True:
            if self._received:
                chunk = self._received.popleft()
                if max_bytes is not None and len(chunk) > max_bytes:
                    self._received.appendleft(chunk[max_bytes:])
                    chunk = chunk[:max_bytes]
                await trio.lowlevel.checkpoint()
                return chunk
            if self._ended is not None:
                await trio.lowlevel.checkpoint()
                if isinstance(self._ended, EOFError):
                    return b""
                raise trio.BrokenResourceError(str(self._ended))
            if self._pending_event is not None:
                event, self._pending_event = self._pending_event, None
                await self._handle_event(event)
            if self._ended is None:
                await self._handle_events()
            if self._received or self._ended is not None:
                continue
            if deadline == math.inf:
                data = await self.stream.receive_some(_RECEIVE_SIZE)
            else:
                # (what a read brings goes to wsproto at once: a message half read stays there)
                data = None
                with trio.move_on_at(deadline):
                    data = await self.stream.receive_some(_RECEIVE_SIZE)
                if data is None:
                    return None
            if not data:
                self._ended = ConnectionError("connection closed without a WebSocket close")
                continue
            try:
                self._ws.receive_data(cast(bytes, data))  # a bytearray does as well: wsproto appends it
            except wsproto.utilities.RemoteProtocolError as exc:
                await self._fail(CloseReason.PROTOCOL_ERROR, f"WebSocket protocol error: {exc}")

    async def _handle_events(self) -> None:
        """Take wsproto's events up to the first payload: what follows it (the peer's close, above
        all) waits until the session has read what came before, as it would over HTTP/2."""
        for event in self._ws.events():
            if self._received:
                self._pending_event = event
                return
            await self._handle_event(event)
            if self._ended is not None:
                return

    async def _handle_event(self, event: wsproto.events.Event) -> None:
        if isinstance(event, wsproto.events.BytesMessage):
            self._message_size += len(event.data)
            if self._message_size > self._max_message:
                await self._fail(CloseReason.MESSAGE_TOO_BIG, f"message longer than {self._max_message} bytes")
                return
            if event.message_finished:
                self._message_size = 0
            if event.data:
                self._received.append(event.data)
        elif isinstance(event, wsproto.events.TextMessage):
            await self._fail(CloseReason.UNSUPPORTED_DATA, "the tunnel takes binary messages only")
        elif isinstance(event, wsproto.events.Ping):
            await self._send_event(event.response())
        elif isinstance(event, wsproto.events.CloseConnection):
            if self._ws.state is wsproto.connection.ConnectionState.OPEN:
                # Not the peer's close: wsproto's verdict on bytes that break the protocol (an
                # unmasked frame, a fragmented control frame, a bad close code...), which it hands
                # over as a close without sending one. This side closes, with wsproto's code.
                await self._fail(event.code, f"WebSocket protocol error: {event.reason}")
                return
            if self._ws.state is wsproto.connection.ConnectionState.REMOTE_CLOSING:
                try:
                    await self._send_event(event.response())
                except trio.BrokenResourceError:
                    pass
            if event.code == CloseReason.NORMAL_CLOSURE:
                self._ended = EOFError()
            else:
                self._ended = ConnectionError(f"WebSocket closed by the peer code={event.code} reason={event.reason!r}")

    async def _fail(self, code: CloseReason | int, reason: str) -> None:
        self._ended = ConnectionError(reason)
        if self._ws.state is wsproto.connection.ConnectionState.OPEN:
            try:
                await self._send_event(wsproto.events.CloseConnection(code=code, reason=reason))
            except trio.BrokenResourceError:
                pass

    async def _send_event(self, event: wsproto.events.Event) -> None:
        async with self._send_lock:
            data = self._ws.send(event)
            await self.stream.send_all(data)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("transport closed")
        if self._ws.state is not wsproto.connection.ConnectionState.OPEN:
            if isinstance(self._ended, EOFError):
                # The peer closed normally: like bytes written to a TCP peer that sent FIN, these are
                # lost, and the session learns of the end from receive_some's b"".
                await trio.lowlevel.checkpoint()
                return
            raise trio.BrokenResourceError("WebSocket is closing")
        view = memoryview(data)
        async with self._send_lock:
            for at in range(0, len(view), self._max_message):
                try:
                    frame = self._ws.send(wsproto.events.BytesMessage(data=bytes(view[at:at + self._max_message])))
                except wsproto.utilities.LocalProtocolError as exc:  # closed meanwhile
                    raise trio.BrokenResourceError(str(exc)) from None
                await self.stream.send_all(frame)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """A close frame (1000) if the WebSocket is still open, then the connection; the session
        bounds it (its close timeout), and the peer's answering close is not waited for."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        try:
            if self._ws.state is wsproto.connection.ConnectionState.OPEN:
                with trio.move_on_after(2, shield=True):
                    await self._send_event(wsproto.events.CloseConnection(code=CloseReason.NORMAL_CLOSURE))
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            pass
        finally:
            await self.stream.aclose()


# --------------------------------------------------------------------------- client


async def dial_ws_tunnel(
    url: str,
    *,
    token: str,
    ssl_context: ssl.SSLContext | None = None,
    headers: Sequence[tuple[str, str]] = (),
) -> WebSocketTransport:
    """Dial ``url`` (``wss://`` over TLS with ALPN http/1.1, or ``ws://``) and upgrade to the tunnel's
    WebSocket. Raises TunnelRejectedError for a non-101 answer, OSError when nothing listens."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"tunnel URL must be ws:// or wss://host[:port]/path, got {url!r}")
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    stream: trio.abc.Stream = fast_stream(await trio.open_tcp_stream(parts.hostname, port))
    try:
        if parts.scheme == "wss":
            ctx = ssl_context or ssl.create_default_context()
            ctx.set_alpn_protocols(["http/1.1"])  # set and used with no await between: a shared context is safe
            tls = tls_stream(stream, ctx, server_side=False, server_hostname=parts.hostname)
            await tls.do_handshake()
            stream = tls
        ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        request = wsproto.events.Request(
            host=parts.netloc, target=target,
            extra_headers=[(k.encode(), v.encode()) for k, v in tunnel_request_headers(token, extra=headers)],
        )
        await stream.send_all(ws.send(request))
        await _await_accept(stream, ws, parts.netloc)
        return WebSocketTransport(stream, ws)
    except BaseException:
        with trio.move_on_after(1, shield=True):
            await stream.aclose()
        raise


async def _await_accept(stream: trio.abc.Stream, ws: wsproto.WSConnection, where: str) -> None:
    """Read until the server's 101 (return) or its refusal (TunnelRejectedError, with at most
    ``_ERROR_BODY_LIMIT`` bytes of its body as the reason)."""
    status = 0
    body = b""
    while True:
        for event in ws.events():
            if isinstance(event, wsproto.events.AcceptConnection):
                return
            if isinstance(event, wsproto.events.RejectConnection):
                status = event.status_code
                if not event.has_body:
                    raise TunnelRejectedError(status, f"HTTP {status}")
            elif isinstance(event, wsproto.events.RejectData):
                body += event.data
                if event.body_finished or len(body) >= _ERROR_BODY_LIMIT:
                    text = body[:_ERROR_BODY_LIMIT].decode(errors="replace").strip()
                    raise TunnelRejectedError(status, text or f"HTTP {status}")
        try:
            data = await stream.receive_some(_RECEIVE_SIZE)
        except trio.BrokenResourceError:
            data = b""
        if not data:
            text = body[:_ERROR_BODY_LIMIT].decode(errors="replace").strip()
            raise TunnelRejectedError(status, text or f"server at {where} closed the connection before answering the WebSocket upgrade")
        try:
            ws.receive_data(cast(bytes, data))
        except wsproto.utilities.RemoteProtocolError as exc:
            raise TunnelRejectedError(0, f"server at {where} did not answer the WebSocket upgrade: {exc}") from None


@asynccontextmanager
async def open_ws_session(
    url: str,
    *,
    token: str,
    ssl_context: ssl.SSLContext | None = None,
    headers: Sequence[tuple[str, str]] = (),
    **session_kwargs: Any,
) -> AsyncIterator[Session]:
    """``async with open_ws_session("wss://kasd:8150/tunnel", token=t) as session:``

    Dial and handshake errors (OSError, TunnelRejectedError, SessionClosedError) raise as
    themselves, as ``open_h2_session``'s do."""
    transport = await dial_ws_tunnel(url, token=token, ssl_context=ssl_context, headers=headers)
    async with open_session(transport, client=True, **session_kwargs) as session:
        yield session


# --------------------------------------------------------------------------- server


async def accept_ws_tunnel(
    stream: trio.abc.Stream, first: bytes | bytearray, *, authenticate: Authenticate, path: str, peer: str
) -> tuple[WebSocketTransport, Any] | None:
    """Read the HTTP/1.1 request whose ``first`` bytes were read already; answer a bad one and
    return None, or upgrade and return the transport and principal. The caller bounds the time."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    if len(first) > MAX_HEAD and first.find(b"\r\n\r\n", 0, MAX_HEAD + 4) < 0:
        # h11 bounds a head that arrives in pieces; one that came in one read is measured here.
        await _reject(stream, conn, TunnelRejectedError(431, "request head too large"), peer, head_read=False)
        return None
    conn.receive_data(bytes(first))
    request = await _next_event(stream, conn, peer)
    if not isinstance(request, h11.Request):
        return None  # the peer left before a whole head, or its head was refused
    method, target = request.method.decode("latin-1"), request.target.decode("latin-1")
    try:
        headers = request_header_map((name.decode("latin-1").lower(), value.decode("latin-1"))
                                     for name, value in request.headers)
        token, public = check_tunnel_request(method, target, headers, path=path, expected_method="GET")
        key = _upgrade_key(headers)
        if request.http_version != b"1.1":
            raise TunnelRejectedError(400, "a WebSocket upgrade needs HTTP/1.1")
        # A GET without a body ends at its head: h11 has the end already, with nothing read.
        if not isinstance(_event_or_none(conn), h11.EndOfMessage):
            raise TunnelRejectedError(400, "a WebSocket upgrade request has no body")
        principal = await authenticate(token, public)
        if principal is None:
            raise TunnelRejectedError(401, "invalid token", [("www-authenticate", "Bearer")])
    except TunnelRejectedError as exc:
        await _reject(stream, conn, exc, peer)
        return None
    response = h11.InformationalResponse(status_code=101, headers=[
        (b"upgrade", b"websocket"), (b"connection", b"Upgrade"),
        (b"sec-websocket-accept", wsproto.utilities.generate_accept_token(key.encode())),
        (b"content-type", TUNNEL_CONTENT_TYPE.encode()),
    ])
    try:
        head = conn.send(response) or b""
    except h11.LocalProtocolError:  # h11 saw no upgrade proposed (an HTTP/1.0 request, say)
        await _reject(stream, conn, TunnelRejectedError(400, "not a WebSocket upgrade h11 can switch"), peer,
                      head_read=False)
        return None
    await stream.send_all(head)
    trailing, _ = conn.trailing_data
    ws = wsproto.connection.Connection(wsproto.ConnectionType.SERVER, trailing_data=bytes(trailing))
    return WebSocketTransport(stream, ws), principal


async def _next_event(stream: trio.abc.Stream, conn: h11.Connection, peer: str) -> object:
    """The next h11 event, reading (at most ``MAX_HEAD`` of head) as needed; a head h11 refuses is
    answered (431 too large, 400 malformed) and None returned."""
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint
            reason = "request head too large" if status == 431 else "malformed HTTP/1.1 request"
            await _reject(stream, conn, TunnelRejectedError(status, reason), peer, head_read=False)
            return None
        if event is not h11.NEED_DATA:
            return event
        try:
            data = await stream.receive_some(_HEAD_READ)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return None
        conn.receive_data(cast(bytes, data))  # b"" is the peer's EOF: h11 then says ConnectionClosed or raises


def _event_or_none(conn: h11.Connection) -> object:
    try:
        return conn.next_event()
    except h11.RemoteProtocolError:
        return None


def _upgrade_key(headers: dict[str, str]) -> str:
    """The client's Sec-WebSocket-Key, or 426 for a request that is not a WebSocket upgrade (a plain
    HTTP/1.1 client on the tunnel port is told what the port speaks)."""
    upgrade = {v.strip().lower() for v in headers.get("upgrade", "").split(",")}
    connection = {v.strip().lower() for v in headers.get("connection", "").split(",")}
    if "websocket" not in upgrade or "upgrade" not in connection:
        raise TunnelRejectedError(
            426, "tunnel endpoint takes a WebSocket upgrade over HTTP/1.1 (or HTTP/2: TLS with ALPN h2, or h2c)",
            [("upgrade", "websocket"), ("sec-websocket-version", "13")],
        )
    if headers.get("sec-websocket-version", "").strip() != "13":
        raise TunnelRejectedError(426, "WebSocket version 13 only", [("sec-websocket-version", "13")])
    key = headers.get("sec-websocket-key", "").strip()
    if not key:
        raise TunnelRejectedError(400, "missing Sec-WebSocket-Key")
    try:
        nonce = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        nonce = b""
    if len(nonce) != 16:  # RFC 6455 4.1: the base64 of 16 random bytes
        raise TunnelRejectedError(400, "Sec-WebSocket-Key is not the base64 of 16 bytes")
    return key


async def _reject(stream: trio.abc.Stream, conn: h11.Connection, rejection: TunnelRejectedError, peer: str,
                  *, head_read: bool = True) -> None:
    """Answer with the status and a plain-text reason, then close: one request per connection."""
    # Never log the token; the message names only what was wrong.
    _strangers.warning(
        (peer_host(peer), "rejected", rejection.status),
        "tunnel request rejected peer=%s status=%d reason=%r carrier=websocket", peer, rejection.status, rejection.message,
    )
    body = (rejection.message + "\n").encode()
    head = [("content-type", "text/plain"), ("content-length", str(len(body))), ("connection", "close"),
            *rejection.headers]
    if head_read:
        data = conn.send(h11.Response(status_code=rejection.status, headers=head)) or b""
        data += conn.send(h11.Data(data=body)) or b""
    else:  # h11 refuses to answer a head it could not read: write the answer by hand
        reason = {400: b"Bad Request", 431: b"Request Header Fields Too Large"}.get(rejection.status, b"Error")
        data = b"HTTP/1.1 %d %s\r\n" % (rejection.status, reason)
        data += b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in head) + b"\r\n" + body
    try:
        await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
