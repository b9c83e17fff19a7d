"""Running kasd: every listener, the registry, and the graceful drain on shutdown.

    runtime = await nursery.start(serve_kasd, config)   # listening once this returns
    runtime.request_shutdown()                           # what SIGTERM does
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio

from daemonkit.listeners import REFUSAL_LOG_INTERVAL, capped_admission
from daemonkit.logs import BurstLimitedLog
from daemonkit.notify import sd_notify, write_ready_file
from h2trio.budget import ResetBuckets
from kasd.agents import AgentAuthenticator, AgentSessions
from kasd.authority import CiAuthority, config_loader
from kasd.config import Config, ConfigError, Listener, plaintext_peer_secret
from kasd.k8sproxy.pipeline import DROPPED, RequestPipeline
from kasd.k8sproxy.server import ProxyServer, configure_alpn
from kasd.managed.client import AgentClient
from kasd.managed.provisioner import AgentProvisioner, ProvisionLimits
from kasd.metrics import Metrics
from kasd.observability import Health, ObservabilityServer
from kasd.replicas import (
    Replication,
    ReplicationFactory,
    identity,
    peer_client_ssl,
    peer_token,
    private_server_ssl,
    redis_replication,
)
from kasd.restapi import STOP_TIME_LIMIT, RestApi, serve_api
from kasd.seams import Router
from kasd.store.environments import EnvironmentSlugs
from kasd.store.finished import FinishedJobs
from kasd.store.made import MadeObjects
from kasd.store.protocol import Store
from kasd.store.revocation import Revocations, open_store
from netio.admission import PER_SOURCE, TOTAL, Admission, CappedListener, ConnectionCaps, Refusal
from routing.local import BreakerPolicy, LocalRouter, TunnelRegistry
from routing.peers import PEER_LIMITS, PEER_PATH, PeerForwarder, PeerPool, peer_authenticator
from routing.placement import PlacementHook, PlacementNotices
from routing.router import ReplicatedRouter
from wire.h2carrier import serve_h2_tunnels, server_ssl_context

log = logging.getLogger("kasd")

#: the refusal reason (and metric label) of a source that spent its HTTP/2 reset budget
RESET_BUDGET = "reset_budget"


@attrs.define(kw_only=True, eq=False)
class Runtime:
    """A running kasd: where it listens and what it holds (for tests and the main loop)."""

    config: Config
    registry: TunnelRegistry
    metrics: Metrics
    health: Health
    proxy: ProxyServer
    #: who may use which agent (``reload()`` on SIGHUP; ``watch`` reloads on file changes)
    authority: CiAuthority
    #: "agent", "observability", "kubernetes_api" (and "private" among replicas) → "host:port" bound
    addresses: dict[str, str] = attrs.field(factory=dict)
    #: the router the proxy asks (``LocalRouter``, or ``ReplicatedRouter`` among replicas)
    router: Router | None = None
    #: among replicas: membership and directory, the peer pool, the private port's forwarder
    replication: Replication | None = None
    pool: PeerPool | None = None
    forwarder: PeerForwarder | None = None
    #: the same names → the connection caps of that listener (open connections, refusals)
    admissions: dict[str, Admission] = attrs.field(factory=dict)
    #: the finished jobs (the store, and this replica's view of it)
    revocations: Revocations | None = None
    #: managed namespaces: made before a job's first request, deleted by the environment's stop
    provisioner: AgentProvisioner | None = None
    _shutdown: trio.Event = attrs.field(factory=trio.Event)

    def request_shutdown(self) -> None:
        self._shutdown.set()

    @property
    def shutdown_requested(self) -> bool:
        return self._shutdown.is_set()

    def port(self, name: str) -> int:
        return int(self.addresses[name].rsplit(":", 1)[1])

    @property
    def agent_url(self) -> str:
        scheme = "https" if self.config.agent.tls else "http"
        return f"{scheme}://{self.addresses['agent']}{self.config.agent.path}"


class StoppableListener(trio.abc.Listener[trio.abc.Stream]):
    """Stops accepting (and closes the socket) once ``stop`` is set, without failing ``serve_listeners``."""

    def __init__(self, inner: CappedListener, stop: trio.Event) -> None:
        self.inner = inner
        self.stop = stop

    @property
    def socket(self) -> Any:
        return self.inner.socket

    async def accept(self) -> trio.abc.Stream:
        async with trio.open_nursery() as nursery:
            accepted: list[trio.abc.Stream] = []

            async def accept_one() -> None:
                accepted.append(await self.inner.accept())
                nursery.cancel_scope.cancel()

            async def wait_stop() -> None:
                await self.stop.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(accept_one)
            nursery.start_soon(wait_stop)
        if accepted:
            return accepted[0]
        await self.inner.aclose()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self.inner.aclose()


def _ssl_context(listener: Listener, name: str) -> ssl.SSLContext | None:
    if listener.tls is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(str(listener.tls.cert), str(listener.tls.key))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"listeners.{name}.tls: cannot load certificate/key: {exc}") from None
    return ctx


def _admission(name: str, listener: Listener, metrics: Metrics, refusals: BurstLimitedLog,
               reset_buckets: ResetBuckets | None = None) -> Admission:
    """The connection caps of one listener, each refusal counted in the metrics and (a few lines
    under a flood) in the log."""
    caps = ConnectionCaps(
        max_connections=listener.max_connections,
        max_per_source=min(listener.max_connections_per_source, listener.max_connections),
    )
    reasons = (TOTAL, PER_SOURCE, RESET_BUDGET) if reset_buckets is not None else (TOTAL, PER_SOURCE)
    counters = {reason: metrics.connections_refused.labels(listener=name, reason=reason) for reason in reasons}
    gate = None
    if reset_buckets is not None:
        buckets = reset_buckets

        def gate(source: str) -> str | None:
            return RESET_BUDGET if buckets.barred(source, trio.current_time()) else None

    def count(refusal: Refusal) -> None:
        counters[refusal.reason].inc()

    admission = capped_admission(caps, listener=name, log=refusals, count=count, gate=gate)

    def open_connections() -> int:
        return admission.statistics().connections

    metrics.listener_connections.labels(listener=name).set_function(open_connections)
    return admission


def _bound(listeners: list[trio.SocketListener]) -> str:
    host, port = listeners[0].socket.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve_kasd(config: Config, *, replication: ReplicationFactory | None = None,
                     placement: PlacementHook | None = None,
                     reread: Callable[[], tuple[Config, Path | None]] | None = None,
                     store: Store | None = None,
                     task_status: trio.TaskStatus[Runtime] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve until ``request_shutdown()``; then drain (bounded by ``shutdown_timeout``) and return.

    Among replicas (``routing.redis.url``, or ``replication`` given: tests share an in-memory
    membership and directory between runtimes this way) it also serves the private port and routes
    with ``ReplicatedRouter``. ``placement`` is the hook for home-placement notices to agents.
    ``store``: where finished jobs are kept (default: as the configuration says, ``open_store``)."""
    agent_tls = _ssl_context(config.agent, "agent")
    proxy_tls = _ssl_context(config.kubernetes_api, "kubernetes_api")
    if replication is None and config.routing.replicated:
        replication = redis_replication(config)
    replicated = replication is not None
    registry = TunnelRegistry(breaker=BreakerPolicy(initial=config.routing.breaker_initial_hold,
                                                    maximum=config.routing.breaker_max_hold))
    metrics = Metrics(registry)
    health = Health()
    local = LocalRouter(registry, agent_wait_timeout=config.agent_wait_timeout)
    # Among replicas the router is made once the listeners are bound (this replica's name is known).
    router = _LateRouter(local)
    # ``reread``: kasd's configuration read again (its file, environment and flags), for reloads;
    # without it (tests) a reload reads the agents' config.yaml and key files again only.
    finished = FinishedJobs()
    metrics.finished_jobs.set_function(lambda: len(finished))
    authority = await CiAuthority.open(config_loader(reread or (lambda: (config, None)), running=config), metrics,
                                       finished=finished)
    # Managed namespaces go through the same router as the jobs' requests, as the agent itself,
    # within the deadlines given here (each request to the agent, one plan in all).
    provisioner = AgentProvisioner(AgentClient(router), limits=ProvisionLimits())
    pipeline = RequestPipeline(
        authority, router, metrics,
        dropped_headers=DROPPED.also(config.kubernetes_api.strip_request_headers),
        max_requests_per_principal=config.kubernetes_api.max_requests_per_principal,
        provisioner=provisioner,
    )
    # The proxy's HTTP/2 reset budget per source; a source that spent it is turned away at accept
    # until it refills (its next connection would cost a TLS handshake, then end at its first reset).
    reset_buckets = ResetBuckets(config.kubernetes_api.http2.reset_limit)
    proxy = ProxyServer(
        pipeline,
        metrics,
        config.kubernetes_api,
        ssl_context=configure_alpn(proxy_tls) if proxy_tls else None,
        reset_buckets=reset_buckets,
    )
    runtime = Runtime(config=config, registry=registry, metrics=metrics, health=health, proxy=proxy, router=local,
                      authority=authority, provisioner=provisioner)
    stop = trio.Event()

    async def listen(name: str, listener: Listener) -> list[trio.SocketListener]:
        try:
            return await trio.open_tcp_listeners(listener.port, host=listener.host)
        except OSError as exc:
            message = f"cannot listen on {listener.address} (the {name} listener): {exc.strerror or exc}"
            raise OSError(exc.errno, message) from None

    agent_sockets = await listen("agent", config.agent)
    proxy_sockets = await listen("kubernetes_api", config.kubernetes_api)
    obs_sockets = await listen("observability", config.observability)
    private_sockets = await listen("private", config.private) if replicated else []
    api_on = config.listeners.api.address is not None
    api_sockets = await listen("api", config.listeners.api) if api_on else []
    runtime.addresses = {
        "agent": _bound(agent_sockets),
        "observability": _bound(obs_sockets),
        "kubernetes_api": _bound(proxy_sockets),
    }
    if replicated:
        runtime.addresses["private"] = _bound(private_sockets)
    if api_on:
        runtime.addresses["api"] = _bound(api_sockets)
    # Every listener's connections are counted here, once, at accept: before TLS or any parsing.
    refusals = BurstLimitedLog(logging.getLogger("kasd.listeners"), interval=REFUSAL_LOG_INTERVAL)
    # The private port is a stranger's port too: its own caps and an HTTP/2 reset budget, before TLS.
    private_resets = ResetBuckets(config.private.http2.reset_limit) if replicated else None
    runtime.admissions = {
        name: _admission(name, getattr(config.listeners, name), metrics, refusals,
                         {"kubernetes_api": reset_buckets, "private": private_resets}.get(name))
        for name in ("agent", "observability", "kubernetes_api", *(("private",) if replicated else ()),
                     *(("api",) if api_on else ()))
    }
    agent_listeners = [StoppableListener(runtime.admissions["agent"].listener(s), stop) for s in agent_sockets]
    proxy_listeners = [StoppableListener(runtime.admissions["kubernetes_api"].listener(s), stop) for s in proxy_sockets]
    obs_listeners = [runtime.admissions["observability"].listener(s) for s in obs_sockets]
    private_listeners = [StoppableListener(runtime.admissions["private"].listener(s), stop) for s in private_sockets]
    api_tls = _ssl_context(config.listeners.api, "api")
    api_listeners = [StoppableListener(runtime.admissions["api"].listener(s), stop) for s in api_sockets]

    directory = None
    me = identity(config, runtime.addresses, runtime.agent_url) if replication is not None else None
    # The replication (its Redis connection and its tasks) opens before the nursery and closes after it.
    async with _opened(replication, me) as opened, _store(config, store) as kept, trio.open_nursery() as nursery:
        await nursery.start(kept.run, finished)
        runtime.revocations = Revocations(kept, finished)
        authority.environments = EnvironmentSlugs(kept)
        provisioner.made = MadeObjects(kept)
        if opened is not None:
            assert me is not None
            replicas = runtime.replication = opened
            directory = replicas.directory
            await nursery.start(replicas.membership.run)
            await nursery.start(replicas.directory.run)
            if plaintext_peer_secret(config):  # the config check let it pass: insecure_plaintext is set
                log.warning("the peer secret crosses the network in clear: listeners.private has no TLS and "
                            "listeners.private.insecure_plaintext is true; whoever reads it there has every agent's "
                            "rights private=%s", runtime.addresses["private"])
            pool = runtime.pool = PeerPool(token=peer_token(config), ssl_context=peer_client_ssl(config),
                                           origin=me.name, insecure_plaintext=config.private.insecure_plaintext)
            await nursery.start(pool.run)
            nursery.start_soon(_forget_departed, replicas, pool)
            runtime.router = router.inner = ReplicatedRouter(
                local, membership=replicas.membership, directory=replicas.directory, pool=pool,
                on_forward=lambda _peer: metrics.forwarded_out.inc(),
            )
            forwarder = runtime.forwarder = PeerForwarder(
                local, drain=pipeline.drain, name=me.name, on_forward=metrics.forwarded_in.inc,
                unexpected=metrics.unexpected_errors("private", logging.getLogger("routing.peers")))
            metrics.enable_replicas(redis_up=lambda: replicas.healthy,
                                    peers_out=lambda: pool.statistics().sessions,
                                    peers_in=lambda: len(forwarder.sessions))
            health.degraded = _degraded(replicas)
            private_tls = private_server_ssl(config)
            await nursery.start(
                lambda task_status: serve_h2_tunnels(
                    forwarder,
                    private_listeners,
                    authenticate=peer_authenticator(
                        config.routing.peer_secret_file.value if config.routing.peer_secret_file else None),
                    path=PEER_PATH,
                    ssl_context=server_ssl_context(private_tls) if private_tls else None,
                    handshake_timeout=config.private.handshake_timeout,
                    reset_limit=config.private.http2.reset_limit,
                    session_kwargs={"limits": PEER_LIMITS, "name": "peer"},
                    unexpected=metrics.unexpected_errors("private", logging.getLogger("wire.h2carrier")),
                    task_status=task_status,
                )
            )
        if placement is None and runtime.replication is not None:
            placement = PlacementNotices(runtime.replication.membership)
        agent_sessions = AgentSessions(registry, directory=directory, placement=placement)
        await nursery.start(
            lambda task_status: serve_h2_tunnels(
                agent_sessions,
                agent_listeners,
                authenticate=AgentAuthenticator(lambda: authority.loaded.agents),
                path=config.agent.path,
                ssl_context=server_ssl_context(agent_tls) if agent_tls else None,
                handshake_timeout=config.agent.handshake_timeout,
                reset_limit=config.agent.http2.reset_limit,
                unexpected=metrics.unexpected_errors("agent", logging.getLogger("wire.h2carrier")),
                task_status=task_status,
            )
        )
        await nursery.start(trio.serve_listeners, proxy.handle_connection, proxy_listeners)
        nursery.start_soon(authority.watch)
        if api_listeners:
            await nursery.start(partial(serve_api, RestApi(lambda: authority.snapshot, provisioner,
                                                           stop_time_limit=STOP_TIME_LIMIT,
                                                           revocations=runtime.revocations,
                                                           environments=authority.environments), api_listeners,
                                        ssl_context=api_tls,
                                        unexpected=metrics.unexpected_errors("api", logging.getLogger("kasd.api"))))
        observability = ObservabilityServer(health, metrics, max_connections=config.observability.max_connections)
        await nursery.start(trio.serve_listeners, observability.handle_connection, obs_listeners)
        health.ready = True
        if config.ready_file is not None:
            write_ready_file(config.ready_file, runtime.addresses)
        sd_notify("READY=1")
        log.info(
            "kasd listening agent=%s observability=%s kubernetes_api=%s agents=%d%s",
            runtime.addresses["agent"],
            runtime.addresses["observability"],
            runtime.addresses["kubernetes_api"],
            len(config.agents),
            (f" private={runtime.addresses['private']} replica={runtime.replication.membership.self_name}"
             if runtime.replication is not None else "") + (f" api={runtime.addresses['api']}" if api_on else ""),
        )
        task_status.started(runtime)

        await runtime._shutdown.wait()
        sd_notify("STOPPING=1")
        log.info("kasd draining timeout=%gs connections=%d sessions=%d", config.shutdown_timeout, proxy.connections, registry.statistics().sessions)
        health.start_draining()
        stop.set()
        if runtime.replication is not None:
            await _drain_replica(runtime, placement)
        else:
            proxy.start_drain()
            with trio.move_on_after(config.shutdown_timeout) as drain_scope:
                await proxy.wait_closed()
                # No proxy request is left: GOAWAY every agent session and let its streams finish.
                async with trio.open_nursery() as drains:
                    for tunnel in registry.tunnels():
                        drains.start_soon(tunnel.session.drain, "kasd is shutting down")
            if drain_scope.cancelled_caught:
                log.warning("drain timed out; closing what is left connections=%d", proxy.connections)
        nursery.cancel_scope.cancel()
    log.info("kasd stopped")


