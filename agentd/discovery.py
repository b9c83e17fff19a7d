"""Cluster discovery: what agentd finds in its cluster, reported to kasd (issue 28, docs/agentd.md
"Cluster discovery").

At the first tunnel and every ``discovery_interval`` seconds after, agentd asks its API server, with
its own credentials: ``/version``, the node count (``/api/v1/nodes`` as metadata, ``limit=1``: the
list's ``remainingItemCount`` says the rest), the API groups (``/apis``), the CRDs' names
(``apiextensions.k8s.io/v1`` as metadata), and its own RBAC reach: a ``SelfSubjectRulesReview``
(what ``kubectl auth can-i --list`` asks) for each namespace it serves, or ``default`` when it serves
the whole cluster. Something it may not read (a 403 on nodes, say) is no failure: the report says so
in ``errors``. The components the groups and CRDs reveal come from ``COMPONENTS``.

``discovery_interval: 0`` turns it off. ``ClusterReporter`` sends the report on a ``cluster-info`` stream (``tunnelhttp.kinds``): OPEN
``{"v": 1, "kind": "cluster-info"}``, the JSON as DATA, HALF_CLOSE; kasd ACCEPTs once stored. It
first looks a second after the first tunnel (kasd's placement settles meanwhile), then sends
at every tunnel that comes up (so a kasd replica that never saw this pod learns it at once) and,
on one tunnel, whenever a check finds something changed (``observed_at`` aside); otherwise nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import trio

from agentd.connection import ConnectionManager
from agentd.upstream import ResponseTooLarge, UpstreamPool, exchange
from tunnelhttp.kinds import KIND_CLUSTER_INFO
from wire.session import MuxStream, Session

log = logging.getLogger("agentd.discovery")

#: the largest report kasd takes (its own bound: ``kasd.discovery.MAX_REPORT_BYTES``)
MAX_REPORT_BYTES = 256 * 1024
#: the largest answer agentd reads from its API server for one discovery request
MAX_ANSWER_BYTES = 8 * 1024 * 1024
#: namespaces whose RBAC reach is reviewed (one request each); the others are named in ``errors``
MAX_REVIEWED_NAMESPACES = 16
#: seconds one discovery request may take
REQUEST_TIMEOUT = 20.0
#: seconds kasd has to store a report
SEND_TIMEOUT = 20.0
#: seconds after the first tunnel before the first look at the cluster
FIRST_REPORT_DELAY = 1.0
#: pages of 500 read to count nodes when the API server gives no ``remainingItemCount``
MAX_NODE_PAGES = 20

#: components and the API groups that reveal them: an exact group, or ``.suffix`` for any group ending so
COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Flux", (".toolkit.fluxcd.io",)),
    ("cert-manager", ("cert-manager.io", ".cert-manager.io")),
    ("Prometheus operator", ("monitoring.coreos.com",)),
    ("Istio", ("networking.istio.io", "security.istio.io", "install.istio.io", "telemetry.istio.io")),
    ("Argo CD", ("argoproj.io",)),
    ("Gatekeeper", (".gatekeeper.sh",)),
    ("Kyverno", ("kyverno.io", ".kyverno.io")),
    ("Linkerd", ("linkerd.io", ".linkerd.io")),
    ("Knative", (".knative.dev",)),
    ("Traefik", ("traefik.io", "traefik.containo.us")),
    ("external-secrets", ("external-secrets.io", ".external-secrets.io")),
    ("Gateway API", ("gateway.networking.k8s.io",)),
    ("Cilium", ("cilium.io",)),
    ("KEDA", ("keda.sh", ".keda.sh")),
    ("Velero", ("velero.io",)),
    ("Crossplane", ("crossplane.io", ".crossplane.io")),
    ("Tekton", (".tekton.dev",)),
    ("Metrics server", ("metrics.k8s.io",)),
)


def _reveals(group: str, patterns: Iterable[str]) -> bool:
    return any(group.endswith(p) if p.startswith(".") else group == p for p in patterns)


def components_of(api_groups: Iterable[str], crds: Iterable[str]) -> list[dict[str, Any]]:
    """The components ``COMPONENTS`` names that the groups (and the CRDs' groups: ``<plural>.<group>``)
    reveal, each with the groups that did, in the table's order."""
    groups = set(api_groups) | {name.partition(".")[2] for name in crds if "." in name}
    found = []
    for name, patterns in COMPONENTS:
        evidence = sorted(g for g in groups if _reveals(g, patterns))
        if evidence:
            found.append({"name": name, "evidence": evidence})
    return found


class ClusterLookupError(Exception):
    """One discovery request failed; the message (no secret in it) goes into ``errors``."""


#: ``await get(method, target, body)`` → (status, JSON document or None)
Fetch = Callable[[str, str, bytes | None], Awaitable[tuple[int, Any]]]


def pool_fetch(pool: UpstreamPool) -> Fetch:
    """Requests to the API server through agentd's own pool (its own credentials, no impersonation)."""

    async def fetch(method: str, target: str, body: bytes | None) -> tuple[int, Any]:
        accept = ("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"
                  if "as-metadata=1" in target else "application/json")
        target = target.replace("&as-metadata=1", "").replace("?as-metadata=1", "")
        headers = [("accept", accept), ("user-agent", "agentd-discovery")]
        if body is not None:
            headers.append(("content-type", "application/json"))
        try:
            with trio.fail_after(REQUEST_TIMEOUT):
                status, answer = await exchange(pool, method, target, headers, body, max_response=MAX_ANSWER_BYTES)
        except trio.TooSlowError:
            raise ClusterLookupError(f"no answer within {REQUEST_TIMEOUT:g}s") from None
        except ResponseTooLarge:
            raise ClusterLookupError(f"answer over {MAX_ANSWER_BYTES // (1024 * 1024)} MiB") from None
        except Exception as exc:  # unreachable, lost, timed out: said in errors, tried again next time
            raise ClusterLookupError(str(exc)[:200] or type(exc).__name__) from None
        try:
            return status, json.loads(answer)
        except ValueError:
            return status, None

    return fetch


def _failure(what: str, status: int, document: Any) -> ClusterLookupError:
    message = document.get("message") if isinstance(document, dict) else None
    reason = document.get("reason") if isinstance(document, dict) else None
    shown = str(message)[:300] if message else f"HTTP {status}"
    return ClusterLookupError(f"{what}: {str(reason).lower() + ': ' if reason else ''}{shown}")


async def _get(fetch: Fetch, what: str, target: str) -> dict[str, Any]:
    status, document = await fetch("GET", target, None)
    if status != 200 or not isinstance(document, dict):
        raise _failure(what, status, document)
    return document


async def _count_nodes(fetch: Fetch) -> int:
    first = await _get(fetch, "nodes", "/api/v1/nodes?limit=1&as-metadata=1")
    items = first.get("items") or []
    meta = first.get("metadata") or {}
    if isinstance(meta.get("remainingItemCount"), int):
        return len(items) + int(meta["remainingItemCount"])
    count, token = 0, ""
    for _ in range(MAX_NODE_PAGES):
        page = await _get(fetch, "nodes", "/api/v1/nodes?limit=500&as-metadata=1"
                          + (f"&continue={quote(token, safe='')}" if token else ""))
        count += len(page.get("items") or [])
        token = str((page.get("metadata") or {}).get("continue") or "")
        if not token:
            return count
    raise ClusterLookupError(f"nodes: more than {MAX_NODE_PAGES * 500}, not counted further")


async def _crds(fetch: Fetch) -> list[str]:
    names: list[str] = []
    token = ""
    for _ in range(40):
        page = await _get(fetch, "customresourcedefinitions",
                          "/apis/apiextensions.k8s.io/v1/customresourcedefinitions?limit=500&as-metadata=1"
                          + (f"&continue={quote(token, safe='')}" if token else ""))
        names += [str((item.get("metadata") or {}).get("name", "")) for item in page.get("items") or []
                  if isinstance(item, dict)]
        token = str((page.get("metadata") or {}).get("continue") or "")
        if not token:
            break
    return sorted(n for n in names if n)


async def _rules_review(fetch: Fetch, namespace: str) -> dict[str, Any]:
    body = json.dumps({"kind": "SelfSubjectRulesReview", "apiVersion": "authorization.k8s.io/v1",
                       "spec": {"namespace": namespace}}).encode()
    status, document = await fetch("POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", body)
    if status not in (200, 201) or not isinstance(document, dict):
        raise _failure(f"rbac {namespace}", status, document)
    answer = document.get("status") or {}
    return {"namespace": namespace,
            "resource_rules": list(answer.get("resourceRules") or []),
            "non_resource_rules": list(answer.get("nonResourceRules") or []),
            "incomplete": bool(answer.get("incomplete", False))}


async def gather(fetch: Fetch, namespaces: Sequence[str], *, now: Callable[[], datetime] = lambda: datetime.now(UTC)
                 ) -> dict[str, Any]:
    """One report (the contract's shape); what could not be had is in ``errors``."""
    errors: list[str] = []
    report: dict[str, Any] = {"observed_at": now().isoformat(timespec="seconds").replace("+00:00", "Z"),
                              "server": {}, "nodes": None, "api_groups": [], "crds": [], "components": [],
                              "rbac": [], "errors": errors}
    try:
        version = await _get(fetch, "version", "/version")
        report["server"] = {"gitVersion": str(version.get("gitVersion", "")),
                            "platform": str(version.get("platform", ""))}
    except ClusterLookupError as exc:
        errors.append(str(exc))
    try:
        report["nodes"] = await _count_nodes(fetch)
    except ClusterLookupError as exc:
        errors.append(str(exc))
    try:
        groups = await _get(fetch, "api groups", "/apis")
        report["api_groups"] = sorted({str(g.get("name")) for g in groups.get("groups") or []
                                       if isinstance(g, dict) and g.get("name")})
    except ClusterLookupError as exc:
        errors.append(str(exc))
    try:
        report["crds"] = await _crds(fetch)
    except ClusterLookupError as exc:
        errors.append(str(exc))
    report["components"] = components_of(report["api_groups"], report["crds"])
    reviewed = list(namespaces)[:MAX_REVIEWED_NAMESPACES] or ["default"]
    if len(namespaces) > MAX_REVIEWED_NAMESPACES:
        errors.append(f"rbac: only the first {MAX_REVIEWED_NAMESPACES} of {len(namespaces)} namespaces reviewed")
    for namespace in reviewed:
        try:
            report["rbac"].append(await _rules_review(fetch, namespace))
        except ClusterLookupError as exc:
            errors.append(str(exc))
    return fit(report)


def encoded(report: dict[str, Any]) -> bytes:
    return json.dumps(report, separators=(",", ":"), sort_keys=True).encode()


def fit(report: dict[str, Any], limit: int = MAX_REPORT_BYTES) -> dict[str, Any]:
    """``report`` within ``limit`` bytes: the RBAC rules go first (marked incomplete), then the tail
    of the CRD and group lists (a note in ``errors`` says what was cut)."""
    if len(encoded(report)) <= limit:
        return report
    for review in report["rbac"]:
        review["resource_rules"], review["non_resource_rules"], review["incomplete"] = [], [], True
    report["errors"].append("rbac: rules left out, the report was over its size limit")
    for key in ("crds", "api_groups"):
        while len(encoded(report)) > limit and report[key]:
            cut = max(1, len(report[key]) // 4)
            report[key] = report[key][:-cut]
            if not report["errors"] or not report["errors"][-1].startswith(f"{key}: "):
                report["errors"].append(f"{key}: list cut short, the report was over its size limit")
    return report


def _same(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    return a is not None and {k: v for k, v in a.items() if k != "observed_at"} == {
        k: v for k, v in b.items() if k != "observed_at"}


class ClusterReporter:
    """Gathers at the first tunnel and every ``interval`` (0: at start only), sends as the module says."""

    def __init__(self, manager: ConnectionManager, fetch: Fetch, namespaces: Sequence[str], *,
                 interval: float = 300.0, settle: float = FIRST_REPORT_DELAY) -> None:
        self.manager = manager
        self.settle = settle
        self.fetch = fetch
        self.namespaces = tuple(namespaces)
        self.interval = interval
        #: the latest report gathered (None until the first)
        self.latest: dict[str, Any] | None = None
        #: reports kasd stored (tests watch this)
        self.sent = 0
        self._sent_on: set[Session] = set()
        self._pending = False
        self._changed = trio.Event()

    async def run(self) -> None:
        await self.manager.first_up.wait()
        # kasd's placement moves a new tunnel to its replica within moments: the first report goes on
        # the tunnel that stays (not once to each), and the move is not slowed by the look around
        await trio.sleep(self.settle)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow_tunnels)
            while True:
                report = await gather(self.fetch, self.namespaces)
                if not _same(self.latest, report):
                    first = self.latest is None
                    self.latest = report
                    if not first:
                        log.info("cluster changed; reporting crds=%d groups=%d nodes=%s",
                                 len(report["crds"]), len(report["api_groups"]), report["nodes"])
                    self._pending = True
                    self._changed.set()
                    self._changed = trio.Event()
                if self.interval <= 0:
                    await trio.sleep_forever()
                await trio.sleep(self.interval)

    async def _follow_tunnels(self) -> None:
        """A new report goes on one tunnel (kasd keeps it per pod, and every replica holding a tunnel of
        this pod keeps it alive); a tunnel that comes up later gets the latest report too."""
        while True:
            changed = self._changed
            failed = False
            if self.latest is not None:
                live = list(self.manager.up_sessions())
                self._sent_on &= set(live)
                if self._pending:
                    for session in live[:1]:
                        if await self._send(session, self.latest):
                            self._pending = False
                            self._sent_on = set(live)
                        else:
                            failed = True
                else:
                    for session in [s for s in live if s not in self._sent_on]:
                        if await self._send(session, self.latest):
                            self._sent_on.add(session)
                        else:
                            failed = True
            if changed is not self._changed:
                continue
            async with trio.open_nursery() as waiting:
                async def wait(event: trio.Event) -> None:
                    await event.wait()
                    waiting.cancel_scope.cancel()

                waiting.start_soon(wait, changed)
                waiting.start_soon(self._wait_tunnels, waiting.cancel_scope)
                if failed:  # tried again in a few seconds
                    waiting.cancel_scope.deadline = trio.current_time() + 5.0

    async def _wait_tunnels(self, scope: trio.CancelScope) -> None:
        await self.manager.wait_tunnels_changed()
        scope.cancel()

    async def _send(self, session: Session, report: dict[str, Any]) -> bool:
        try:
            with trio.fail_after(SEND_TIMEOUT):
                stream: MuxStream = await session.open_stream({"v": 1, "kind": KIND_CLUSTER_INFO})
                try:
                    await stream.send_all(encoded(report))
                    await stream.send_eof()
                    await stream.wait_accepted()
                finally:
                    with trio.move_on_after(1, shield=True):
                        await stream.aclose()
        except Exception as exc:  # kasd refused it or went away: tried again on the next tunnel/check
            log.warning("cluster report not delivered error=%s", str(exc)[:200] or type(exc).__name__)
            return False
        self.sent += 1
        log.info("cluster report delivered server=%s nodes=%s components=%s",
                 report["server"].get("gitVersion", "?"), report["nodes"],
                 ",".join(c["name"] for c in report["components"]) or "-")
        return True


__all__ = ["COMPONENTS", "ClusterReporter", "components_of", "fit", "gather", "pool_fetch"]
