"""agentd's tunnels against a fake kasd: upgrades, GOAWAY replacement, readiness."""

from __future__ import annotations

import functools
import json
import logging
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

from agentd.agent import RunningAgent, run_agent
from agentd.config import AgentdConfig
from agentd.kubeapi import kubeconfig_target
from kubesim.server import open_kubesim
from netio.tlsreload import reload_all
from tests.agentd.harness import (
    SIM_TOKEN,
    RequestLog,
    agent_config,
    exchange,
    head,
    open_request,
    read_all,
    read_http_head,
    running_agent,
    start_fake_kasd,
)
from tests.tlsprobe import ServerFiles, https_get, plain_get
from tests.trusted import TRUSTED
from tunnelhttp.head import RequestHead, ResponseHead, TunnelCode
from wire.h2carrier import server_ssl_context
from wire.session import StreamResetError


@pytest.fixture(params=["h2", "ws"])
def carrier(request: pytest.FixtureRequest) -> str:
    """How agentd dials the fake kasd (which, as kasd's agent port, serves both carriers)."""
    return str(request.param)

pytestmark = pytest.mark.timeout(20)


def write_kubeconfig(path: Path, server: str, token: str = "upstream-token") -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    return path


class SpdyUpstream:
    """Answers ``101`` to ``Upgrade: SPDY/3.1``, sends a greeting, echoes upper-cased, says bye at EOF."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.port = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        read = await read_http_head(stream)
        if read is None:
            return
        request, rest = read
        self.heads.append(request)
        if b"upgrade: spdy/3.1" not in request.lower():
            await stream.send_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            return
        await stream.send_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                              b"Upgrade: SPDY/3.1\r\n\r\nhello-early")
        if rest:
            await stream.send_all(rest.upper())
        while chunk := await stream.receive_some(4096):
            await stream.send_all(chunk.upper())
        await stream.send_all(b"bye")
        await stream.aclose()


async def test_upgrade_becomes_a_raw_pipe_both_ways(nursery: trio.Nursery, tmp_path: Path) -> None:
    upstream = SpdyUpstream()
    listeners = await nursery.start(functools.partial(trio.serve_tcp, upstream.handle, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    kasd = await start_fake_kasd(nursery)
    config = agent_config(tmp_path, kasd.url)
    async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)):
        session = await kasd.session()
        request = head("POST", "/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true",
                       headers=(("connection", "Upgrade"), ("upgrade", "SPDY/3.1"),
                                ("x-stream-protocol-version", "v4.channel.k8s.io")))
        stream, response = await open_request(session, request, eof=False)
        assert response.status == 101
        assert ("upgrade", "SPDY/3.1") in response.headers
        greeting = b""
        while len(greeting) < len(b"hello-early"):
            greeting += await stream.receive_some()
        assert greeting == b"hello-early"
        await stream.send_all(b"abc")
        echoed = b""
        while len(echoed) < 3:
            echoed += await stream.receive_some()
        assert echoed == b"ABC"
        await stream.send_eof()  # half-close travels upstream; upstream answers and closes
        assert await read_all(stream) == b"bye"
    sent = upstream.heads[0].decode().lower()
    assert "authorization: bearer upstream-token" in sent
    assert "impersonate-user: alice" in sent
    assert "connection: upgrade" in sent
    assert sent.startswith("post /api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true http/1.1")


async def test_goaway_dials_replacement_before_old_session_ends(nursery: trio.Nursery, tmp_path: Path,
                                                                carrier: str) -> None:
    async with open_kubesim(objects=TRUSTED, token=SIM_TOKEN, bookmark_interval=3600) as sim:
        sim.write_kubeconfig(tmp_path / "kubeconfig")
        kasd = await start_fake_kasd(nursery)
        kasd.carrier = carrier
        config = agent_config(tmp_path, kasd.url)
        async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)) as agent:
            old = await kasd.session(0)
            # An in-flight watch keeps the old session draining until the test ends it.
            watch, response = await open_request(old, head("GET", "/api/v1/namespaces/default/configmaps?watch=1"))
            assert response.status == 200
            drained = trio.Event()

            async def drain_old() -> None:
                await old.drain("kasd restarting")
                drained.set()

            nursery.start_soon(drain_old)
            new = await kasd.session(1)
            assert kasd.events == ["up 0", "up 1"]  # the replacement is up; the old one still drains
            assert not old.closed and not drained.is_set()
            response, _ = await exchange(new, head("GET", "/api/v1/namespaces"))
            assert response.status == 200
            await watch.reset(TunnelCode.CLIENT_GONE, "done")
            await drained.wait()
            await kasd.wait_for(lambda: "closed 0" in kasd.events)
            assert kasd.events == ["up 0", "up 1", "closed 0"]
            stats = agent.manager.statistics()
            assert stats.goaways == 1
            assert stats.tunnels_up == 1


async def http_get(address: tuple[str, int], path: str) -> tuple[int, str]:
    stream = await trio.open_tcp_stream("127.0.0.1", address[1])
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some():
            data += chunk
    head_text, _, body = data.partition(b"\r\n\r\n")
    return int(head_text.split()[1]), body.decode()


class GatedSleep:
    """A sleep the test releases by hand, so backoff waits are events, not time."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        self.called = trio.Event()
        self.release = trio.Event()

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        self.called.set()
        await self.release.wait()


