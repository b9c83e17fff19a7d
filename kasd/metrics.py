"""Prometheus metrics of one kasd (its own registry, so several can run in one process in tests)."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from daemonkit.logs import UnexpectedErrors
from netio.tlsreload import reload_counts
from routing.local import TunnelRegistry

CONTENT_TYPE = CONTENT_TYPE_LATEST
#: seconds between two ERROR lines of one kind of unexpected exception (the rest are counted)
UNEXPECTED_LINE_INTERVAL = 60.0


class ViewsFigures(Protocol):
    """What ``kasd.environments.ViewsStatistics`` tells (this module does not import the views)."""

    @property
    def watch_sets(self) -> int: ...
    @property
    def viewers(self) -> int: ...
    @property
    def watches_opened(self) -> int: ...
    @property
    def discoveries(self) -> int: ...
    @property
    def viewers_dropped(self) -> int: ...
    @property
    def snapshots_discovered(self) -> int: ...
    @property
    def snapshots_shared(self) -> int: ...
    @property
    def snapshots_from_views(self) -> int: ...


class _ViewsCollector(Collector):
    def __init__(self, statistics: Callable[[], ViewsFigures]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterator[Metric]:
        stats = self._statistics()
        yield GaugeMetricFamily("kasd_environment_watch_sets", "Live environment views: one set of upstream watches "
                                "per environment and viewer identity, shared by its viewers", value=stats.watch_sets)
        yield GaugeMetricFamily("kasd_environment_viewers", "Viewers of live environment views (SSE streams)",
                                value=stats.viewers)
        yield CounterMetricFamily("kasd_environment_watches_opened", "Upstream WATCH requests the environment views "
                                  "opened through the tunnels", value=stats.watches_opened)
        yield CounterMetricFamily("kasd_environment_discoveries", "Discoveries the live environment views ran "
                                  "(first, after a broken watch, and periodically)", value=stats.discoveries)
        yield CounterMetricFamily("kasd_environment_viewers_dropped", "Viewers dropped for falling behind their "
                                  "environment's updates (their bounded queue was full)", value=stats.viewers_dropped)
        snapshots = CounterMetricFamily("kasd_environment_snapshots", "One-off reads of an environment's objects "
                                        "(REST API), by what answered: a discovery of their own, one another "
                                        "caller ran at the same time (shared), a live view's objects (view)",
                                        labels=["answered_by"])
        snapshots.add_metric(["discovery"], stats.snapshots_discovered)
        snapshots.add_metric(["shared"], stats.snapshots_shared)
        snapshots.add_metric(["view"], stats.snapshots_from_views)
        yield snapshots


#: ``access_type`` label values (GitLab's usage counters ``k8s_api_proxy_requests_via_<type>``): a CI job
#: token (``ci_access``), a personal access token under ``user_access`` (``pat_access``), and ``none``
#: for a request no grant was made for (refused, malformed). A fixed set: never a client's words.
ACCESS_TYPES = ("ci_access", "pat_access", "none")
_ACCESS_TYPE_OF_KIND = {"ci": "ci_access", "pat": "pat_access"}
#: ``status`` of ``kasd_routing_duration_seconds``: a stream found, none within ``agent_wait_timeout``
#: (also counted in ``kasd_routing_timeouts``), another routing failure, the request cancelled meanwhile
ROUTING_STATUSES = ("success", "timeout", "error", "aborted")
#: seconds to find a tunnel: a connected agent's is sub-millisecond, a wait for one is up to
#: ``agent_wait_timeout`` (10 s by default; gitlab-kas waits 20 s)
ROUTING_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)


def access_type(kind: str | None) -> str:
    """The ``access_type`` label of a grant's token ``kind`` (None: no grant)."""
    return _ACCESS_TYPE_OF_KIND.get(kind or "", "none")


def status_class(status: int) -> str:
    """``1xx`` … ``5xx``; anything else (never sent, or out of range) is ``other``."""
    return f"{status // 100}xx" if 100 <= status <= 599 else "other"


