"""HTTP/1.1 on the proxy port (``http11``, llhttp): keep-alive, streamed bodies both ways, ``101`` →
raw byte pipe. Protocol only: each request becomes an ``Exchange`` for the request pipeline, which
decides everything else.

The connection's clocks are ``frontend.ConnectionClock``'s, the same as HTTP/2's: the head deadline
(hard until one request passed the pipeline), the idle wait between requests, the drain, and the
close after a few answers refused on a connection none of whose requests passed (that answer says
``Connection: close``). What is HTTP/1.1's own: a head begun on a kept-alive connection has
``header_timeout`` from its first byte, and a head not whole in time is answered ``408``."""

from __future__ import annotations

import contextlib
import logging

import trio

import http11
from daemonkit.logs import BurstLimitedLog
from kasd.k8sproxy.accesslog import RequestRecord
from kasd.k8sproxy.exchange import CONNECTION_LOST, ClientGone, ClientRequest, Headers
from kasd.k8sproxy.frontend import FrontEndContext
from kasd.k8sproxy.status import status_body, status_headers
from netio.fastio import peer_host

log = logging.getLogger("kasd.k8sproxy")
#: a rejected head is a line a stranger can repeat once per connection: once per 10 s per source and status
_strangers = BurstLimitedLog(log, interval=10.0)

_RECEIVE_SIZE = 256 * 1024  # per-chunk Python work dominates bulk transfers: fewer, larger chunks
_LINGER_SECONDS = 2.0
_LINGER_BYTES = 64 << 20
#: what a request we cannot parse (or that comes too slowly) is answered with
_REJECT_STATUSES = frozenset({400, 408, 431})
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_MUX_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)


def _host_problem(request: http11.Request) -> str | None:
    """RFC 9112, 3.2: a server MUST answer 400 to an HTTP/1.1 request without a Host header, and to
    any request with more than one (a front proxy and kasd could each take another)."""
    hosts = 0
    for name, _ in request.headers:  # a loop, not sum(generator): no Python call per header
        if name == "host":
            hosts += 1
    if hosts > 1:
        return "malformed HTTP/1.1 request: more than one Host header"
    if hosts == 0 and request.http_version == "1.1":
        return "malformed HTTP/1.1 request: no Host header"
    return None


