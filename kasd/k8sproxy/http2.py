"""HTTP/2 on the proxy port, on the one h2 driver (``h2trio.driver``): one reader per connection, one
handler task per request.

Protocol only: each request stream becomes an ``Exchange`` for the request pipeline, which decides
everything else. Received DATA is acknowledged only as the pipeline takes it (flow control is the
backpressure); sending respects the client's windows. A client RST_STREAM cancels that request's
exchange, and the pipeline stops the work behind it. This module owns the connection's clocks: the
head deadline, the keep-alive idle timeout, and the drain.
"""

from __future__ import annotations

import logging
import math

import h2.config
import h2.errors
import h2.settings
import trio

from h2trio.driver import H2Driver, H2Stream
from h2trio.lean import new_connection
from kasd.k8sproxy.exchange import ClientGone, ClientRequest, Headers
from kasd.k8sproxy.frontend import FrontEndContext
from kasd.k8sproxy.status import ProxyError

log = logging.getLogger("kasd.k8sproxy")

_RECEIVE_SIZE = 64 * 1024
_STREAM_WINDOW = 1 << 20
_CONNECTION_WINDOW = 16 << 20
_MAX_STREAMS = 250
_MUX_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)
_CONNECT_REFUSAL = "CONNECT (and WebSocket over HTTP/2) is not supported; use HTTP/1.1 for exec/attach/port-forward"


