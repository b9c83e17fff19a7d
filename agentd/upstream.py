"""An HTTP/1.1 client (``http11`` over trio TCP/TLS) to one upstream — the Kubernetes API server
(``agentd.kubeapi.KubeTarget``) or an in-cluster service of agentd's allow-list
(``agentd.services.ServiceTarget``) — with a keep-alive pool.

    async with pool.request(head, body) as response:
        async for chunk in response: ...          # or response.raw after a 101

Bodies stream both ways and are never buffered whole. Connecting has a timeout, and so has the
response head (``response_header_timeout``: an API server that takes the request and never answers
must not hold it, and its pooled connection, forever); the response body has none, since watches
and ``logs -f`` last as long as the client wants (and their head comes at once). A connection goes
back to the pool only after a complete exchange (both messages DONE); after an upgrade, an error, a
timeout or a cancelled exchange it is closed. The pool adds the agent's own credentials and the
``Impersonate-*`` headers: whatever ``Authorization`` or ``Impersonate-*`` the head carried is
dropped first.
"""

from __future__ import annotations

import logging
import math
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Protocol

import attrs
import trio

import http11
from agentd.neterrors import failure_reason
from netio.fastio import fast_stream, tls_stream
from tunnelhttp.head import Headers, RequestHead, strip_hop_by_hop
from tunnelhttp.requestid import REQUEST_ID_HEADER

log = logging.getLogger("agentd.upstream")

_CHUNK = 256 * 1024  # per-chunk Python work dominates bulk transfers: fewer, larger chunks
_MAX_HEAD = 256 * 1024
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: above the API server's own bound on a request (``--request-timeout``, 60 s by default), after
#: which a working API server answers 504 itself: agentd's bound only fires on one that is hung
DEFAULT_RESPONSE_HEADER_TIMEOUT = 90.0


def target_url(scheme: str, host: str, port: int, path_prefix: str = "") -> str:
    """``scheme://host:port/prefix``, an IPv6 host in brackets: how a target is named in messages."""
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}{path_prefix}"


def host_header(scheme: str, host: str, port: int) -> str:
    """The ``Host`` header for ``host:port`` (the port left out when it is the scheme's default)."""
    shown = f"[{host}]" if ":" in host else host
    return shown if port == (443 if scheme == "https" else 80) else f"{shown}:{port}"


