"""HTTP/2 on the proxy port (h2): one reader task per connection, one handler task per request.

Protocol only: each request stream becomes an ``Exchange`` for the request pipeline, which decides
everything else. Received DATA is acknowledged only as the pipeline takes it (flow control is the
backpressure); sending respects the client's windows. A client RST_STREAM cancels that request's
exchange, and the pipeline stops the work behind it.
"""

from __future__ import annotations

import logging
import math
from collections import deque

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio

from kasd.k8sproxy.exchange import ClientGone, ClientRequest, Headers
from kasd.k8sproxy.frontend import FrontEndContext
from kasd.k8sproxy.status import ProxyError

log = logging.getLogger("kasd.k8sproxy")

_RECEIVE_SIZE = 64 * 1024
_STREAM_WINDOW = 1 << 20
_CONNECTION_WINDOW = 16 << 20
_MAX_STREAMS = 250
_MUX_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)


class _Request:
    """One client stream: its head, buffered body (bounded by our window) and whether it was reset."""

    def __init__(self, stream_id: int, headers: list[tuple[str, str]]) -> None:
        self.stream_id = stream_id
        self.headers = headers
        self.body: deque[tuple[bytes, int]] = deque()
        self.ended = False
        self.reset = False
        self.lot = trio.lowlevel.ParkingLot()
        self.scope = trio.CancelScope()
        #: we reset the stream (its answer could not be completed), not the client
        self.aborted = False

    def on_reset(self) -> None:
        self.reset = True
        self.scope.cancel()
        self.lot.unpark_all()


