"""The HTTP/2 carrier: one session rides one long-lived bidirectional HTTP/2 request stream.

The client ``POST``s to the tunnel path with ``Authorization: Bearer <token>`` and, once it gets
``200``, both directions of that one HTTP/2 stream are the session's byte stream. The server answers
a wrong method, path or token with the proper status before any session starts.

h2's own flow control is opened wide (windows of 2**31-1): the mux credits are what bound memory, and
h2 must never throttle below them. Received bytes are still acknowledged only once the session took
them, so h2 keeps a true picture of what is in flight.
"""

from __future__ import annotations

import logging
import ssl
import struct
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.frame_buffer
import h2.settings
import hyperframe.exceptions
import hyperframe.frame
import trio

from netio.fastio import FastTLSStream, fast_stream, peer_name, send_many
from wire.session import Session, SessionClosedError, connect_session, open_session

log = logging.getLogger("wire.h2carrier")

TUNNEL_CONTENT_TYPE = "application/x-kasd-tunnel"
_MAX_WINDOW = 2**31 - 1
_MAX_FRAME = 1 << 20  # fewer, larger DATA frames: per-frame Python overhead dominates on loopback
_RECEIVE_SIZE = 256 * 1024
_HEADER_LIST_LIMIT = 16 * 1024
_ERROR_BODY_LIMIT = 4096
#: bytes queued behind a send in progress before a further flush() waits for it
_FLUSH_HIGH_WATER = 1 << 20


class TunnelRejectedError(Exception):
    """The server refused the tunnel request (wrong path, bad token, …) with an HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"tunnel rejected with HTTP {status}: {message}")
        self.status = status
        self.message = message


class TunnelRejected(Exception):
    """Raise from an authentication callback to answer with ``status`` (e.g. 403) and ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _data_frame_body_repr(self: hyperframe.frame.DataFrame) -> str:
    return f"<{len(self.data)} bytes>"


# h2 4.x builds ``repr(frame)`` for a trace log line on every frame it receives, whether or not
# anyone logs it, and hyperframe's DataFrame repr copies and hex-encodes the *whole* payload before
# truncating it to 20 characters: O(payload) work per frame, a third of a receiver's CPU at 1 MiB
# frames. A repr that says how many bytes there are is what a log line needs anyway.
hyperframe.frame.DataFrame._body_repr = _data_frame_body_repr  # type: ignore[method-assign,assignment]


_FRAME_HEADER = struct.Struct(">HBBBL")


class _LeanFrameBuffer(h2.frame_buffer.FrameBuffer):
    """h2's receive buffer, parsing a DATA frame's body in place: h2 first copies the body out of
    its buffer and then copies it again into the frame (one of those copies is enough)."""

    def __next__(self) -> hyperframe.frame.Frame:
        data = self._data
        if len(data) < 9 or data[3] != 0x0 or self._headers_buffer:
            return super().__next__()  # not a DATA frame (or one the general path must reject)
        length = int.from_bytes(data[:3], "big")
        if len(data) < 9 + length:
            raise StopIteration
        self._validate_frame_length(length)
        frame, _ = hyperframe.frame.Frame.parse_frame_header(memoryview(data[:9]))
        with memoryview(data) as view:
            body = view[9 : 9 + length]
            try:
                frame.parse_body(body)  # takes its payload with .tobytes(): nothing keeps the view
            except hyperframe.exceptions.InvalidDataError as err:
                raise h2.exceptions.ProtocolError("Received frame with non-compliant data") from err
            except hyperframe.exceptions.InvalidFrameError as err:
                raise h2.exceptions.FrameDataMissingError("Frame data missing or invalid") from err
            finally:
                body.release()
        del data[: 9 + length]
        return frame


