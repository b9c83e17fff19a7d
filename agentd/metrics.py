"""agentd's own metrics, on its health address's ``/metrics`` (Prometheus text format): the tunnels
to kasd, the requests it proxied (to the API server and to each allow-listed service) and the
events it acted on. Its own registry, never the process-wide default one.

May import: ``agentd.connection`` (the manager's statistics), ``agentd.proxy``/``agentd.events``
records, ``netio.tlsreload`` (the reload counts), prometheus-client.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from agentd.connection import ManagerStatistics
from agentd.events.handler import EventRecord
from agentd.proxy import UpstreamRequestRecord
from netio.tlsreload import reload_counts

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _ManagerCollector(Collector):
    """The connection manager's running totals, read at scrape time."""

    def __init__(self, statistics: Callable[[], ManagerStatistics]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterator[Metric]:
        stats = self._statistics()
        for name, value, text in (
            ("agentd_dials", stats.dials, "Tunnels dialled to kasd (each attempt)"),
            ("agentd_dial_failures", stats.failures, "Dials to kasd that failed (refused, unreachable, TLS, timeout)"),
            ("agentd_dials_rejected", stats.rejected, "Dials kasd answered with a refusal (a bad token: 401/403)"),
            ("agentd_goaways", stats.goaways, "GOAWAYs received from kasd (a drain or a placement move)"),
            ("agentd_streams_handled", stats.streams_handled, "Streams from kasd served to their end"),
            ("agentd_reconnects", stats.reconnects, "Tunnels that ended (a GOAWAY, or broken) and were dialled again"),
        ):
            family = CounterMetricFamily(name, text)
            family.add_metric([], value)
            yield family


class _TLSReloadsCollector(Collector):
    """``agentd_tls_reloads_total{name,result}``: the TLS files read again since the start, per context
    (``kas_ca_file``, the receptive listener's, the health address's), ``ok`` or ``failed`` (changed
    files that did not load: the previous ones stay). Read when scraped."""

    def __init__(self, contexts: Sequence[ssl.SSLContext | None]) -> None:
        self._contexts = contexts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("agentd_tls_reloads", "TLS files read again since the start, by context name "
                                     "and result (ok: the next handshake uses them; failed: the previous ones stay)",
                                     labels=["name", "result"])
        for name, (ok, failed) in sorted(reload_counts(self._contexts).items()):
            family.add_metric([name, "ok"], ok)
            family.add_metric([name, "failed"], failed)
        yield family


class AgentMetrics:
    """``requests(record)`` and ``events(record)`` are the proxies' and the event handler's ``on_done``."""

    def __init__(self, services: Iterable[str] = ()) -> None:
        #: the configured services: a name kasd asked for that agentd does not have is counted as
        #: ``service:unknown`` (labels a stranger to agentd's configuration cannot multiply)
        self._services = frozenset(services)
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.tunnels_up = Gauge("agentd_tunnels_up", "Tunnels to kasd that are up", registry=r)
        self.streams_active = Gauge("agentd_streams_active", "Streams from kasd being served now", registry=r)
        self._requests = Counter(
            "agentd_requests", "Requests from kasd served, by target (k8s-api, or service:<name>) and outcome",
            ["target", "outcome"], registry=r)
        self._duration = Histogram(
            "agentd_request_duration_seconds", "Time from a request's stream to its end, by target", ["target"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60), registry=r)
        self._upstream_latency = Histogram(
            "agentd_upstream_latency_seconds", "Time from sending a request to its upstream (the API server, or a "
            "service) to the upstream's response head, by target", ["target"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60), registry=r)
        #: (target, outcome) → its request counter and its target's two histograms (targets: the
        #: API server, the configured services and "unknown"; outcomes: a fixed few)
        self._children: dict[tuple[str, str], tuple[Counter, Histogram, Histogram]] = {}
        self._events = Counter("agentd_events", "Events from kasd, by outcome (done, duplicate, ignored, failed)",
                               ["outcome"], registry=r)

    def watch_manager(self, statistics: Callable[[], ManagerStatistics]) -> None:
        self.registry.register(_ManagerCollector(statistics))
        self.tunnels_up.set_function(lambda: statistics().tunnels_up)
        self.streams_active.set_function(lambda: statistics().streams_active)

    def watch_tls(self, contexts: Sequence[ssl.SSLContext | None]) -> None:
        """Export the reloads of ``contexts`` (those that read their files again: ``netio.tlsreload``)."""
        self.registry.register(_TLSReloadsCollector(contexts))

    def requests(self, record: UpstreamRequestRecord) -> None:
        if record.service is None:
            target = "k8s-api"
        else:
            target = f"service:{record.service if record.service in self._services else 'unknown'}"
        children = self._children.get((target, record.outcome))
        if children is None:  # labels() costs ~12 Python calls: once per target and outcome, not per request
            children = self._children[(target, record.outcome)] = (
                self._requests.labels(target=target, outcome=record.outcome),
                self._duration.labels(target=target), self._upstream_latency.labels(target=target))
        children[0].inc()
        children[1].observe(record.duration)
        if record.upstream_latency is not None:
            children[2].observe(record.upstream_latency)

    def events(self, record: EventRecord) -> None:
        self._events.labels(outcome=record.outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["CONTENT_TYPE", "AgentMetrics"]
