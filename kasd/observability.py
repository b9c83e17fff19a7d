"""The observability port (8151): ``/liveness``, ``/readiness`` and ``/metrics``, on h11.

Tiny on purpose: GET only, small heads, one short request at a time per connection.
"""

from __future__ import annotations

import logging

import h11
import trio

from kasd.metrics import CONTENT_TYPE, Metrics

log = logging.getLogger("kasd.observability")

_TIMEOUT = 10.0
_MAX_HEAD = 8 * 1024


class Health:
    """Readiness: up once every listener is bound, down again while draining."""

    def __init__(self) -> None:
        self.ready = False
        self.draining = False
        self.drain_started = trio.Event()

    def start_draining(self) -> None:
        self.draining = True
        self.drain_started.set()

    def readiness(self) -> tuple[int, bytes]:
        if self.draining:
            return 503, b"draining\n"
        if not self.ready:
            return 503, b"starting\n"
        return 200, b"ready\n"


class ObservabilityServer:
    def __init__(self, health: Health, metrics: Metrics) -> None:
        self.health = health
        self.metrics = metrics

    def respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        path = path.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"GET only\n"
        if path == "/liveness":
            return 200, "text/plain", b"ok\n"
        if path == "/readiness":
            status, body = self.health.readiness()
            return status, "text/plain", body
        if path == "/metrics":
            return 200, CONTENT_TYPE, self.metrics.render()
        return 404, "text/plain", b"not found: try /liveness, /readiness or /metrics\n"

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD)
        try:
            while True:
                with trio.move_on_after(_TIMEOUT):
                    event = await self._next_event(conn, stream)
                    if not isinstance(event, h11.Request):
                        return
                    status, ctype, body = self.respond(event.method.decode(), event.target.decode("latin-1"))
                    headers = [("content-type", ctype), ("content-length", str(len(body)))]
                    data = conn.send(h11.Response(status_code=status, headers=headers))
                    if event.method != b"HEAD":
                        data += conn.send(h11.Data(data=body))
                    data += conn.send(h11.EndOfMessage())
                    await stream.send_all(data)
                    while not isinstance(await self._next_event(conn, stream), (h11.EndOfMessage, h11.ConnectionClosed)):
                        pass
                    if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                        return
                    conn.start_next_cycle()
                    continue
                return  # timed out
        except (h11.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError, UnicodeDecodeError) as exc:
            log.debug("observability connection ended error=%r", exc)
        finally:
            with trio.move_on_after(1, shield=True):
                await stream.aclose()

    async def _next_event(self, conn: h11.Connection, stream: trio.abc.Stream) -> object:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(bytes(await stream.receive_some(16 * 1024)))
                continue
            return event