class _LeanH2Connection(h2.connection.H2Connection):
    """h2, queuing DATA payloads without copying them.

    h2 copies every outgoing DATA payload four times (the frame body, header + body, the join of
    all frames, the ``bytearray`` they are appended to) and ``data_to_send`` a fifth. A tunnel's
    bytes are nearly all DATA payload, so here a DATA frame is queued as its 9-byte header plus
    the payload object itself, and ``data_to_send_chunks`` hands the list to a vectored send.
    """

    def __init__(self, config: h2.config.H2Configuration) -> None:
        super().__init__(config)
        self._chunks: list[bytes] = []
        lean = _LeanFrameBuffer(server=not config.client_side)
        lean.max_frame_size = self.incoming_buffer.max_frame_size
        self.incoming_buffer = lean

    def _take_bytearray(self) -> None:
        # h2 writes its connection preamble straight into its buffer: keep it first, in order.
        if self._data_to_send:
            self._chunks.append(bytes(self._data_to_send))
            self._data_to_send = bytearray()

    def _prepare_for_sending(self, frames: list[hyperframe.frame.Frame]) -> None:
        if not frames:
            return
        self._take_bytearray()
        chunks = self._chunks
        for frame in frames:
            if type(frame) is hyperframe.frame.DataFrame and "PADDED" not in frame.flags:
                size = len(frame.data)
                frame.body_len = size
                flags = 0x1 if "END_STREAM" in frame.flags else 0
                chunks.append(_FRAME_HEADER.pack((size >> 8) & 0xFFFF, size & 0xFF, 0x0, flags, frame.stream_id))
                if size:
                    chunks.append(frame.data)
            else:
                chunks.append(frame.serialize())

    def data_to_send_chunks(self) -> list[bytes]:
        """Everything queued, as a list of buffers (in order), and forget it."""
        self._take_bytearray()
        chunks, self._chunks = self._chunks, []
        return chunks

    def data_to_send(self, amount: int | None = None) -> bytes:
        if amount is not None:
            raise NotImplementedError("partial data_to_send is not used by the tunnel")
        return b"".join(self.data_to_send_chunks())

    def clear_outbound_data_buffer(self) -> None:
        super().clear_outbound_data_buffer()
        self._chunks = []


def _h2_settings(conn: h2.connection.H2Connection, *, server: bool) -> None:
    conn.update_settings(
        {
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _MAX_WINDOW,
            h2.settings.SettingCodes.MAX_FRAME_SIZE: _MAX_FRAME,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: _HEADER_LIST_LIMIT,
            **({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 16} if server else {}),
        }
    )
    conn.increment_flow_control_window(_MAX_WINDOW - 65535)