class Http1Connection:
    def __init__(
        self, stream: trio.abc.Stream, port: FrontEndContext, *, initial: bytes, head_deadline: float, peer: str
    ) -> None:
        self.stream = stream
        self.port = port
        self.peer = peer
        self.clock = port.clock(head_deadline, trio.current_time())
        self.parser = http11.RequestParser(max_head=port.limits.max_header_bytes)
        self._nursery: trio.Nursery  # the connection's, set by run()
        #: the connection became a byte pipe (101); nothing HTTP is left to say on it
        self.switched = False
        #: the current request's body is all read (its END taken from the parser)
        self.request_done = False
        #: the current response is all written
        self.response_done = False
        #: the client left (or sent what we cannot go on after): the connection is over
        self.client_gone = False
        if initial:
            self.parser.feed(initial)

    # ------------------------------------------------------------------ connection loop

    async def run(self) -> None:
        # One nursery for the connection's life: a request's body/watch task starts in it only when
        # the request needs one, so a quick bodiless exchange spawns nothing.
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._serve_requests()

    async def _serve_requests(self) -> None:
        while True:
            request = await self._read_head()
            if request is None:
                return
            self.request_done = self.response_done = False
            keep_alive = await self._handle(request)
            if self.switched:
                return
            if not (keep_alive and request.keep_alive and self.request_done and self.response_done):
                if not self.request_done:
                    await self._linger_close()  # a body still coming: closing now could reset our answer away
                return  # the request was read whole: close as soon as the answer is flushed
            if not self.clock.takes_requests(self.port.draining):
                return
            if request.upgrade:
                self.parser.start_next_cycle()  # a refused upgrade: HTTP goes on after it

    async def _read_head(self) -> http11.Request | None:
        settings = self.port.limits
        clock = self.clock
        # A fresh connection's head clock started at accept; a kept-alive one first waits for the
        # next request, and a head's own clock starts at its first byte.
        started = not clock.requests_seen
        deadline = clock.head_deadline if started else clock.next_request_deadline()
        while True:
            try:
                event = self.parser.next_event()
            except http11.ProtocolError as exc:
                status = exc.status if exc.status in _REJECT_STATUSES else 400
                if status == 431:
                    message = f"request head larger than {settings.max_header_bytes} bytes"
                else:
                    message = f"malformed HTTP/1.1 request: {exc}"
                _strangers.info(
                    (peer_host(self.peer), status), "rejected request peer=%s status=%d reason=%r", self.peer, status, message
                )
                await self._reject(status, message)
                return None
            if event is http11.NEED_DATA:
                if not started and self.port.draining:
                    return None
                with trio.CancelScope(deadline=deadline) as scope:
                    if not started:
                        self.port.idle_scopes.add(scope)
                    try:
                        data = await self.stream.receive_some(_RECEIVE_SIZE)
                    except _MUX_ERRORS:
                        return None
                    finally:
                        self.port.idle_scopes.discard(scope)
                if scope.cancelled_caught:
                    if started and trio.current_time() >= deadline:
                        message = f"request head not received within {settings.header_timeout:g}s"
                        _strangers.info(
                            (peer_host(self.peer), 408), "rejected request peer=%s status=408 reason=%r", self.peer, message
                        )
                        await self._reject(408, message)
                    return None
                if not started:
                    started = True
                    deadline = clock.head_due(trio.current_time())
                self.parser.feed(data)
                continue
            if type(event) is http11.Request:
                problem = _host_problem(event)
                if problem is not None:
                    _strangers.info((peer_host(self.peer), 400), "rejected request peer=%s status=400 reason=%r",
                                    self.peer, problem)
                    await self._reject(400, problem)
                    return None
                return event
            return None  # CLOSED: the client left between requests

    async def _reject(self, status: int, message: str) -> None:
        """Answer a request we could not parse (the parser has stopped) and close."""
        body = status_body(status, message)
        head = http11.encode_response_head(status, [*status_headers(body), ("connection", "close")])
        self.port.count_rejected(status)
        with trio.move_on_after(_LINGER_SECONDS):
            try:
                await self.stream.send_all(head + body)
            except _MUX_ERRORS:
                return
        await self._linger_close()

    async def _linger_close(self) -> None:
        """Read (and drop) what the client still sends for a moment (at most ``_LINGER_SECONDS``,
        ``_LINGER_BYTES``), so our answer is not lost to a RST: closing a socket with unread bytes
        resets the connection, and the client may discard our answer before reading it. Only for a
        request we did not read whole (an unread body, a head we could not parse); a request read
        whole closes as soon as the answer is flushed (over TLS there is no half-close to tell the
        client we are done, so it would wait for the whole linger)."""
        if isinstance(self.stream, trio.abc.HalfCloseableStream):
            try:
                await self.stream.send_eof()
            except _MUX_ERRORS:
                return
        with trio.move_on_after(_LINGER_SECONDS):
            total = 0
            while total < _LINGER_BYTES:
                try:
                    data = await self.stream.receive_some(_RECEIVE_SIZE)
                except _MUX_ERRORS:
                    return
                if not data:
                    return
                total += len(data)

    # ------------------------------------------------------------------ client I/O

    def _response_head(self, ex: _H1Exchange, request: http11.Request, status: int,
                       headers: list[tuple[str, str]], *, close: bool = False) -> tuple[bytes, http11.BodyWriter]:
        """The head to send, and the framing of the body after it (as the client can take it)."""
        keep_alive = (request.keep_alive and not close and self.clock.takes_requests(self.port.draining)
                      and ex.keep_alive)
        no_body = request.method == "HEAD" or status in (204, 304)
        if not no_body and "content-length" not in dict(headers):
            if request.http_version == "1.1":
                headers.append(("transfer-encoding", "chunked"))
            else:
                keep_alive = False  # HTTP/1.0 has no chunks: the body ends when we close
        if not keep_alive:
            headers.append(("connection", "close"))
            ex.keep_alive = False
        try:
            return (http11.encode_response_head(status, headers),
                    http11.BodyWriter.for_headers(headers, no_body=no_body))
        except http11.FramingError as exc:
            raise self._framing_error(exc) from None

    def _gone(self, reason: str) -> ClientGone:
        """Every way this connection's client is lost to the exchange goes through here."""
        self.client_gone = True
        return ClientGone(reason)

    def _framing_error(self, exc: http11.FramingError) -> ClientGone:
        # e.g. the response body does not match its Content-Length: the only honest move is to cut.
        log.warning("response framing error peer=%s error=%s", self.peer, exc)
        return self._gone(str(exc))

    async def _write(self, data: bytes) -> None:
        if data:
            try:
                await self.stream.send_all(data)
            except _MUX_ERRORS as exc:
                raise self._gone(str(exc)) from None

    async def _receive_raw(self) -> bytes:
        try:
            return bytes(await self.stream.receive_some(_RECEIVE_SIZE))
        except _MUX_ERRORS as exc:
            raise self._gone(str(exc)) from None

    async def _next_body_event(self) -> object:
        """Request body data (``bytes``) or ``http11.END``."""
        parser = self.parser
        while True:
            try:
                event = parser.next_event()
            except http11.ProtocolError as exc:
                raise self._gone(f"bad request body framing: {exc}") from None
            if event is http11.NEED_DATA:
                parser.feed(await self._receive_raw())
                continue
            if event is http11.CLOSED:
                raise self._gone("connection closed")
            if event is http11.END:
                self.request_done = True
            return event

    # ------------------------------------------------------------------ one request

    async def _handle(self, request: http11.Request) -> bool:
        """Serve one request; True if the connection may carry another."""
        ex = _H1Exchange(self, request)
        records: list[RequestRecord] = []
        self.clock.request_started()
        try:
            await self.port.serve(ex, done=records.append, proven=self.clock.request_proved)
        except CONNECTION_LOST:
            raise  # the connection broke: nothing left to answer on
        except Exception as exc:  # past the pipeline's own net (a bug): answer it if we still can, and close
            self.port.unexpected.report(exc, "HTTP/1.1 request failed unexpectedly peer=%s", self.peer)
            if not ex.head_sent and not self.client_gone:
                body = status_body(500, "kasd failed to serve this request: an internal error")
                head = http11.encode_response_head(500, [*status_headers(body), ("connection", "close")])
                with trio.move_on_after(_LINGER_SECONDS), contextlib.suppress(ClientGone):
                    await self._write(head + body)
            return False
        finally:
            self.clock.request_ended(records[0] if records else None, trio.current_time())
        return ex.keep_alive and not self.client_gone

    def _skip_buffered_body(self) -> None:
        """Consume a request body that already arrived whole (a GET's empty one, say), so an error
        answer can keep the connection alive; a body still on the wire closes it instead."""
        parser = self.parser
        while not self.request_done:
            try:
                event = parser.next_event()
            except http11.ProtocolError:
                return
            if event is http11.END:
                self.request_done = True
            elif type(event) is not bytes:
                return  # NEED_DATA or CLOSED


