"""The HTTP/2 carrier: one session rides one long-lived bidirectional HTTP/2 request stream.

The client ``POST``s to the tunnel path with ``Authorization: Bearer <token>`` and, once it gets
``200``, both directions of that one HTTP/2 stream are the session's byte stream. The server answers
a wrong method, path or token with the proper status before any session starts. What any carrier
checks and raises is in ``wire.carrier``; HTTP/2 itself is driven by ``h2trio.driver``.

The tunnel stream's HTTP/2 receive windows (the stream's and the connection's) are ``TUNNEL_WINDOW``
(16 MiB) each way, and received bytes are acknowledged only once the session took them: so a peer
never has more than that unconsumed on this side, even while a send waiting for the peer's window
reads the connection and the session's reader does not take what arrives (a peer that keeps this
side's window shut and floods session PINGs). The session reads the carrier continuously otherwise,
so the window bounds only what is in flight on the path: h2 returns credit in halves, so at least
8 MiB is always open to the peer, more than a loopback or LAN tunnel ever has in flight (the mux's
per-stream credits are what bound each stream, as before).

Before a peer has authenticated, the server's side costs little: frames of at most 16 KiB (the
HTTP/2 default; raised to 1 MiB for the tunnel only once its request was accepted), header blocks
of at most 16 KiB, at most ``_MAX_REJECTIONS`` rejected tunnel requests per connection (then GOAWAY
ENHANCE_YOUR_CALM), and ``handshake_timeout`` as a hard deadline for TLS, preface and tunnel request
(no frame extends it). The rejections are logged at most once per ten seconds per source address,
with a count.

With ``websocket=True`` (kasd's agent port) a connection whose first bytes are an HTTP/1.1 request
rather than the preface goes to the WebSocket carrier (``wire.wscarrier``) under the same deadline;
the HTTP/2 path is unchanged (the same first read, no extra copy or task).
"""

from __future__ import annotations

import logging
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.settings
import trio

from daemonkit.fatal import leaves
from daemonkit.logs import BurstLimitedLog, UnexpectedErrors
from h2trio.budget import DEFAULT_RESET_LIMIT, ResetLimit
from h2trio.driver import H2Driver, H2Stream
from h2trio.lean import new_connection
from netio.fastio import fast_stream, peer_host, peer_name, tls_stream
from wire.carrier import (
    DEFAULT_PATH,
    TUNNEL_CONTENT_TYPE,
    Authenticate,
    TunnelRejectedError,
    authenticate_tunnel_request,
    request_header_map,
    tunnel_request_headers,
)
from wire.session import Session, connect_session, open_session
from wire.wscarrier import WebSocketTransport, accept_ws_tunnel, looks_like_http1

__all__ = [
    "TUNNEL_CONTENT_TYPE",
    "TUNNEL_WINDOW",
    "Authenticate",
    "H2StreamTransport",
    "SessionHandler",
    "TunnelRejectedError",
    "dial_h2_tunnel",
    "open_h2_session",
    "request_h2_tunnel",
    "serve_h2_connection",
    "serve_h2_tunnels",
    "server_ssl_context",
]

log = logging.getLogger("wire.h2carrier")
#: lines a stranger can repeat at will (a bad token, a broken preface): one per source per 10 s
_strangers = BurstLimitedLog(log, interval=10.0)
#: a connection that fails unexpectedly (a bug) when its server was given no reporter of its own
_unexpected = UnexpectedErrors(log)

#: the tunnel's HTTP/2 receive window, stream and connection (see the module docstring)
TUNNEL_WINDOW = 16 << 20
_MAX_FRAME = 1 << 20  # fewer, larger DATA frames: per-frame Python overhead dominates on loopback
_RECEIVE_SIZE = 256 * 1024
_HEADER_LIST_LIMIT = 16 * 1024
_ERROR_BODY_LIMIT = 4096
#: tunnel requests a connection may have rejected (agentd sends one per connection) before GOAWAY
_MAX_REJECTIONS = 3


def _new_driver(stream: trio.abc.Stream, *, server: bool, reset_limit: ResetLimit = DEFAULT_RESET_LIMIT) -> H2Driver:
    conn = new_connection(h2.config.H2Configuration(client_side=not server, header_encoding="utf-8"))
    settings: dict[h2.settings.SettingCodes | int, int] = {
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: TUNNEL_WINDOW,
        h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: _HEADER_LIST_LIMIT,
        # The server takes large frames only once the tunnel request was accepted (_check_request).
        **({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 16} if server else {h2.settings.SettingCodes.MAX_FRAME_SIZE: _MAX_FRAME}),
    }
    return H2Driver(
        stream, conn, settings=settings, connection_window=TUNNEL_WINDOW, receive_size=_RECEIVE_SIZE,
        reset_limit=reset_limit,
    )


