"""kasd's side of pod topology and cluster discovery: the HELLO's identity, the cluster-info stream
(validated, bounded, stored per pod), and the per-tunnel records in the store (memory alone, a real
redis-server among replicas) that every replica lists."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from kasd.agents import MAX_HELLO_NAMESPACES, hello_namespaces
from kasd.discovery import MAX_REPORT_BYTES, ReportError, validate_report
from kasd.store.discovery import MemoryPods, PodRecord, pod_key, report_body
from tests.kasd.helpers import fake_agent, running_kasd
from tests.kasd.storeopeners import flushed_redis_url
from tests.redisproc import RedisProcess
from tunnelhttp.head import TunnelCode
from tunnelhttp.kinds import KIND_CLUSTER_INFO
from wire.session import Session, StreamRefusedError

pytestmark = pytest.mark.timeout(20)

REPORT = {"observed_at": "2026-11-27T10:00:00Z", "server": {"gitVersion": "v1.32.0", "platform": "linux/amd64"},
          "nodes": 3, "api_groups": ["apps", "source.toolkit.fluxcd.io"],
          "crds": ["gitrepositories.source.toolkit.fluxcd.io"],
          "components": [{"name": "Flux", "evidence": ["source.toolkit.fluxcd.io"]}],
          "rbac": [{"namespace": "default", "resource_rules": [{"verbs": ["*"], "apiGroups": ["*"],
                                                                "resources": ["*"]}],
                    "non_resource_rules": [], "incomplete": False}], "errors": []}


async def _send(session: Session, body: bytes) -> dict[str, Any]:
    stream = await session.open_stream({"v": 1, "kind": KIND_CLUSTER_INFO})
    try:
        await stream.send_all(body)
        await stream.send_eof()
        return dict(await stream.wait_accepted())
    finally:
        await stream.aclose()


async def test_a_pods_identity_and_cluster_report_are_kept_and_a_bad_report_is_refused_naming_why() -> None:
    hello = {"pod_name": "agentd-a", "pod_uid": "uid-a", "pod_namespace": "gitlab-agent", "node_name": "node-7",
             "namespaces": ["team-a", "team-a", 5, "n" * 300, "team-b"]}
    async with running_kasd() as kasd, fake_agent(kasd, hello=hello) as agent:
        (tunnel,) = kasd.registry.tunnels(1)
        assert (tunnel.pod_namespace, tunnel.node_name) == ("gitlab-agent", "node-7")
        # an agent is authenticated, not trusted to be sane: strings only, no repeats, each bounded
        assert tunnel.namespaces == ("team-a", "n" * 253, "team-b")
        assert kasd.store is not None
        with trio.fail_after(5):
            assert await _send(agent.session, json.dumps({**REPORT, "extra": "dropped"}).encode()) == {}
        (body,) = await kasd.store.cluster_reports(1)
        kept = json.loads(body)
        assert (kept["pod"], kept["pod_uid"]) == ("agentd-a", "uid-a") and kept["report"] == REPORT
        await trio.testing.wait_all_tasks_blocked()
        (record,) = (await kasd.store.pod_records([1]))[1]
        assert (record.pod, record.pod_namespace, record.node, record.namespaces) == (
            "agentd-a", "gitlab-agent", "node-7", ("team-a", "n" * 253, "team-b"))

        for bad, problem in [
            (b"[1, 2]", "report must be a JSON object, not list"),
            (b"{not json", "report is not JSON"),
            (b" " * (MAX_REPORT_BYTES + 1), "report is over 256 KiB"),
            (json.dumps({**REPORT, "errors": ["e" * 5000]}).encode(), "a string of 5000 characters"),
            (json.dumps({**REPORT, "nodes": "three"}).encode(), "nodes must be a whole number"),
        ]:
            with trio.fail_after(5), pytest.raises(StreamRefusedError) as refused:
                await _send(agent.session, bad)
            assert refused.value.code == TunnelCode.BAD_REQUEST and problem in refused.value.message, problem
        # the good report stays; the session too
        assert len(await kasd.store.cluster_reports(1)) == 1 and not agent.session.closed
    await trio.testing.wait_all_tasks_blocked()
    assert await kasd.store.pod_records([1]) == {}  # its tunnel went: its record too


def test_validation_bounds_nesting_and_types() -> None:
    deep: Any = []
    for _ in range(10):
        deep = [deep]
    with pytest.raises(ReportError, match="nested deeper"):
        validate_report(json.dumps({**REPORT, "rbac": [{"namespace": "x", "resource_rules": deep}]}).encode())
    with pytest.raises(ReportError, match="components must be"):
        validate_report(json.dumps({**REPORT, "components": [{"name": 1}]}).encode())
    with pytest.raises(ReportError, match="crds must be a list of strings"):
        validate_report(json.dumps({**REPORT, "crds": [{}]}).encode())
    with pytest.raises(ReportError, match="not JSON"):
        validate_report(b"[" * 100_000)
    assert validate_report(b"{}")["crds"] == []


@pytest.mark.parametrize("report", [b'{"crds": ["a\\ud800"]}', b'{"server": {"gitVersion": "\\udfff"}}',
                                    b'{"rbac": [{"resource_rules": [{"\\ud800": 1}]}]}'])
def test_a_lone_surrogate_is_refused_not_stored_to_break_every_reader(report: bytes) -> None:
    """JSON's ``\\ud800`` escape spells a string no UTF-8 answer can hold: kept, it made every
    ``GET …/agents/<id>/cluster`` a 500 for as long as the agent kept reporting it."""
    with pytest.raises(ReportError, match="a lone surrogate"):
        validate_report(report)


def test_hello_namespaces_are_bounded() -> None:
    assert hello_namespaces({"namespaces": "team-a"}) == ()
    assert len(hello_namespaces({"namespaces": [f"n{i}" for i in range(10_000)]})) == MAX_HELLO_NAMESPACES


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def _store(kind: str, request: pytest.FixtureRequest, clock: Clock) -> AsyncIterator[Any]:
    if kind == "memory":
        yield MemoryPods(clock)
        return
    from kasd.store.redis import RedisStore
    from routing.redisconn import open_redis

    async with open_redis(flushed_redis_url(request, kind)) as client:
        yield RedisStore(client, key_prefix="test", max_entries=10, clock=clock)


def _record(key: str, replica: str, pod: str = "agentd-0") -> PodRecord:
    return PodRecord(agent_id=1, key=key, pod=pod, pod_uid=f"uid-{pod}", pod_namespace="gitlab-agent", node="n1",
                     namespaces=("a",), version="1", since="2026-11-27T10:00:00Z", replica=replica)


@pytest.mark.parametrize("kind", ["memory", "redis", "redis-cluster"])
async def test_records_and_reports_lapse_unless_refreshed_and_go_when_dropped(kind: str,
                                                                              request: pytest.FixtureRequest) -> None:
    clock = Clock()
    async with _store(kind, request, clock) as store:
        await store.put_pod_records([_record("kasd-0/a", "kasd-0"), _record("kasd-1/b", "kasd-1", "agentd-1")], 60)
        found = await store.pod_records([1, 2])
        assert sorted(r.key for r in found[1]) == ["kasd-0/a", "kasd-1/b"] and 2 not in found
        assert found[1][0].namespaces == ("a",)
        await store.drop_pod_record(1, "kasd-0/a")
        assert [r.key for r in (await store.pod_records([1]))[1]] == ["kasd-1/b"]
        body = report_body(pod="agentd-1", pod_uid="uid-agentd-1", replica="kasd-1", received_at=clock.now,
                           report=REPORT)
        await store.put_cluster_report(1, pod_key("uid-agentd-1", "agentd-1"), body, 60)
        assert await store.cluster_reports(1) == [body]
        # kasd-1 died: nothing refreshes its record; a report kept alive by another replica stays
        clock.now += 40
        await store.keep_cluster_reports(1, [pod_key("uid-agentd-1", "agentd-1")], 60)
        clock.now += 30
        assert await store.pod_records([1]) == {}
        if kind == "memory":  # (Redis's own clock expires the keys: the TTL is checked above for records)
            assert await store.cluster_reports(1) == [body]
            clock.now += 61
            assert await store.cluster_reports(1) == []
        # an agent claiming ever new pods is bounded: beyond the cap, a clear refusal
        from kasd.store.discovery import MAX_REPORTS
        from kasd.store.errors import StoreError

        for n in range(MAX_REPORTS - len(await store.cluster_reports(1))):
            await store.put_cluster_report(1, f"uid:{n}", "{}", 600)
        with pytest.raises(StoreError, match=f"over {MAX_REPORTS} cluster reports"):
            await store.put_cluster_report(1, "uid:one-too-many", "{}", 600)
        await store.put_cluster_report(1, "uid:0", "{}", 600)  # (a known pod is replaced, never refused)


async def test_in_redis_a_report_and_its_index_carry_their_ttl(request: pytest.FixtureRequest) -> None:
    clock = Clock()
    async with _store("redis", request, clock) as store:
        await store.put_cluster_report(1, "uid:x", "{}", 30)
        await store.put_pod_records([_record("kasd-0/a", "kasd-0")], 30)
    server: RedisProcess = request.getfixturevalue("redis_server")
    keys = server.command("KEYS", "test:*").decode()
    assert "test:cluster:{agent:1}:" in keys and "test:pods:{agent:1}" in keys
    for key in ("test:cluster:{agent:1}", "test:pods:{agent:1}"):
        assert 0 < int(server.command("TTL", key).decode().strip(":\r\n")) <= 30, key


async def test_lists_every_replicas_records_via_agent_pods(request: pytest.FixtureRequest) -> None:
    """Two replicas' ``AgentPods`` sharing one Redis: each lists its own tunnels and the other's."""
    from kasd.discovery import AgentPods
    from routing.local import AgentTunnel, TunnelRegistry

    clock = Clock()
    async with _store("redis", request, clock) as store:
        registries = [TunnelRegistry(), TunnelRegistry()]
        pods = [AgentPods(store, registries[i], f"kasd-{i}", clock=clock) for i in (0, 1)]
        async with trio.open_nursery() as nursery:
            sessions = []
            for i in (0, 1):
                session: Any = object()
                tunnel = AgentTunnel(agent_id=1, session=session, pod_name=f"agentd-{i}", node_name=f"n{i}",
                                     pod_namespace="gitlab-agent", namespaces=("a",), version="1",
                                     connected_at=trio.current_time())
                registries[i].register(tunnel)
                await pods[i].up(tunnel)
                sessions.append(tunnel)
            for i in (0, 1):
                listed = (await pods[i].connections([1]))[1]
                assert [(c["pod"], c["node"], c["replica"]) for c in listed] == [
                    (f"agentd-{i}", f"n{i}", f"kasd-{i}"), (f"agentd-{1 - i}", f"n{1 - i}", f"kasd-{1 - i}")]
            await pods[1].down(sessions[1])
            assert [c["pod"] for c in (await pods[0].connections([1]))[1]] == ["agentd-0"]
            nursery.cancel_scope.cancel()
