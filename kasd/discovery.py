"""Connected agentd pods and their cluster reports, for every replica to list (issue 28;
docs/discovery.md).

``AgentPods`` writes a record of each tunnel this replica holds into the store (``kasd.store``:
Redis among replicas, memory alone) when it comes, refreshes them every ``ttl / 3`` seconds, and
removes each as it goes; a replica that dies stops refreshing and its records lapse within ``ttl``.
It also keeps alive the cluster reports of the pods it holds tunnels of. ``connections`` is what
``GET /api/kasd/v1/agents`` lists: this replica's tunnels from its registry (always fresh) and the
other replicas' from the store.

``ClusterInfoIntake.handle`` serves the ``cluster-info`` streams agentd opens (``tunnelhttp.kinds``):
the report (a JSON object of at most ``MAX_REPORT_BYTES``, read within ``READ_TIMEOUT``) is checked by
``validate_report`` — an agent is authenticated, not trusted to be sane: known keys only, each of its
type, strings, lists and nesting bounded — then stored per (agent, pod) and ACCEPTed with ``{}``; a
bad one is REFUSEd with ``BAD_REQUEST`` naming the problem.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import trio

from daemonkit.logs import BurstLimitedLog, UnexpectedErrors
from kasd.store.discovery import PodRecord, pod_key, report_body
from kasd.store.protocol import Store, StoreError
from routing.local import AgentTunnel, TunnelRegistry
from tunnelhttp.head import TunnelCode
from wire.errors import RemoteProtocolError
from wire.session import MuxStream

log = logging.getLogger("kasd.discovery")
#: a bug this part's store calls reached: one line per kind a minute, the session and kasd go on
_unexpected = UnexpectedErrors(log)

#: seconds a record (or report) outlives the last refresh of the replica that wrote it
RECORD_TTL = 60.0
#: seconds one store call of this module may take
STORE_TIMEOUT = 3.0
#: the largest report kasd takes
MAX_REPORT_BYTES = 256 * 1024
#: seconds agentd has to send its whole report once it opened the stream
READ_TIMEOUT = 10.0
#: the longest string in a report (a group, a CRD name, an error, an RBAC rule's entry)
MAX_STRING = 1024
#: the most items in one list of a report
MAX_ITEMS = 10_000
#: the deepest nesting of a report (the RBAC rules are the deepest: 4)
MAX_DEPTH = 6


class ReportError(ValueError):
    """A report kasd does not take; the message names the problem."""


def _bounded(value: Any, where: str, depth: int = 0) -> Any:
    """``value`` if it is JSON within the bounds (strings, lists, nesting), else ReportError."""
    if depth > MAX_DEPTH:
        raise ReportError(f"{where}: nested deeper than {MAX_DEPTH}")
    if isinstance(value, str):
        if len(value) > MAX_STRING:
            raise ReportError(f"{where}: a string of {len(value)} characters (at most {MAX_STRING})")
        _unicode(value, where)
        return value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ReportError(f"{where}: not a finite number")
        return value
    if isinstance(value, list):
        if len(value) > MAX_ITEMS:
            raise ReportError(f"{where}: {len(value)} items (at most {MAX_ITEMS})")
        return [_bounded(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if len(value) > 64:
            raise ReportError(f"{where}: {len(value)} keys (at most 64)")
        for key in value:
            if len(key) > MAX_STRING:
                raise ReportError(f"{where}: a key of {len(key)} characters")
            _unicode(key, f"{where} (a key)")
        return {k: _bounded(v, f"{where}.{k[:40]}", depth + 1) for k, v in value.items()}
    raise ReportError(f"{where}: not JSON")


def _unicode(text: str, where: str) -> None:
    """ReportError for a string JSON's ``\\ud800`` escapes made that is not Unicode text: no UTF-8
    answer (the REST API's, the dashboard's) could carry it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ReportError(f"{where}: a lone surrogate (an unpaired \\ud800-\\udfff escape), not Unicode text") from None


def _strings(report: Mapping[str, Any], key: str) -> list[str]:
    value = report.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ReportError(f"{key} must be a list of strings")
    return list(value)


