"""Running kasd: every listener, the registry, and the graceful drain on shutdown.

    runtime = await nursery.start(serve_kasd, config)   # listening once this returns
    runtime.request_shutdown()                           # what SIGTERM does

``serve_kasd`` puts named parts together, each whole before anything uses it: the store, the
authority, the listeners bound with their caps (``kasd.listening``), the replication among
replicas, the router (``LocalRouter``, or ``ReplicatedRouter`` over it), the pipeline, one server per
port; then it waits for the shutdown and drains (``kasd.drain``).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import attrs
import trio

from daemonkit.listeners import REFUSAL_LOG_INTERVAL
from daemonkit.logs import BurstLimitedLog
from daemonkit.notify import sd_notify, write_ready_file
from h2trio.budget import ResetBuckets
from kasd.agentclient import AgentRequestError
from kasd.agents import AgentAuthenticator, AgentSessions
from kasd.authority import CiAuthority, config_loader
from kasd.config import Config, plaintext_peer_secret
from kasd.discovery import AgentPods, ClusterInfoIntake
from kasd.drain import DrainDeadlines, drain_alone, drain_replica
from kasd.environments import EnvironmentViews
from kasd.eventdelivery import EventDelivery
from kasd.k8sproxy.pipeline import DROPPED, RequestPipeline
from kasd.k8sproxy.server import ProxyServer, configure_alpn
from kasd.listening import (
    StoppableListener,
    bind_listeners,
    listener_admission,
    listener_names,
    listener_ssl_context,
    warn_plaintext,
)
from kasd.managed.client import AgentClient
from kasd.managed.provisioner import AgentProvisioner, ProvisionLimits
from kasd.metrics import Metrics, event_metrics
from kasd.observability import ObservabilityServer, Readiness
from kasd.receptive import ReceptiveDialer
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
from kasd.store.deployments import DeploymentRecorder
from kasd.store.environments import EnvironmentSlugs
from kasd.store.finished import FinishedJobs
from kasd.store.made import MadeObjects
from kasd.store.protocol import EventStore, Store
from kasd.store.revocation import Revocations, open_store
from kasd.web.dashboard import dashboard_routes
from kasd.web.events import EventsApi
from kasd.web.gitconfig import config_routes
from kasd.web.services import ServiceDispatch, ServiceRoutes
from kasd.web.wiring import api_app
from netio.admission import Admission
from netio.tlsreload import reload_all
from routing.local import BreakerPolicy, LocalRouter, TunnelRegistry
from routing.peers import PEER_LIMITS, PEER_PATH, PeerForwarder, PeerPool, peer_authenticator
from routing.placement import PlacementHook, PlacementNotices
from routing.router import ReplicatedRouter
from tunnelhttp.kinds import KIND_CLUSTER_INFO
from wire.h2carrier import serve_h2_tunnels, server_ssl_context
from wire.session import MuxStream

if TYPE_CHECKING:  # (routing.membership pulls in coredis: only a kasd with routing.redis.url loads it)
    from kasd.gitrefresh import RefreshFanout
    from routing.membership import Member

log = logging.getLogger("kasd")


@attrs.define(kw_only=True, eq=False)
class Runtime:
    """A running kasd: where it listens and what it holds (for tests and the main loop)."""

    config: Config
    registry: TunnelRegistry
    metrics: Metrics
    health: Readiness
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
    #: the store (finished jobs, environments and their deployment history)
    store: Store | None = None
    #: what records each CI job's deployments into the store
    recorder: DeploymentRecorder | None = None
    #: environments, live (the API port's web app): discovery and the shared watch sets
    views: EnvironmentViews | None = None
    #: events pushed to agents: posted on the API port, delivered from the store's queues
    events: EventDelivery | None = None
    #: every TLS context of the listeners and the peer pool (each reads its files again when they change)
    tls: list[ssl.SSLContext] = attrs.field(factory=list)
    #: kasd's dials to receptive agents (their TLS files are reloaded with the rest)
    receptive: ReceptiveDialer | None = None
    _shutdown: trio.Event = attrs.field(factory=trio.Event)

    def request_shutdown(self) -> None:
        self._shutdown.set()

    def reload_tls(self) -> None:
        """Look at every TLS file now (SIGHUP): new connections get what changed."""
        reload_all(self.tls)
        if self.receptive is not None:
            self.receptive.reload()

    def tls_contexts(self) -> list[ssl.SSLContext | None]:
        """Every TLS context that reads its files again: the listeners', the peers', the receptive agents'."""
        receptive = self.receptive.credentials.values() if self.receptive is not None else ()
        return [*self.tls, *(credentials.tls for credentials in receptive)]

    def port(self, name: str) -> int:
        return int(self.addresses[name].rsplit(":", 1)[1])

    @property
    def agent_url(self) -> str:
        return agent_url(self.config, self.addresses)


