"""`GET /metrics`: a few of the API server's own metrics, in Prometheus text exposition format 0.0.4.

Mirrors k8s.io/apiserver/pkg/endpoints/metrics (1.32): `apiserver_request_total` and
`apiserver_request_duration_seconds` with the labels verb, dry_run, group, version, resource,
subresource, scope, component (and code); `apiserver_current_inflight_requests{request_kind}`
and `apiserver_longrunning_requests` (the long-running requests — watches, exec, attach, logs,
port-forward — count only in the latter, as the max-in-flight filter leaves them out);
`apiserver_storage_objects{resource}`; `kubernetes_build_info`. The verb is the API server's
"clean verb": LIST/GET/WATCH/POST/PUT/PATCH/APPLY/DELETE/DELETECOLLECTION/CONNECT.

Written by hand rather than with prometheus-client: kubesim is a distribution of its own and the
format is a few lines. Every label value comes from a closed set (resources the registry knows,
their subresources, a fixed list of non-resource paths, HTTP status codes), so what a stranger
sends cannot grow the series without bound: requests for anything else (404s, unauthenticated
requests, which a real server answers before its instrumentation) are not counted.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from kubesim.paths import Target

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: non-resource paths counted (their path is the `subresource` label, as the real server does)
NON_RESOURCE_PATHS = frozenset({"/", "/api", "/apis", "/healthz", "/livez", "/readyz", "/version",
                                "/metrics", "/openapi/v2", "/openapi/v3"})
#: subresources that are CONNECT (k8s.io/apiserver metrics.validConnectRequests)
CONNECT_SUBRESOURCES = frozenset({"exec", "attach", "portforward", "proxy"})
#: long-running subresources (k8s.io/apiserver's default LongRunningRequestCheck)
LONG_RUNNING_SUBRESOURCES = frozenset({"exec", "attach", "portforward", "proxy", "log"})
#: apiserver_request_duration_seconds buckets of 1.32
DURATION_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0,
                    5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0)
READ_ONLY_VERBS = frozenset({"GET", "LIST", "WATCH"})
#: the verbs reported; any other method is counted as "other" (k8s.io/apiserver metrics
#: validRequestMethods and OtherRequestMethod), so a client inventing methods adds one series
VALID_VERBS = frozenset({"APPLY", "CONNECT", "CREATE", "DELETE", "DELETECOLLECTION", "GET", "LIST",
                         "PATCH", "POST", "PROXY", "PUT", "UPDATE", "WATCH", "WATCHLIST"})
OTHER_VERB = "other"
LABELS = ("component", "dry_run", "group", "resource", "scope", "subresource", "verb", "version")


@attrs.frozen(kw_only=True)
class RequestLabels:
    verb: str
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    scope: str = ""
    dry_run: str = ""

    @property
    def long_running(self) -> bool:
        return self.verb == "WATCH" or (bool(self.resource)
                                        and self.subresource in LONG_RUNNING_SUBRESOURCES)

    def values(self) -> tuple[str, ...]:
        return ("apiserver", self.dry_run, self.group, self.resource, self.scope, self.subresource,
                self.verb, self.version)


def resource_labels(method: str, target: Target, *, watch: bool, dry_run: bool,
                    content_type: str = "") -> RequestLabels:
    """The labels of a request for a resource (after its path was parsed, so all known)."""
    kind, sub = target.kind, target.subresource or ""
    if target.name is not None:
        scope = "resource"
    elif target.namespace:
        scope = "namespace"
    else:
        scope = "cluster"
    verb = method.upper()
    if watch:
        verb = "WATCH"
    elif verb == "GET" and target.name is None:
        verb = "LIST"
    elif verb == "DELETE" and target.name is None:
        verb = "DELETECOLLECTION"
    elif verb == "PATCH" and content_type.startswith("application/apply-patch"):
        verb = "APPLY"
    if sub in CONNECT_SUBRESOURCES:
        verb = "CONNECT"
    if verb not in VALID_VERBS:
        verb = OTHER_VERB
    return RequestLabels(verb=verb, group=kind.group, version=kind.version, resource=kind.plural,
                         subresource=sub, scope=scope, dry_run="All" if dry_run else "")


def non_resource_labels(method: str, path: str) -> RequestLabels | None:
    if path not in NON_RESOURCE_PATHS:
        return None
    return RequestLabels(verb=method.upper() if method.upper() in ("GET", "HEAD") else "GET",
                         subresource=path)


class Histogram:
    def __init__(self) -> None:
        self.counts = [0] * len(DURATION_BUCKETS)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(DURATION_BUCKETS):
            if value <= bound:
                self.counts[i] += 1
        self.total += 1
        self.sum += value


class Metrics:
    """What one kubesim has counted since it started."""

    def __init__(self) -> None:
        self.requests: dict[tuple[tuple[str, ...], str], int] = {}
        self.durations: dict[tuple[str, ...], Histogram] = {}
        self.inflight = {"mutating": 0, "readOnly": 0}
        self.longrunning: dict[tuple[str, ...], int] = {}

    @contextmanager
    def in_flight(self, labels: RequestLabels) -> Iterator[None]:
        """Count the request as in flight (or long-running) while the block runs."""
        if labels.long_running:
            key = labels.values()
            self.longrunning[key] = self.longrunning.get(key, 0) + 1
        else:
            kind = "readOnly" if labels.verb in READ_ONLY_VERBS else "mutating"
            self.inflight[kind] += 1
        try:
            yield
        finally:
            if labels.long_running:
                self.longrunning[labels.values()] -= 1
            else:
                self.inflight[kind] -= 1

    def observe(self, labels: RequestLabels, code: int, seconds: float) -> None:
        key = labels.values()
        self.requests[(key, str(code))] = self.requests.get((key, str(code)), 0) + 1
        if not labels.long_running:  # the real server leaves WATCH and CONNECT out of latency
            self.durations.setdefault(key, Histogram()).observe(seconds)

    def render(self, *, storage: Iterable[tuple[str, int]], build: dict[str, str]) -> bytes:
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")

        family("apiserver_current_inflight_requests", "gauge",
               "[STABLE] Maximal number of currently used inflight request limit of this apiserver "
               "per request kind in last second.")
        for kind, value in sorted(self.inflight.items()):
            lines.append(f'apiserver_current_inflight_requests{{request_kind="{kind}"}} {value}')
        family("apiserver_longrunning_requests", "gauge",
               "[STABLE] Gauge of all active long-running apiserver requests broken out by verb, "
               "group, version, resource, scope and component. Not all requests are tracked this way.")
        for key, value in sorted(self.longrunning.items()):
            lines.append(f"apiserver_longrunning_requests{{{_labels(LABELS, key)}}} {value}")
        family("apiserver_request_duration_seconds", "histogram",
               "[STABLE] Response latency distribution in seconds for each verb, dry run value, "
               "group, version, resource, subresource, scope and component.")
        for key, hist in sorted(self.durations.items()):
            base = _labels(LABELS, key)
            for bound, count in zip(DURATION_BUCKETS, hist.counts, strict=True):
                lines.append(f'apiserver_request_duration_seconds_bucket{{{base},le="{_num(bound)}"}} {count}')
            lines.append(f'apiserver_request_duration_seconds_bucket{{{base},le="+Inf"}} {hist.total}')
            lines.append(f"apiserver_request_duration_seconds_sum{{{base}}} {hist.sum!r}")
            lines.append(f"apiserver_request_duration_seconds_count{{{base}}} {hist.total}")
        family("apiserver_request_total", "counter",
               "[STABLE] Counter of apiserver requests broken out for each verb, dry run value, "
               "group, version, resource, scope, component, and HTTP response code.")
        for (key, code), value in sorted(self.requests.items()):
            names = ("code", *LABELS)
            lines.append(f"apiserver_request_total{{{_labels(names, (code, *key))}}} {value}")
        family("apiserver_storage_objects", "gauge",
               "[STABLE] Number of stored objects at the time of last check split by kind. In case "
               "of a fetching error, the value will be -1.")
        for resource, count in sorted(storage):
            lines.append(f'apiserver_storage_objects{{resource="{_escape(resource)}"}} {count}')
        family("kubernetes_build_info", "gauge",
               "[ALPHA] A metric with a constant '1' value labeled by major, minor, git version, git "
               "commit, git tree state, build date, Go version, and compiler from which Kubernetes "
               "was built, and platform on which it is running.")
        build_names = tuple(sorted(build))
        lines.append(f"kubernetes_build_info{{{_labels(build_names, tuple(build[n] for n in build_names))}}} 1")
        return ("\n".join(lines) + "\n").encode()


def _labels(names: Iterable[str], values: Iterable[str]) -> str:
    return ",".join(f'{name}="{_escape(value)}"' for name, value in zip(names, values, strict=True))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    return repr(value).removesuffix(".0") if value == int(value) else repr(value)


def now() -> float:
    return time.monotonic()


def build_labels(document: dict[str, Any]) -> dict[str, str]:
    """kubernetes_build_info's labels from a /version document."""
    return {"build_date": document["buildDate"], "compiler": document["compiler"],
            "git_commit": document["gitCommit"], "git_tree_state": document["gitTreeState"],
            "git_version": document["gitVersion"], "go_version": document["goVersion"],
            "major": document["major"], "minor": document["minor"], "platform": document["platform"]}