class _H2Link:
    """One HTTP/2 connection: a reader task feeding h2, a lock serialising writes, stream buffers."""

    def __init__(self, stream: trio.abc.Stream, conn: _LeanH2Connection) -> None:
        self.stream = stream
        self.conn: _LeanH2Connection = conn
        self._queued: list[bytes] = []
        self._queued_bytes = 0
        self._sending = False
        self._drained = trio.lowlevel.ParkingLot()
        self.transports: dict[int, H2StreamTransport] = {}
        self.closed = False
        self.close_reason = ""
        self.window_lot = trio.lowlevel.ParkingLot()
        #: events that arrived in the same batch as the tunnel's request/response head
        self.pending: list[h2.events.Event] = []

    async def flush(self, *, wait: bool = False) -> None:
        """Send what h2 queued. One task at a time moves bytes to the socket and keeps going until
        none are left, so a second caller's bytes go out after the first's, in order; that caller
        returns at once unless much is queued (or ``wait``: until everything is sent)."""
        chunks = self.conn.data_to_send_chunks()
        if chunks:
            self._queued.extend(chunks)
            self._queued_bytes += sum(map(len, chunks))
        while self._sending:
            if not wait and self._queued_bytes < _FLUSH_HIGH_WATER:
                return
            await self._drained.park()
        if not self._queued:
            return
        self._sending = True
        try:
            while self._queued:
                chunks, self._queued = self._queued, []
                self._queued_bytes = 0
                await send_many(self.stream, chunks)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._queued.clear()
            self.fail(f"connection lost while sending: {exc!r}")
            raise trio.BrokenResourceError(self.close_reason) from exc
        finally:
            self._sending = False
            self._drained.unpark_all()

    def fail(self, reason: str, *, clean: bool = False) -> None:
        """The connection is gone; ``clean`` (an orderly GOAWAY) reads as EOF rather than an error."""
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        for transport in self.transports.values():
            if clean:
                transport._on_eof()
            else:
                transport._fail(trio.BrokenResourceError(reason))
        self.window_lot.unpark_all()

    async def read_events(self) -> list[h2.events.Event]:
        try:
            data = await self.stream.receive_some(_RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.fail(f"connection lost: {exc!r}")
            return []
        if not data:
            self.fail("peer closed the connection")
            return []
        try:
            return list(self.conn.receive_data(data))
        except h2.exceptions.ProtocolError as exc:
            self.fail(f"HTTP/2 protocol error from peer: {exc}")
            try:
                await self.flush()  # h2 queued a GOAWAY naming the error
            except trio.BrokenResourceError:
                pass
            return []

    def dispatch(self, event: h2.events.Event) -> None:
        """Events that concern an established tunnel stream."""
        if isinstance(event, h2.events.DataReceived):
            transport = self.transports.get(event.stream_id)
            if transport is not None:
                transport._on_data(event.data, event.flow_controlled_length)
            else:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            transport = self.transports.get(event.stream_id)
            if transport is not None:
                transport._on_eof()
        elif isinstance(event, h2.events.StreamReset):
            transport = self.transports.pop(event.stream_id, None)
            if transport is not None:
                transport._fail(trio.BrokenResourceError(f"HTTP/2 stream reset by peer (code {event.error_code})"))
        elif isinstance(event, h2.events.WindowUpdated):
            self.window_lot.unpark_all()
        elif isinstance(event, h2.events.ConnectionTerminated):
            code = event.error_code
            self.fail(f"peer sent HTTP/2 GOAWAY (code {code})", clean=code == h2.errors.ErrorCodes.NO_ERROR)


class H2StreamTransport(trio.abc.Stream):
    """Both directions of one HTTP/2 stream as a ``trio.abc.Stream`` (what a Session runs over)."""

    def __init__(self, link: _H2Link, stream_id: int, *, owns_connection: bool) -> None:
        self._link = link
        self.stream_id = stream_id
        self._owns_connection = owns_connection
        self._buffer: deque[tuple[bytes, int]] = deque()
        self._eof = False
        self._error: BaseException | None = None
        self._closed = False
        self._lot = trio.lowlevel.ParkingLot()
        self._local_ended = False
        link.transports[stream_id] = self

    def _on_data(self, data: bytes, flow_length: int) -> None:
        self._buffer.append((data, flow_length))
        self._lot.unpark_all()

    def _on_eof(self) -> None:
        self._eof = True
        self._lot.unpark_all()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._lot.unpark_all()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("transport closed")
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self._buffer and not self._eof and self._error is None:
            await self._lot.park()
        if self._buffer:
            data, flow_length = self._buffer.popleft()
            if max_bytes is not None and len(data) > max_bytes:
                self._buffer.appendleft((data[max_bytes:], 0))
                data = data[:max_bytes]
            if flow_length and not self._link.closed:
                self._link.conn.acknowledge_received_data(flow_length, self.stream_id)
                await self._link.flush()
            return data
        if self._eof:
            return b""
        assert self._error is not None
        raise self._error

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("transport closed")
        link = self._link
        view = memoryview(data).cast("B")
        await trio.lowlevel.checkpoint_if_cancelled()
        while view:
            if self._error is not None:
                raise self._error
            if link.closed:
                raise trio.BrokenResourceError(link.close_reason)
            window = min(link.conn.local_flow_control_window(self.stream_id), link.conn.max_outbound_frame_size)
            if window <= 0:
                await link.flush()
                await link.window_lot.park()
                continue
            if window >= len(view) and isinstance(data, bytes) and len(view) == len(data):
                chunk, view = data, view[:0]  # the common case: all of it in one frame, no copy
            else:
                chunk, view = view[:window].tobytes(), view[window:]
            try:
                link.conn.send_data(self.stream_id, chunk)
            except h2.exceptions.ProtocolError as exc:
                raise trio.BrokenResourceError(f"HTTP/2 stream unusable: {exc}") from exc
        await link.flush()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        link = self._link
        link.transports.pop(self.stream_id, None)
        with trio.move_on_after(2, shield=True):
            if not link.closed:
                try:
                    if self._owns_connection:
                        link.conn.close_connection()
                    else:
                        link.conn.end_stream(self.stream_id)
                    await link.flush(wait=True)
                except (h2.exceptions.ProtocolError, trio.BrokenResourceError):
                    pass
            if self._owns_connection:
                link.fail("closed by this side")
                await link.stream.aclose()
        self._lot.unpark_all()


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

    The returned transport needs ``run_h2_reader(transport)`` running in a task to make progress.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"tunnel URL must be http:// or https://host[:port]/path, got {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    stream: trio.abc.Stream = fast_stream(await trio.open_tcp_stream(parts.hostname, port))
    try:
        if parts.scheme == "https":
            tls = FastTLSStream(stream, _client_ssl_context(ssl_context), server_hostname=parts.hostname)
            await tls.do_handshake()
            if tls.selected_alpn_protocol() != "h2":
                raise TunnelRejectedError(0, f"server at {parts.netloc} did not negotiate HTTP/2 (ALPN h2) over TLS")
            stream = tls
        conn = _LeanH2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        _h2_settings(conn, server=False)
        link = _H2Link(stream, conn)
        stream_id = conn.get_next_available_stream_id()
        conn.send_headers(
            stream_id,
            [
                (":method", "POST"),
                (":scheme", parts.scheme),
                (":authority", parts.netloc),
                (":path", parts.path or "/"),
                ("authorization", f"Bearer {token}"),
                ("content-type", TUNNEL_CONTENT_TYPE),
                *headers,
            ],
        )
        await link.flush()
        status, body = await _await_response(link, stream_id)
        if status != 200:
            raise TunnelRejectedError(status, body or f"HTTP {status}")
        return H2StreamTransport(link, stream_id, owns_connection=True)
    except BaseException:
        with trio.move_on_after(1, shield=True):
            await stream.aclose()
        raise


async def run_h2_reader(transport: H2StreamTransport) -> None:
    """The reader task of a dialed tunnel connection; returns when the connection ends."""
    await _read_forever(transport._link)


async def _await_response(link: _H2Link, stream_id: int) -> tuple[int, str]:
    """Read until the tunnel request's response head; for an error, its (bounded) body too."""
    status: int | None = None
    body = b""
    while True:
        events = await link.read_events()
        if link.closed:
            raise TunnelRejectedError(status or 0, body.decode(errors="replace") or link.close_reason)
        for event in events:
            if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream_id:
                status = int(_headers(event.headers).get(":status", "0"))
                if status == 200:
                    # Later events in this batch may already be tunnel data: leave them for the reader.
                    link.pending = events[events.index(event) + 1 :]
                    await link.flush()
                    return status, ""
            elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream_id:
                body = (body + event.data)[:_ERROR_BODY_LIMIT]
                link.conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
            elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)) and event.stream_id == stream_id:
                return status or 0, body.decode(errors="replace").strip()
        await link.flush()