class _TunnelsCollector(Collector):
    """This replica's tunnel sessions, read when scraped (a session gone is a series gone): per agent
    the sessions (tunnels), the distinct pods, and each session's breaker."""

    def __init__(self, tunnels: TunnelRegistry) -> None:
        self._tunnels = tunnels

    def collect(self) -> Iterator[Metric]:
        try:
            now = trio.current_time()
        except RuntimeError:  # scraped outside Trio (a test): a breaker with failures counts as open
            now = None
        per_agent = GaugeMetricFamily("kasd_agent_tunnels", "Live tunnel sessions to this replica, per agent "
                                      "(one per agentd connection)", labels=["agent"])
        pods = GaugeMetricFamily("kasd_connected_pods", "Distinct agentd pods with at least one live tunnel "
                                 "session to this replica, per agent", labels=["agent"])
        # ``session``: the session's place among its pod's sessions here, oldest first ("0", "1", …):
        # agentd keeps several (``connections``), and each has a breaker of its own.
        breaker = GaugeMetricFamily("kasd_tunnel_breaker_open", "1 while the session's breaker holds it back (its "
                                    "agent refused a stream: API server unreachable), else 0",
                                    labels=["agent", "pod", "session"])
        failures = GaugeMetricFamily("kasd_tunnel_breaker_failures", "Refusals for an unreachable API server since "
                                     "the session last took a stream (what the breaker's hold doubles with)",
                                     labels=["agent", "pod", "session"])
        sessions: dict[int, int] = {}
        pod_ids: dict[int, set[str]] = {}
        of_pod: dict[tuple[str, str], int] = {}
        live = [tunnel for tunnel in self._tunnels.tunnels() if not tunnel.session.closed]
        for tunnel in sorted(live, key=lambda t: t.connected_at):
            agent = str(tunnel.agent_id)
            sessions[tunnel.agent_id] = sessions.get(tunnel.agent_id, 0) + 1
            pod_ids.setdefault(tunnel.agent_id, set()).add(tunnel.pod_uid or tunnel.pod_name or str(id(tunnel)))
            held = tunnel.held(now) if now is not None else tunnel.failures > 0
            pod = tunnel.pod_name[:63] or "-"
            index = of_pod[agent, pod] = of_pod.get((agent, pod), -1) + 1
            breaker.add_metric([agent, pod, str(index)], 1.0 if held else 0.0)
            failures.add_metric([agent, pod, str(index)], tunnel.failures)
        for agent_id, count in sorted(sessions.items()):
            per_agent.add_metric([str(agent_id)], count)
            pods.add_metric([str(agent_id)], len(pod_ids[agent_id]))
        yield from (per_agent, pods, breaker, failures)


class _TLSReloadsCollector(Collector):
    """``kasd_tls_reloads_total{name,result}``: the TLS files read again since the start, per context
    (a listener's, the peers', a receptive agent's), ``ok`` (a new certificate serves) or ``failed``
    (changed files that did not load: the previous ones still serve). Read when scraped."""

    def __init__(self, contexts: Callable[[], Iterable[ssl.SSLContext | None]]) -> None:
        self._contexts = contexts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("kasd_tls_reloads", "TLS files read again since the start, by context name "
                                     "and result (ok: new connections get them; failed: the previous ones stay)",
                                     labels=["name", "result"])
        for name, (ok, failed) in sorted(reload_counts(self._contexts()).items()):
            family.add_metric([name, "ok"], ok)
            family.add_metric([name, "failed"], failed)
        yield family