class H2StreamTransport(trio.abc.HalfCloseableStream):
    """Both directions of one HTTP/2 stream as a Trio stream (what a Session runs over)."""

    def __init__(self, h2s: H2Stream, *, owns_connection: bool) -> None:
        h2s.head = None  # checked already; an idle tunnel end (there are thousands) need not keep it
        self.h2s = h2s
        self.driver = h2s.driver
        self.driver.reads_on_demand = True  # no reader task: the session's reader reads it
        self.stream_id = h2s.stream_id
        self._owns_connection = owns_connection
        self._closed = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """The next bytes of the tunnel stream. The connection has no reader task: this reads it
        (``H2Driver.read_for``), so the session's reader is the connection's reader too, and the
        h2 connection's own frames are answered as they are read."""
        if self._closed:
            raise trio.ClosedResourceError("transport closed")
        data = await self.h2s.read_data(max_bytes)
        assert data is not None
        return data

    async def receive_before(self, deadline: float, max_bytes: int | None = None) -> bytes | None:
        """``receive_some``, or None once ``deadline`` passed with nothing received: only the wait
        for bytes is cut (what was read is fed to h2 and answered whole), so a session's reader can
        keep its timers without a task of their own (``wire.session``)."""
        if self._closed:
            raise trio.ClosedResourceError("transport closed")
        return await self.h2s.read_data(max_bytes, deadline=deadline)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("transport closed")
        await self.h2s.send_data(data)

    async def send_eof(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("transport closed")
        await self.h2s.end_stream()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        self.h2s.close()
        if self._owns_connection:
            await self.driver.aclose()
            return
        with trio.move_on_after(2, shield=True):
            try:
                await self.h2s.end_stream()
            except trio.BrokenResourceError:
                pass


# --------------------------------------------------------------------------- client


def _client_ssl_context(ssl_context: ssl.SSLContext | None) -> ssl.SSLContext:
    ctx = ssl_context or ssl.create_default_context()
    ctx.set_alpn_protocols(["h2"])
    return ctx


async def dial_h2_tunnel(
    url: str,
    *,
    token: str,
    ssl_context: ssl.SSLContext | None = None,
    headers: Sequence[tuple[str, str]] = (),
) -> H2StreamTransport:
    """Dial ``url`` (``https://`` with ALPN h2, or ``http://`` as h2c prior knowledge) and open the
    tunnel stream. Raises TunnelRejectedError for a non-200 answer, OSError when nothing listens.

    The returned transport needs no task of its own: whoever receives from it (the session's
    reader) reads the connection, and a send that waits for the peer's window reads meanwhile.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"tunnel URL must be http:// or https://host[:port]/path, got {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    stream: trio.abc.Stream = fast_stream(await trio.open_tcp_stream(parts.hostname, port))
    try:
        if parts.scheme == "https":
            tls = tls_stream(stream, _client_ssl_context(ssl_context), server_hostname=parts.hostname)
            await tls.do_handshake()
            if tls.selected_alpn_protocol() != "h2":
                raise TunnelRejectedError(0, f"server at {parts.netloc} did not negotiate HTTP/2 (ALPN h2) over TLS")
            stream = tls
        return await request_h2_tunnel(stream, scheme=parts.scheme, authority=parts.netloc, path=parts.path or "/",
                                       token=token, headers=headers)
    except BaseException:
        with trio.move_on_after(1, shield=True):
            await stream.aclose()
        raise


async def request_h2_tunnel(
    stream: trio.abc.Stream,
    *,
    scheme: str,
    authority: str,
    path: str,
    token: str,
    headers: Sequence[tuple[str, str]] = (),
) -> H2StreamTransport:
    """The client's side of the carrier on a connection that is already open (``dial_h2_tunnel``'s,
    or one kasd dialled to a receptive agentd): the preface and the tunnel request. Raises
    TunnelRejectedError for a non-200 answer; the caller closes ``stream`` on any error."""
    driver = _new_driver(stream, server=False)
    request = [
        (":method", "POST"),
        (":scheme", scheme),
        (":authority", authority),
        (":path", path),
        *tunnel_request_headers(token, extra=headers),
    ]
    h2s = await driver.open_stream(request)
    status, body = await _await_response(h2s)
    if status != 200:
        raise TunnelRejectedError(status, body or f"HTTP {status}")
    return H2StreamTransport(h2s, owns_connection=True)


async def _await_response(h2s: H2Stream) -> tuple[int, str]:
    """Read until the tunnel request's response head; for an error, its (bounded) body too. Data
    that follows a 200 in the same read stays queued on the stream for the session."""
    driver = h2s.driver
    while True:
        status = int(_headers(h2s.head).get(":status", "0")) if h2s.head is not None else None
        if status == 200:
            return status, ""
        if h2s.ended_by_peer or h2s.reset_code is not None or driver.closed:
            body = b""
            try:
                while len(body) < _ERROR_BODY_LIMIT and (chunk := await h2s.receive_data()):
                    body += chunk
            except trio.BrokenResourceError:
                pass
            text = body[:_ERROR_BODY_LIMIT].decode(errors="replace").strip()
            if driver.closed and not h2s.ended_by_peer:
                raise TunnelRejectedError(status or 0, text or driver.close_reason)
            return status or 0, text
        await driver.pump()


@asynccontextmanager
async def open_h2_session(
    url: str,
    *,
    token: str,
    ssl_context: ssl.SSLContext | None = None,
    headers: Sequence[tuple[str, str]] = (),
    **session_kwargs: Any,
) -> AsyncIterator[Session]:
    """``async with open_h2_session("https://kasd:8150/tunnel", token=t) as session:``

    Dial and handshake errors (OSError, TunnelRejectedError, SessionClosedError) raise as
    themselves, before the nursery exists, so callers can catch them plainly.
    """
    transport = await dial_h2_tunnel(url, token=token, ssl_context=ssl_context, headers=headers)
    async with open_session(transport, client=True, **session_kwargs) as session:
        yield session


# --------------------------------------------------------------------------- server

SessionHandler = Callable[[Session, Any], Awaitable[None]]


def server_ssl_context(ssl_context: ssl.SSLContext, *, websocket: bool = False) -> ssl.SSLContext:
    """Make a server context offer ALPN h2, and http/1.1 too for ``websocket`` (call before listening)."""
    ssl_context.set_alpn_protocols(["h2", "http/1.1"] if websocket else ["h2"])
    return ssl_context


async def serve_h2_tunnels(
    handler: SessionHandler,
    listeners: Sequence[trio.abc.Listener[Any]],
    *,
    authenticate: Authenticate,
    path: str = DEFAULT_PATH,
    ssl_context: ssl.SSLContext | None = None,
    handshake_timeout: float = 10.0,
    reset_limit: ResetLimit = DEFAULT_RESET_LIMIT,
    session_kwargs: dict[str, Any] | None = None,
    unexpected: UnexpectedErrors | None = None,
    websocket: bool = False,
    task_status: trio.TaskStatus[Sequence[trio.abc.Listener[Any]]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept tunnel connections on ``listeners`` and run ``handler(session, principal)`` for each.
    A connection that fails unexpectedly (a bug) ends alone, in one line ``unexpected`` rate-limits.

    ``authenticate(token, headers)`` returns the principal, None (401), or raises
    TunnelRejectedError (see ``wire.carrier``). ``handshake_timeout`` bounds TLS, preface and the
    tunnel request together; ``reset_limit`` the streams a connection may reset or have refused.
    With ``websocket``, an HTTP/1.1 request on the same path is served by the WebSocket carrier
    (``wire.wscarrier``; give ``ssl_context`` through ``server_ssl_context(…, websocket=True)``).
    """

    async def on_connection(stream: trio.abc.Stream) -> None:
        await _serve_connection(
            stream,
            handler=handler,
            authenticate=authenticate,
            path=path,
            ssl_context=ssl_context,
            handshake_timeout=handshake_timeout,
            reset_limit=reset_limit,
            session_kwargs=session_kwargs or {},
            unexpected=unexpected,
            websocket=websocket,
        )

    await trio.serve_listeners(on_connection, list(listeners), task_status=task_status)