async def test_readiness_flips_once_a_tunnel_is_up(nursery: trio.Nursery, tmp_path: Path) -> None:
    async with open_kubesim(objects=TRUSTED, token=SIM_TOKEN) as sim:
        sim.write_kubeconfig(tmp_path / "kubeconfig")
        kasd = await start_fake_kasd(nursery)
        kasd.reject_status = 401
        sleep = GatedSleep()
        config = agent_config(tmp_path, kasd.url, ready_file=tmp_path / "ready.json", api_check_interval=10.0)
        async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig),
                                 manager_kwargs={"sleep": sleep}) as agent:
            assert await http_get(agent.health_address, "/liveness") == (200, "ok\n")
            await sleep.called.wait()  # the first dial was rejected; the slot now backs off
            status, reason = await http_get(agent.health_address, "/readiness")
            assert status == 503
            assert "no tunnel to kasd is up" in reason and "rejected=1" in reason
            assert not (tmp_path / "ready.json").exists()
            kasd.reject_status = None
            sleep.release.set()
            await agent.manager.first_up.wait()
            assert agent.api_server is not None
            await agent.api_server.checked.wait()
            assert await http_get(agent.health_address, "/readiness") == (200, "ok\n")
            assert (await http_get(agent.health_address, "/nope"))[0] == 404


async def test_with_a_certificate_the_health_address_serves_https_only_and_a_rotated_one_at_once(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """health_cert_file/health_key_file: /readiness and /metrics over HTTPS (kubelet ``scheme: HTTPS``,
    Prometheus ``scheme: https``), plain HTTP gets no answer; a certificate written over the files
    is served on the next connection after SIGHUP."""
    files = ServerFiles(tmp_path)
    first = files.serial
    kasd = await start_fake_kasd(nursery)
    write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1")
    config = agent_config(tmp_path, kasd.url, health_cert_file=files.cert, health_key_file=files.key)
    reloadable: list[ssl.SSLContext | None] = []
    async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig), reloadable=reloadable) as agent:
        await agent.manager.first_up.wait()
        port = agent.health_address[1]
        with trio.fail_after(10):
            ready = await https_get(port, "/readiness", files.ca_file)
            assert (ready.status, ready.body, ready.serial) == (200, b"ok\n", first)
            metrics = await https_get(port, "/metrics", files.ca_file)
            assert metrics.status == 200 and b"agentd_" in metrics.body
            assert not (await plain_get(port, "/readiness")).startswith(b"HTTP/")
            rotated = files.rotate()
            reload_all(reloadable)  # what agentd's SIGHUP does
            assert (await https_get(port, "/liveness", files.ca_file)).serial == rotated != first
            scraped = await https_get(port, "/metrics", files.ca_file)  # the reload is counted
            assert b'agentd_tls_reloads_total{name="health",result="ok"} 1.0' in scraped.body


async def test_readiness_says_when_the_api_server_is_unreachable(nursery: trio.Nursery, tmp_path: Path) -> None:
    # A port nothing listens on: bound, then closed.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{closed_port}")
    kasd = await start_fake_kasd(nursery)
    config = agent_config(tmp_path, kasd.url, api_check_interval=10.0)
    async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)) as agent:
        await agent.manager.first_up.wait()  # the tunnel is up: only the API server is missing
        assert agent.api_server is not None
        await agent.api_server.checked.wait()
        status, reason = await http_get(agent.health_address, "/readiness")
        assert status == 503
        assert reason.startswith("the API server is unreachable: ") and "refused" in reason
        assert "no tunnel" not in reason


