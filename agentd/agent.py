"""``run_agent``: the health port, the upstream pool, the proxy and the tunnel manager, wired together."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import trio

from agentd import __version__
from agentd.apicheck import CHECK_TIMEOUT, ApiServerReachability
from agentd.config import AgentdConfig
from agentd.connection import ConnectionManager
from agentd.discovery import ClusterReporter, pool_fetch
from agentd.events import EventHandler
from agentd.health import health_ssl_context, serve_health
from agentd.kubeapi import KubeTarget, in_cluster_target, kubeconfig_target
from agentd.metrics import CONTENT_TYPE, AgentMetrics
from agentd.proxy import KubeApiProxy
from agentd.receptive import ReceptiveListener, receptive_manager
from agentd.serviceproxy import ServiceProxy
from agentd.services import describe_services
from agentd.streams import StreamKinds
from agentd.upstream import UpstreamPool
from daemonkit.health import HealthResponse
from daemonkit.notify import sd_notify, write_ready_file
from netio.fastio import is_loopback_host
from netio.tlsreload import ReloadingContext, TLSFiles
from tunnelhttp.kinds import KIND_EVENT, KIND_K8S_API, KIND_SERVICE

log = logging.getLogger("agentd")


@attrs.define(eq=False)
class RunningAgent:
    """What ``run_agent`` hands to ``task_status.started``: where it listens and its parts."""

    health_address: tuple[str, int]
    manager: ConnectionManager
    pool: UpstreamPool
    proxy: KubeApiProxy
    stop_event: trio.Event
    #: the handler of streams of kind ``service`` (agentd's allow-list of in-cluster services)
    services: ServiceProxy | None = None
    #: the handler of each kind of stream kasd opens (``tunnelhttp.kinds``)
    streams: StreamKinds = attrs.field(factory=lambda: StreamKinds({}))
    #: acts on the events kasd pushes (kind ``event``)
    events: EventHandler | None = None
    #: the cluster discovery reports (``agentd.discovery``)
    reporter: ClusterReporter | None = None
    #: whether the API server could be reached at the last try (``/readiness``)
    api_server: ApiServerReachability | None = None
    #: receptive mode: the listener kasd dials (``agentd.receptive``)
    receptive: ReceptiveListener | None = None
    #: the health address's TLS (None: plain HTTP)
    health_tls: ssl.SSLContext | None = None

    def stop(self) -> None:
        """Graceful stop: no more dials, in-flight streams finish (bounded), run_agent returns."""
        self.stop_event.set()


def kube_target_for(config: AgentdConfig) -> KubeTarget:
    """The API server as configured (raises KubeConfigError with a message to show)."""
    if config.kubeconfig is not None:
        return kubeconfig_target(config.kubeconfig, context=config.kube_context)
    environ = {
        "KUBERNETES_SERVICE_HOST": config.kubernetes_service_host or "",
        "KUBERNETES_SERVICE_PORT": config.kubernetes_service_port or "443",
    }
    return in_cluster_target(config.serviceaccount_dir, environ)


def kas_ssl_context(config: AgentdConfig) -> ssl.SSLContext | None:
    """How agentd verifies kasd: ``kas_ca_file`` (read again when it changes: each dial uses the
    bundle current then), else the system's CAs."""
    if not any(url.startswith(("https://", "wss://")) for url in config.kas_addresses):
        return None
    context: ssl.SSLContext
    if config.kas_ca_file is not None:
        context = ReloadingContext(TLSFiles(server=False, ca=config.kas_ca_file), name="kas_ca_file",
                                   check_interval=config.kas_ca_reload_interval)
    else:
        context = ssl.create_default_context()
    context.set_alpn_protocols(["h2"])
    return context


def plaintext_kas_addresses(config: AgentdConfig) -> list[str]:
    """The ``kas_address`` URLs agentd would dial in plain text over a network: ``http://`` or
    ``ws://`` to a host that is not loopback."""
    return [url for url in config.kas_addresses
            if urlsplit(url).scheme in ("http", "ws") and not is_loopback_host(urlsplit(url).hostname or "")]


def warn_plaintext(config: AgentdConfig) -> None:
    """One WARNING at start for each address agentd dials in plain text beyond loopback (plain text
    is configured explicitly, by the URL's scheme; this says what it costs)."""
    for url in plaintext_kas_addresses(config):
        log.warning("agentd dials kasd in plain text beyond loopback url=%s: whoever is on the network reads and "
                    "alters the agent token and every request to this cluster; use https:// or wss://", url)