class UpstreamTarget(Protocol):
    """Where a pool connects and what it adds to each request (``KubeTarget``, ``ServiceTarget``)."""

    @property
    def scheme(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def ssl_context(self) -> ssl.SSLContext | None: ...
    @property
    def server_hostname(self) -> str | None: ...
    @property
    def path_prefix(self) -> str:
        """Prepended to every request target."""
    @property
    def url(self) -> str: ...
    @property
    def host_header(self) -> str: ...
    @property
    def peer(self) -> str:
        """How messages name the upstream: ``the API server``, ``service 'prometheus'``."""
    @property
    def peer_title(self) -> str:
        """How the 504 message names it: ``cluster API``, ``service 'prometheus'``."""

    def authorization(self) -> str | None:
        """The ``Authorization`` header agentd sends (its own credential), or None."""


class UpstreamUnreachable(Exception):
    """No answer could be had from the API server (connect failed, or it closed before answering)."""


class UpstreamTimeout(Exception):
    """The API server took the request but sent no response head within the bound. It may have acted
    on the request, so this is an answer (504), not a refusal another agent could retry."""


class UpstreamLost(Exception):
    """The API server connection broke after the response head (mid-body)."""


class RequestAborted(Exception):
    """The request body source failed (the client went away) or did not match its framing."""


class InvalidRequest(Exception):
    """The request head cannot be sent as HTTP/1.1 (an illegal method, target or header)."""


@attrs.frozen(kw_only=True)
class PoolStatistics:
    idle: int
    active: int
    opened: int
    reused: int
    #: connections closed without going back to the pool (upgrade, error, cancelled exchange)
    discarded: int


class _Connection:
    """One HTTP/1.1 connection: a byte stream, its response parser, and how far the exchange got."""

    def __init__(self, stream: trio.abc.Stream, peer: str = "the API server") -> None:
        self.stream = stream
        self.peer = peer
        self.parser = http11.ResponseParser(max_head=_MAX_HEAD)
        self.idle_since = 0.0
        self.broken = False
        #: the request and the response of the current exchange are complete
        self.request_done = False
        self.response_done = False

    async def send(self, data: bytes) -> None:
        if data:
            try:
                await self.stream.send_all(data)
            except BaseException:
                self.broken = True
                raise

    async def next_event(self) -> object:
        parser = self.parser
        while True:
            try:
                event = parser.next_event()
            except http11.ProtocolError as exc:
                self.broken = True
                raise UpstreamLost(f"{self.peer} broke HTTP/1.1: {exc}") from exc
            if event is not http11.NEED_DATA:
                if event is http11.END:
                    self.response_done = True
                return event
            try:
                data = await self.stream.receive_some(_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self.broken = True
                raise UpstreamLost(f"connection to {self.peer} lost: {failure_reason(exc)}") from exc
            parser.feed(data)

    @property
    def reusable(self) -> bool:
        return not self.broken and self.request_done and self.response_done and self.parser.keep_alive

    def start_next_cycle(self) -> None:
        self.request_done = self.response_done = False
        self.parser.start_next_cycle()

    def readable_while_idle(self) -> bool:
        """An idle keep-alive connection with bytes (or EOF) waiting is one the server gave up on."""
        stream = self.stream
        sock = getattr(stream, "socket", None) or getattr(getattr(stream, "transport_stream", None), "socket", None)
        if sock is None:
            return True
        # Trio's own sockets (KASD_SAFE_MODE) only offer an async recv: borrow the descriptor.
        peek = sock if isinstance(sock, socket.socket) else socket.socket(fileno=sock.fileno())
        try:
            peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False  # nothing waiting: still a good connection
        except OSError:
            pass
        finally:
            if peek is not sock:
                peek.detach()  # the descriptor stays Trio's
        return True

    async def aclose(self) -> None:
        with trio.move_on_after(1, shield=True):
            await trio.aclose_forcefully(self.stream)


@attrs.define(eq=False)
class UpstreamResponse:
    """The response head, then its body by ``receive_some`` (``b""`` at the end), or ``raw`` for 101."""

    status: int
    #: hop-by-hop headers removed (``Connection``/``Upgrade`` kept on a 101)
    headers: Headers
    _conn: _Connection
    #: after 101: the connection as a raw byte pipe, and bytes the server sent right after the head
    raw: trio.abc.Stream | None = None
    trailing: bytes = b""
    #: why the exchange was abandoned (the request body source failed: the client went away)
    aborted: str | None = None
    bytes_received: int = 0
    _done: bool = False

    async def receive_some(self) -> bytes:
        if self._done or self.raw is not None:
            return b""
        event = await self._conn.next_event()
        if type(event) is bytes:
            self.bytes_received += len(event)
            return event
        self._done = True
        if event is http11.END:
            return b""
        self._conn.broken = True
        raise UpstreamLost(f"{self._conn.peer} closed the connection mid-response ({event!r})")

    def __aiter__(self) -> UpstreamResponse:
        return self

    async def __anext__(self) -> bytes:
        # A plain iterator, not an async generator: nothing is left to finalize if the loop breaks.
        chunk = await self.receive_some()
        if not chunk:
            raise StopAsyncIteration
        return chunk


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections to one upstream (the API server, or one in-cluster service)."""

    # max_idle: as many idle connections as kasd commonly has requests in flight. Fewer, and a burst
    # of 64 concurrent requests closes most connections after each answer and dials (and TLS
    # handshakes) them again: that halved requests/s at concurrency 64 and doubled the API server's
    # CPU per request.
    def __init__(self, target: UpstreamTarget, *, connect_timeout: float = 10.0, max_idle: int = 64,
                 idle_timeout: float = 50.0,
                 response_header_timeout: float | None = DEFAULT_RESPONSE_HEADER_TIMEOUT,
                 on_connect: Callable[[str | None], object] | None = None) -> None:
        self.target = target
        #: told the outcome of each connection attempt: None (connected) or why it failed (readiness)
        self.on_connect = on_connect
        self.connect_timeout = connect_timeout
        #: None: wait for the response head as long as the API server takes
        self.response_header_timeout = response_header_timeout
        self.max_idle = max_idle
        self.idle_timeout = idle_timeout
        self._idle: list[_Connection] = []
        self._active = 0
        self._opened = 0
        self._reused = 0
        self._discarded = 0

    def statistics(self) -> PoolStatistics:
        return PoolStatistics(idle=len(self._idle), active=self._active, opened=self._opened,
                              reused=self._reused, discarded=self._discarded)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.aclose()

    # ---- the exchange

    @asynccontextmanager
    async def request(self, head: RequestHead, body: trio.abc.ReceiveStream | None) -> AsyncIterator[UpstreamResponse]:
        """Send ``head`` (plus ``body``, streamed) and yield the response once its head arrived.

        Raises UpstreamUnreachable (before yielding) when no response head could be had, and
        UpstreamTimeout when the API server sent none within ``response_header_timeout``. ``body`` is
        None for an upgrade request; otherwise it is read to EOF (kasd half-closes after the body).
        """
        headers = self._headers(head)
        first = b""
        has_body = False
        if body is not None and not head.wants_upgrade:
            if "content-length" in dict(headers):
                has_body = True
            else:
                # No length given: look at the first chunk to choose between no body and chunked.
                first = bytes(await body.receive_some(_CHUNK))
                if first:
                    has_body = True
                    headers.append(("transfer-encoding", "chunked"))
                elif head.method in _BODY_METHODS:
                    headers.append(("content-length", "0"))
        conn = await self._acquire()
        self._active += 1
        try:
            try:
                request = http11.encode_request_head(head.method, self.target.path_prefix + head.target, headers)
                writer = http11.BodyWriter.for_headers(headers, no_body=not has_body)
            except http11.FramingError as exc:
                conn.broken = True
                raise InvalidRequest(f"request cannot be sent as HTTP/1.1: {exc}") from None
            conn.parser.expect(head.method)
            timer = _HeadTimer(self.response_header_timeout, self.target.peer_title)
            if not has_body:
                # Nothing to send beside the response: no body task, no nursery, and one deadline
                # scope (the timer's) for sending the head and waiting for the answer's.
                yield await self._bodiless_exchange(conn, request, timer)
                return
            try:
                with trio.move_on_after(timer.timeout) as sending:
                    await conn.send(request)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise UpstreamUnreachable(f"cannot reach {self.target.url}: {failure_reason(exc)}") from exc
            if sending.cancelled_caught:
                raise timer.expired(conn)
            failure: BaseException | None = None
            caller_error: BaseException | None = None
            async with trio.open_nursery() as nursery:
                state = _BodyState()
                assert body is not None
                nursery.start_soon(self._send_body, conn, writer, body, first, state, nursery.cancel_scope, timer)
                try:
                    response = await self._response_head(conn, timer)
                except (UpstreamUnreachable, UpstreamTimeout) as exc:
                    failure = exc
                    nursery.cancel_scope.cancel()
                else:
                    state.response = response
                    try:
                        yield response
                    except BaseException as exc:
                        caller_error = exc
                        nursery.cancel_scope.cancel()
                    else:
                        if not state.finished:
                            # The response is done; give a well-behaved body sender a moment to finish
                            # its last chunk before the exchange is abandoned (and the connection with it).
                            with trio.move_on_after(1.0 if response._done else 0):
                                await state.finished_event.wait()
                            nursery.cancel_scope.cancel()
            if state.aborted_by_body:
                # Our own cancel (the body source failed) ended the exchange: say so, not "Cancelled".
                raise RequestAborted(state.reason or "request aborted")
            if failure is not None:
                raise failure
            if caller_error is not None:
                raise caller_error
        finally:
            self._active -= 1
            await self._release(conn)

    async def _send_body(self, conn: _Connection, writer: http11.BodyWriter, body: trio.abc.ReceiveStream,
                         first: bytes, state: _BodyState, scope: trio.CancelScope, timer: _HeadTimer) -> None:
        chunk = first
        try:
            while True:
                if chunk:
                    timer.waiting_on_server()
                    try:
                        await conn.send(writer.data(chunk))
                    except http11.FramingError as exc:  # more bytes than the content-length said
                        conn.broken = True
                        state.abort(f"request body does not match its length: {exc}", scope)
                        return
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        return  # the API server stopped reading; its response says why
                timer.waiting_on_client()
                try:
                    chunk = bytes(await body.receive_some(_CHUNK))
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    conn.broken = True
                    state.abort(f"client went away while sending the body: {exc}", scope)
                    return
                if not chunk:
                    break
            timer.waiting_on_server()
            try:
                await conn.send(writer.end())
            except http11.FramingError as exc:  # fewer bytes than the content-length said
                conn.broken = True
                state.abort(f"request body ended early: {exc}", scope)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return
            conn.request_done = True
        finally:
            state.finished = True
            state.finished_event.set()
            timer.waiting_on_server()  # all sent (or the API server stopped reading): its answer is due

    async def _bodiless_exchange(self, conn: _Connection, request: bytes, timer: _HeadTimer) -> UpstreamResponse:
        """Send a request without a body and read its answer's head, both within the timer's bound
        (as a request with a body sends its head, and then waits for the answer's)."""
        response = None
        with timer.scope:
            try:
                await conn.send(request)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise UpstreamUnreachable(f"cannot reach {self.target.url}: {failure_reason(exc)}") from exc
            conn.request_done = True
            timer.waiting_on_server()
            try:
                response = await self._read_response_head(conn)
            except UpstreamLost as exc:
                raise UpstreamUnreachable(f"cannot reach {self.target.url}: {exc}") from None
        if response is None:
            raise timer.expired(conn)
        return response

    async def _response_head(self, conn: _Connection, timer: _HeadTimer) -> UpstreamResponse:
        """The response head (after any 1xx but 101); UpstreamUnreachable when none came,
        UpstreamTimeout when none came in time."""
        with timer.scope:
            try:
                return await self._read_response_head(conn)
            except UpstreamLost as exc:
                raise UpstreamUnreachable(f"cannot reach {self.target.url}: {exc}") from None
        raise timer.expired(conn)

    async def _read_response_head(self, conn: _Connection) -> UpstreamResponse:
        event = await conn.next_event()
        if type(event) is http11.Response:
            if event.status == 101:
                conn.parser.next_event()  # its END, already queued: the parser stopped there
                return UpstreamResponse(101, strip_hop_by_hop(event.headers, keep_upgrade=True), conn,
                                        raw=conn.stream, trailing=conn.parser.trailing)
            return UpstreamResponse(event.status, strip_hop_by_hop(event.headers), conn)
        conn.broken = True
        raise UpstreamLost(f"{conn.peer} closed the connection before answering")

    def _headers(self, head: RequestHead) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = [("host", self.target.host_header)]
        for name, value in strip_hop_by_hop(head.headers, keep_upgrade=head.wants_upgrade):
            if name in ("host", "authorization", REQUEST_ID_HEADER) or name.startswith("impersonate-"):
                continue
            out.append((name, value))
        authorization = self.target.authorization()
        if authorization:
            out.append(("authorization", authorization))
        if head.impersonate is not None:
            out.extend(head.impersonate.headers())
        if head.request_id:  # kasd's id for the request, as labkit's outbound requests carry it
            out.append((REQUEST_ID_HEADER, head.request_id))
        return out

    # ---- the pool

    async def _acquire(self) -> _Connection:
        now = trio.current_time()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < self.idle_timeout and not conn.readable_while_idle():
                self._reused += 1
                return conn
            self._discarded += 1
            await conn.aclose()
        return await self._connect()

    async def _connect(self) -> _Connection:
        target = self.target
        tcp: trio.abc.Stream | None = None
        try:
            with trio.fail_after(self.connect_timeout):
                tcp = fast_stream(await trio.open_tcp_stream(target.host, target.port))
                stream: trio.abc.Stream = tcp
                if target.scheme == "https":
                    assert target.ssl_context is not None
                    tls = tls_stream(tcp, target.ssl_context, https_compatible=True,
                                     server_hostname=target.server_hostname or target.host)
                    await tls.do_handshake()
                    stream = tls
        except trio.TooSlowError:
            if tcp is not None:
                await trio.aclose_forcefully(tcp)
            reason = f"connect timed out after {self.connect_timeout:g}s"
            self._connect_outcome(reason)
            raise UpstreamUnreachable(f"cannot reach {target.url}: {reason}") from None
        except (OSError, ssl.SSLError, trio.BrokenResourceError) as exc:
            if tcp is not None:
                await trio.aclose_forcefully(tcp)
            reason = failure_reason(exc, host=target.host)
            self._connect_outcome(reason)
            raise UpstreamUnreachable(f"cannot reach {target.url}: {reason}") from exc
        self._connect_outcome(None)
        self._opened += 1
        return _Connection(stream, target.peer)

    def _connect_outcome(self, failure: str | None) -> None:
        if self.on_connect is not None:
            self.on_connect(failure)

    async def _release(self, conn: _Connection) -> None:
        if conn.reusable and len(self._idle) < self.max_idle:
            conn.start_next_cycle()
            conn.idle_since = trio.current_time()
            self._idle.append(conn)
            return
        self._discarded += 1
        await conn.aclose()


class _HeadTimer:
    """The bound on the response head. It counts only the time agentd waits on the API server —
    sending it the request, then waiting for its answer — never the time it waits for the client's
    body, so a slow upload is not blamed on the API server. It fires while the head is awaited (the
    body, sent meanwhile, moves the deadline as it goes)."""

    def __init__(self, timeout: float | None, peer_title: str) -> None:
        self.timeout = math.inf if timeout is None else timeout
        self.peer_title = peer_title
        self.scope = trio.CancelScope(deadline=trio.current_time() + self.timeout)

    def waiting_on_server(self) -> None:
        self.scope.deadline = trio.current_time() + self.timeout

    def waiting_on_client(self) -> None:
        self.scope.deadline = math.inf

    def expired(self, conn: _Connection) -> UpstreamTimeout:
        conn.broken = True  # an answer may still come: the connection is out of step, not reusable
        return UpstreamTimeout(f"{self.peer_title} sent no response head within {self.timeout:g}s")


@attrs.define(eq=False)
class _BodyState:
    response: UpstreamResponse | None = None
    finished: bool = False
    finished_event: trio.Event = attrs.field(factory=trio.Event)
    aborted_by_body: bool = False
    reason: str | None = None

    def abort(self, reason: str, scope: trio.CancelScope) -> None:
        self.aborted_by_body = True
        self.reason = reason
        if self.response is not None:
            self.response.aborted = reason
        scope.cancel()


# ------------------------------------------------------------------ one small exchange, read whole


class ResponseTooLarge(Exception):
    """The answer's body is over the bound; ``status`` is its status (the head came)."""

    def __init__(self, status: int, limit: int) -> None:
        super().__init__(f"answer over {limit} bytes")
        self.status = status


class BytesBody(trio.abc.ReceiveStream):
    """``data`` once, then the end."""

    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        data, self._data = self._data or b"", None
        return data

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def exchange(pool: UpstreamPool, method: str, target: str, headers: Sequence[tuple[str, str]],
                   body: bytes | None, *, max_response: int, request_id: str = "") -> tuple[int, bytes]:
    """Send one request; its status and body (at most ``max_response`` bytes, else
    ``ResponseTooLarge``). Raises what ``UpstreamPool.request`` raises; never follows a redirect."""
    sent = list(headers)
    if body is not None:
        sent.append(("content-length", str(len(body))))
    head = RequestHead(method=method, target=target, headers=tuple(sent), request_id=request_id)
    async with pool.request(head, None if body is None else BytesBody(body)) as response:
        chunks: list[bytes] = []
        size = 0
        while chunk := await response.receive_some():
            size += len(chunk)
            if size > max_response:
                raise ResponseTooLarge(response.status, max_response)
            chunks.append(chunk)
        return response.status, b"".join(chunks)