async def serve_h2_connection(
    stream: trio.abc.Stream,
    handler: SessionHandler,
    *,
    authenticate: Authenticate,
    path: str = DEFAULT_PATH,
    handshake_timeout: float = 10.0,
    reset_limit: ResetLimit = DEFAULT_RESET_LIMIT,
    session_kwargs: dict[str, Any] | None = None,
    unexpected: UnexpectedErrors | None = None,
) -> None:
    """The server's side of the carrier on one connection that is already open (and, if it is TLS,
    handshaken): what ``serve_h2_tunnels`` runs for each connection it accepts, for kasd's
    connections to receptive agents (``kasd.receptive``). Returns when the connection ends; closes it."""
    await _serve_connection(
        stream, handler=handler, authenticate=authenticate, path=path, ssl_context=None,
        handshake_timeout=handshake_timeout, reset_limit=reset_limit, session_kwargs=session_kwargs or {},
        unexpected=unexpected,
    )


#: what every HTTP/2 connection begins with (RFC 9113 3.4)
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

_HTTP1_HINT = (
    b"HTTP/1.1 505 HTTP Version Not Supported\r\ncontent-type: text/plain\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s"
)
_HTTP1_MESSAGE = b"this port speaks HTTP/2 only: TLS with ALPN h2, or h2c with prior knowledge\n"


