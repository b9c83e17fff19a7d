"""HTTP/2 on the proxy port, on the one h2 driver (``h2trio.driver``): one reader per connection, one
handler task per request.

Protocol only: each request stream becomes an ``Exchange`` for the request pipeline, which decides
everything else. Received DATA is acknowledged only as the pipeline takes it (flow control is the
backpressure); sending respects the client's windows. A client RST_STREAM cancels that request's
exchange, and the pipeline stops the work behind it. The connection's clocks (head deadline, idle
timeout, drain, answers refused before any request passed) are ``frontend.ConnectionClock``'s, the
same as HTTP/1.1's: only the read waits under them, and a connection the clock closes gets GOAWAY
``NO_ERROR`` once no request runs (new streams are refused meanwhile). Streams the client resets
before their answer get no access line each: one line per connection sums them up (and ``h2trio``
ends a connection that resets too many with GOAWAY ENHANCE_YOUR_CALM).
"""

from __future__ import annotations

import logging
import re

import h2.config
import h2.errors
import h2.settings
import trio

from daemonkit.logs import BurstLimitedLog
from h2trio.budget import BudgetExceededError
from h2trio.driver import H2Driver, H2Stream
from h2trio.lean import new_connection
from kasd.k8sproxy.accesslog import RequestRecord
from kasd.k8sproxy.exchange import CONNECTION_LOST, ClientGone, ClientRequest, Headers
from kasd.k8sproxy.frontend import FrontEndContext
from kasd.k8sproxy.status import ProxyError, status_body, status_headers
from netio.fastio import peer_host

log = logging.getLogger("kasd.k8sproxy")
#: lines a stranger can repeat at will (one per connection): one per source address per 10 s
_strangers = BurstLimitedLog(log, interval=10.0)

_RECEIVE_SIZE = 64 * 1024
_STREAM_WINDOW = 1 << 20
_CONNECTION_WINDOW = 16 << 20
_MAX_STREAMS = 250
_MUX_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)
_CONNECT_REFUSAL = "CONNECT (and WebSocket over HTTP/2) is not supported; use HTTP/1.1 for exec/attach/port-forward"
#: an RFC 9110 method token
_METHOD = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class Http2Connection:
    def __init__(
        self, stream: trio.abc.Stream, port: FrontEndContext, *, initial: bytes, head_deadline: float, peer: str
    ) -> None:
        self.stream = stream
        self.port = port
        self.peer = peer
        self.initial = initial
        self.driver = H2Driver(
            stream,
            new_connection(h2.config.H2Configuration(client_side=False, header_encoding=None)),
            settings={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: _MAX_STREAMS,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _STREAM_WINDOW,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: port.limits.max_header_bytes,
            },
            connection_window=_CONNECTION_WINDOW,
            reset_limit=port.limits.http2.reset_limit,
            reset_bucket=port.reset_bucket(peer),
        )
        self.requests: dict[int, _H2Exchange] = {}
        self.clock = port.clock(head_deadline, trio.current_time())
        self._read_scope: trio.CancelScope | None = None
        #: requests the client dropped before an answer, written as no access line of their own
        self._unlogged = 0

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
        self._log_dropped()

    def _log_dropped(self) -> None:
        """One line for the streams the client dropped (and why the connection ended, if it went
        beyond a limit) instead of one access line per stream."""
        stats = self.driver.statistics()
        dropped = stats.streams_dropped + self._unlogged
        error = self.driver.protocol_error
        if not dropped and not stats.streams_refused and not isinstance(error, BudgetExceededError):
            return
        over = isinstance(error, BudgetExceededError)
        _strangers.info(
            (peer_host(self.peer), "dropped"),
            "HTTP/2 client dropped %d streams before an answer peer=%s refused=%d goaway=%s reason=%s",
            dropped, self.peer, stats.streams_refused,
            h2.errors.ErrorCodes(error.error_code).name if over and error is not None else "-",
            _quote(str(error)) if over else "-",
        )

    # ------------------------------------------------------------------ reader

    async def _read_loop(self) -> None:
        driver = self.driver
        if self.initial:
            await driver.pump(self.initial)
        clock = self.clock
        while not driver.closed:
            if clock.over(self.port.draining):
                return
            # Only the read waits under the connection's clocks: feeding h2 and flushing its
            # answers is never cut in half.
            with trio.CancelScope(deadline=clock.next_request_deadline()) as scope:
                self._read_scope = scope
                if not clock.running:
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
                if clock.running:
                    continue  # a request finished or the server drains: re-evaluate
                if clock.past_head_deadline(trio.current_time()):
                    if not clock.requests_seen:
                        self.port.count_rejected(408)
                    why = clock.expiry()
                    _strangers.info((peer_host(self.peer), why), "HTTP/2 client %s peer=%s", why, self.peer)
                return
            if not data:
                driver.fail("peer closed the connection")
                return
            await driver.pump(data)
        if driver.protocol_error is not None:
            if not isinstance(driver.protocol_error, BudgetExceededError):  # summed up at the end
                _strangers.info((peer_host(self.peer), "h2"), "HTTP/2 protocol error peer=%s error=%s", self.peer, driver.protocol_error)
            self.port.count_rejected(400)

    def _on_request(self, h2s: H2Stream, nursery: trio.Nursery) -> None:
        """A new request stream (called by the driver's reader once the read that brought it is
        dispatched; must not block). Its head is checked here: a task is started only for a
        well-formed request."""
        if not self.clock.takes_requests(self.port.draining):
            self.driver.refuse(h2s)
            return
        request = self._request_of(h2s)
        if request is None:
            self.driver.refuse(h2s, h2.errors.ErrorCodes.PROTOCOL_ERROR)  # malformed (RFC 9113, 8.1.1)
            return
        self.clock.request_started()
        ex = _H2Exchange(h2s, nursery, self)
        ex.request = request
        self.requests[h2s.stream_id] = ex
        nursery.start_soon(self._handle, ex)

    def _request_of(self, h2s: H2Stream) -> ClientRequest | None:
        """The request as the pipeline sees it; None if its head is malformed (h2 already checked
        the pseudo-header fields are the right ones, each once)."""
        method = target = b""
        headers = []
        for k, v in h2s.head or ():
            name = bytes(k)
            if name == b":method":
                method = bytes(v)
            elif name == b":path":
                target = bytes(v)
            elif not name.startswith(b":"):
                headers.append((name.decode("latin-1").lower(), bytes(v).decode("latin-1")))
        if not _METHOD.fullmatch(method):
            return None
        return ClientRequest(
            method=method.decode("ascii"),
            target=target.decode("latin-1"),
            headers=tuple(headers),
            protocol="HTTP/2",
            peer=self.peer,
            # The whole read that brought the HEADERS is dispatched: an END_STREAM in it (a GET's) is in.
            has_body=not (h2s.ended_by_peer and not h2s.buffered),
        )

    def _request_done(self, ex: _H2Exchange, record: RequestRecord | None) -> None:
        self.requests.pop(ex.h2s.stream_id, None)
        if record is not None and record.dropped:
            self._unlogged += 1
        clock = self.clock
        clock.request_ended(record, trio.current_time())
        if not clock.running and self._read_scope is not None:
            # The reader waits without a deadline while requests run: give it its clock now.
            self._read_scope.deadline = clock.next_request_deadline()
            if clock.over(self.port.draining):
                self._read_scope.cancel()
            else:
                self.port.idle_scopes.add(self._read_scope)

    # ------------------------------------------------------------------ one request

    async def _handle(self, ex: _H2Exchange) -> None:
        h2s = ex.h2s
        refusal = ProxyError(400, _CONNECT_REFUSAL) if ex.request.method == "CONNECT" else None
        records: list[RequestRecord] = []
        try:
            with ex.scope:
                h2s.cancel_when_broken(ex.scope)
                await self.port.serve(ex, refusal=refusal, log_dropped=False, done=records.append,
                                      proven=self.clock.request_proved)
        except CONNECTION_LOST:
            ex.aborted = True  # this stream alone is reset; the connection's reader sees what broke
        except Exception as exc:  # past the pipeline's own net (a bug): this stream alone ends
            self.port.unexpected.report(exc, "HTTP/2 request failed unexpectedly peer=%s stream=%d", self.peer, h2s.stream_id)
            await _answer_failure(ex)
        finally:
            self._request_done(ex, records[0] if records else None)
            if ex.client_gone or ex.aborted:
                with trio.move_on_after(1, shield=True):
                    await h2s.reset(h2.errors.ErrorCodes.CANCEL)
            else:
                h2s.close()



