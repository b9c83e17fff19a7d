"""What the store keeps of connected agentd pods (issue 28: pod topology and cluster discovery).

``PodRecord``: one tunnel of one agentd pod, as the replica holding it describes it (HELLO's pod,
uid, namespace, node, served namespaces, version; when it came; which replica). Each replica writes
its tunnels' records with an expiry and refreshes them (``kasd.discovery.AgentPods``); a tunnel that
ends is removed; a replica that dies stops refreshing, and its records expire. ``ClusterReport``: the
latest cluster-info report of one pod (agent, pod key), kept while any replica refreshes it (a
replica refreshes the reports of the pods it holds a tunnel of).

``MemoryPods``: a lone kasd's, in memory (its tunnels and the reports they brought end with the
process anyway, and agentd sends its report again at each tunnel). ``kasd.store.redis`` keeps them
in Redis among replicas.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from kasd.store.errors import StoreError

#: records one agent may have listed (tunnels of all its pods on all replicas)
MAX_POD_RECORDS = 1024
#: reports one agent may have kept (one per pod)
MAX_REPORTS = 256


@attrs.frozen(kw_only=True)
class PodRecord:
    agent_id: int
    #: unique per tunnel (the replica's name and a random id)
    key: str
    pod: str = ""
    pod_uid: str = ""
    pod_namespace: str = ""
    node: str = ""
    namespaces: tuple[str, ...] = ()
    version: str = ""
    #: RFC 3339, UTC
    since: str = ""
    replica: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "key": self.key, "pod": self.pod, "pod_uid": self.pod_uid,
                "pod_namespace": self.pod_namespace, "node": self.node, "namespaces": list(self.namespaces),
                "version": self.version, "since": self.since, "replica": self.replica}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PodRecord:
        return cls(agent_id=int(data["agent_id"]), key=str(data["key"]), pod=str(data.get("pod", "")),
                   pod_uid=str(data.get("pod_uid", "")), pod_namespace=str(data.get("pod_namespace", "")),
                   node=str(data.get("node", "")),
                   namespaces=tuple(str(n) for n in data.get("namespaces") or ()),
                   version=str(data.get("version", "")), since=str(data.get("since", "")),
                   replica=str(data.get("replica", "")))


def pod_key(pod_uid: str, pod_name: str) -> str:
    """A pod's key among an agent's: its uid when it sent one, else its name."""
    return f"uid:{pod_uid}" if pod_uid else f"name:{pod_name}"


class MemoryPods:
    """Pod records and cluster reports in this process, each with its expiry (``clock``: epoch s)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._records: dict[int, dict[str, tuple[float, PodRecord]]] = {}
        self._reports: dict[int, dict[str, tuple[float, str]]] = {}

    def _live_records(self, agent_id: int) -> dict[str, tuple[float, PodRecord]]:
        now = self._clock()
        kept = {k: v for k, v in self._records.get(agent_id, {}).items() if v[0] > now}
        if kept:
            self._records[agent_id] = kept
        else:
            self._records.pop(agent_id, None)
        return kept

    def _live_reports(self, agent_id: int) -> dict[str, tuple[float, str]]:
        now = self._clock()
        kept = {k: v for k, v in self._reports.get(agent_id, {}).items() if v[0] > now}
        if kept:
            self._reports[agent_id] = kept
        else:
            self._reports.pop(agent_id, None)
        return kept

    async def put_pod_records(self, records: Sequence[PodRecord], ttl: float) -> None:
        until = self._clock() + ttl
        for record in records:
            live = self._live_records(record.agent_id)
            if record.key not in live and len(live) >= MAX_POD_RECORDS:
                raise StoreError(f"agent {record.agent_id} has over {MAX_POD_RECORDS} tunnel records")
            self._records.setdefault(record.agent_id, {})[record.key] = (until, record)

    async def drop_pod_record(self, agent_id: int, key: str) -> None:
        self._records.get(agent_id, {}).pop(key, None)

    async def pod_records(self, agent_ids: Sequence[int]) -> dict[int, list[PodRecord]]:
        out = {}
        for agent_id in agent_ids:
            live = self._live_records(agent_id)
            if live:
                out[agent_id] = [record for _, record in live.values()]
        return out

    async def put_cluster_report(self, agent_id: int, pod: str, body: str, ttl: float) -> None:
        live = self._live_reports(agent_id)
        if pod not in live and len(live) >= MAX_REPORTS:
            raise StoreError(f"agent {agent_id} has over {MAX_REPORTS} cluster reports")
        self._reports.setdefault(agent_id, {})[pod] = (self._clock() + ttl, body)

    async def keep_cluster_reports(self, agent_id: int, pods: Sequence[str], ttl: float) -> None:
        live = self._live_reports(agent_id)
        until = self._clock() + ttl
        for pod in pods:
            if pod in live:
                self._reports[agent_id][pod] = (until, live[pod][1])

    async def cluster_reports(self, agent_id: int) -> list[str]:
        return [body for _, body in self._live_reports(agent_id).values()]


def report_body(*, pod: str, pod_uid: str, replica: str, received_at: float, report: Mapping[str, Any]) -> str:
    """What the store keeps for a pod's report: who sent it, when, to which replica, and the report."""
    return json.dumps({"pod": pod, "pod_uid": pod_uid, "replica": replica,
                       "received_at": received_at if math.isfinite(received_at) else 0.0, "report": report},
                      separators=(",", ":"))


__all__ = ["MAX_POD_RECORDS", "MAX_REPORTS", "MemoryPods", "PodRecord", "pod_key", "report_body"]
