"""agentd end to end on 127.0.0.1: a fake kasd opens HTTP streams on agentd's tunnel; kubesim is the
Kubernetes API server behind it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from agentd.kubeapi import kubeconfig_target
from agentd.proxy import UpstreamRequestRecord
from kubesim.server import KubeSim, open_kubesim
from tests.agentd.harness import (
    SIM_TOKEN,
    FakeKasd,
    agent_config,
    exchange,
    head,
    open_request,
    running_agent,
    start_fake_kasd,
)
from tests.trusted import TRUSTED
from tunnelhttp.head import TunnelCode
from wire.session import StreamRefusedError

pytestmark = pytest.mark.timeout(20)


class Setup:
    def __init__(self, sim: KubeSim, kasd: FakeKasd, agent: object) -> None:
        self.sim = sim
        self.kasd = kasd
        self.agent = agent
        self.records: list[UpstreamRequestRecord] = []
        self.record_event = trio.Event()

    def on_done(self, record: UpstreamRequestRecord) -> None:
        self.records.append(record)
        self.record_event.set()
        self.record_event = trio.Event()


@pytest.fixture
async def setup(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Setup]:
    async with open_kubesim(objects=TRUSTED, token=SIM_TOKEN, bookmark_interval=3600) as sim:
        sim.write_kubeconfig(tmp_path / "kubeconfig")
        kasd = await start_fake_kasd(nursery)
        config = agent_config(tmp_path, kasd.url)
        async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)) as agent:
            s = Setup(sim, kasd, agent)
            agent.proxy.on_done = s.on_done
            yield s


async def test_get_returns_kubesim_json_with_agent_credentials_and_impersonation(setup: Setup) -> None:
    session = await setup.kasd.session()
    assert session.peer_metadata["agent_id"] == "7"
    assert session.peer_metadata["pod_name"] == "agentd-0"
    assert session.peer_metadata["pod_uid"] == "uid-0"
    assert session.peer_metadata["version"]
    response, body = await exchange(session, head("GET", "/api/v1/namespaces", groups=("devs", "ops")))
    assert response.status == 200
    doc = json.loads(body)
    assert doc["kind"] == "NamespaceList"
    seen = [r for r in setup.sim.requests if r.path == "/api/v1/namespaces"]
    assert seen and seen[-1].bearer_token == SIM_TOKEN
    assert seen[-1].impersonate["impersonate-user"] == "alice"
    assert seen[-1].impersonate["impersonate-group"] == "devs, ops"
    assert not any(name in ("transfer-encoding", "connection") for name, _ in response.headers)


async def test_client_authorization_is_replaced(setup: Setup) -> None:
    session = await setup.kasd.session()
    request = head("GET", "/api/v1/namespaces/default", headers=(("authorization", "Bearer client-token"),
                                                                ("impersonate-user", "system:admin"),
                                                                ("x-request-id", "not-kasds")))
    response, _ = await exchange(session, request)
    assert response.status == 200
    last = [r for r in setup.sim.requests if r.path == "/api/v1/namespaces/default"][-1]
    assert last.bearer_token == SIM_TOKEN
    assert last.impersonate["impersonate-user"] == "alice"
    assert last.request_id == "req-1"  # the id kasd gave the request in its head, and no other


async def test_keep_alive_connection_is_reused(setup: Setup) -> None:
    session = await setup.kasd.session()
    for _ in range(3):
        response, _ = await exchange(session, head("GET", "/api/v1/namespaces/default"))
        assert response.status == 200
    stats = setup.agent.pool.statistics()  # type: ignore[attr-defined]
    assert stats.opened == 1
    assert stats.reused == 2


async def test_five_mib_body_streams_through(setup: Setup) -> None:
    session = await setup.kasd.session()
    payload = "x" * (5 * 1024 * 1024)
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {"blob": payload}}
    body = json.dumps(obj).encode()
    request = head("POST", "/api/v1/namespaces/default/configmaps",
                   headers=(("content-type", "application/json"), ("content-length", str(len(body)))))
    response, answer = await exchange(session, request, body)
    assert response.status == 201, answer[:300]
    response, answer = await exchange(session, head("GET", "/api/v1/namespaces/default/configmaps/big"))
    assert response.status == 200
    assert json.loads(answer)["data"]["blob"] == payload
    # The record is written once agentd has closed the stream, which may be just after kasd saw EOF.
    while len(setup.records) < 2:
        await setup.record_event.wait()
    assert setup.records[-2].bytes_in == len(body)
    assert setup.records[-1].bytes_out == len(answer)


async def test_body_without_length_goes_chunked(setup: Setup) -> None:
    session = await setup.kasd.session()
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "chunky"},
                       "data": {"a": "b"}}).encode()
    request = head("POST", "/api/v1/namespaces/default/configmaps", headers=(("content-type", "application/json"),))
    response, answer = await exchange(session, request, body)
    assert response.status == 201, answer


async def test_watch_delivers_event_while_open(setup: Setup) -> None:
    session = await setup.kasd.session()
    stream, response = await open_request(session, head("GET", "/api/v1/namespaces/default/configmaps?watch=1"))
    assert response.status == 200
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "watched"}}).encode()
    created, _ = await exchange(session, head("POST", "/api/v1/namespaces/default/configmaps",
                                              headers=(("content-type", "application/json"),)), body)
    assert created.status == 201
    buffer = b""
    while b"watched" not in buffer:
        chunk = await stream.receive_some()
        assert chunk, "watch ended early"
        buffer += chunk
    event = json.loads(buffer.split(b"\n")[-2] if buffer.endswith(b"\n") else buffer)
    assert event["type"] == "ADDED"
    await stream.reset(TunnelCode.CLIENT_GONE, "test done")


async def test_reset_from_kasd_cancels_upstream_watch(setup: Setup) -> None:
    session = await setup.kasd.session()
    stream, response = await open_request(session, head("GET", "/api/v1/namespaces/default/configmaps?watch=1"))
    assert response.status == 200
    assert setup.sim.store.statistics().watchers >= 1
    discarded = setup.agent.pool.statistics().discarded  # type: ignore[attr-defined]
    await stream.reset(TunnelCode.CLIENT_GONE, "kubectl went away")
    while not any(r.path.endswith("/configmaps") and r.outcome == "client-gone" for r in setup.records):
        await setup.record_event.wait()
    stats = setup.agent.pool.statistics()  # type: ignore[attr-defined]
    assert stats.active == 0
    assert stats.discarded == discarded + 1  # the watch's connection was closed, not reused
    agent_session = setup.agent.manager.sessions()[0]  # type: ignore[attr-defined]
    assert agent_session.statistics().open_streams == 0


async def test_upstream_down_refuses_with_upstream_unreachable(nursery: trio.Nursery, tmp_path: Path) -> None:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    (tmp_path / "kubeconfig").write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    kasd = await start_fake_kasd(nursery)
    config = agent_config(tmp_path, kasd.url)
    async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)):
        session = await kasd.session()
        with pytest.raises(StreamRefusedError) as info:
            await open_request(session, head("GET", "/api/v1/pods"))
        assert info.value.code == TunnelCode.UPSTREAM_UNREACHABLE
        assert f"cannot reach http://127.0.0.1:{port}" in info.value.message


async def test_bad_head_and_unknown_kind_are_refused(setup: Setup) -> None:
    session = await setup.kasd.session()
    with pytest.raises(StreamRefusedError) as info:
        await open_request(session, head("GET", "/api/v1/pods", kind="prometheus"))
    assert info.value.code == TunnelCode.UNKNOWN_TARGET
    stream = await session.open_stream({"v": 1, "method": "get", "target": "/x", "headers": []})
    with pytest.raises(StreamRefusedError) as info:
        await stream.wait_accepted()
    assert info.value.code == TunnelCode.BAD_REQUEST


async def test_error_status_passes_through(setup: Setup) -> None:
    session = await setup.kasd.session()
    response, body = await exchange(session, head("GET", "/api/v1/namespaces/default/configmaps/missing"))
    assert response.status == 404
    assert json.loads(body)["kind"] == "Status"


async def test_reset_during_upload_abandons_the_upstream_request(setup: Setup) -> None:
    session = await setup.kasd.session()
    request = head("POST", "/api/v1/namespaces/default/configmaps",
                   headers=(("content-type", "application/json"), ("content-length", str(10 * 1024 * 1024))))
    stream = await session.open_stream(request.to_metadata())
    await stream.send_all(b"{" + b" " * (1024 * 1024))
    await stream.reset(TunnelCode.CLIENT_GONE, "kubectl interrupted")
    while not any(r.method == "POST" for r in setup.records):
        await setup.record_event.wait()
    record = next(r for r in setup.records if r.method == "POST")
    assert record.outcome == "client-gone"
    assert record.status is None
    stats = setup.agent.pool.statistics()  # type: ignore[attr-defined]
    assert stats.active == 0 and stats.idle == 0 and stats.discarded == 1


async def test_a_small_answer_trickled_in_tiny_reads_costs_about_its_length() -> None:
    """A small answer is read whole before its head goes to kasd; a hostile API server or service
    that sends its 64 KiB two bytes a read must not make agentd hold a Python object per read (a
    list of 32768 reads was ~1.4 MB for one stream, times every stream it answers slowly)."""
    import tracemalloc

    from agentd.proxy import _read_small_body

    length = 64 * 1024

    class Trickle:
        sent = 0

        async def receive_some(self) -> bytes:
            if self.sent == length:
                return b""
            self.sent += 2
            return bytes((self.sent % 256, 0))  # a new object each read, as a socket read is

    tracemalloc.start()
    try:
        body, error = await _read_small_body(Trickle(), length)  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert error is None and len(body) == length
    assert peak < 3 * length, peak