async def test_rejected_token_is_logged_and_backed_off(nursery: trio.Nursery, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture, carrier: str) -> None:
    write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1")
    kasd = await start_fake_kasd(nursery)
    kasd.carrier = carrier
    kasd.reject_status = 403
    sleep = GatedSleep()
    config = agent_config(tmp_path, kasd.url)
    async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig),
                             manager_kwargs={"sleep": sleep}):
        await sleep.called.wait()
        assert len(kasd.tokens) == 1  # one dial, then a backoff wait: no tight loop
        assert 0.0 <= sleep.calls[0] <= 1.0
        messages = [r.getMessage() for r in caplog.records if r.name == "agentd.connection"]
        assert any("kasd rejected the agent token" in m and "status=403" in m for m in messages)
        assert not any("agent-token-xyz" in r.getMessage() for r in caplog.records)



def _configmap_upload(name: str) -> tuple[RequestHead, bytes]:
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}).encode()
    request = head("POST", "/api/v1/namespaces/default/configmaps",
                   headers=(("content-type", "application/json"), ("content-length", str(len(body)))))
    return request, body


async def _start_stoppable_agent(nursery: trio.Nursery, config: AgentdConfig) -> tuple[RunningAgent, trio.Event]:
    finished = trio.Event()

    async def run(task_status: trio.TaskStatus[RunningAgent]) -> None:
        try:
            await run_agent(config, kube_target=kubeconfig_target(config.kubeconfig), task_status=task_status)
        finally:
            finished.set()

    return await nursery.start(run), finished


async def test_stop_lets_in_flight_requests_finish(nursery: trio.Nursery, tmp_path: Path) -> None:
    async with open_kubesim(objects=TRUSTED, token=SIM_TOKEN) as sim:
        sim.write_kubeconfig(tmp_path / "kubeconfig")
        kasd = await start_fake_kasd(nursery)
        config = agent_config(tmp_path, kasd.url, shutdown_grace=15.0)
        agent, finished = await _start_stoppable_agent(nursery, config)
        session = await kasd.session(0)
        request, body = _configmap_upload("late")
        upload = await session.open_stream(request.to_metadata())
        await upload.send_all(body[:10])
        agent.stop()
        await session.wait_goaway()  # agentd tells kasd: no new streams here
        assert not finished.is_set()
        await upload.send_all(body[10:])  # the upload still goes through, and its answer comes back
        await upload.send_eof()
        assert ResponseHead.from_metadata(await upload.wait_accepted()).status == 201
        assert b'"late"' in await read_all(upload)
        assert agent.manager.statistics().dials == 1  # stopped dialing
        with trio.fail_after(5):
            await finished.wait()
        await kasd.wait_for(lambda: "closed 0" in kasd.events)


async def test_stop_ends_a_watch_between_events(nursery: trio.Nursery, tmp_path: Path) -> None:
    async with open_kubesim(objects=TRUSTED, token=SIM_TOKEN, bookmark_interval=3600) as sim:
        sim.write_kubeconfig(tmp_path / "kubeconfig")
        kasd = await start_fake_kasd(nursery)
        config = agent_config(tmp_path, kasd.url, shutdown_grace=30.0)
        agent, finished = await _start_stoppable_agent(nursery, config)
        requests = RequestLog(agent)
        session = await kasd.session(0)
        watch, response = await open_request(session, head("GET", "/api/v1/namespaces/default/configmaps?watch=1"))
        assert response.status == 200
        store = sim.store
        store.create(store.kind("", "configmaps"), "default",
                     {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "seen"}})
        seen = b""
        while b'"seen"' not in seen:
            seen += await watch.receive_some()
        with trio.fail_after(5):  # far inside the grace: the watch does not hold the drain
            agent.stop()
            seen += await read_all(watch)  # a clean end of the body, not a reset
            await finished.wait()
    events = [json.loads(line) for line in seen.splitlines()]  # every event whole
    assert seen.endswith(b"\n") and events[-1]["object"]["metadata"]["name"] == "seen"
    assert requests.outcomes() == [(200, "drained")]


async def test_stop_grace_bounds_the_drain(nursery: trio.Nursery, tmp_path: Path) -> None:
    async with open_kubesim(objects=TRUSTED, token=SIM_TOKEN) as sim:
        sim.write_kubeconfig(tmp_path / "kubeconfig")
        kasd = await start_fake_kasd(nursery)
        config = agent_config(tmp_path, kasd.url, shutdown_grace=0.2)
        agent, finished = await _start_stoppable_agent(nursery, config)
        session = await kasd.session(0)
        request, body = _configmap_upload("never")
        upload = await session.open_stream(request.to_metadata())
        await upload.send_all(body[:10])  # and never the rest
        agent.stop()
        with trio.fail_after(5):
            await finished.wait()  # the upload never ends by itself; the grace does