async def run_agent(
    config: AgentdConfig,
    *,
    kube_target: KubeTarget | None = None,
    stop_event: trio.Event | None = None,
    manager_kwargs: Mapping[str, Any] | None = None,
    kas_tls: ssl.SSLContext | None = None,
    reloadable: list[ssl.SSLContext | None] | None = None,
    task_status: trio.TaskStatus[RunningAgent] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run until ``stop_event`` is set (then drain gracefully and return) or cancelled. ``kas_tls``:
    how kasd is verified (default: ``kas_ssl_context(config)``; given, the caller can reload it).
    ``reloadable``: the TLS contexts built here (the receptive listener's, the health address's) are
    added to it, for the caller's SIGHUP to reload."""
    target = kube_target or kube_target_for(config)
    if stop_event is None:
        stop_event = trio.Event()
    api_server = ApiServerReachability(target.url)
    pool = UpstreamPool(target, response_header_timeout=config.upstream_response_header_timeout or None,
                        on_connect=api_server.connected)
    discovery_pool = UpstreamPool(target, max_idle=1, on_connect=api_server.connected)
    check_pool = UpstreamPool(target, max_idle=1, connect_timeout=CHECK_TIMEOUT, response_header_timeout=CHECK_TIMEOUT,
                              on_connect=api_server.connected)
    metrics = AgentMetrics(service.name for service in config.services)
    proxy = KubeApiProxy(pool, on_done=metrics.requests)
    events = EventHandler(config.events, kube=pool, agent_id=config.agent_id, on_done=metrics.events)
    services = ServiceProxy(config.services, drain=proxy.drain, on_done=metrics.requests)
    streams = StreamKinds({KIND_K8S_API: proxy.handle, KIND_SERVICE: services.handle, KIND_EVENT: events.handle})
    receptive = ReceptiveListener(config, session_kwargs=config.session_keepalive) \
        if config.receptive_listen_address is not None else None
    health_tls = health_ssl_context(config)
    if reloadable is not None:
        reloadable += [receptive.ssl_context if receptive is not None else None, health_tls]
    if kas_tls is None:
        kas_tls = kas_ssl_context(config)
    metrics.watch_tls([kas_tls, receptive.ssl_context if receptive is not None else None, health_tls])
    manager = (partial(receptive_manager, receptive) if receptive is not None
               else partial(ConnectionManager, config.kas_addresses))(
        token_file=config.token_file,
        handler=streams,
        metadata={"agent_id": config.agent_id, "pod_name": config.pod_name, "pod_uid": config.pod_uid,
                  "pod_namespace": config.pod_namespace, "node_name": config.node_name,
                  "namespaces": list(config.namespaces), "version": __version__},
        connections=config.connections,
        quick_window=config.reconnect_quick_window,
        shutdown_grace=config.shutdown_grace,
        kas_ssl_context=kas_tls,
        session_kwargs=config.session_keepalive,
        **dict(manager_kwargs or {}),
    )

    def readiness() -> str | None:
        reasons = []
        if not manager.tunnels_up:
            stats = manager.statistics()
            reasons.append(f"no tunnel to kasd is up (dials={stats.dials} failures={stats.failures} "
                           f"rejected={stats.rejected})" if receptive is None else
                           f"receptive: no kasd session is up (kasd dialled in {receptive.accepted} times, "
                           f"{receptive.refused} refused)")
        if api_server.unreachable is not None:
            reasons.append(f"the API server is unreachable: {api_server.unreachable}")
        return "; ".join(reasons) or None

    if receptive is None:
        warn_plaintext(config)
    log.info("agentd starting version=%s kas=%s api=%s connections=%d agent_id=%s pod=%s services=%s",
             __version__, receptive.url if receptive is not None else ",".join(config.kas_addresses), target.url, config.connections,
             config.agent_id or "-", config.pod_name or "-", describe_services(config.services))
    try:
        async with trio.open_nursery() as nursery:
            metrics.watch_manager(manager.statistics)
            health = await nursery.start(partial(serve_health, metrics=lambda: HealthResponse(200, metrics.render(), CONTENT_TYPE),
                                                 ssl_context=health_tls),
                                         config.health_host, config.health_port, readiness)
            await nursery.start(events.run)
            if receptive is not None:
                await nursery.start(receptive.serve)
            if config.api_check_interval > 0:
                nursery.start_soon(partial(api_server.run, check_pool, interval=config.api_check_interval))
            manager_done = trio.Event()

            async def run_manager(*, task_status: trio.TaskStatus[ConnectionManager] = trio.TASK_STATUS_IGNORED) -> None:
                try:
                    await manager.run(task_status=task_status)
                finally:
                    manager_done.set()

            await nursery.start(run_manager)
            # what agentd finds in its cluster, reported to kasd at the first tunnel and when it changes
            # (its own connection to the API server: the proxy's pool is the requests')
            reporter = ClusterReporter(manager, pool_fetch(discovery_pool), config.namespaces,
                                       interval=config.discovery_interval)
            if config.discovery_interval > 0:
                nursery.start_soon(reporter.run)
            running = RunningAgent(health_address=health, manager=manager, pool=pool, proxy=proxy,
                                   stop_event=stop_event, streams=streams, events=events, services=services,
                                   reporter=reporter, api_server=api_server, receptive=receptive,
                                   health_tls=health_tls)
            sd_notify("READY=1")
            nursery.start_soon(_after_first_tunnel, manager, config.ready_file, health)
            task_status.started(running)
            await stop_event.wait()
            log.info("agentd stopping: no more dials, draining in-flight streams grace=%.1fs", config.shutdown_grace)
            sd_notify("STOPPING=1")
            proxy.drain.begin()
            events.draining = True
            manager.stop()
            # The manager returns once drained (bounded by its grace); then the rest (health) goes.
            await manager_done.wait()
            nursery.cancel_scope.cancel()
    finally:
        with trio.move_on_after(1, shield=True):
            await pool.aclose()
            await services.aclose()
            await discovery_pool.aclose()
            await check_pool.aclose()
    log.info("agentd stopped")


async def _after_first_tunnel(manager: ConnectionManager, ready_file: Path | None, health: tuple[str, int]) -> None:
    await manager.first_up.wait()
    if ready_file is not None:
        host, port = health
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        write_ready_file(ready_file, {"health": f"{shown}:{port}"})
    # systemd shows this; tests use it to know the ready file is there.
    sd_notify("STATUS=connected to kasd")