def validate_report(data: bytes) -> dict[str, Any]:
    """The report ``data`` holds, checked (the contract's keys; any other key is dropped)."""
    if len(data) > MAX_REPORT_BYTES:
        raise ReportError(f"report is over {MAX_REPORT_BYTES // 1024} KiB")
    try:
        report = json.loads(data)
    except (ValueError, RecursionError):
        raise ReportError("report is not JSON") from None
    if not isinstance(report, dict):
        raise ReportError(f"report must be a JSON object, not {type(report).__name__}")
    observed = report.get("observed_at", "")
    if not isinstance(observed, str):
        raise ReportError("observed_at must be a string")
    server = report.get("server", {})
    if not isinstance(server, dict) or not all(isinstance(v, str) for v in server.values()):
        raise ReportError("server must be an object of strings")
    nodes = report.get("nodes")
    if nodes is not None and (isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 0):
        raise ReportError("nodes must be a whole number >= 0 or null")
    components = report.get("components", [])
    if not isinstance(components, list) or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("evidence", []), list)
            and all(isinstance(e, str) for e in c.get("evidence", [])) for c in components):
        raise ReportError("components must be a list of {name, evidence: [strings]}")
    rbac = report.get("rbac", [])
    if not isinstance(rbac, list) or not all(
            isinstance(r, dict) and isinstance(r.get("namespace", ""), str)
            and isinstance(r.get("resource_rules", []), list) and isinstance(r.get("non_resource_rules", []), list)
            for r in rbac):
        raise ReportError("rbac must be a list of {namespace, resource_rules, non_resource_rules, incomplete}")
    checked = {
        "observed_at": observed,
        "server": {k: server[k] for k in ("gitVersion", "platform") if k in server},
        "nodes": nodes,
        "api_groups": _strings(report, "api_groups"),
        "crds": _strings(report, "crds"),
        "components": [{"name": c["name"], "evidence": list(c.get("evidence", []))} for c in components],
        "rbac": [{"namespace": r.get("namespace", ""), "resource_rules": r.get("resource_rules", []),
                  "non_resource_rules": r.get("non_resource_rules", []),
                  "incomplete": bool(r.get("incomplete", False))} for r in rbac],
        "errors": _strings(report, "errors"),
    }
    return dict(_bounded(checked, "report"))


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class AgentPods:
    """This replica's tunnels as store records (see the module docstring)."""

    def __init__(self, store: Store, registry: TunnelRegistry, replica: str, *, ttl: float = RECORD_TTL,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.registry = registry
        self.replica = replica
        self.ttl = ttl
        self._clock = clock
        self._keys: dict[AgentTunnel, str] = {}
        self._failures = BurstLimitedLog(log, interval=60.0)

    def record(self, tunnel: AgentTunnel) -> PodRecord:
        key = self._keys.get(tunnel)
        if key is None:
            key = self._keys[tunnel] = f"{self.replica}/{uuid.uuid4().hex}"
        offset = self._clock() - trio.current_time()  # connected_at is Trio's clock
        return PodRecord(agent_id=tunnel.agent_id, key=key, pod=tunnel.pod_name, pod_uid=tunnel.pod_uid,
                         pod_namespace=tunnel.pod_namespace, node=tunnel.node_name, namespaces=tunnel.namespaces,
                         version=tunnel.version, since=_iso(tunnel.connected_at + offset), replica=self.replica)

    async def _store(self, what: str, work: Any) -> bool:
        try:
            with trio.fail_after(STORE_TIMEOUT):
                await work
            return True
        except (StoreError, trio.TooSlowError) as exc:
            self._failures.warning(what, "agent pods: could not %s (retried at the next refresh) error=%s",
                                   what, str(exc)[:200] or type(exc).__name__)
            return False
        except Exception as exc:  # a bug here must not end an agent's session, nor kasd
            _unexpected.report(exc, "agent pods: could not %s", what)
            return False

    async def up(self, tunnel: AgentTunnel) -> None:
        await self._store("write a record", self.store.put_pod_records([self.record(tunnel)], self.ttl))

    async def down(self, tunnel: AgentTunnel) -> None:
        key = self._keys.pop(tunnel, None)
        if key is not None:
            await self._store("remove a record", self.store.drop_pod_record(tunnel.agent_id, key))

    async def refresh(self) -> None:
        tunnels = [t for t in self.registry.tunnels() if t in self._keys]
        if not tunnels:
            return
        await self._store("refresh the records", self.store.put_pod_records([self.record(t) for t in tunnels],
                                                                            self.ttl))
        pods: dict[int, set[str]] = {}
        for t in tunnels:
            pods.setdefault(t.agent_id, set()).add(pod_key(t.pod_uid, t.pod_name))
        for agent_id, keys in pods.items():
            await self._store("keep the cluster reports",
                              self.store.keep_cluster_reports(agent_id, sorted(keys), self.ttl))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.ttl / 3)
            await self.refresh()

    # ---- what the REST API lists

    async def connections(self, agent_ids: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
        """Agent id → its connections: this replica's tunnels, then the others' records."""
        wanted = set(agent_ids)
        out: dict[int, list[dict[str, Any]]] = {}
        for tunnel in self.registry.tunnels():
            if tunnel.agent_id in wanted:
                out.setdefault(tunnel.agent_id, []).append(connection_json(self.record(tunnel)))
        try:
            with trio.fail_after(STORE_TIMEOUT):
                others = await self.store.pod_records(sorted(wanted))
        except (StoreError, trio.TooSlowError) as exc:
            self._failures.warning("list", "agent pods: other replicas' records unavailable error=%s",
                                   str(exc)[:200] or type(exc).__name__)
            return out
        for agent_id, records in others.items():
            for record in sorted(records, key=lambda r: (r.replica, r.pod, r.since)):
                if record.replica != self.replica:
                    out.setdefault(agent_id, []).append(connection_json(record))
        return out

    async def reports(self, agent_id: int) -> list[dict[str, Any]]:
        """The agent's latest report per pod (``StoreError`` when the store cannot say)."""
        try:
            with trio.fail_after(STORE_TIMEOUT):
                bodies = await self.store.cluster_reports(agent_id)
        except trio.TooSlowError:
            raise StoreError(f"the store did not answer within {STORE_TIMEOUT:g}s") from None
        out = []
        for body in bodies:
            try:
                data = json.loads(body)
            except ValueError:
                continue
            if isinstance(data, dict):
                out.append({"pod": data.get("pod", ""), "pod_uid": data.get("pod_uid", ""),
                            "replica": data.get("replica", ""),
                            "received_at": _iso(float(data.get("received_at") or 0)),
                            "report": data.get("report", {})})
        return sorted(out, key=lambda r: (str(r["pod"]), str(r["pod_uid"])))

    async def keep_report(self, tunnel: AgentTunnel, report: Mapping[str, Any]) -> None:
        body = report_body(pod=tunnel.pod_name, pod_uid=tunnel.pod_uid, replica=self.replica,
                           received_at=self._clock(), report=report)
        with trio.fail_after(STORE_TIMEOUT):
            await self.store.put_cluster_report(tunnel.agent_id, pod_key(tunnel.pod_uid, tunnel.pod_name), body,
                                                self.ttl)


def connection_json(record: PodRecord) -> dict[str, Any]:
    """One connection as ``GET /api/kasd/v1/agents`` lists it."""
    return {"pod": record.pod, "pod_uid": record.pod_uid, "pod_namespace": record.pod_namespace,
            "node": record.node, "namespaces": list(record.namespaces), "version": record.version,
            "since": record.since, "replica": record.replica}


class ClusterInfoIntake:
    """The ``incoming`` handler of ``cluster-info`` streams (``AgentSessions``)."""

    def __init__(self, pods: AgentPods) -> None:
        self.pods = pods
        self._refusals = BurstLimitedLog(log, interval=60.0)

    async def handle(self, stream: MuxStream, tunnel: AgentTunnel) -> None:
        try:
            try:
                data = await _read_bounded(stream, MAX_REPORT_BYTES)
                report = validate_report(data)
            except ReportError as exc:
                self._refusals.warning(tunnel.agent_id, "cluster report refused agent_id=%d pod=%s reason=%s",
                                       tunnel.agent_id, tunnel.pod_name, exc)
                await stream.refuse(TunnelCode.BAD_REQUEST, f"kasd: {exc}")
                return
            try:
                await self.pods.keep_report(tunnel, report)
            except (StoreError, trio.TooSlowError) as exc:
                await stream.refuse(TunnelCode.UPSTREAM_UNREACHABLE, "kasd could not store the report: "
                                    + (str(exc)[:200] or "store timed out"))
                return
            await stream.accept({})
            log.info("cluster report stored agent_id=%d pod=%s server=%s nodes=%s crds=%d", tunnel.agent_id,
                     tunnel.pod_name, report["server"].get("gitVersion", "?"), report["nodes"], len(report["crds"]))
        except (trio.BrokenResourceError, trio.ClosedResourceError, RemoteProtocolError):
            pass
        finally:
            with trio.move_on_after(1, shield=True):
                await stream.aclose()


async def _read_bounded(stream: MuxStream, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    try:
        with trio.fail_after(READ_TIMEOUT):
            while True:
                chunk = await stream.receive_some()
                if not chunk:
                    return b"".join(chunks)
                size += len(chunk)
                if size > limit:
                    raise ReportError(f"report is over {limit // 1024} KiB")
                chunks.append(chunk)
    except trio.TooSlowError:
        raise ReportError(f"report not sent whole within {READ_TIMEOUT:g}s") from None


__all__ = ["AgentPods", "ClusterInfoIntake", "ReportError", "connection_json", "validate_report"]