#: how a tunnel connection ends that is no bug: the peer went away or closed the session (agentd
#: moving the tunnel to its placement, a restart, a network cut)
_CONNECTION_ENDS = (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError)


def _connection_end(exc: BaseException) -> BaseException | None:
    """The exception that says how the connection ended when ``exc`` is only that, however deep in
    exception groups the handler's or the carrier's nurseries put it (a task that touched the session
    after the peer left); None when anything in it is a bug."""
    found = leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    if found and all(isinstance(e, _CONNECTION_ENDS) for e in found):
        return found[0]
    return None


async def _serve_connection(
    stream: trio.abc.Stream,
    *,
    handler: SessionHandler,
    authenticate: Authenticate,
    path: str,
    ssl_context: ssl.SSLContext | None,
    handshake_timeout: float,
    reset_limit: ResetLimit,
    session_kwargs: dict[str, Any],
    unexpected: UnexpectedErrors | None = None,
    websocket: bool = False,
) -> None:
    stream = fast_stream(stream)
    peer = peer_name(stream)
    accepted: tuple[H2StreamTransport | WebSocketTransport, Any] | None = None
    try:
        async with trio.open_nursery() as nursery:
            # A hard deadline from accept: nothing the peer sends (PING, SETTINGS…) moves it.
            with trio.move_on_after(handshake_timeout) as deadline:
                if ssl_context is not None:
                    tls = tls_stream(stream, ssl_context, server_side=True)
                    await tls.do_handshake()
                    stream = tls
                accepted = await _accept_tunnel(
                    stream, authenticate=authenticate, path=path, peer=peer, reset_limit=reset_limit,
                    websocket=websocket,
                )
            if deadline.cancelled_caught:
                _strangers.warning(
                    (peer_host(peer), "timeout"), "tunnel handshake timed out peer=%s after=%.1fs", peer, handshake_timeout
                )
                return
            if accepted is None:
                return
            transport, principal = accepted
            # Either carrier is read by the session's reader: no task of the carrier's own.
            session = await connect_session(nursery, transport, client=False, **session_kwargs)
            try:
                await handler(session, principal)
            finally:
                await session.aclose()
                nursery.cancel_scope.cancel()
    except Exception as exc:  # one bad connection must never take the listener down
        ended = _connection_end(exc)
        if ended is not None and accepted is None:
            # Before authentication (a TLS handshake that failed, a peer that left): a stranger can
            # repeat it at will, so one line per source address per 10 s, with a count.
            _strangers.info((peer_host(peer), "ended"), "tunnel connection ended before authentication peer=%s "
                            "error=%r", peer, ended)
        elif ended is not None:
            log.info("tunnel connection ended peer=%s error=%r", peer, ended)
        else:
            (unexpected or _unexpected).report(exc, "tunnel connection failed unexpectedly peer=%s", peer)
    finally:
        with trio.move_on_after(1, shield=True):
            await stream.aclose()



def _header_pairs(raw: Any) -> list[tuple[str, str]]:
    """h2 hands headers as str (we ask for utf-8 decoding); be safe about bytes anyway."""
    return [
        (k.decode() if isinstance(k, bytes) else k, v.decode(errors="replace") if isinstance(v, bytes) else v)
        for k, v in raw
    ]


def _headers(raw: Any) -> dict[str, str]:
    return dict(_header_pairs(raw))


