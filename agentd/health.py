"""agentd's health address: ``/liveness``, ``/readiness`` and ``/metrics`` on daemonkit's health server.

Liveness is 200 while the process serves at all; readiness is 200 while at least one tunnel is up and
503 with the reason otherwise, so a Deployment's rollout waits for a connected agent. Plain HTTP by
default; HTTPS only with ``health_cert_file``/``health_key_file`` (``health_ssl_context``: read again
when the files change).
"""

from __future__ import annotations

import logging
import ssl

import trio

from agentd.config import AgentdConfig
from daemonkit.health import ReadinessCheck, Route, liveness, readiness_route
from daemonkit.health import serve_health as serve_routes
from netio.tlsreload import ReloadingContext, TLSFiles

log = logging.getLogger("agentd.health")


async def serve_health(
    host: str,
    port: int,
    readiness: ReadinessCheck,
    *,
    metrics: Route | None = None,
    ssl_context: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``host:port`` (0 picks a port); ``started((host, bound_port))`` once listening."""
    routes: dict[str, Route] = {"/liveness": liveness, "/readiness": readiness_route(readiness)}
    if metrics is not None:
        routes["/metrics"] = metrics

    async def serve(task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        await serve_routes(host, port, routes, what="the health address", ssl_context=ssl_context,
                           task_status=task_status)

    async with trio.open_nursery() as nursery:
        bound: tuple[str, int] = await nursery.start(serve)
        log.info("health listening address=%s:%d scheme=%s", bound[0], bound[1],
                 "http" if ssl_context is None else "https")
        task_status.started(bound)


def health_ssl_context(config: AgentdConfig) -> ReloadingContext | None:
    """The health address's TLS (None: plain HTTP), read again when its files change (every
    ``tls_reload_interval``, and on SIGHUP). ``TLSLoadError`` if the files do not load."""
    if config.health_cert_file is None or config.health_key_file is None:
        return None
    return ReloadingContext(TLSFiles(server=True, cert=config.health_cert_file, key=config.health_key_file),
                            name="health", check_interval=config.tls_reload_interval)
