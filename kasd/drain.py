"""kasd's graceful drain after SIGTERM, alone or among replicas, within deadlines its caller sets.

The listeners have stopped accepting when a drain begins; ``serve_kasd`` cancels what is left when
it returns. docs/kasd.md, "## Shutdown"; docs/routing.md, "Shutdown of a replica".

May import: ``kasd.agents``, ``kasd.k8sproxy.server``, ``kasd.replicas``, ``routing``, trio, attrs
and the standard library.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import trio

from kasd.k8sproxy.server import ProxyServer
from kasd.replicas import Replication
from routing.local import TunnelRegistry
from routing.peers import PeerForwarder
from routing.placement import PlacementHook

log = logging.getLogger("kasd")

#: the GOAWAY debug text every agent session gets
SHUTTING_DOWN = "kasd is shutting down"


@attrs.frozen(kw_only=True)
class DrainDeadlines:
    """What each part of a drain may take, in seconds (``serve_kasd`` sets them from the configuration)."""

    #: the whole drain: proxy requests, forwarded streams and agent sessions finish within it
    #: (``shutdown_timeout``); what is left then is closed
    total: float
    #: each wait for Redis (it may be down): marking this replica draining (at most a quarter of
    #: ``total``, so that the requests keep most of it), and, after the drain, withdrawing its
    #: directory entries and leaving the membership, together (``routing.leave_timeout``)
    redis: float = 2.0
    #: telling one agent session where to go before its GOAWAY (a placement notice)
    notice: float = 1.0


async def drain_alone(proxy: ProxyServer, registry: TunnelRegistry, deadlines: DrainDeadlines) -> None:
    """A lone kasd: proxy connections finish their requests; then every agent session gets GOAWAY
    and its streams finish."""
    proxy.start_drain()
    with trio.move_on_after(deadlines.total) as drain_scope:
        await proxy.wait_closed()
        # No proxy request is left: GOAWAY every agent session and let its streams finish.
        async with trio.open_nursery() as drains:
            for tunnel in registry.tunnels():
                drains.start_soon(tunnel.session.drain, SHUTTING_DOWN)
    if drain_scope.cancelled_caught:
        log.warning("drain timed out; closing what is left connections=%d", proxy.connections)


async def drain_replica(proxy: ProxyServer, registry: TunnelRegistry, deadlines: DrainDeadlines, *,
                        replicas: Replication, forwarder: PeerForwarder,
                        placement: PlacementHook | None) -> None:
    """A replica (docs/routing.md, "Shutdown of a replica"): the others drop it from their rings;
    each agent is told where to go and gets GOAWAY (agentd dials the replacement first); proxy
    requests and streams forwarded here finish (watches end between two events); then it leaves."""
    with trio.move_on_after(deadlines.total) as drain_scope:
        with trio.move_on_after(min(deadlines.redis, deadlines.total / 4)):
            await replicas.membership.set_draining()  # bounded: Redis may be down
        proxy.start_drain()  # and the pipeline's Drain: forwarded watches end at a boundary too

        async def leave_session(session: Any) -> None:
            if placement is not None:
                with trio.move_on_after(deadlines.notice):
                    await placement.leaving(session)
            await session.drain(SHUTTING_DOWN)

        async with trio.open_nursery() as drains:
            for tunnel in registry.tunnels():
                drains.start_soon(leave_session, tunnel.session)
            drains.start_soon(forwarder.drain_sessions)
            drains.start_soon(proxy.wait_closed)
    if drain_scope.cancelled_caught:
        log.warning("drain timed out; closing what is left connections=%d forwarded=%d",
                    proxy.connections, forwarder.active)
    with trio.move_on_after(deadlines.redis, shield=True):  # bounded: Redis may be away
        await replicas.directory.withdraw()
        await replicas.membership.leave()


__all__ = ["SHUTTING_DOWN", "DrainDeadlines", "drain_alone", "drain_replica"]
