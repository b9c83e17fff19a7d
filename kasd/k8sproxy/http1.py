"""HTTP/1.1 on the proxy port (``http11``): keep-alive, streamed bodies both ways, ``101`` → raw byte pipe."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import attrs
import trio

import http11
from kasd.k8sproxy.accesslog import RequestRecord
from kasd.k8sproxy.forward import Plan, answer_boundary, clean_response_headers, relay_answer
from kasd.k8sproxy.status import ProxyError, status_body, status_headers
from tunnelhttp.head import ResponseHead, TunnelCode
from wire.session import MuxStream

if TYPE_CHECKING:
    from kasd.k8sproxy.server import ProxyServer

log = logging.getLogger("kasd.k8sproxy")

_RECEIVE_SIZE = 256 * 1024  # per-chunk Python work dominates bulk transfers: fewer, larger chunks
_LINGER_SECONDS = 2.0
#: a bodiless request whose answer takes longer gets a task watching for the client to leave
_WATCH_AFTER = 1.0
_LINGER_BYTES = 64 << 20
#: what a request we cannot parse (or that comes too slowly) is answered with
_REJECT_STATUSES = frozenset({400, 408, 431})
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_MUX_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)


class _ClientGone(Exception):
    """The client closed or broke its connection (or sent something we cannot continue after)."""


@attrs.frozen(eq=False)
class _ClientReader:
    #: the whole task (cancelled once the exchange is over)
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    #: its watch for the client leaving, after the body (cancelled before a 101's byte pipe)
    watch: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    done: trio.Event = attrs.field(factory=trio.Event)


@attrs.define(eq=False)
class _Exchange:
    """One proxied request: what the connection task and its client reader (if any) share."""

    request: http11.Request
    stream: MuxStream
    plan: Plan
    record: RequestRecord
    #: cancelled when the client goes away mid-exchange
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    client_gone: bool = False
    keep_alive: bool = True
    #: the task reading from the client (the body, then watching for it to leave); only when needed
    reader: _ClientReader | None = None


class Http1Connection:
    def __init__(
        self, stream: trio.abc.Stream, server: ProxyServer, *, initial: bytes, head_deadline: float, peer: str
    ) -> None:
        self.stream = stream
        self.server = server
        self.peer = peer
        self.head_deadline = head_deadline
        self.parser = http11.RequestParser(max_head=server.settings.max_header_bytes)
        self._nursery: trio.Nursery  # the connection's, set by run()
        #: the connection became a byte pipe (101); nothing HTTP is left to say on it
        self.switched = False
        #: the current request's body is all read (its END taken from the parser)
        self.request_done = False
        #: the current response is all written
        self.response_done = False
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
        first = True
        while True:
            request = await self._read_head(first)
            if request is None:
                return
            first = False
            self.request_done = self.response_done = False
            keep_alive = await self._handle(request)
            if self.switched:
                return
            if not (keep_alive and request.keep_alive and self.request_done and self.response_done):
                await self._linger_close()
                return
            if self.server.draining:
                return
            if request.upgrade:
                self.parser.start_next_cycle()  # a refused upgrade: HTTP goes on after it

    async def _read_head(self, first: bool) -> http11.Request | None:
        settings = self.server.settings
        # A fresh connection's head clock started at accept; a kept-alive one first idles, and the
        # head clock starts at its first byte.
        started = first
        deadline = self.head_deadline if first else trio.current_time() + settings.idle_timeout
        while True:
            try:
                event = self.parser.next_event()
            except http11.ProtocolError as exc:
                status = exc.status if exc.status in _REJECT_STATUSES else 400
                if status == 431:
                    message = f"request head larger than {settings.max_header_bytes} bytes"
                else:
                    message = f"malformed HTTP/1.1 request: {exc}"
                log.info("rejected request peer=%s status=%d reason=%r", self.peer, status, message)
                await self._reject(status, message)
                return None
            if event is http11.NEED_DATA:
                if not started and self.server.draining:
                    return None
                with trio.CancelScope(deadline=deadline) as scope:
                    if not started:
                        self.server.idle_scopes.add(scope)
                    try:
                        data = await self.stream.receive_some(_RECEIVE_SIZE)
                    except _MUX_ERRORS:
                        return None
                    finally:
                        self.server.idle_scopes.discard(scope)
                if scope.cancelled_caught:
                    if started and trio.current_time() >= deadline:
                        message = f"request head not received within {settings.header_timeout:g}s"
                        log.info("rejected request peer=%s status=408 reason=%r", self.peer, message)
                        await self._reject(408, message)
                    return None
                if not started:
                    started = True
                    deadline = trio.current_time() + settings.header_timeout
                self.parser.feed(data)
                continue
            if type(event) is http11.Request:
                return event
            return None  # CLOSED: the client left between requests

    async def _reject(self, status: int, message: str) -> None:
        """Answer a request we could not parse (the parser has stopped) and close."""
        body = status_body(status, message)
        head = http11.encode_response_head(status, [*status_headers(body), ("connection", "close")])
        self.server.count_rejected(status)
        with trio.move_on_after(_LINGER_SECONDS):
            try:
                await self.stream.send_all(head + body)
            except _MUX_ERRORS:
                return
        await self._linger_close()

    async def _linger_close(self) -> None:
        """Read (and drop) what the client still sends for a moment, so our answer is not lost to a RST."""
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

    def _response_head(self, ex: _Exchange | None, request: http11.Request, status: int,
                       headers: list[tuple[str, str]], *, close: bool = False) -> tuple[bytes, http11.BodyWriter]:
        """The head to send, and the framing of the body after it (as the client can take it)."""
        keep_alive = (request.keep_alive and not close and not self.server.draining
                      and (ex is None or ex.keep_alive))
        no_body = request.method == "HEAD" or status in (204, 304)
        if not no_body and not any(name == "content-length" for name, _ in headers):
            if request.http_version == "1.1":
                headers.append(("transfer-encoding", "chunked"))
            else:
                keep_alive = False  # HTTP/1.0 has no chunks: the body ends when we close
        if not keep_alive:
            headers.append(("connection", "close"))
            if ex is not None:
                ex.keep_alive = False
        try:
            return (http11.encode_response_head(status, headers),
                    http11.BodyWriter.for_headers(headers, no_body=no_body))
        except http11.FramingError as exc:
            raise self._framing_error(exc) from None

    def _framing_error(self, exc: http11.FramingError) -> _ClientGone:
        # e.g. the agent's body does not match its Content-Length: the only honest move is to cut.
        log.warning("response framing error peer=%s error=%s", self.peer, exc)
        return _ClientGone(str(exc))

    async def _write(self, data: bytes) -> None:
        if data:
            try:
                await self.stream.send_all(data)
            except _MUX_ERRORS as exc:
                raise _ClientGone(str(exc)) from None

    async def _receive_raw(self) -> bytes:
        try:
            return bytes(await self.stream.receive_some(_RECEIVE_SIZE))
        except _MUX_ERRORS as exc:
            raise _ClientGone(str(exc)) from None

    async def _next_body_event(self) -> object:
        """Request body data (``bytes``) or ``http11.END``."""
        parser = self.parser
        while True:
            try:
                event = parser.next_event()
            except http11.ProtocolError as exc:
                raise _ClientGone(f"bad request body framing: {exc}") from None
            if event is http11.NEED_DATA:
                parser.feed(await self._receive_raw())
                continue
            if event is http11.CLOSED:
                raise _ClientGone("connection closed")
            if event is http11.END:
                self.request_done = True
            return event

    # ------------------------------------------------------------------ one request

    async def _handle(self, request: http11.Request) -> bool:
        """Serve one request; True if the connection may carry another."""
        headers = request.headers
        target = request.target
        record = RequestRecord(
            request_id=os.urandom(16).hex(),
            method=request.method,
            path=target,
            protocol=f"HTTP/{request.http_version}",
            peer=self.peer,
        )
        upgrade = request.upgrade
        forwarder = self.server.forwarder
        try:
            plan = forwarder.plan(
                method=record.method, target=target, headers=headers, request_id=record.request_id, upgrade=upgrade
            )
            record.agent_id, record.subject = plan.grant.agent_id, plan.grant.subject
            stream = await forwarder.open(plan)
            bodiless = not upgrade and not request.has_body
            if bodiless:
                # Say so now: the OPEN and its FIN then leave in one write.
                await stream.send_eof()
        except ProxyError as exc:
            try:
                await self._send_status(None, request, exc, record)
            except _ClientGone:
                record.outcome = "client-gone"
                return False
            finally:
                self.server.finish(record)
            return True
        try:
            return await self._exchange(_Exchange(request, stream, plan, record), bodiless=bodiless)
        finally:
            self.server.finish(record)

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

    async def _send_status(self, ex: _Exchange | None, request: http11.Request, exc: ProxyError,
                           record: RequestRecord) -> None:
        self._skip_buffered_body()
        body = status_body(exc.status, exc.message)
        headers = [*status_headers(body, exc.headers), ("x-request-id", record.request_id)]
        record.status = exc.status
        record.outcome = "error"
        # An unread body closes the connection.
        head, writer = self._response_head(ex, request, exc.status, headers, close=not self.request_done)
        framed = writer.data(body)
        await self._write(head + framed + writer.end())
        self.response_done = True
        record.bytes_out += len(framed)

    async def _exchange(self, ex: _Exchange, *, bodiless: bool) -> bool:
        """Relay one exchange. A request with a body (or an upgrade) gets a task reading from the
        client at once; a bodiless one only if its answer is slow (a second) or long, to notice the client
        leaving — a quick small GET runs in this task alone."""
        metrics = self.server.metrics
        metrics.active_streams.inc()
        try:
            if not (bodiless and self._end_of_bodiless_request(ex.request)):
                self._start_client_reader(ex, body=True)
            with ex.scope:
                try:
                    await self._response_side(ex)
                except _ClientGone:
                    ex.client_gone = True
            if ex.reader is not None:
                ex.reader.scope.cancel()
                await ex.reader.done.wait()
        finally:
            metrics.active_streams.dec()
            if ex.client_gone:
                ex.record.outcome = "client-gone"
                await ex.stream.reset(TunnelCode.CLIENT_GONE, "client went away")
            else:
                await ex.stream.aclose()
        return ex.keep_alive and not ex.client_gone

    def _end_of_bodiless_request(self, request: http11.Request) -> bool:
        """Take the (empty) body the parser already has; False if the request is not over (a reader
        task then takes it from here, and reports any error)."""
        if request.expects_continue:
            return False
        self._skip_buffered_body()
        return self.request_done

    def _start_client_reader(self, ex: _Exchange, *, body: bool) -> None:
        ex.reader = _ClientReader()
        self._nursery.start_soon(self._client_reader, ex, body)

    async def _client_reader(self, ex: _Exchange, body: bool) -> None:
        """Stream the request body to the agent (``body``), then watch for the client going away."""
        reader = ex.reader
        assert reader is not None
        try:
            with reader.scope:
                if body and not await self._stream_request_body(ex):
                    return
                # The body is in; a read now returns only if the client leaves (or pipelines).
                with reader.watch:
                    data = await self._receive_raw()
                    if not data:
                        raise _ClientGone("client closed the connection")
                    self.parser.feed(data)  # early bytes: the next request, or the upgraded stream
        except _ClientGone:
            ex.client_gone = True
            ex.scope.cancel()
        finally:
            reader.done.set()

    async def _stream_request_body(self, ex: _Exchange) -> bool:
        """True once the body is in; False if the agent's stream broke (the response side says why)."""
        bytes_to_agent = self.server.metrics.bytes_to_agent
        if ex.request.expects_continue and not self.request_done:
            await self._write(_CONTINUE)
        while True:
            event = await self._next_body_event()
            if event is http11.END:
                if ex.request.upgrade:
                    return True  # an upgrade: after a 101 the stream carries the client's bytes, so no EOF
                try:
                    await ex.stream.send_eof()
                except _MUX_ERRORS:
                    return False
                return True
            assert type(event) is bytes
            try:
                await ex.stream.send_all(event)
            except _MUX_ERRORS:
                return False  # the response side reports what happened to the stream
            ex.record.bytes_in += len(event)
            bytes_to_agent.inc(len(event))

    async def _await_head(self, ex: _Exchange) -> ResponseHead:
        if ex.reader is None:
            # Most answers come at once; a slow one gets a reader to notice the client leaving.
            with trio.move_on_after(_WATCH_AFTER):
                return await self._response(ex)
            self._start_client_reader(ex, body=False)
        return await self._response(ex)

    async def _response(self, ex: _Exchange) -> ResponseHead:
        bodiless = not ex.request.upgrade and not ex.request.has_body
        ex.stream, head = await self.server.forwarder.response(ex.stream, ex.plan, bodiless=bodiless)
        return head

    async def _response_side(self, ex: _Exchange) -> None:
        record = ex.record
        agent_id = ex.plan.grant.agent_id
        try:
            head = await self._await_head(ex)
            if head.status == 101 and not ex.request.upgrade:
                raise ProxyError(502, f"agent {agent_id} switched protocols for a request that did not ask to")
            if 100 <= head.status < 200 and head.status != 101:
                raise ProxyError(502, f"agent {agent_id} sent an interim {head.status} response head")
        except ProxyError as exc:
            await self._send_status(ex, ex.request, exc, record)
            return
        stream = ex.stream  # the one that answered: not the first, if that agent did not take the request
        record.status = head.status
        if head.status == 101:
            ex.keep_alive = False
            assert ex.reader is not None  # an upgrade always has one
            ex.reader.watch.cancel()
            await ex.reader.done.wait()
            await self._switch(ex, head.headers)
            return
        headers = [*clean_response_headers(head.headers), ("x-request-id", record.request_id)]
        bytes_from_agent = self.server.metrics.bytes_from_agent
        # The head, and whatever of the body already arrived (all of a small answer), in one write.
        first, writer = self._response_head(ex, ex.request, head.status, headers)
        boundary = answer_boundary(ex.plan, head)
        out = [first]
        size = 0
        try:
            while size < _RECEIVE_SIZE:
                try:
                    data = stream.receive_nowait(_RECEIVE_SIZE)
                except (trio.WouldBlock, *_MUX_ERRORS):
                    break  # not here yet, or an error the loop below reports
                if not data:
                    out.append(writer.end())
                    await self._write(b"".join(out))
                    self.response_done = True
                    return
                out.append(writer.data(data))
                if boundary is not None:
                    boundary.feed(data)
                size += len(data)
                record.bytes_out += len(data)
                bytes_from_agent.inc(len(data))
            await self._write(b"".join(out))
            if ex.reader is None:
                self._start_client_reader(ex, body=False)  # a long answer (a watch, logs -f): watch the client
            if not await relay_answer(stream, record, bytes_from_agent, lambda data: self._write(writer.data(data)),
                                      chunk=_RECEIVE_SIZE, drain=self.server.drain, boundary=boundary):
                ex.keep_alive = False  # cut the connection: the client sees a truncated body
                return
            await self._write(writer.end())
        except http11.FramingError as exc:
            raise self._framing_error(exc) from None
        self.response_done = True

    async def _switch(self, ex: _Exchange, raw_headers: tuple[tuple[str, str], ...]) -> None:
        """``101``: from here on, the client connection and the logical stream are one byte pipe."""
        stream, record = ex.stream, ex.record
        headers = [*clean_response_headers(raw_headers, switching=True), ("x-request-id", record.request_id)]
        try:
            await self._write(http11.encode_response_head(101, headers))
        except http11.FramingError as exc:
            raise self._framing_error(exc) from None
        self.switched = True
        early = self.parser.trailing
        metrics = self.server.metrics
        to_agent = metrics.bytes_to_agent
        from_agent = metrics.bytes_from_agent
        record.outcome = "upgraded"

        async def client_to_agent(scope: trio.CancelScope) -> None:
            try:
                data = bytes(early)
                while True:
                    if data:
                        await stream.send_all(data)
                        record.bytes_in += len(data)
                        to_agent.inc(len(data))
                    data = await self._receive_raw()
                    if not data:
                        await stream.send_eof()
                        return
            except _ClientGone:
                ex.client_gone = True
                scope.cancel()
            except _MUX_ERRORS:
                scope.cancel()

        async def agent_to_client(scope: trio.CancelScope) -> None:
            while True:
                try:
                    data = await stream.receive_some(_RECEIVE_SIZE)
                except _MUX_ERRORS:
                    scope.cancel()  # the agent's side broke: nothing more will come
                    return
                if not data:
                    break
                try:
                    await self.stream.send_all(data)
                except _MUX_ERRORS:
                    ex.client_gone = True
                    scope.cancel()
                    return
                record.bytes_out += len(data)
                from_agent.inc(len(data))
            # The agent finished sending: pass the half-close on when the transport can carry it.
            if isinstance(self.stream, trio.abc.HalfCloseableStream):
                try:
                    await self.stream.send_eof()
                except _MUX_ERRORS:
                    scope.cancel()
            else:
                scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(client_to_agent, nursery.cancel_scope)
            nursery.start_soon(agent_to_client, nursery.cancel_scope)
