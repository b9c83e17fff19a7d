"""The observability port (8151): ``/liveness``, ``/readiness`` and ``/metrics`` on daemonkit's
health server (GET only, small heads, one short request per connection); plain HTTP, or HTTPS only
with ``listeners.observability.tls`` (its files read again when they change)."""

from __future__ import annotations

import ssl
from collections.abc import Callable

import trio

from daemonkit.health import MAX_CONNECTIONS, HealthResponse, HealthServer, liveness
from kasd.metrics import CONTENT_TYPE, Metrics


class Readiness:
    """Readiness: up once every listener is bound, down again while draining; among replicas,
    ``degraded`` (still 200) while Redis is unreachable.

    Why 200 and not 503 while degraded: a replica that lost Redis still serves every agent
    connected to it, and a load balancer that pulled it would cut those agents' users off too;
    Redis trouble is usually every replica's at once, so a 503 would empty the whole pool. The body
    says ``degraded``, ``kasd_redis_up`` says it to monitoring, and the log says it once.
    """

    def __init__(self) -> None:
        self.ready = False
        self.draining = False
        self.drain_started = trio.Event()
        #: among replicas: why this replica is degraded now (None: it is not)
        self.degraded: Callable[[], str | None] = _not_degraded

    def start_draining(self) -> None:
        self.draining = True
        self.drain_started.set()

    def readiness(self) -> tuple[int, bytes]:
        if self.draining:
            return 503, b"draining\n"
        if not self.ready:
            return 503, b"starting\n"
        reason = self.degraded()
        if reason is not None:
            return 200, f"degraded: {reason}\n".encode()
        return 200, b"ready\n"


def _not_degraded() -> str | None:
    return None


class ObservabilityServer(HealthServer):
    def __init__(self, health: Readiness, metrics: Metrics, *, max_connections: int = MAX_CONNECTIONS,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.health = health
        self.metrics = metrics
        routes = {"/liveness": liveness, "/readiness": self._readiness, "/metrics": self._metrics}
        super().__init__(routes, max_connections=max_connections, ssl_context=ssl_context)

    def _readiness(self) -> HealthResponse:
        status, body = self.health.readiness()
        return HealthResponse(status, body)

    def _metrics(self) -> HealthResponse:
        return HealthResponse(200, self.metrics.render(), CONTENT_TYPE)
