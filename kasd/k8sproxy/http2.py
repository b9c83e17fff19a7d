"""HTTP/2 on the proxy port (h2): one reader task per connection, one handler task per request.

Received DATA is acknowledged only as the handler takes it (flow control is the backpressure);
sending respects the client's windows. A client RST_STREAM cancels that request's handler, which
resets the logical stream so the agent stops the upstream request.
"""

from __future__ import annotations

import logging
import math
import os
from collections import deque
from typing import TYPE_CHECKING

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio

from kasd.k8sproxy.accesslog import RequestRecord
from kasd.k8sproxy.forward import Plan, answer_boundary, clean_response_headers, relay_answer
from kasd.k8sproxy.status import ProxyError, status_body, status_headers
from tunnelhttp.head import TunnelCode
from wire.session import MuxStream

if TYPE_CHECKING:
    from kasd.k8sproxy.server import ProxyServer

log = logging.getLogger("kasd.k8sproxy")

_RECEIVE_SIZE = 64 * 1024
_STREAM_WINDOW = 1 << 20
_CONNECTION_WINDOW = 16 << 20
_MAX_STREAMS = 250
_MUX_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)


class _ClientGone(Exception):
    pass


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
        #: the logical stream to the agent carrying it (another one if the first agent did not take it)
        self.tunnel: MuxStream | None = None

    def on_reset(self) -> None:
        self.reset = True
        self.scope.cancel()
        self.lot.unpark_all()