async def _read_forever(link: _H2Link) -> None:
    """The reader task of an established tunnel connection, either side."""
    for event in link.pending:
        link.dispatch(event)
    while not link.closed:
        events = await link.read_events()
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                # One tunnel per connection: no further requests either way (a server never opens
                # streams to a tunnel client; a client gets one tunnel stream per connection).
                link.conn.reset_stream(event.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            else:
                link.dispatch(event)
        if not link.closed:
            try:
                await link.flush()
            except trio.BrokenResourceError:
                return


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
    async with open_session(
        transport, client=True, transport_task=partial(run_h2_reader, transport), **session_kwargs
    ) as session:
        yield session


# --------------------------------------------------------------------------- server

Authenticate = Callable[[str, dict[str, str]], Awaitable[Any]]
SessionHandler = Callable[[Session, Any], Awaitable[None]]


def server_ssl_context(ssl_context: ssl.SSLContext) -> ssl.SSLContext:
    """Make a server context offer ALPN h2 (call before listening)."""
    ssl_context.set_alpn_protocols(["h2"])
    return ssl_context


async def serve_h2_tunnels(
    handler: SessionHandler,
    listeners: Sequence[trio.abc.Listener[Any]],
    *,
    authenticate: Authenticate,
    path: str = "/tunnel",
    ssl_context: ssl.SSLContext | None = None,
    handshake_timeout: float = 10.0,
    session_kwargs: dict[str, Any] | None = None,
    task_status: trio.TaskStatus[Sequence[trio.abc.Listener[Any]]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept tunnel connections on ``listeners`` and run ``handler(session, principal)`` for each.

    ``authenticate(token, headers)`` returns the principal, None (401), or raises TunnelRejected.
    """

    async def on_connection(stream: trio.abc.Stream) -> None:
        await _serve_connection(
            stream,
            handler=handler,
            authenticate=authenticate,
            path=path,
            ssl_context=ssl_context,
            handshake_timeout=handshake_timeout,
            session_kwargs=session_kwargs or {},
        )

    await trio.serve_listeners(on_connection, list(listeners), task_status=task_status)


_HTTP1_HINT = (
    b"HTTP/1.1 505 HTTP Version Not Supported\r\ncontent-type: text/plain\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s"
)
_HTTP1_MESSAGE = b"this port speaks HTTP/2 only: TLS with ALPN h2, or h2c with prior knowledge\n"


async def _serve_connection(
    stream: trio.abc.Stream,
    *,
    handler: SessionHandler,
    authenticate: Authenticate,
    path: str,
    ssl_context: ssl.SSLContext | None,
    handshake_timeout: float,
    session_kwargs: dict[str, Any],
) -> None:
    stream = fast_stream(stream)
    peer = peer_name(stream)
    try:
        async with trio.open_nursery() as nursery:
            accepted = None
            with trio.move_on_after(handshake_timeout) as deadline:
                if ssl_context is not None:
                    tls = FastTLSStream(stream, ssl_context, server_side=True)
                    await tls.do_handshake()
                    stream = tls
                accepted = await _accept_tunnel(stream, authenticate=authenticate, path=path, peer=peer)
            if deadline.cancelled_caught:
                log.warning("tunnel handshake timed out peer=%s after=%.1fs", peer, handshake_timeout)
                return
            if accepted is None:
                return
            transport, principal = accepted
            nursery.start_soon(run_h2_reader, transport)
            session = await connect_session(nursery, transport, client=False, **session_kwargs)
            try:
                await handler(session, principal)
            finally:
                await session.aclose()
                nursery.cancel_scope.cancel()
    except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError) as exc:
        log.info("tunnel connection ended peer=%s error=%r", peer, exc)
    except Exception as exc:  # one bad connection must never take the listener down
        if isinstance(exc, SessionClosedError):
            log.info("tunnel session ended during handshake peer=%s reason=%s", peer, exc)
        else:
            log.exception("tunnel connection failed peer=%s", peer)
    finally:
        with trio.move_on_after(1, shield=True):
            await stream.aclose()


def _headers(raw: Any) -> dict[str, str]:
    """h2 hands headers as str (we ask for utf-8 decoding); be safe about bytes anyway."""
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode(errors="replace") if isinstance(v, bytes) else v)
        for k, v in raw
    }


async def _accept_tunnel(
    stream: trio.abc.Stream, *, authenticate: Authenticate, path: str, peer: str
) -> tuple[H2StreamTransport, Any] | None:
    """Speak HTTP/2 until a valid tunnel request arrives; answer bad ones; None if the peer quits."""
    if isinstance(stream, FastTLSStream) and stream.selected_alpn_protocol() != "h2":
        log.warning("tunnel client did not offer ALPN h2 peer=%s", peer)
    conn = _LeanH2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
    conn.initiate_connection()
    _h2_settings(conn, server=True)
    link = _H2Link(stream, conn)
    first = True
    while True:
        try:
            data = await stream.receive_some(_RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return None
        if not data:
            return None
        if first and not data.startswith(b"PRI * HTTP/2.0") and data[:8].split(b" ")[0].isalpha():
            # An HTTP/1.1 client (curl without --http2-prior-knowledge, a browser): say what we speak.
            await stream.send_all(_HTTP1_HINT % (len(_HTTP1_MESSAGE), _HTTP1_MESSAGE))
            log.info("rejected HTTP/1.x request on tunnel port peer=%s", peer)
            return None
        first = False
        try:
            events = conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            log.warning("HTTP/2 protocol error on tunnel port peer=%s error=%s", peer, exc)
            await link.flush()
            return None
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                accepted = await _check_request(link, event, authenticate=authenticate, path=path, peer=peer)
                if accepted is not None:
                    link.pending = events[events.index(event) + 1 :]
                    await link.flush()
                    return accepted
            elif isinstance(event, h2.events.ConnectionTerminated):
                return None
        await link.flush()


async def _check_request(
    link: _H2Link, event: h2.events.RequestReceived, *, authenticate: Authenticate, path: str, peer: str
) -> tuple[H2StreamTransport, Any] | None:
    headers = _headers(event.headers)
    method, req_path = headers.get(":method", ""), headers.get(":path", "")
    if req_path.split("?", 1)[0] != path:
        _reject(link, event.stream_id, 404, f"no tunnel endpoint at {req_path!r}; use {path!r}", peer)
        return None
    if method != "POST":
        allow = [("allow", "POST")]
        _reject(link, event.stream_id, 405, f"tunnel endpoint takes POST, not {method}", peer, allow)
        return None
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        _reject(link, event.stream_id, 401, "missing bearer token", peer, [("www-authenticate", "Bearer")])
        return None
    public = {k: v for k, v in headers.items() if k != "authorization"}
    try:
        principal = await authenticate(token.strip(), public)
    except TunnelRejected as exc:
        _reject(link, event.stream_id, exc.status, exc.message, peer)
        return None
    if principal is None:
        _reject(link, event.stream_id, 401, "invalid token", peer, [("www-authenticate", "Bearer")])
        return None
    link.conn.send_headers(event.stream_id, [(":status", "200"), ("content-type", TUNNEL_CONTENT_TYPE)])
    return H2StreamTransport(link, event.stream_id, owns_connection=True), principal


def _reject(
    link: _H2Link, stream_id: int, status: int, message: str, peer: str, extra: Sequence[tuple[str, str]] = ()
) -> None:
    """Answer a bad tunnel request with ``status`` and a plain-text reason; always returns None."""
    # Never log the token; the message names only what was wrong.
    log.warning("tunnel request rejected peer=%s status=%d reason=%r", peer, status, message)
    body = (message + "\n").encode()
    link.conn.send_headers(
        stream_id,
        [(":status", str(status)), ("content-type", "text/plain"), ("content-length", str(len(body))), *extra],
    )
    link.conn.send_data(stream_id, body, end_stream=True)
    return None