class Metrics:
    def __init__(self, tunnels: TunnelRegistry) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        Gauge("kasd_connected_agents", "Agents with at least one live tunnel session", registry=r).set_function(
            lambda: tunnels.statistics().agents
        )
        Gauge("kasd_agent_sessions", "Live tunnel sessions (agentd connections)", registry=r).set_function(
            lambda: tunnels.statistics().sessions
        )
        self.proxy_requests = Counter(
            "kasd_proxy_requests", "Kubernetes API proxy requests by response status", ["code"], registry=r
        )
        self.active_streams = Gauge(
            "kasd_proxy_active_streams", "Proxy requests in flight (open logical streams to agents)", registry=r
        )
        self.tunnel_bytes = Counter(
            "kasd_tunnel_bytes",
            "Body bytes carried through tunnels by the proxy (to_agent: request bodies and upgraded client bytes)",
            ["direction"],
            registry=r,
        )
        self.request_duration = Histogram(
            "kasd_proxy_request_duration_seconds",
            "Proxy request duration, head to last byte",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 30, 300, 3600),
            registry=r,
        )
        self.proxy_connections = Gauge("kasd_proxy_connections", "Open client connections on the proxy port", registry=r)
        self.listener_connections = Gauge(
            "kasd_listener_connections", "Open connections on each listener (what its caps count)", ["listener"], registry=r
        )
        self.connections_refused = Counter(
            "kasd_connections_refused",
            "Connections refused at accept: the listener's max_connections or max_connections_per_source was reached, "
            "or (reset_budget) the source keeps spending its HTTP/2 reset budget",
            ["listener", "reason"],
            registry=r,
        )
        self.internal_errors = Counter(
            "kasd_internal_errors",
            "Unexpected exceptions (bugs) caught while serving one request or connection, by port (kubernetes_api, "
            "agent, private, api): each ended only that request (500 or a reset stream) or connection",
            ["port"], registry=r)
        self.internal_error_lines_suppressed = Counter(
            "kasd_internal_error_lines_suppressed",
            "Of kasd_internal_errors, those whose ERROR line was held back (one line per kind per minute is written)",
            ["port"], registry=r)
        # Among replicas (routing.redis): Redis, the kasd-to-kasd hop. Set up by enable_replicas.
        self.authz_config_ok = Gauge(
            "kasd_authz_config_ok",
            "1 when the last authorization (re)load succeeded; 0 when it failed and the previous configuration is in force",
            registry=r,
        )
        #: jobs ended whose tokens are still refused (``set_function`` by the server)
        self.finished_jobs = Gauge(
            "kasd_finished_jobs", "Ended CI jobs whose tokens this replica refuses (until they would have expired)",
            registry=r,
        )
        #: what became of each deployment record the proxy's recorder made (``kasd.store.deployments``)
        self.deployment_records = Counter(
            "kasd_deployment_records", "Deployment records by outcome (recorded, dropped: queue full, failed: store error)",
            ["outcome"], registry=r,
        )
        self.authz_reloads = Counter(
            "kasd_authz_reloads", "Authorization configuration reloads by result (ok, failed)", ["result"], registry=r
        )
        self.redis_up = Gauge(
            "kasd_redis_up", "1 while this replica reaches Redis (membership and tunnel directory), else 0; "
            "absent on a lone kasd", registry=None)
        self.forwarded_requests = Counter(
            "kasd_forwarded_requests",
            "Requests carried over the kasd-to-kasd hop: out (this replica sent one to the replica holding the "
            "agent's tunnel), in (this replica passed a peer's one to its own tunnel)",
            ["direction"], registry=None)
        self.peer_sessions = Gauge(
            "kasd_peer_sessions", "Open kasd-to-kasd sessions: out (dialled by this replica), in (on its private port)",
            ["direction"], registry=None)
        self.forwarded_out = self.forwarded_requests.labels(direction="out")
        self.forwarded_in = self.forwarded_requests.labels(direction="in")
        # Per-request code asks for these children: look them up once (labels() is not free).
        self.bytes_to_agent = self.tunnel_bytes.labels(direction="to_agent")
        self.bytes_from_agent = self.tunnel_bytes.labels(direction="from_agent")
        self._requests_by_code: dict[int, Counter] = {}
        # labels() per request costs ~12 Python calls: each label set's child is looked up once. The
        # sets are few (status classes × access types × the directory's agents).
        self._proxied: dict[tuple[str, str, str], Counter] = {}
        self._by_agent: dict[tuple[int, str], Counter] = {}
        # ---- in gitlab-kas's spirit (docs/metrics.md maps each to gitlab-kas's name)
        r.register(_TunnelsCollector(tunnels))
        self.proxied_requests = Counter(
            "kasd_proxied_requests",
            "Requests the proxy answered (Kubernetes API and in-cluster services), by status class (1xx-5xx), "
            "access type (ci_access, pat_access, none: refused before a grant) and agent (the granted agent's id; "
            "empty when none was granted)",
            ["status_class", "access_type", "agent"], registry=r)
        self.agent_requests = Counter(
            "kasd_agent_requests",
            "Usage: requests an agent took (its agentd accepted the stream), once per request however many "
            "sessions it was tried on, by agent and access type (GitLab's k8s_api_proxy_request usage counter)",
            ["agent", "access_type"], registry=r)
        self.routing_duration = Histogram(
            "kasd_routing_duration_seconds",
            "Time to find a tunnel stream to the request's agent (local session, another replica's, or a wait "
            "for one), by status (success, timeout, error, aborted)",
            ["status"], buckets=ROUTING_BUCKETS, registry=r)
        self.routing_timeouts = Counter(
            "kasd_routing_timeouts",
            "Requests that found no tunnel to their agent within agent_wait_timeout (answered 503)",
            registry=r)
        self.rate_limited = Counter(
            "kasd_rate_limited_requests",
            "Requests refused 429 by a limit, by limit (principal: kubernetes_api.max_requests_per_principal)",
            ["limit"], registry=r)
        self._routing = {status: self.routing_duration.labels(status=status) for status in ROUTING_STATUSES}
        self.rate_limited.labels(limit="principal")  # 0 from the start: a rate() has a series to read

    def enable_replicas(self, *, redis_up: Callable[[], bool], peers_out: Callable[[], int],
                        peers_in: Callable[[], int]) -> None:
        """Export the replica metrics (a lone kasd has no Redis and no peers to report)."""
        self.redis_up.set_function(lambda: 1.0 if redis_up() else 0.0)
        self.peer_sessions.labels(direction="out").set_function(peers_out)
        self.peer_sessions.labels(direction="in").set_function(peers_in)
        for metric in (self.redis_up, self.forwarded_requests, self.peer_sessions):
            self.registry.register(metric)

    def enable_tls_reloads(self, contexts: Callable[[], Iterable[ssl.SSLContext | None]]) -> None:
        """Export the reloads of the TLS contexts ``contexts()`` lists (``netio.tlsreload``)."""
        self.registry.register(_TLSReloadsCollector(contexts))

    def enable_environment_views(self, statistics: Callable[[], ViewsFigures]) -> None:
        """Export the environments' live views (``kasd.environments.EnvironmentViews.statistics``):
        what their shared watches and viewers cost (read when scraped)."""
        self.registry.register(_ViewsCollector(statistics))

    def unexpected_errors(self, port: str, logger: logging.Logger) -> UnexpectedErrors:
        """Where ``port``'s unexpected exceptions are reported: rate-limited lines, counted here."""
        return UnexpectedErrors(
            logger, interval=UNEXPECTED_LINE_INTERVAL,
            on_error=self.internal_errors.labels(port=port).inc,
            on_suppressed=self.internal_error_lines_suppressed.labels(port=port).inc,
        )

    def count_request(self, status: int) -> None:
        child = self._requests_by_code.get(status)
        if child is None:
            child = self._requests_by_code[status] = self.proxy_requests.labels(code=str(status))
        child.inc()

    def count_proxied(self, status: int, kind: str | None, agent_id: int | None) -> None:
        """One answered request: ``kind`` is its grant's token kind and ``agent_id`` its granted agent
        (both None when no grant was made: the agent label is then empty, never the client's words)."""
        key = (status_class(status), access_type(kind), "" if agent_id is None or kind is None else str(agent_id))
        child = self._proxied.get(key)
        if child is None:
            child = self._proxied[key] = self.proxied_requests.labels(status_class=key[0], access_type=key[1], agent=key[2])
        child.inc()

    def count_agent_request(self, agent_id: int, kind: str) -> None:
        """Usage: a request the agent took (call once per request, not per session tried)."""
        child = self._by_agent.get((agent_id, kind))
        if child is None:
            child = self._by_agent[(agent_id, kind)] = self.agent_requests.labels(agent=str(agent_id),
                                                                                  access_type=access_type(kind))
        child.inc()

    def routed(self, status: str, seconds: float) -> None:
        """One routing attempt's outcome (``ROUTING_STATUSES``) and how long it took."""
        self._routing[status].observe(seconds)
        if status == "timeout":
            self.routing_timeouts.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


    # ----------------------------------------------------------------- agent configuration from Git (issue 28, G)

    def _config_gauge(self, name: str) -> Gauge:
        """``kasd_config_commit_info`` or ``kasd_config_ref_commit_info``, made on first use (a kasd
        reading files exports neither)."""
        gauges: dict[str, Gauge] = self.__dict__.setdefault("_config_gauges", {})
        if name not in gauges:
            help_text = {
                "kasd_config_commit_info": "The commit each config project's agent configuration is read from "
                                           "(authorization.config_git): 1 per config project",
                "kasd_config_ref_commit_info": "The commit each config project's ref named at kasd's last look; "
                                               "another than kasd_config_commit_info's: that commit's configuration "
                                               "could not be loaded (the log says why)",
            }[name]
            gauges[name] = Gauge(name, help_text, ["project", "commit"], registry=self.registry)
        return gauges[name]

    def set_config_commits(self, commits: list[tuple[str, str]], *, at_ref: bool = False) -> None:
        """The (project, commit) pairs in force (or, ``at_ref``, named by the refs at the last look),
        replacing the previous ones."""
        if not commits and "_config_gauges" not in self.__dict__:
            return
        gauge = self._config_gauge("kasd_config_ref_commit_info" if at_ref else "kasd_config_commit_info")
        gauge.clear()
        for project, commit in commits:
            gauge.labels(project=project, commit=commit).set(1)