class Http2Connection:
    def __init__(
        self, stream: trio.abc.Stream, server: ProxyServer, *, initial: bytes, head_deadline: float, peer: str
    ) -> None:
        self.stream = stream
        self.server = server
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
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: self.server.settings.max_header_bytes,
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
            except (_ClientGone, h2.exceptions.ProtocolError):
                pass

    # ------------------------------------------------------------------ reader

    def _read_deadline(self) -> float:
        if self.requests:
            return math.inf
        if not self._seen_request:
            return self.head_deadline
        return trio.current_time() + self.server.settings.idle_timeout

    async def _read_loop(self, nursery: trio.Nursery) -> None:
        data = self.initial
        while True:
            if data:
                try:
                    events = self.conn.receive_data(data)
                except h2.exceptions.ProtocolError as exc:
                    log.info("HTTP/2 protocol error peer=%s error=%s", self.peer, exc)
                    self.server.count_rejected(400)
                    try:
                        await self._flush()  # the GOAWAY h2 queued
                    except _ClientGone:
                        pass
                    self._broken = True
                    return
                for event in events:
                    if self._on_event(event, nursery):
                        return
                try:
                    await self._flush()
                except _ClientGone:
                    return
            if not self.requests and self.server.draining:
                return
            with trio.CancelScope(deadline=self._read_deadline()) as scope:
                self._read_scope = scope
                if not self.requests:
                    self.server.idle_scopes.add(scope)
                try:
                    data = bytes(await self.stream.receive_some(_RECEIVE_SIZE))
                except _MUX_ERRORS:
                    self._broken = True
                    return
                finally:
                    self._read_scope = None
                    self.server.idle_scopes.discard(scope)
            if scope.cancelled_caught:
                if self.requests:
                    data = b""
                    continue  # a request finished or the server drains: re-evaluate
                if not self._seen_request and trio.current_time() >= self.head_deadline:
                    log.info("HTTP/2 client sent no request in time peer=%s", self.peer)
                    self.server.count_rejected(408)
                return
            if not data:
                self._broken = True
                return

    def _on_event(self, event: h2.events.Event, nursery: trio.Nursery) -> bool:
        """Handle one event; True when the connection is over."""
        if isinstance(event, h2.events.RequestReceived):
            headers = [(bytes(k).decode("latin-1").lower(), bytes(v).decode("latin-1")) for k, v in event.headers]
            if self.server.draining:
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
            self._read_scope.deadline = trio.current_time() + self.server.settings.idle_timeout
            if self.server.draining:
                self._read_scope.cancel()
            else:
                self.server.idle_scopes.add(self._read_scope)

    # ------------------------------------------------------------------ writing

    async def _flush(self) -> None:
        async with self._send_lock:
            data = self.conn.data_to_send()
            if data:
                try:
                    await self.stream.send_all(data)
                except _MUX_ERRORS as exc:
                    self._broken = True
                    raise _ClientGone(str(exc)) from None

    async def _send_headers(self, request: _Request, headers: list[tuple[str, str]], *, end: bool = False) -> None:
        if request.reset:
            raise _ClientGone("stream reset by client")
        try:
            self.conn.send_headers(request.stream_id, headers, end_stream=end)
        except h2.exceptions.ProtocolError as exc:
            raise _ClientGone(f"cannot send response head: {exc}") from None
        await self._flush()

    async def _send_data(self, request: _Request, data: bytes, *, end: bool = False) -> None:
        view = memoryview(data)
        while True:
            if request.reset or self._broken:
                raise _ClientGone("stream reset by client")
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
                raise _ClientGone(f"stream unusable: {exc}") from None
            await self._flush()

    async def _receive_body(self, request: _Request) -> bytes:
        while not request.body and not request.ended and not request.reset:
            await request.lot.park()
        if request.reset:
            raise _ClientGone("stream reset by client")
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
        headers = [(k, v) for k, v in request.headers if not k.startswith(":")]
        record = RequestRecord(
            request_id=os.urandom(16).hex(),
            method=pseudo.get(":method", "?"),
            path=pseudo.get(":path", ""),
            protocol="HTTP/2",
            peer=self.peer,
        )
        try:
            with request.scope:
                try:
                    await self._serve(request, record, headers)
                except _ClientGone:
                    request.reset = True
            if request.reset and record.outcome != "upstream-broken":
                record.outcome = "client-gone"
        finally:
            self._request_done(request)
            self.server.finish(record)
            if request.reset and not self._broken:
                try:
                    self.conn.reset_stream(request.stream_id, h2.errors.ErrorCodes.CANCEL)
                except h2.exceptions.ProtocolError:
                    pass
                with trio.move_on_after(1, shield=True):
                    try:
                        await self._flush()
                    except _ClientGone:
                        pass

    async def _serve(self, request: _Request, record: RequestRecord, headers: list[tuple[str, str]]) -> None:
        forwarder = self.server.forwarder
        try:
            if record.method == "CONNECT":
                raise ProxyError(400, "CONNECT (and WebSocket over HTTP/2) is not supported; use HTTP/1.1 for exec/attach/port-forward")
            plan = forwarder.plan(
                method=record.method, target=record.path, headers=headers, request_id=record.request_id, upgrade=False
            )
            record.agent_id, record.subject = plan.grant.agent_id, plan.grant.subject
            request.tunnel = await forwarder.open(plan)
        except ProxyError as exc:
            await self._send_status(request, exc, record)
            return
        stream = request.tunnel
        bodiless = request.ended and not request.body  # before the body pump takes anything
        metrics = self.server.metrics
        metrics.active_streams.inc()
        gone = False
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump_body, request, stream, record)
                try:
                    await self._respond(request, stream, plan, record, bodiless=bodiless)
                except _ClientGone:
                    gone = True
                nursery.cancel_scope.cancel()
        finally:
            metrics.active_streams.dec()
            tunnel = request.tunnel
            assert tunnel is not None
            if gone or request.reset:
                await tunnel.reset(TunnelCode.CLIENT_GONE, "client went away")
            else:
                await tunnel.aclose()
        if gone:
            raise _ClientGone("client went away")

    async def _pump_body(self, request: _Request, stream: MuxStream, record: RequestRecord) -> None:
        to_agent = self.server.metrics.bytes_to_agent
        try:
            while data := await self._receive_body(request):
                await stream.send_all(data)
                record.bytes_in += len(data)
                to_agent.inc(len(data))
            await stream.send_eof()
        except (_ClientGone, *_MUX_ERRORS):
            return  # a reset cancels the handler; a broken stream shows in the response

    async def _send_status(self, request: _Request, exc: ProxyError, record: RequestRecord) -> None:
        body = status_body(exc.status, exc.message)
        headers = [(":status", str(exc.status)), *status_headers(body, exc.headers), ("x-request-id", record.request_id)]
        record.status = exc.status
        record.outcome = "error"
        await self._send_headers(request, headers)
        await self._send_data(request, body, end=True)
        record.bytes_out += len(body)

    async def _respond(self, request: _Request, stream: MuxStream, plan: Plan, record: RequestRecord, *,
                       bodiless: bool) -> None:
        try:
            request.tunnel, head = await self.server.forwarder.response(stream, plan, bodiless=bodiless)
            stream = request.tunnel
            if 100 <= head.status < 200:
                raise ProxyError(502, f"agent {plan.grant.agent_id} answered {head.status}, which HTTP/2 cannot carry here")
        except ProxyError as exc:
            await self._send_status(request, exc, record)
            return
        record.status = head.status
        headers = [(":status", str(head.status)), *clean_response_headers(head.headers), ("x-request-id", record.request_id)]
        await self._send_headers(request, headers)
        if not await relay_answer(stream, record, self.server.metrics.bytes_from_agent,
                                  lambda data: self._send_data(request, data), chunk=_RECEIVE_SIZE,
                                  drain=self.server.drain, boundary=answer_boundary(plan, head)):
            request.reset = True  # RST_STREAM tells the client the body is truncated
            return
        await self._send_data(request, b"", end=True)
