"""The one small HTTP server of both daemons' health ports: kasd's observability port (``/liveness``,
``/readiness``, ``/metrics``) and agentd's health address (``/liveness``, ``/readiness``).

Each daemon supplies its routes (path → a function returning the response); this module owns the
HTTP. Anyone who can reach the port gets a small, fixed budget: one request per connection, a head of
at most ``max_head`` bytes that must arrive within ``header_timeout`` seconds, a bounded time to
take the answer, and at most ``max_connections`` connections at once. With an ``ssl_context`` it
serves HTTPS only (the TLS handshake counts in ``header_timeout``; a failed one just closes). A request that breaks those rules gets its answer (400, 408, 431), then the
connection closes; GET and HEAD only (405 otherwise).

``serve_health`` also caps its listener as kasd caps each of its own (``netio.admission``): at most
``MAX_CONNECTIONS`` at once and ``MAX_CONNECTIONS_PER_SOURCE`` from one address, more reset at accept
before a task starts for them, with a rate-limited log line.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Mapping
from http import HTTPStatus

import attrs
import h11
import trio

from daemonkit.listeners import REFUSAL_LOG_INTERVAL, capped_admission
from daemonkit.logs import BurstLimitedLog
from netio.admission import ConnectionCaps

log = logging.getLogger("daemonkit.health")

HEADER_TIMEOUT = 10.0
MAX_HEAD = 8 * 1024
#: how long a client has to take a (small) answer
SEND_TIMEOUT = 10.0
#: connections served at once; more are closed at once (probes and scrapers need a handful)
MAX_CONNECTIONS = 64
#: connections from one address at once (a runaway client keeps at most half)
MAX_CONNECTIONS_PER_SOURCE = 32
#: what ``serve_health``'s listener admits
CAPS = ConnectionCaps(max_connections=MAX_CONNECTIONS, max_per_source=MAX_CONNECTIONS_PER_SOURCE)


@attrs.frozen
class HealthResponse:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


Route = Callable[[], HealthResponse]
#: None when ready, or why not
ReadinessCheck = Callable[[], str | None]


def liveness() -> HealthResponse:
    """200 while the process serves at all."""
    return HealthResponse(200, b"ok\n")


def readiness_route(check: ReadinessCheck) -> Route:
    """200 ``ok`` when ``check()`` says ready, else 503 with its reason."""

    def readiness() -> HealthResponse:
        reason = check()
        return HealthResponse(200, b"ok\n") if reason is None else HealthResponse(503, reason.encode() + b"\n")

    return readiness


class _Refused(Exception):
    """The request cannot be answered normally; ``status`` says how it is answered instead."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class HealthServer:
    """Serves ``routes`` (path → response function) on each connection handed to
    ``handle_connection`` (for ``trio.serve_listeners``)."""

    def __init__(
        self,
        routes: Mapping[str, Route],
        *,
        header_timeout: float = HEADER_TIMEOUT,
        max_head: int = MAX_HEAD,
        send_timeout: float = SEND_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.routes = dict(routes)
        #: None: plain HTTP; else HTTPS only (a ``netio.tlsreload.ReloadingContext`` serves changed files)
        self.ssl_context = ssl_context
        self.max_connections = max_connections
        self.connections = 0
        self.header_timeout = header_timeout
        self.max_head = max_head
        self.send_timeout = send_timeout

    def respond(self, method: str, target: str) -> HealthResponse:
        if method not in ("GET", "HEAD"):
            return HealthResponse(405, b"GET only\n")
        route = self.routes.get(target.split("?", 1)[0])
        if route is None:
            return HealthResponse(404, f"not found: try {', '.join(self.routes)}\n".encode())
        return route()

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        if self.connections >= self.max_connections:
            log.debug("health connection refused: %d connections open", self.connections)
            await trio.aclose_forcefully(stream)
            return
        self.connections += 1
        if self.ssl_context is not None:  # (the handshake runs at the first read, within header_timeout)
            stream = trio.SSLStream(stream, self.ssl_context, server_side=True)
        try:
            data = await self._answer(stream)
            if data:
                with trio.move_on_after(self.send_timeout):
                    await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("health connection ended error=%r", exc)
        finally:
            self.connections -= 1
            await trio.aclose_forcefully(stream)

    async def _answer(self, stream: trio.abc.Stream) -> bytes:
        """The bytes to send back: the response to the request, or the refusal (b"" when the client
        left without asking anything)."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.max_head)
        try:
            with trio.fail_after(self.header_timeout):
                request = await _next_request(conn, stream)
        except trio.TooSlowError:
            log.debug("health request head not received within %gs", self.header_timeout)
            return _refusal(_Refused(408, f"request head not received within {self.header_timeout:g}s"))
        except _Refused as refused:
            log.debug("health request refused status=%d reason=%s", refused.status, refused.reason)
            return _refusal(refused)
        if request is None:
            return b""
        method = request.method.decode("ascii", "replace")
        response = self.respond(method, request.target.decode("latin-1"))
        headers = [
            ("content-type", response.content_type),
            ("content-length", str(len(response.body))),
            ("connection", "close"),
        ]
        data = conn.send(h11.Response(status_code=response.status, headers=headers)) or b""
        if method != "HEAD":
            data += conn.send(h11.Data(data=response.body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        return data


async def _next_request(conn: h11.Connection, stream: trio.abc.Stream) -> h11.Request | None:
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            # The answer names the problem, never echoes the client's bytes (h11's text does).
            log.debug("health request malformed error=%s", exc)
            status = exc.error_status_hint
            reason = "request head too large" if status == 431 else "malformed HTTP/1.1 request"
            raise _Refused(status, reason) from None
        if event is h11.NEED_DATA:
            conn.receive_data(bytes(await stream.receive_some(4096)))
            continue
        if isinstance(event, h11.Request):
            return event
        return None  # ConnectionClosed: the client left before asking


def _refusal(refused: _Refused) -> bytes:
    """A complete answer written by hand: h11 sends nothing once the request was malformed."""
    body = f"{refused.reason}\n".encode()
    phrase = HTTPStatus(refused.status).phrase
    head = (
        f"HTTP/1.1 {refused.status} {phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


async def serve_health(
    host: str,
    port: int,
    routes: Mapping[str, Route],
    *,
    what: str,
    name: str = "health",
    caps: ConnectionCaps = CAPS,
    ssl_context: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``host:port`` (0 picks a port) and serve ``routes``; ``started((host, bound_port))``
    once listening. A port that cannot be bound is an OSError naming ``what`` it is for; ``name`` is
    the listener's in the log line of a refused connection. ``ssl_context``: HTTPS only."""
    try:
        sockets = await trio.open_tcp_listeners(port, host=host or None)
    except OSError as exc:
        message = f"cannot listen on {host}:{port} ({what}): {exc.strerror or exc}"
        raise OSError(exc.errno, message) from None
    bound = sockets[0].socket.getsockname()
    server = HealthServer(routes, max_connections=caps.max_connections, ssl_context=ssl_context)
    refusals = BurstLimitedLog(log, interval=REFUSAL_LOG_INTERVAL)
    admission = capped_admission(caps, listener=name, log=refusals)
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, server.handle_connection, [admission.listener(s) for s in sockets])
        task_status.started((bound[0], bound[1]))