def agent_url(config: Config, addresses: dict[str, str]) -> str:
    """What agentd dials to reach this kasd, from the agent listener's bound address."""
    scheme = "https" if config.agent.tls else "http"
    return f"{scheme}://{addresses['agent']}{config.agent.path}"


async def serve_kasd(config: Config, *, replication: ReplicationFactory | None = None,
                     placement: PlacementHook | None = None,
                     reread: Callable[[], tuple[Config, Path | None]] | None = None,
                     store: Store | None = None,
                     task_status: trio.TaskStatus[Runtime] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve until ``request_shutdown()``; then drain (bounded by ``shutdown_timeout``) and return.

    Among replicas (``routing.redis.url``, or ``replication`` given: tests share an in-memory
    membership and directory between runtimes this way) it also serves the private port and routes
    with ``ReplicatedRouter``. ``placement`` is the hook for home-placement notices to agents.
    ``store``: where finished jobs are kept (default: as the configuration says, ``open_store``).
    ``reread``: kasd's configuration read again (its file, environment and flags), for reloads;
    without it (tests) a reload reads the agents' config.yaml and key files again only."""
    warn_plaintext(config, listener_names(config, replicated=False))  # (a ConfigError beyond loopback unasked)
    agent_tls = listener_ssl_context(config.agent, "agent")
    proxy_tls = listener_ssl_context(config.kubernetes_api, "kubernetes_api")
    api_tls = listener_ssl_context(config.listeners.api, "api")
    observability_tls = listener_ssl_context(config.observability, "observability")
    private_tls = private_server_ssl(config) if replication is not None or config.routing.replicated else None
    peer_tls = peer_client_ssl(config) if replication is not None or config.routing.replicated else None
    if replication is None and config.routing.replicated:
        replication = redis_replication(config)
    registry = TunnelRegistry(breaker=BreakerPolicy(initial=config.routing.breaker_initial_hold,
                                                    maximum=config.routing.breaker_max_hold))
    metrics = Metrics(registry)
    health = Readiness()
    local = LocalRouter(registry, agent_wait_timeout=config.agent_wait_timeout)
    finished = FinishedJobs()
    metrics.finished_jobs.set_function(lambda: len(finished))
    stop = trio.Event()  # the listeners stop accepting

    async with _store(config, store) as kept:
        authority = await CiAuthority.open(config_loader(reread or (lambda: (config, None)), running=config), metrics,
                                           finished=finished, environments=EnvironmentSlugs(kept))
        names = listener_names(config, replicated=replication is not None)
        bound = await bind_listeners(config, names)
        addresses = bound.addresses
        # The HTTP/2 reset budgets per source; a source that spent one is turned away at accept until
        # it refills (its next connection would cost a TLS handshake, then end at its first reset).
        # The private port is a stranger's port too: its own caps and budget, before TLS.
        resets: dict[str, ResetBuckets] = {name: ResetBuckets(getattr(config.listeners, name).http2.reset_limit)
                  for name in ("kubernetes_api", "private") if name in names}
        admissions = _admissions(config, names, metrics, resets)
        listeners = {name: [admissions[name].listener(s) for s in bound.sockets[name]] for name in names}

        def stoppable(name: str) -> list[StoppableListener]:
            return [StoppableListener(listener, stop) for listener in listeners.get(name, [])]

        me = identity(config, addresses, agent_url(config, addresses)) if replication is not None else None
        # The replication (its Redis connection and its tasks) opens before the nursery and closes after it.
        async with _opened(replication, me) as replicas, trio.open_nursery() as nursery:
            await nursery.start(kept.run, finished)
            # each CI job's use of an agent for its environment, written to the store by one task
            recorder = DeploymentRecorder(kept, project_id=lambda path: _project_id(authority, path),
                                          count=lambda outcome: metrics.deployment_records.labels(outcome).inc())
            await nursery.start(recorder.run)
            router: Router = local
            pool = None
            if replicas is not None:
                assert me is not None
                pool = await _join(nursery, config, replicas, me, addresses, peer_tls)
                router = ReplicatedRouter(local, membership=replicas.membership, directory=replicas.directory,
                                          pool=pool, on_forward=lambda _peer: metrics.forwarded_out.inc())
            # Managed namespaces go through the same router as the jobs' requests, as the agent itself,
            # within the deadlines given here (each request to the agent, one plan in all).
            provisioner = AgentProvisioner(AgentClient(router), limits=ProvisionLimits(), made=MadeObjects(kept))
            pipeline = RequestPipeline(
                authority, router, metrics,
                dropped_headers=DROPPED.also(config.kubernetes_api.strip_request_headers),
                max_requests_per_principal=config.kubernetes_api.max_requests_per_principal,
                provisioner=provisioner, recorder=recorder,
            )
            proxy = ProxyServer(pipeline, metrics, config.kubernetes_api,
                                ssl_context=configure_alpn(proxy_tls) if proxy_tls else None,
                                reset_buckets=resets["kubernetes_api"])
            runtime = Runtime(config=config, registry=registry, metrics=metrics, health=health, proxy=proxy,
                              authority=authority, addresses=addresses, router=router, replication=replicas,
                              pool=pool, admissions=admissions, revocations=Revocations(kept, finished),
                              provisioner=provisioner, store=kept, recorder=recorder,
                              tls=[c for c in (agent_tls, proxy_tls, api_tls, private_tls, peer_tls, observability_tls)
                                   if c is not None])
            if replicas is not None:
                assert me is not None and pool is not None
                forwarder = runtime.forwarder = PeerForwarder(
                    local, drain=pipeline.drain, name=me.name, on_forward=metrics.forwarded_in.inc,
                    unexpected=metrics.unexpected_errors("private", logging.getLogger("routing.peers")))
                _watch_replicas(metrics, health, replicas, pool, forwarder)
                await nursery.start(_serve_private, config, forwarder, stoppable("private"), private_tls, metrics)
                if placement is None:
                    placement = PlacementNotices(replicas.membership)
            # each tunnel's record and each pod's cluster report, for every replica to list
            pods = AgentPods(kept, registry, me.name if me is not None else addresses["kubernetes_api"])
            await nursery.start(pods.run)
            sessions = AgentSessions(registry, directory=replicas.directory if replicas is not None else None,
                                     placement=placement,
                                     incoming={KIND_CLUSTER_INFO: ClusterInfoIntake(pods).handle}, pods=pods)
            await nursery.start(_serve_agents, config, sessions, authority, stoppable("agent"), agent_tls, metrics)
            # receptive agents: kasd dials them (this replica: those it is home for), same sessions
            runtime.receptive = ReceptiveDialer(
                config.agents, sessions=sessions, authenticate=AgentAuthenticator(lambda: authority.loaded.agents),
                membership=replicas.membership if replicas is not None else None, stop=stop,
                handshake_timeout=config.agent.handshake_timeout, session_kwargs=config.agent.session_keepalive)
            nursery.start_soon(runtime.receptive.run)
            metrics.enable_tls_reloads(runtime.tls_contexts)
            await nursery.start(trio.serve_listeners, proxy.handle_connection, stoppable("kubernetes_api"))
            nursery.start_soon(authority.watch)
            refresh = authority.refresh  # (among replicas: here and, through Redis, on the others)
            if replicas is not None and config.routing.redis.url is not None:
                assert me is not None
                refresh = (await nursery.start(_refresh_fanout, config, authority, me.name)).refresh
            if "api" in names:
                rest = RestApi(lambda: authority.snapshot, provisioner, stop_time_limit=STOP_TIME_LIMIT,
                               revocations=runtime.revocations,
                               environments=authority.environments, history=kept)
                # Environments, live: one set of watches per environment and viewer identity, through
                # the same router as every request, for the web app (REST API, SSE, dashboard).
                views = runtime.views = EnvironmentViews(router)
                metrics.enable_environment_views(views.statistics)
                await nursery.start(views.run)
                events = _events(config, kept, router, registry, metrics, me)
                if events is not None:
                    runtime.events = events
                    await nursery.start(events.run)
                    nursery.start_soon(events.watch_connections, registry.sessions_changed,
                                       lambda: {t.agent_id for t in registry.tunnels()})
                event_routes = EventsApi(lambda: authority.snapshot, events, counts=event_metrics(metrics)).routes() \
                    if events is not None else []
                api = api_app(rest, config, lambda: authority.snapshot, kept, views, registry,
                              me.name if me is not None else addresses["kubernetes_api"],
                              agent_errors=(AgentRequestError,),
                              extra_routes=[*dashboard_routes(), *config_routes(authority, refresh=refresh),
                                            *event_routes],
                              directory=replicas.directory if replicas is not None else None, pods=pods)
                # In-cluster services (and PromQL): the proxy's pipeline, before the app.
                services = ServiceDispatch(pipeline, ServiceRoutes(lambda: authority.snapshot))
                await nursery.start(partial(serve_api, api, stoppable("api"), ssl_context=api_tls,
                                            unexpected=metrics.unexpected_errors("api", logging.getLogger("kasd.api")),
                                            bypass=services))
            observability = ObservabilityServer(health, metrics, max_connections=config.observability.max_connections,
                                                ssl_context=observability_tls)
            await nursery.start(trio.serve_listeners, observability.handle_connection, listeners["observability"])
            _announce(runtime)
            task_status.started(runtime)
            await _drain_at_shutdown(runtime, stop, placement)
            nursery.cancel_scope.cancel()
    log.info("kasd stopped")


async def _drain_at_shutdown(runtime: Runtime, stop: trio.Event, placement: PlacementHook | None) -> None:
    """Wait for ``request_shutdown()``; then stop accepting and drain within the configured deadlines."""
    config, proxy, registry = runtime.config, runtime.proxy, runtime.registry
    await runtime._shutdown.wait()
    sd_notify("STOPPING=1")
    log.info("kasd draining timeout=%gs connections=%d sessions=%d", config.shutdown_timeout, proxy.connections,
             registry.statistics().sessions)
    runtime.health.start_draining()
    stop.set()
    deadlines = DrainDeadlines(total=config.shutdown_timeout, redis=config.routing.leave_timeout)
    if runtime.replication is not None:
        assert runtime.forwarder is not None
        await drain_replica(proxy, registry, deadlines, replicas=runtime.replication, forwarder=runtime.forwarder,
                            placement=placement)
    else:
        await drain_alone(proxy, registry, deadlines)


def _admissions(config: Config, names: tuple[str, ...], metrics: Metrics,
                resets: dict[str, ResetBuckets]) -> dict[str, Admission]:
    """Every listener's connections are counted here, once, at accept: before TLS or any parsing."""
    refusals = BurstLimitedLog(logging.getLogger("kasd.listeners"), interval=REFUSAL_LOG_INTERVAL)
    return {name: listener_admission(name, getattr(config.listeners, name), metrics, refusals, resets.get(name))
            for name in names}


async def _join(nursery: trio.Nursery, config: Config, replicas: Replication, me: Member,
                addresses: dict[str, str], peer_tls: ssl.SSLContext | None) -> PeerPool:
    """Among replicas: run the membership and the directory, and the pool of sessions to peers."""
    await nursery.start(replicas.membership.run)
    await nursery.start(replicas.directory.run)
    if plaintext_peer_secret(config):  # the config check let it pass: insecure_plaintext is set
        log.warning("the peer secret crosses the network in clear: listeners.private has no TLS and "
                    "listeners.private.insecure_plaintext is true; whoever reads it there has every agent's "
                    "rights private=%s", addresses["private"])
    pool = PeerPool(token=peer_token(config), ssl_context=peer_tls, origin=me.name,
                    insecure_plaintext=config.private.insecure_plaintext, **config.private.session_keepalive)
    await nursery.start(pool.run)
    nursery.start_soon(_forget_departed, replicas, pool)
    return pool


def _watch_replicas(metrics: Metrics, health: Readiness, replicas: Replication, pool: PeerPool,
                    forwarder: PeerForwarder) -> None:
    """The replicas' gauges, and readiness's word when Redis is away."""
    metrics.enable_replicas(redis_up=lambda: replicas.healthy,
                            peers_out=lambda: pool.statistics().sessions,
                            peers_in=lambda: len(forwarder.sessions))
    health.degraded = _degraded(replicas)


async def _serve_private(config: Config, forwarder: PeerForwarder, listeners: list[StoppableListener],
                         private_tls: ssl.SSLContext | None, metrics: Metrics, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
    """The private port: peers' forwarded requests, authenticated by the peer secret or mutual TLS."""
    secret = config.routing.peer_secret_file
    await serve_h2_tunnels(
        forwarder,
        listeners,
        authenticate=peer_authenticator(secret.value if secret is not None else None),
        path=PEER_PATH,
        ssl_context=server_ssl_context(private_tls) if private_tls else None,
        handshake_timeout=config.private.handshake_timeout,
        reset_limit=config.private.http2.reset_limit,
        session_kwargs={"limits": PEER_LIMITS, "name": "peer", **config.private.session_keepalive},
        unexpected=metrics.unexpected_errors("private", logging.getLogger("wire.h2carrier")),
        task_status=task_status,
    )


async def _serve_agents(config: Config, sessions: AgentSessions, authority: CiAuthority,
                        listeners: list[StoppableListener], tls: ssl.SSLContext | None, metrics: Metrics, *,
                        task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
    """The agent port: agentd's tunnels, authenticated by the agents' tokens."""
    await serve_h2_tunnels(
        sessions,
        listeners,
        authenticate=AgentAuthenticator(lambda: authority.loaded.agents),
        path=config.agent.path,
        ssl_context=server_ssl_context(tls, websocket=True) if tls else None,
        handshake_timeout=config.agent.handshake_timeout,
        reset_limit=config.agent.http2.reset_limit,
        session_kwargs=config.agent.session_keepalive,
        unexpected=metrics.unexpected_errors("agent", logging.getLogger("wire.h2carrier")),
        websocket=True,  # agentd's tunnel over HTTP/2 or, by upgrade on the same path, a WebSocket
        task_status=task_status,
    )


def _announce(runtime: Runtime) -> None:
    """Ready: readiness, the ready file, systemd, and the log line saying where kasd listens."""
    config, addresses = runtime.config, runtime.addresses
    runtime.health.ready = True
    if config.ready_file is not None:
        write_ready_file(config.ready_file, addresses)
    sd_notify("READY=1")
    log.info(
        "kasd listening agent=%s observability=%s kubernetes_api=%s agents=%d%s",
        addresses["agent"],
        addresses["observability"],
        addresses["kubernetes_api"],
        len(config.agents),
        (f" private={addresses['private']} replica={runtime.replication.membership.self_name}"
         if runtime.replication is not None else "") + (f" api={addresses['api']}" if "api" in addresses else ""),
    )


@asynccontextmanager
async def _opened(replication: ReplicationFactory | None, me: Member | None) -> AsyncIterator[Replication | None]:
    if replication is None:
        yield None
        return
    assert me is not None
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


async def _refresh_fanout(config: Config, authority: CiAuthority, name: str, *,
                          task_status: trio.TaskStatus[RefreshFanout] = trio.TASK_STATUS_IGNORED) -> None:
    """A config refresh asked of this replica reaches the others (``kasd.gitrefresh``: imported
    here, as coredis is only by a kasd with ``routing.redis.url``)."""
    from kasd.gitrefresh import refresh_fanout

    redis = config.routing.redis
    assert redis.url is not None
    async with refresh_fanout(authority, redis.url, password=redis.password, name=name,
                              key_prefix=redis.key_prefix) as fanout:
        task_status.started(fanout)
        await trio.sleep_forever()
def _events(config: Config, store: Store, router: Router, registry: TunnelRegistry, metrics: Metrics,
            me: Member | None) -> EventDelivery | None:
    """Events pushed to agents (``kasd.eventdelivery``), delivered preferably by the replica holding
    the agent's tunnel; None when the store given keeps no events (a test's)."""
    if not hasattr(store, "post_event"):
        return None

    def pod_of(stream: MuxStream) -> str | None:
        return next((t.pod_name or None for t in registry.tunnels() if t.session is stream.session), None)

    return EventDelivery(cast(EventStore, store), router, config.events, owner=me.name if me is not None else "kasd",
                         holds=lambda agent_id: any(True for _ in registry.tunnels(agent_id)), pod_of=pod_of,
                         counts=event_metrics(metrics))


def _project_id(authority: CiAuthority, path: str) -> int | None:
    """A project's id from the directory in force (for job tokens that carry none)."""
    project = authority.snapshot.directory.project(path)
    return project.id if project is not None else None


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