@asynccontextmanager
async def _opened(replication: ReplicationFactory | None, me: Any) -> AsyncIterator[Replication | None]:
    if replication is None:
        yield None
        return
    made = replication(me)
    if isinstance(made, Replication):
        yield made
    else:
        async with made as replicas:
            yield replicas


@asynccontextmanager
async def _store(config: Config, given: Store | None) -> AsyncIterator[Store]:
    if given is not None:
        yield given
        return
    async with open_store(config) as store:
        yield store


class _LateRouter:
    """The pipeline's router: ``LocalRouter`` until (among replicas) the replicated one is made."""

    def __init__(self, inner: Router) -> None:
        self.inner = inner

    async def open_stream(self, agent_id: int, metadata: Any, *, avoid: frozenset[Any] = frozenset()) -> Any:
        return await self.inner.open_stream(agent_id, metadata, avoid=avoid)

    def report(self, stream: Any, refusal: Any) -> None:
        self.inner.report(stream, refusal)


async def _drain_replica(runtime: Runtime, placement: PlacementHook | None) -> None:
    """SIGTERM among replicas (docs/routing.md, "Shutdown of a replica"): the listeners stopped
    already; the others drop this replica from their rings; each agent is told where to go and
    gets GOAWAY (agentd dials the replacement first); proxy requests and streams forwarded here
    finish within ``shutdown_timeout`` (watches end between two events); then this replica leaves."""
    config, registry, proxy = runtime.config, runtime.registry, runtime.proxy
    replicas, forwarder = runtime.replication, runtime.forwarder
    assert replicas is not None and forwarder is not None
    with trio.move_on_after(config.shutdown_timeout) as drain_scope:
        with trio.move_on_after(min(2.0, config.shutdown_timeout / 4)):
            await replicas.membership.set_draining()  # bounded: Redis may be down
        proxy.start_drain()  # and the pipeline's Drain: forwarded watches end at a boundary too

        async def leave_session(session: Any) -> None:
            if placement is not None:
                with trio.move_on_after(1.0):
                    await placement.leaving(session)
            await session.drain("kasd is shutting down")

        async with trio.open_nursery() as drains:
            for tunnel in registry.tunnels():
                drains.start_soon(leave_session, tunnel.session)
            drains.start_soon(forwarder.drain_sessions)
            drains.start_soon(proxy.wait_closed)
    if drain_scope.cancelled_caught:
        log.warning("drain timed out; closing what is left connections=%d forwarded=%d",
                    proxy.connections, forwarder.active)
    with trio.move_on_after(2.0, shield=True):  # bounded: Redis may be away
        await replicas.directory.withdraw()
        await replicas.membership.leave()


async def _forget_departed(replicas: Replication, pool: PeerPool) -> None:
    """Close the pooled session of each member that left."""
    while True:
        await replicas.membership.wait_changed()
        members = replicas.membership.members()
        for name in pool.known() - set(members):
            pool.forget(name)


def _degraded(replicas: Replication) -> Any:
    def reason() -> str | None:
        return None if replicas.healthy else "redis unreachable; serving the agents connected here"

    return reason