class _H1Exchange:
    """One HTTP/1.1 request as the pipeline sees it (``kasd.k8sproxy.exchange.Exchange``). Its I/O
    is the connection's, which raises ``ClientGone`` and remembers that the client left."""

    watches_client = True

    def __init__(self, conn: Http1Connection, request: http11.Request) -> None:
        self.conn = conn
        self.http = request
        self.request = ClientRequest(
            method=request.method,
            target=request.target,
            headers=tuple(request.headers),
            protocol=f"HTTP/{request.http_version}",
            peer=conn.peer,
            upgrade=request.upgrade,
            has_body=request.has_body,
        )
        self.nursery = conn._nursery
        self.keep_alive = True
        #: a response head went out (or began to): too late for another answer
        self.head_sent = False
        self._continued = False
        self._writer: http11.BodyWriter | None = None

    @property
    def client_gone(self) -> bool:
        return self.conn.client_gone

    def take_empty_body(self) -> bool:
        """Take the (empty) body the parser already has; False if the request is not over (a reader
        task then takes it from here, and reports any error)."""
        if self.http.expects_continue:
            return False
        self.conn._skip_buffered_body()
        return self.conn.request_done

    async def receive_body(self) -> bytes:
        conn = self.conn
        if not self._continued:
            self._continued = True
            if self.http.expects_continue and not conn.request_done:
                await conn._write(_CONTINUE)
        event = await conn._next_body_event()
        if event is http11.END:
            return b""
        assert type(event) is bytes
        return event

    async def watch_client(self) -> None:
        # The body is in; a read now returns only if the client leaves (or pipelines).
        data = await self.conn._receive_raw()
        if not data:
            raise self.conn._gone("client closed the connection")
        self.conn.parser.feed(data)  # early bytes: the next request, or the upgraded stream

    async def respond(self, status: int, headers: Headers, body: bytes, *, end: bool) -> None:
        conn = self.conn
        head, writer = conn._response_head(self, self.http, status, list(headers))
        self._writer = writer
        self.head_sent = True
        try:
            out = head + writer.data(body) + writer.end() if end else head + writer.data(body)
        except http11.FramingError as exc:
            raise conn._framing_error(exc) from None
        await conn._write(out)
        if end:
            conn.response_done = True

    async def send_error(self, status: int, headers: Headers, body: bytes) -> None:
        conn = self.conn
        conn._skip_buffered_body()
        # An unread body closes the connection, and so does the last answer a connection none of
        # whose requests passed may have (the clock ends it after this one if it was refused too).
        close = not conn.request_done or conn.clock.answer_may_be_last
        head, writer = conn._response_head(self, self.http, status, list(headers), close=close)
        self.head_sent = True
        # An unproven connection does not outlive its head deadline by not reading its answer.
        with trio.move_on_at(conn.clock.answer_deadline()) as scope:
            await conn._write(head + writer.data(body) + writer.end())
        if scope.cancelled_caught:
            raise conn._gone("the client took no answer before its head deadline")
        conn.response_done = True

    async def send(self, data: bytes) -> None:
        assert self._writer is not None
        try:
            framed = self._writer.data(data)
        except http11.FramingError as exc:
            raise self.conn._framing_error(exc) from None
        await self.conn._write(framed)

    async def end(self) -> None:
        assert self._writer is not None
        try:
            framed = self._writer.end()
        except http11.FramingError as exc:
            raise self.conn._framing_error(exc) from None
        await self.conn._write(framed)
        self.conn.response_done = True

    def abort(self) -> None:
        self.keep_alive = False  # cut the connection: the client sees a truncated body

    async def upgrade(self, headers: Headers) -> tuple[trio.abc.Stream, bytes]:
        conn = self.conn
        self.keep_alive = False
        try:
            head = http11.encode_response_head(101, list(headers))
        except http11.FramingError as exc:
            raise conn._framing_error(exc) from None
        self.head_sent = True
        await conn._write(head)
        conn.switched = True
        return conn.stream, bytes(conn.parser.trailing)