async def _accept_tunnel(
    stream: trio.abc.Stream,
    *,
    authenticate: Authenticate,
    path: str,
    peer: str,
    reset_limit: ResetLimit = DEFAULT_RESET_LIMIT,
    websocket: bool = False,
) -> tuple[H2StreamTransport | WebSocketTransport, Any] | None:
    """Speak HTTP/2 until a valid tunnel request arrives; answer bad ones; None if the peer quits
    (or had ``_MAX_REJECTIONS`` requests rejected: GOAWAY ENHANCE_YOUR_CALM).

    Nothing is read while a request is being authenticated, so before a peer has authenticated it
    costs at most one read's worth of buffered bytes."""
    alpn = getattr(stream, "selected_alpn_protocol", None)  # over TLS (ours or Trio's SSLStream)
    if alpn is not None and alpn() != "h2" and not websocket:
        _strangers.warning((peer_host(peer), "alpn"), "tunnel client did not offer ALPN h2 peer=%s", peer)
    driver = _new_driver(stream, server=True, reset_limit=reset_limit)
    requests: deque[H2Stream] = deque()
    driver.on_request = requests.append
    data: bytes | bytearray | None
    try:
        data = await stream.receive_some(_RECEIVE_SIZE)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return None
    if not data:
        return None
    while len(data) < len(_H2_PREFACE) and _H2_PREFACE.startswith(data):
        # Only the start of the preface so far ("P" could still be "POST"): read on (at most 24
        # bytes, within the handshake deadline) until the bytes tell HTTP/2 from HTTP/1.1.
        try:
            more = await stream.receive_some(_RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return None
        if not more:
            return None
        data = bytes(data) + bytes(more)
    if looks_like_http1(data):
        if websocket:
            return await accept_ws_tunnel(stream, data, authenticate=authenticate, path=path, peer=peer)
        # An HTTP/1.1 client (curl without --http2-prior-knowledge, a browser): say what we speak.
        await stream.send_all(_HTTP1_HINT % (len(_HTTP1_MESSAGE), _HTTP1_MESSAGE))
        _strangers.info((peer_host(peer), "http1"), "rejected HTTP/1.x request on tunnel port peer=%s", peer)
        return None
    rejections = 0
    while True:
        await driver.pump(data)
        if driver.protocol_error is not None:
            _strangers.warning(
                (peer_host(peer), "h2"), "HTTP/2 protocol error on tunnel port peer=%s error=%s", peer, driver.protocol_error
            )
            return None
        while requests:
            accepted = await _check_request(requests.popleft(), authenticate=authenticate, path=path, peer=peer)
            if accepted is None:
                rejections += 1
                if rejections >= _MAX_REJECTIONS:
                    driver.go_away(
                        h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, f"{rejections} tunnel requests rejected on one connection"
                    )
                    try:
                        await driver.flush()
                    except trio.BrokenResourceError:
                        pass
                    return None
            else:
                # One tunnel per connection: no further requests either way (a server never opens
                # streams to a tunnel client; a client gets one tunnel stream per connection).
                driver.on_request = None
                for other in requests:
                    await other.reset(h2.errors.ErrorCodes.REFUSED_STREAM)
                return accepted
        if driver.closed:
            return None
        data = None


async def _check_request(
    h2s: H2Stream, *, authenticate: Authenticate, path: str, peer: str
) -> tuple[H2StreamTransport, Any] | None:
    try:
        headers = request_header_map(_header_pairs(h2s.head or ()))
        principal = await authenticate_tunnel_request(
            headers.get(":method", ""), headers.get(":path", ""), headers, path=path, authenticate=authenticate
        )
    except TunnelRejectedError as exc:
        await _reject(h2s, exc, peer)
        return None
    # The tunnel moves bulk data: from the peer's SETTINGS ACK on, it may send frames of 1 MiB.
    h2s.driver.update_settings({h2.settings.SettingCodes.MAX_FRAME_SIZE: _MAX_FRAME})
    await h2s.send_headers([(":status", "200"), ("content-type", TUNNEL_CONTENT_TYPE)])
    return H2StreamTransport(h2s, owns_connection=True), principal


async def _reject(h2s: H2Stream, rejection: TunnelRejectedError, peer: str) -> None:
    """Answer a bad tunnel request with its status and a plain-text reason."""
    # Never log the token; the message names only what was wrong.
    _strangers.warning(
        (peer_host(peer), "rejected", rejection.status),
        "tunnel request rejected peer=%s status=%d reason=%r", peer, rejection.status, rejection.message,
    )
    body = (rejection.message + "\n").encode()
    h2s.close()
    await h2s.send_headers(
        [
            (":status", str(rejection.status)),
            ("content-type", "text/plain"),
            ("content-length", str(len(body))),
            *rejection.headers,
        ]
    )
    await h2s.send_data(body, end_stream=True)