class Http2Connection:
    def __init__(
        self, stream: trio.abc.Stream, port: FrontEndContext, *, initial: bytes, head_deadline: float, peer: str
    ) -> None:
        self.stream = stream
        self.port = port
        self.peer = peer
        self.initial = initial
        self.head_deadline = head_deadline
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.conn = h2.connection.H2Connection(config)
        self.requests: dict[int, _Request] = {}
        self._send_lock = trio.StrictFIFOLock()
        self._window_lot = trio.lowlevel.ParkingLot()
        self._read_scope: trio.CancelScope | None = None
        self._seen_request = False
        self._broken = False

    async def run(self) -> None:
        conn = self.conn
        conn.initiate_connection()
        conn.update_settings(
            {
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: _MAX_STREAMS,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _STREAM_WINDOW,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: self.port.limits.max_header_bytes,
            }
        )
        conn.increment_flow_control_window(_CONNECTION_WINDOW - 65535)
        async with trio.open_nursery() as nursery:
            try:
                await self._read_loop(nursery)
            finally:
                # The connection is over: requests still running lost their client.
                for request in list(self.requests.values()):
                    request.on_reset()
        with trio.move_on_after(1, shield=True):
            try:
                if not self._broken:
                    conn.close_connection()
                    await self._flush()
            except (ClientGone, h2.exceptions.ProtocolError):
                pass

    # ------------------------------------------------------------------ reader

    def _read_deadline(self) -> float:
        if self.requests:
            return math.inf
        if not self._seen_request:
            return self.head_deadline
        return trio.current_time() + self.port.limits.idle_timeout

    async def _read_loop(self, nursery: trio.Nursery) -> None:
        data = self.initial
        while True:
            if data:
                try:
                    events = self.conn.receive_data(data)
                except h2.exceptions.ProtocolError as exc:
                    log.info("HTTP/2 protocol error peer=%s error=%s", self.peer, exc)
                    self.port.count_rejected(400)
                    try:
                        await self._flush()  # the GOAWAY h2 queued
                    except ClientGone:
                        pass
                    self._broken = True
                    return
                for event in events:
                    if self._on_event(event, nursery):
                        return
                try:
                    await self._flush()
                except ClientGone:
                    return
            if not self.requests and self.port.draining:
                return
            with trio.CancelScope(deadline=self._read_deadline()) as scope:
                self._read_scope = scope
                if not self.requests:
                    self.port.idle_scopes.add(scope)
                try:
                    data = bytes(await self.stream.receive_some(_RECEIVE_SIZE))
                except _MUX_ERRORS:
                    self._broken = True
                    return
                finally:
                    self._read_scope = None
                    self.port.idle_scopes.discard(scope)
            if scope.cancelled_caught:
                if self.requests:
                    data = b""
                    continue  # a request finished or the server drains: re-evaluate
                if not self._seen_request and trio.current_time() >= self.head_deadline:
                    log.info("HTTP/2 client sent no request in time peer=%s", self.peer)
                    self.port.count_rejected(408)
                return
            if not data:
                self._broken = True
                return

    def _on_event(self, event: h2.events.Event, nursery: trio.Nursery) -> bool:
        """Handle one event; True when the connection is over."""
        if isinstance(event, h2.events.RequestReceived):
            headers = [(bytes(k).decode("latin-1").lower(), bytes(v).decode("latin-1")) for k, v in event.headers]
            if self.port.draining:
                self.conn.reset_stream(event.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
                return False
            self._seen_request = True
            request = _Request(event.stream_id, headers)
            self.requests[event.stream_id] = request
            nursery.start_soon(self._handle, request)
        elif isinstance(event, h2.events.DataReceived):
            req = self.requests.get(event.stream_id)
            if req is not None:
                req.body.append((event.data, event.flow_controlled_length))
                req.lot.unpark_all()
            else:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            req = self.requests.get(event.stream_id)
            if req is not None:
                req.ended = True
                req.lot.unpark_all()
        elif isinstance(event, h2.events.StreamReset):
            req = self.requests.get(event.stream_id)
            if req is not None:
                req.on_reset()
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self._window_lot.unpark_all()
        elif isinstance(event, h2.events.ConnectionTerminated):
            return True
        return False

    def _request_done(self, request: _Request) -> None:
        self.requests.pop(request.stream_id, None)
        if not self.requests and self._read_scope is not None:
            # The reader waits without a deadline while requests run: give it the idle one now.
            self._read_scope.deadline = trio.current_time() + self.port.limits.idle_timeout
            if self.port.draining:
                self._read_scope.cancel()
            else:
                self.port.idle_scopes.add(self._read_scope)

    # ------------------------------------------------------------------ writing

    async def _flush(self) -> None:
        async with self._send_lock:
            data = self.conn.data_to_send()
            if data:
                try:
                    await self.stream.send_all(data)
                except _MUX_ERRORS as exc:
                    self._broken = True
                    raise ClientGone(str(exc)) from None

    async def _send_headers(self, request: _Request, headers: list[tuple[str, str]], *, end: bool = False) -> None:
        if request.reset:
            raise ClientGone("stream reset by client")
        try:
            self.conn.send_headers(request.stream_id, headers, end_stream=end)
        except h2.exceptions.ProtocolError as exc:
            raise ClientGone(f"cannot send response head: {exc}") from None
        await self._flush()

    async def _send_data(self, request: _Request, data: bytes, *, end: bool = False) -> None:
        view = memoryview(data)
        while True:
            if request.reset or self._broken:
                raise ClientGone("stream reset by client")
            try:
                if not view:
                    if end:
                        self.conn.end_stream(request.stream_id)
                        await self._flush()
                    return
                window = min(self.conn.local_flow_control_window(request.stream_id), self.conn.max_outbound_frame_size)
                if window <= 0:
                    await self._window_lot.park()
                    continue
                chunk, view = view[:window], view[window:]
                self.conn.send_data(request.stream_id, chunk.tobytes(), end_stream=end and not view)
                if end and not view:
                    end = False
            except h2.exceptions.ProtocolError as exc:
                raise ClientGone(f"stream unusable: {exc}") from None
            await self._flush()

    async def _receive_body(self, request: _Request) -> bytes:
        while not request.body and not request.ended and not request.reset:
            await request.lot.park()
        if request.reset:
            raise ClientGone("stream reset by client")
        if request.body:
            data, flow = request.body.popleft()
            if flow and not self._broken:
                try:
                    self.conn.acknowledge_received_data(flow, request.stream_id)
                except h2.exceptions.ProtocolError:
                    pass
                await self._flush()
            return data
        return b""

    # ------------------------------------------------------------------ one request

    async def _handle(self, request: _Request) -> None:
        pseudo = {k: v for k, v in request.headers if k.startswith(":")}
        method = pseudo.get(":method", "?")
        ex = _H2Exchange(self, request, ClientRequest(
            method=method,
            target=pseudo.get(":path", ""),
            headers=tuple((k, v) for k, v in request.headers if not k.startswith(":")),
            protocol="HTTP/2",
            peer=self.peer,
            has_body=not (request.ended and not request.body),
        ))
        refusal = None
        if method == "CONNECT":
            refusal = ProxyError(400, "CONNECT (and WebSocket over HTTP/2) is not supported; use HTTP/1.1 for exec/attach/port-forward")
        try:
            async with trio.open_nursery() as nursery:
                ex.nursery = nursery
                with request.scope:
                    await self.port.serve(ex, refusal=refusal)
        finally:
            self._request_done(request)
            if (request.reset or request.aborted) and not self._broken:
                try:
                    self.conn.reset_stream(request.stream_id, h2.errors.ErrorCodes.CANCEL)
                except h2.exceptions.ProtocolError:
                    pass
                with trio.move_on_after(1, shield=True):
                    try:
                        await self._flush()
                    except ClientGone:
                        pass


class _H2Exchange:
    """One HTTP/2 request stream as the pipeline sees it (``kasd.k8sproxy.exchange.Exchange``)."""

    #: the connection's reader sees a RST_STREAM and cancels the exchange: no read needed
    watches_client = False
    nursery: trio.Nursery

    def __init__(self, conn: Http2Connection, stream: _Request, request: ClientRequest) -> None:
        self.conn = conn
        self.stream = stream
        self.request = request

    @property
    def client_gone(self) -> bool:
        return self.stream.reset

    def _lost(self, exc: ClientGone) -> ClientGone:
        self.stream.reset = True
        return exc

    def take_empty_body(self) -> bool:
        return self.stream.ended and not self.stream.body

    async def receive_body(self) -> bytes:
        try:
            return await self.conn._receive_body(self.stream)
        except ClientGone as exc:
            raise self._lost(exc) from None

    async def watch_client(self) -> None:
        return  # the connection's reader notices a reset and cancels the exchange

    async def respond(self, status: int, headers: Headers, body: bytes, *, end: bool) -> None:
        try:
            await self.conn._send_headers(self.stream, [(":status", str(status)), *headers], end=end and not body)
            if body:
                await self.conn._send_data(self.stream, body, end=end)
        except ClientGone as exc:
            raise self._lost(exc) from None

    async def send_error(self, status: int, headers: Headers, body: bytes) -> None:
        await self.respond(status, headers, body, end=True)

    async def send(self, data: bytes) -> None:
        try:
            await self.conn._send_data(self.stream, data)
        except ClientGone as exc:
            raise self._lost(exc) from None

    async def end(self) -> None:
        try:
            await self.conn._send_data(self.stream, b"", end=True)
        except ClientGone as exc:
            raise self._lost(exc) from None

    def abort(self) -> None:
        self.stream.aborted = True  # RST_STREAM tells the client the body is truncated

    async def upgrade(self, headers: Headers) -> tuple[trio.abc.Stream, bytes]:
        raise AssertionError("HTTP/2 requests never ask to upgrade")
