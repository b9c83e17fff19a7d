"""HTTP/1.1 on the proxy port (h11): keep-alive, streamed bodies both ways, ``101`` → raw byte pipe."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import attrs
import h11
import trio

from kasd.k8sproxy.accesslog import RequestRecord
from kasd.k8sproxy.forward import Plan, clean_response_headers
from kasd.k8sproxy.status import ProxyError, status_body, status_headers
from wire.httptunnel import ResponseHead, TunnelCode
from wire.session import MuxStream

if TYPE_CHECKING:
    from kasd.k8sproxy.server import ProxyServer

log = logging.getLogger("kasd.k8sproxy")

_RECEIVE_SIZE = 256 * 1024  # per-chunk Python work dominates bulk transfers: fewer, larger chunks
_LINGER_SECONDS = 2.0
#: a bodiless request whose answer takes longer gets a task watching for the client to leave
_WATCH_AFTER = 1.0
_LINGER_BYTES = 64 << 20
_PHRASES = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}
_MUX_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)
_MIGHT_SWITCH = h11.MIGHT_SWITCH_PROTOCOL  # type: ignore[attr-defined]  # exported, just not in __all__


def _has_no_body(headers: list[tuple[str, str]]) -> bool:
    """A request without Transfer-Encoding or with Content-Length 0 (or none): no body follows."""
    for name, value in headers:
        if name == "transfer-encoding" or (name == "content-length" and value.strip() != "0"):
            return False
    return True


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
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=server.settings.max_header_bytes)
        self._nursery: trio.Nursery  # the connection's, set by run()
        #: the connection became a byte pipe (101); nothing HTTP is left to say on it
        self.switched = False
        if initial:
            self.conn.receive_data(initial)

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
            keep_alive = await self._handle(request)
            if self.switched:
                return
            if not keep_alive or self.conn.our_state is not h11.DONE or self.conn.their_state is not h11.DONE:
                await self._linger_close()
                return
            if self.server.draining:
                return
            try:
                self.conn.start_next_cycle()
            except h11.LocalProtocolError:
                return

    async def _read_head(self, first: bool) -> h11.Request | None:
        settings = self.server.settings
        # A fresh connection's head clock started at accept; a kept-alive one first idles, and the
        # head clock starts at its first byte.
        started = first
        deadline = self.head_deadline if first else trio.current_time() + settings.idle_timeout
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint if exc.error_status_hint in _PHRASES else 400
                if status == 431:
                    message = f"request head larger than {settings.max_header_bytes} bytes"
                else:
                    message = f"malformed HTTP/1.1 request: {exc}"
                log.info("rejected request peer=%s status=%d reason=%r", self.peer, status, message)
                await self._reject(status, message)
                return None
            if event is h11.NEED_DATA:
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
                self.conn.receive_data(bytes(data))
                continue
            if isinstance(event, h11.Request):
                # h11 bounds only heads still incomplete; one that arrived whole is measured here.
                size = len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)
                if size > settings.max_header_bytes:
                    message = f"request head larger than {settings.max_header_bytes} bytes"
                    log.info("rejected request peer=%s status=431 reason=%r", self.peer, message)
                    await self._reject(431, message)
                    return None
                return event
            return None  # ConnectionClosed

    async def _reject(self, status: int, message: str) -> None:
        """Answer a request we could not parse (h11 is in an error state) and close."""
        body = status_body(status, message)
        head = b"HTTP/1.1 %d %s\r\n" % (status, _PHRASES[status])
        for name, value in [*status_headers(body), ("connection", "close")]:
            head += f"{name}: {value}\r\n".encode()
        self.server.count_rejected(status)
        with trio.move_on_after(_LINGER_SECONDS):
            try:
                await self.stream.send_all(head + b"\r\n" + body)
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

    async def _send(self, event: h11.Event) -> None:
        await self._write(self._encode(event))

    def _encode(self, event: h11.Event) -> bytes:
        try:
            return self.conn.send(event) or b""
        except h11.LocalProtocolError as exc:
            # e.g. the agent's body does not match its Content-Length: the only honest move is to cut.
            log.warning("response framing error peer=%s error=%s", self.peer, exc)
            raise _ClientGone(str(exc)) from None

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

    async def _next_body_event(self) -> h11.Event:
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise _ClientGone(f"bad request body framing: {exc}") from None
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self._receive_raw())
                continue
            if isinstance(event, h11.ConnectionClosed):
                raise _ClientGone("connection closed")
            return event  # type: ignore[return-value]

    # ------------------------------------------------------------------ one request

    async def _handle(self, request: h11.Request) -> bool:
        """Serve one request; True if the connection may carry another."""
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in request.headers]
        target = request.target.decode("latin-1")
        record = RequestRecord(
            request_id=os.urandom(16).hex(),
            method=request.method.decode("ascii", "replace"),
            path=target,
            protocol=f"HTTP/{request.http_version.decode()}",
            peer=self.peer,
        )
        upgrade = self.conn.their_state is _MIGHT_SWITCH or any(k == "upgrade" for k, _ in headers)
        forwarder = self.server.forwarder
        try:
            plan = forwarder.plan(
                method=record.method, target=target, headers=headers, request_id=record.request_id, upgrade=upgrade
            )
            record.agent_id, record.subject = plan.grant.agent_id, plan.grant.subject
            stream = await forwarder.open(plan)
            bodiless = not upgrade and _has_no_body(headers)
            if bodiless:
                # Say so now: the OPEN and its FIN then leave in one write.
                await stream.send_eof()
        except ProxyError as exc:
            try:
                await self._send_status(exc, record)
            except _ClientGone:
                record.outcome = "client-gone"
                return False
            finally:
                self.server.finish(record)
            return True
        try:
            return await self._exchange(_Exchange(stream, plan, record), bodiless=bodiless)
        finally:
            self.server.finish(record)

    def _skip_buffered_body(self) -> None:
        """Consume a request body that already arrived whole (a GET's empty one, say), so an error
        answer can keep the connection alive; a body still on the wire closes it instead."""
        while self.conn.their_state is h11.SEND_BODY:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError:
                return
            if event is h11.NEED_DATA or event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                return

    async def _send_status(self, exc: ProxyError, record: RequestRecord) -> None:
        self._skip_buffered_body()
        body = status_body(exc.status, exc.message)
        headers = [*status_headers(body, exc.headers), ("x-request-id", record.request_id)]
        if self.conn.their_state not in (h11.DONE, _MIGHT_SWITCH) or self.server.draining:
            headers.append(("connection", "close"))  # the body is unread: this connection is done
        record.status = exc.status
        record.outcome = "error"
        await self._send(h11.Response(status_code=exc.status, headers=headers))
        await self._send(h11.Data(data=body))
        await self._send(h11.EndOfMessage())
        record.bytes_out += len(body)

    async def _exchange(self, ex: _Exchange, *, bodiless: bool) -> bool:
        """Relay one exchange. A request with a body (or an upgrade) gets a task reading from the
        client at once; a bodiless one only if its answer is slow (a second) or long, to notice the client
        leaving — a quick small GET runs in this task alone."""
        metrics = self.server.metrics
        metrics.active_streams.inc()
        try:
            if not (bodiless and self._end_of_bodiless_request()):
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

    def _end_of_bodiless_request(self) -> bool:
        """Take the (empty) body h11 already has; False if the request is not over (a reader task
        then takes it from here, and reports any error)."""
        if self.conn.they_are_waiting_for_100_continue:
            return False
        self._skip_buffered_body()
        return self.conn.their_state is h11.DONE

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
                    self.conn.receive_data(data)  # early bytes: the next request, or the upgraded stream
        except _ClientGone:
            ex.client_gone = True
            ex.scope.cancel()
        finally:
            reader.done.set()

    async def _stream_request_body(self, ex: _Exchange) -> bool:
        """True once the body is in; False if the agent's stream broke (the response side says why)."""
        bytes_to_agent = self.server.metrics.bytes_to_agent
        if self.conn.they_are_waiting_for_100_continue:
            await self._send(h11.InformationalResponse(status_code=100, headers=[]))
        while True:
            event = await self._next_body_event()
            if isinstance(event, h11.Data):
                try:
                    await ex.stream.send_all(event.data)
                except _MUX_ERRORS:
                    return False  # the response side reports what happened to the stream
                ex.record.bytes_in += len(event.data)
                bytes_to_agent.inc(len(event.data))
            elif isinstance(event, h11.EndOfMessage):
                if self.conn.their_state is _MIGHT_SWITCH:
                    return True  # an upgrade: after a 101 the stream carries the client's bytes, so no EOF
                try:
                    await ex.stream.send_eof()
                except _MUX_ERRORS:
                    return False
                return True

    async def _await_head(self, ex: _Exchange) -> ResponseHead:
        forwarder = self.server.forwarder
        if ex.reader is None:
            # Most answers come at once; a slow one gets a reader to notice the client leaving.
            with trio.move_on_after(_WATCH_AFTER):
                return await forwarder.response(ex.stream, ex.plan)
            self._start_client_reader(ex, body=False)
        return await forwarder.response(ex.stream, ex.plan)

    async def _response_side(self, ex: _Exchange) -> None:
        stream, record = ex.stream, ex.record
        agent_id = ex.plan.grant.agent_id
        try:
            head = await self._await_head(ex)
            if head.status == 101 and self.conn.their_state is not _MIGHT_SWITCH:
                raise ProxyError(502, f"agent {agent_id} switched protocols for a request that did not ask to")
            if 100 <= head.status < 200 and head.status != 101:
                raise ProxyError(502, f"agent {agent_id} sent an interim {head.status} response head")
        except ProxyError as exc:
            await self._send_status(exc, record)
            ex.keep_alive = not self.server.draining
            return
        record.status = head.status
        if head.status == 101:
            ex.keep_alive = False
            assert ex.reader is not None  # an upgrade always has one
            ex.reader.watch.cancel()
            await ex.reader.done.wait()
            await self._switch(ex, head.headers)
            return
        headers = [*clean_response_headers(head.headers), ("x-request-id", record.request_id)]
        if self.server.draining:
            headers.append(("connection", "close"))
        bytes_from_agent = self.server.metrics.bytes_from_agent
        # The head, and whatever of the body already arrived (all of a small answer), in one write.
        out = [self._encode(h11.Response(status_code=head.status, headers=headers))]
        size = 0
        while size < _RECEIVE_SIZE:
            try:
                data = stream.receive_nowait(_RECEIVE_SIZE)
            except (trio.WouldBlock, *_MUX_ERRORS):
                break  # not here yet, or an error the loop below reports
            if not data:
                out.append(self._encode(h11.EndOfMessage()))
                await self._write(b"".join(out))
                return
            out.append(self._encode(h11.Data(data=data)))
            size += len(data)
            record.bytes_out += len(data)
            bytes_from_agent.inc(len(data))
        await self._write(b"".join(out))
        if ex.reader is None:
            self._start_client_reader(ex, body=False)  # a long answer (a watch, logs -f): watch the client
        while True:
            try:
                data = await stream.receive_some(_RECEIVE_SIZE)
            except _MUX_ERRORS as exc:
                # Too late for a Status: cut the connection so the client sees a truncated body.
                log.warning("agent stream broke mid-response request_id=%s error=%s", record.request_id, exc)
                record.outcome = "upstream-broken"
                ex.keep_alive = False
                return
            if not data:
                break
            await self._send(h11.Data(data=data))
            record.bytes_out += len(data)
            bytes_from_agent.inc(len(data))
        await self._send(h11.EndOfMessage())

    async def _switch(self, ex: _Exchange, raw_headers: tuple[tuple[str, str], ...]) -> None:
        """``101``: from here on, the client connection and the logical stream are one byte pipe."""
        stream, record = ex.stream, ex.record
        headers = [*clean_response_headers(raw_headers, switching=True), ("x-request-id", record.request_id)]
        await self._send(h11.InformationalResponse(status_code=101, headers=headers))
        self.switched = True
        early, _closed = self.conn.trailing_data
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