# ------------------------------------------------------------------ events (issue 28: kasd.eventdelivery)

#: seconds from an event's POST to agentd's answer (the buckets: a hop is a few ms, a retry seconds)
EVENT_LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class EventMetrics:
    """Events pushed to agents: received (POSTs that queued one), refused (429: a queue full),
    delivered by outcome, the latency from POST to agentd's answer, expired, retried by reason, and
    the events waiting (``queued``, read when scraped where the store can say cheaply; else absent)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.received = Counter("kasd_events_received", "Events posted and queued (a known id is not counted)",
                                registry=r)
        self.refused = Counter("kasd_events_refused", "Events refused because the agent's queue was full (429)",
                               registry=r)
        self.delivered = Counter("kasd_events_delivered", "Events agentd answered for, by outcome (done, duplicate, "
                                 "ignored, failed)", ["outcome"], registry=r)
        self.latency = Histogram("kasd_event_delivery_seconds", "Seconds from an event's POST to agentd's answer",
                                 buckets=EVENT_LATENCY_BUCKETS, registry=r)
        self.expired = Counter("kasd_events_expired", "Events that expired undelivered (events.ttl)", registry=r)
        self.retried = Counter("kasd_event_delivery_retries", "Delivery attempts to be tried again, by reason "
                               "(no_agent, route, refused, tunnel, timeout)", ["reason"], registry=r)
        self.queued = Gauge("kasd_events_queued", "Undelivered events in the store, all agents (as of the last "
                            "sweep, every few seconds)", registry=r)

    def event_received(self) -> None:
        self.received.inc()

    def event_refused(self) -> None:
        self.refused.inc()

    def event_delivered(self, outcome: str, latency: float) -> None:
        self.delivered.labels(outcome=outcome).inc()
        self.latency.observe(latency)

    def event_expired(self, count: int) -> None:
        self.expired.inc(count)

    def event_retried(self, reason: str) -> None:
        self.retried.labels(reason=reason).inc()

    def events_queued(self, count: int) -> None:
        self.queued.set(count)


def event_metrics(metrics: Metrics) -> EventMetrics:
    """The events block of ``metrics``' registry (made once per ``Metrics``)."""
    found: EventMetrics | None = getattr(metrics, "_events", None)
    if found is None:
        found = EventMetrics(metrics.registry)
        metrics._events = found  # type: ignore[attr-defined]
    return found