async def _answer_failure(ex: _H2Exchange) -> None:
    """A 500 Status for a request a bug ended, if no head went out yet; else its stream is reset."""
    if ex.head_sent or ex.client_gone:
        ex.aborted = True
        return
    body = status_body(500, "kasd failed to serve this request: an internal error")
    with trio.move_on_after(1) as scope:
        try:
            await ex.respond(500, status_headers(body), body, end=True)
        except ClientGone:
            ex.aborted = True
    if scope.cancelled_caught:
        ex.aborted = True


def _quote(text: str) -> str:
    return '"' + text.replace('"', "'") + '"'


class _H2Exchange:
    """One HTTP/2 request stream as the pipeline sees it (``kasd.k8sproxy.exchange.Exchange``)."""

    #: the connection's reader sees a RST_STREAM and cancels the exchange: no read needed
    watches_client = False

    request: ClientRequest  # set by the handler task

    def __init__(self, h2s: H2Stream, nursery: trio.Nursery, connection: Http2Connection) -> None:
        self.h2s = h2s
        self.nursery = nursery
        self.connection = connection
        #: cancelled when the client resets the stream or the connection ends
        self.scope = trio.CancelScope()
        #: we reset the stream (its answer could not be completed), not the client
        self.aborted = False
        #: a response head went out (or began to): too late for another answer
        self.head_sent = False
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
        self.head_sent = True
        try:
            await self.h2s.send_headers([(":status", str(status)), *headers], end_stream=end and not body)
            if body:
                await self.h2s.send_data(body, end_stream=end)
        except _MUX_ERRORS as exc:
            raise self._lost(exc) from None

    async def send_error(self, status: int, headers: Headers, body: bytes) -> None:
        # An unproven connection does not outlive its head deadline by leaving its window shut
        # on a 401 (or any Status) it was sent.
        with trio.move_on_at(self.connection.clock.answer_deadline()) as scope:
            await self.respond(status, headers, body, end=True)
        if scope.cancelled_caught:
            self._gone = True
            raise ClientGone("the client took no answer before its head deadline")

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