class Http2Connection:
    def __init__(
        self, stream: trio.abc.Stream, port: FrontEndContext, *, initial: bytes, head_deadline: float, peer: str
    ) -> None:
        self.stream = stream
        self.port = port
        self.peer = peer
        self.initial = initial
        self.head_deadline = head_deadline
        self.driver = H2Driver(
            stream,
            new_connection(h2.config.H2Configuration(client_side=False, header_encoding=None)),
            settings={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: _MAX_STREAMS,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _STREAM_WINDOW,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: port.limits.max_header_bytes,
            },
            connection_window=_CONNECTION_WINDOW,
        )
        self.requests: dict[int, _H2Exchange] = {}
        self._read_scope: trio.CancelScope | None = None
        self._seen_request = False

    async def run(self) -> None:
        driver = self.driver
        async with trio.open_nursery() as nursery:
            driver.on_request = lambda h2s: self._on_request(h2s, nursery)
            try:
                await self._read_loop()
            finally:
                driver.on_request = None
                # The connection is over: requests still running lost their client.
                for ex in list(self.requests.values()):
                    ex.lose_client()
        await driver.aclose()  # GOAWAY if it still stands (bounded, shielded)

    # ------------------------------------------------------------------ reader

    def _read_deadline(self) -> float:
        if self.requests:
            return math.inf
        if not self._seen_request:
            return self.head_deadline
        return trio.current_time() + self.port.limits.idle_timeout

    async def _read_loop(self) -> None:
        driver = self.driver
        if self.initial:
            await driver.pump(self.initial)
        while not driver.closed:
            if not self.requests and self.port.draining:
                return
            # Only the read waits under the connection's clocks: feeding h2 and flushing its
            # answers is never cut in half.
            with trio.CancelScope(deadline=self._read_deadline()) as scope:
                self._read_scope = scope
                if not self.requests:
                    self.port.idle_scopes.add(scope)
                try:
                    data = await self.stream.receive_some(_RECEIVE_SIZE)
                except _MUX_ERRORS as exc:
                    driver.fail(f"connection lost: {exc!r}")
                    return
                finally:
                    self._read_scope = None
                    self.port.idle_scopes.discard(scope)
            if scope.cancelled_caught:
                if self.requests:
                    continue  # a request finished or the server drains: re-evaluate
                if not self._seen_request and trio.current_time() >= self.head_deadline:
                    log.info("HTTP/2 client sent no request in time peer=%s", self.peer)
                    self.port.count_rejected(408)
                return
            if not data:
                driver.fail("peer closed the connection")
                return
            await driver.pump(data)
        if driver.protocol_error is not None:
            log.info("HTTP/2 protocol error peer=%s error=%s", self.peer, driver.protocol_error)
            self.port.count_rejected(400)

    def _on_request(self, h2s: H2Stream, nursery: trio.Nursery) -> None:
        """A new request stream (called by the driver's reader; must not block)."""
        if self.port.draining:
            self.driver.conn.reset_stream(h2s.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            h2s.close()
            return
        self._seen_request = True
        ex = _H2Exchange(h2s, nursery)
        self.requests[h2s.stream_id] = ex
        nursery.start_soon(self._handle, ex)

    def _request_done(self, ex: _H2Exchange) -> None:
        self.requests.pop(ex.h2s.stream_id, None)
        if not self.requests and self._read_scope is not None:
            # The reader waits without a deadline while requests run: give it the idle one now.
            self._read_scope.deadline = trio.current_time() + self.port.limits.idle_timeout
            if self.port.draining:
                self._read_scope.cancel()
            else:
                self.port.idle_scopes.add(self._read_scope)

    # ------------------------------------------------------------------ one request

    async def _handle(self, ex: _H2Exchange) -> None:
        h2s = ex.h2s
        head = [(bytes(k).decode("latin-1").lower(), bytes(v).decode("latin-1")) for k, v in h2s.head or ()]
        pseudo = {k: v for k, v in head if k.startswith(":")}
        # Built in this task, not as the HEADERS are read: an END_STREAM in the same read (a GET's)
        # is dispatched after the request, and says whether a body follows.
        ex.request = ClientRequest(
            method=pseudo.get(":method", "?"),
            target=pseudo.get(":path", ""),
            headers=tuple((k, v) for k, v in head if not k.startswith(":")),
            protocol="HTTP/2",
            peer=self.peer,
            has_body=not (h2s.ended_by_peer and not h2s.buffered),
        )
        refusal = ProxyError(400, _CONNECT_REFUSAL) if ex.request.method == "CONNECT" else None
        try:
            with ex.scope:
                h2s.cancel_when_broken(ex.scope)
                await self.port.serve(ex, refusal=refusal)
        finally:
            self._request_done(ex)
            if ex.client_gone or ex.aborted:
                with trio.move_on_after(1, shield=True):
                    await h2s.reset(h2.errors.ErrorCodes.CANCEL)
            else:
                h2s.close()


class _H2Exchange:
    """One HTTP/2 request stream as the pipeline sees it (``kasd.k8sproxy.exchange.Exchange``)."""

    #: the connection's reader sees a RST_STREAM and cancels the exchange: no read needed
    watches_client = False

    request: ClientRequest  # set by the handler task

    def __init__(self, h2s: H2Stream, nursery: trio.Nursery) -> None:
        self.h2s = h2s
        self.nursery = nursery
        #: cancelled when the client resets the stream or the connection ends
        self.scope = trio.CancelScope()
        #: we reset the stream (its answer could not be completed), not the client
        self.aborted = False
        self._gone = False

    @property
    def client_gone(self) -> bool:
        return self._gone or self.h2s.broken

    def lose_client(self) -> None:
        """The connection is over while this exchange runs."""
        self._gone = True
        self.scope.cancel()

    def _lost(self, exc: BaseException) -> ClientGone:
        self._gone = True
        return ClientGone(str(exc))

    def take_empty_body(self) -> bool:
        return self.h2s.ended_by_peer and not self.h2s.buffered

    async def receive_body(self) -> bytes:
        try:
            return await self.h2s.receive_data(_RECEIVE_SIZE)
        except _MUX_ERRORS as exc:
            raise self._lost(exc) from None

    async def watch_client(self) -> None:
        return  # the connection's reader notices a reset and cancels the exchange

    async def respond(self, status: int, headers: Headers, body: bytes, *, end: bool) -> None:
        try:
            await self.h2s.send_headers([(":status", str(status)), *headers], end_stream=end and not body)
            if body:
                await self.h2s.send_data(body, end_stream=end)
        except _MUX_ERRORS as exc:
            raise self._lost(exc) from None

    async def send_error(self, status: int, headers: Headers, body: bytes) -> None:
        await self.respond(status, headers, body, end=True)

    async def send(self, data: bytes) -> None:
        try:
            await self.h2s.send_data(data)
        except _MUX_ERRORS as exc:
            raise self._lost(exc) from None

    async def end(self) -> None:
        try:
            await self.h2s.end_stream()
        except _MUX_ERRORS as exc:
            raise self._lost(exc) from None

    def abort(self) -> None:
        self.aborted = True  # RST_STREAM tells the client the body is truncated

    async def upgrade(self, headers: Headers) -> tuple[trio.abc.Stream, bytes]:
        raise AssertionError("HTTP/2 requests never ask to upgrade")