async def test_kasd_over_tls_with_ca_file(nursery: trio.Nursery, tmp_path: Path, carrier: str) -> None:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    ca.cert_pem.write_to_path(str(tmp_path / "kas-ca.pem"))
    async with open_kubesim(objects=TRUSTED, token=SIM_TOKEN) as sim:
        sim.write_kubeconfig(tmp_path / "kubeconfig")
        kasd = await start_fake_kasd(nursery, server_ssl_context(server, websocket=True))
        kasd.carrier = carrier  # agentd's one CA context (ALPN h2) serves wss:// too
        config = agent_config(tmp_path, kasd.url, kas_ca_file=tmp_path / "kas-ca.pem", connections=2)
        async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)) as agent:
            session = await kasd.session(1)
            response, _ = await exchange(session, head("GET", "/api/v1/namespaces"))
            assert response.status == 200
            await kasd.session(0)
            assert agent.manager.statistics().dials == 2


async def test_upstream_lost_mid_body_resets_the_stream(nursery: trio.Nursery, tmp_path: Path) -> None:
    async def truncating(stream: trio.SocketStream) -> None:
        await read_http_head(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await stream.aclose()

    listeners = await nursery.start(functools.partial(trio.serve_tcp, truncating, 0, host="127.0.0.1"))
    write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}")
    kasd = await start_fake_kasd(nursery)
    config = agent_config(tmp_path, kasd.url)
    async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)):
        session = await kasd.session()
        stream, response = await open_request(session, head("GET", "/api/v1/pods"))
        assert response.status == 200
        data = b""
        with pytest.raises(StreamResetError) as info:
            while chunk := await stream.receive_some():
                data += chunk
        assert data == b"partial"
        assert info.value.code == TunnelCode.UPSTREAM_UNREACHABLE


async def test_client_leaving_an_open_pipe_is_client_gone(nursery: trio.Nursery, tmp_path: Path) -> None:
    upstream = SpdyUpstream()
    listeners = await nursery.start(functools.partial(trio.serve_tcp, upstream.handle, 0, host="127.0.0.1"))
    write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}")
    kasd = await start_fake_kasd(nursery)
    config = agent_config(tmp_path, kasd.url)
    async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)) as agent:
        requests = RequestLog(agent)
        session = await kasd.session()
        request = head("POST", "/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true",
                       headers=(("connection", "Upgrade"), ("upgrade", "SPDY/3.1")))
        stream, response = await open_request(session, request, eof=False)
        assert response.status == 101
        greeting = b""
        while len(greeting) < len(b"hello-early"):
            greeting += await stream.receive_some()
        await stream.reset(TunnelCode.CLIENT_GONE, "client went away")  # the upstream is still talking
        with trio.fail_after(5):
            await requests.first.wait()
    assert requests.outcomes() == [(101, "client-gone")]


async def test_a_stream_whose_handler_fails_unexpectedly_is_reset_in_one_line(
        nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from agentd.proxy import KubeApiProxy

    async def broken(self: KubeApiProxy, stream: Any) -> None:
        raise RuntimeError(f"bug while serving {stream.metadata}")

    monkeypatch.setattr(KubeApiProxy, "handle", broken)
    write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1")
    kasd = await start_fake_kasd(nursery)
    config = agent_config(tmp_path, kasd.url)
    async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)):
        session = await kasd.session()
        for i in range(3):
            with pytest.raises(trio.BrokenResourceError):
                await open_request(session, head("GET", f"/api/secret-{i}"))
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and not errors[0].exc_info and "RuntimeError" in errors[0].getMessage()
    assert "secret-" not in caplog.text


async def test_the_tunnels_keep_alive_as_configured(nursery: trio.Nursery, tmp_path: Path) -> None:
    """agentd's keepalive settings reach its tunnels' sessions (what each then does with them:
    tests/agentd/test_config.py::test_a_configured_keepalive_is_what_the_tunnel_uses)."""
    write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")  # never asked: no request is sent
    kasd = await start_fake_kasd(nursery)
    config = agent_config(tmp_path, kasd.url, keepalive_interval=40.0)
    async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)) as agent:
        with trio.fail_after(10):
            await agent.manager.first_up.wait()
        [session] = agent.manager.sessions()
        assert (session.keepalive_interval, session.keepalive_timeout) == (40.0, 120.0)
