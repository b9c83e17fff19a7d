"""The observability port (8151): ``/liveness``, ``/readiness`` and ``/metrics`` on daemonkit's
health server (GET only, small heads, one short request per connection)."""

from __future__ import annotations

import trio

from daemonkit.health import MAX_CONNECTIONS, HealthServer, Response, liveness
from kasd.metrics import CONTENT_TYPE, Metrics


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


class ObservabilityServer(HealthServer):
    def __init__(self, health: Health, metrics: Metrics, *, max_connections: int = MAX_CONNECTIONS) -> None:
        self.health = health
        self.metrics = metrics
        routes = {"/liveness": liveness, "/readiness": self._readiness, "/metrics": self._metrics}
        super().__init__(routes, max_connections=max_connections)

    def _readiness(self) -> Response:
        status, body = self.health.readiness()
        return Response(status, body)

    def _metrics(self) -> Response:
        return Response(200, self.metrics.render(), CONTENT_TYPE)
