"""agentd's health address: ``/liveness``, ``/readiness`` and ``/metrics`` on daemonkit's health server.

Liveness is 200 while the process serves at all; readiness is 200 while at least one tunnel is up and
503 with the reason otherwise, so a Deployment's rollout waits for a connected agent.
"""

from __future__ import annotations

import logging

import trio

from daemonkit.health import ReadinessCheck, Route, liveness, readiness_route
from daemonkit.health import serve_health as serve_routes

log = logging.getLogger("agentd.health")


async def serve_health(
    host: str,
    port: int,
    readiness: ReadinessCheck,
    *,
    metrics: Route | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``host:port`` (0 picks a port); ``started((host, bound_port))`` once listening."""
    routes: dict[str, Route] = {"/liveness": liveness, "/readiness": readiness_route(readiness)}
    if metrics is not None:
        routes["/metrics"] = metrics

    async def serve(task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        await serve_routes(host, port, routes, what="the health address", task_status=task_status)

    async with trio.open_nursery() as nursery:
        bound: tuple[str, int] = await nursery.start(serve)
        log.info("health listening address=%s:%d", bound[0], bound[1])
        task_status.started(bound)
