"""What kasd (and so the client) is told when the API server fails agentd: one that takes a request
and never answers gets a 504 Status within the configured bound (a watch whose head came at once is
never cut); one that cannot be reached is refused with UPSTREAM_UNREACHABLE and a message naming why."""

from __future__ import annotations

import functools
import json
import ssl
from pathlib import Path

import pytest
import trio
import trio.testing
import trustme

from agentd.kubeapi import KubeTarget, kubeconfig_target
from agentd.upstream import UpstreamPool, UpstreamTimeout, UpstreamUnreachable
from tests.agentd.harness import (
    FakeKasd,
    RequestLog,
    agent_config,
    head,
    open_request,
    read_all,
    read_http_head,
    running_agent,
    start_fake_kasd,
)
from tests.agentd.test_tunnels import write_kubeconfig
from tests.kasd.helpers import (
    AGENT1_TOKEN,
    CI_TOKEN,
    bearer,
    http_request,
    running_kasd,
    wait_sessions,
)
from tunnelhttp.head import ResponseHead, TunnelCode
from wire.session import StreamRefusedError

pytestmark = pytest.mark.timeout(20)

BOUND = 0.5  # the response-head bound these tests configure


class HungApiServer:
    """Reads each request head and never answers; says when agentd closed a connection on it."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.connections = 0
        self.closed = 0
        self._changed = trio.Event()

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        read = await read_http_head(stream)
        if read is not None:
            self.heads.append(read[0])
            self._notify()
            try:
                while await stream.receive_some(65536):  # the body, then EOF when agentd gives up
                    pass
            except trio.BrokenResourceError:
                pass
        self.closed += 1
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_closed(self, count: int) -> None:
        while self.closed < count:
            await self._changed.wait()


async def _serve(nursery: trio.Nursery, handler: object) -> int:
    listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    return int(listeners[0].socket.getsockname()[1])


async def _kasd_for_api(nursery: trio.Nursery, tmp_path: Path, server: str) -> FakeKasd:
    write_kubeconfig(tmp_path / "kubeconfig", server)
    return await start_fake_kasd(nursery)


# --------------------------------------------------------------------------- no response head in time


async def test_a_hung_api_server_gets_the_client_a_504_within_the_bound(nursery: trio.Nursery,
                                                                         tmp_path: Path) -> None:
    api = HungApiServer()
    port = await _serve(nursery, api.handle)
    kasd = await _kasd_for_api(nursery, tmp_path, f"http://127.0.0.1:{port}")
    config = agent_config(tmp_path, kasd.url, upstream_response_header_timeout=BOUND)
    async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)) as agent:
        requests = RequestLog(agent)
        session = await kasd.session()
        started = trio.current_time()
        with trio.fail_after(BOUND + 3):
            stream, response = await open_request(session, head("GET", "/api/v1/namespaces/default/pods"))
            body = await read_all(stream)
        waited = trio.current_time() - started
        assert waited >= BOUND  # not before the bound
        assert response.status == 504
        status = json.loads(body)
        assert (status["kind"], status["code"], status["reason"]) == ("Status", 504, "Timeout")
        assert status["message"] == "cluster API sent no response head within 0.5s"
        assert ("content-type", "application/json") in response.headers
        # the pooled connection the API server hung on is closed, not reused
        with trio.fail_after(5):
            await api.wait_closed(1)
            await requests.first.wait()
        assert requests.outcomes() == [(504, "upstream-timeout")]
        stats = agent.pool.statistics()
        assert (stats.active, stats.idle, stats.discarded) == (0, 0, 1)
        # the next request gets a connection of its own (and the same answer)
        with trio.fail_after(BOUND + 3):
            stream, response = await open_request(session, head("GET", "/api/v1/namespaces/default/pods"))
            await read_all(stream)
        assert response.status == 504
        assert api.connections == 2


async def test_through_kasd_kubectl_sees_the_504_status(nursery: trio.Nursery, tmp_path: Path) -> None:
    # the same, end to end: a client on kasd's proxy port, a real kasd, a real agentd, a hung API server
    api = HungApiServer()
    port = await _serve(nursery, api.handle)
    async with running_kasd() as kasd:
        config = agent_config(tmp_path, kasd.agent_url, agent_id="1", upstream_response_header_timeout=BOUND)
        config.token_file.write_text(AGENT1_TOKEN + "\n")
        target = KubeTarget(scheme="http", host="127.0.0.1", port=port)
        async with running_agent(nursery, config, target) as agent:
            with trio.fail_after(5):
                await wait_sessions(kasd, 1, 1)
            with trio.fail_after(BOUND + 5):
                reply = await http_request(kasd.port("kubernetes_api"), "GET", "/api/v1/namespaces/default/pods",
                                           [bearer(CI_TOKEN)])
            assert reply.status == 504
            status = json.loads(reply.body)
            assert (status["kind"], status["reason"], status["code"]) == ("Status", "Timeout", 504)
            assert status["message"] == "cluster API sent no response head within 0.5s"
            agent.stop()


async def test_a_hung_api_server_times_out_after_a_request_with_a_body_too() -> None:
    api = HungApiServer()
    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, api.handle)
        pool = UpstreamPool(KubeTarget(scheme="http", host="127.0.0.1", port=port), response_header_timeout=BOUND)
        send, body = trio.testing.memory_stream_one_way_pair()
        await send.send_all(b'{"kind": "ConfigMap"}')
        send.close()
        request = head("POST", "/api/v1/namespaces/default/configmaps",
                       headers=(("content-type", "application/json"), ("content-length", "21")))
        with pytest.raises(UpstreamTimeout, match=r"^cluster API sent no response head within 0.5s$"), \
                trio.fail_after(BOUND + 3):
            async with pool.request(request, body):
                pass
        with trio.fail_after(5):
            await api.wait_closed(1)  # agentd closed the connection it hung on
        assert api.heads and api.heads[0].startswith(b"POST ")
        stats = pool.statistics()
        assert (stats.active, stats.idle, stats.discarded) == (0, 0, 1)
        nursery.cancel_scope.cancel()


async def test_the_bound_starts_once_the_request_is_sent_not_while_the_client_uploads(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    # The client sends its body slower than the bound: that is the client's time, not the API
    # server's, so the API server (which answers once it has the whole body) is not cut off.
    async def answers_after_the_body(stream: trio.SocketStream) -> None:
        read = await read_http_head(stream)
        assert read is not None
        request, body = read
        length = int(next(line.split(b":")[1] for line in request.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        while len(body) < length:
            body += await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok")

    port = await _serve(nursery, answers_after_the_body)
    kasd = await _kasd_for_api(nursery, tmp_path, f"http://127.0.0.1:{port}")
    config = agent_config(tmp_path, kasd.url, upstream_response_header_timeout=BOUND)
    async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)):
        session = await kasd.session()
        parts = [b'{"kind": "ConfigMap", ', b'"data": {}}']
        request = head("POST", "/api/v1/namespaces/default/configmaps",
                       headers=(("content-type", "application/json"),
                                ("content-length", str(sum(map(len, parts))))))
        stream = await session.open_stream(request.to_metadata())
        for part in parts:
            await stream.send_all(part)
            await trio.sleep(BOUND * 1.5)  # pacing: a slow client, not synchronisation
        await stream.send_eof()
        with trio.fail_after(5):
            answer = ResponseHead.from_metadata(await stream.wait_accepted())
            assert await read_all(stream) == b"ok"
        assert answer.status == 201


async def test_a_watch_whose_head_came_at_once_is_not_cut_however_slow_its_events(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    events = [json.dumps({"type": "ADDED", "object": {"metadata": {"name": f"cm-{i}"}}}).encode() + b"\n"
              for i in range(2)]

    async def slow_watch(stream: trio.SocketStream) -> None:
        await read_http_head(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                              b"transfer-encoding: chunked\r\n\r\n")
        for event in events:
            await trio.sleep(BOUND * 1.5)  # pacing: events further apart than the bound
            await stream.send_all(b"%x\r\n%s\r\n" % (len(event), event))
        await stream.send_all(b"0\r\n\r\n")

    port = await _serve(nursery, slow_watch)
    kasd = await _kasd_for_api(nursery, tmp_path, f"http://127.0.0.1:{port}")
    config = agent_config(tmp_path, kasd.url, upstream_response_header_timeout=BOUND)
    async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)) as agent:
        requests = RequestLog(agent)
        session = await kasd.session()
        stream, response = await open_request(session, head("GET", "/api/v1/namespaces/default/configmaps?watch=1"))
        assert response.status == 200
        with trio.fail_after(10):
            assert await read_all(stream) == b"".join(events)
            await requests.first.wait()
        assert requests.outcomes() == [(200, "ok")]
        # the upstream latency (agentd_upstream_latency_seconds) is to the response head, not the last event
        record = requests.records[0]
        assert record.upstream_latency is not None and record.upstream_latency < record.duration - 2 * BOUND


async def test_a_hung_api_server_is_waited_for_without_a_bound_when_it_is_off(nursery: trio.Nursery,
                                                                              tmp_path: Path) -> None:
    api = HungApiServer()
    port = await _serve(nursery, api.handle)
    kasd = await _kasd_for_api(nursery, tmp_path, f"http://127.0.0.1:{port}")
    config = agent_config(tmp_path, kasd.url, upstream_response_header_timeout=0.0)
    async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)) as agent:
        assert agent.pool.response_header_timeout is None
        session = await kasd.session()
        stream = await session.open_stream(head("GET", "/api/v1/pods").to_metadata())
        await stream.send_eof()
        with trio.move_on_after(BOUND * 2) as waited:
            await stream.wait_accepted()
        assert waited.cancelled_caught
        assert api.closed == 0
        await stream.reset(TunnelCode.CLIENT_GONE, "test done")


# --------------------------------------------------------------------------- unreachable: say why


async def _refusal(nursery: trio.Nursery, tmp_path: Path, server: str, *,
                   target: KubeTarget | None = None) -> StreamRefusedError:
    kasd = await _kasd_for_api(nursery, tmp_path, server)
    config = agent_config(tmp_path, kasd.url)
    async with running_agent(nursery, config, target or kubeconfig_target(config.kubeconfig)):
        session = await kasd.session()
        with pytest.raises(StreamRefusedError) as info, trio.fail_after(10):
            await open_request(session, head("GET", "/api/v1/pods"))
    assert info.value.code == TunnelCode.UPSTREAM_UNREACHABLE
    return info.value


async def test_connection_refused_is_named(nursery: trio.Nursery, tmp_path: Path) -> None:
    with trio.socket.socket() as sock:  # bound, never listening: refused, and no other test can take the port
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        refusal = await _refusal(nursery, tmp_path, f"http://127.0.0.1:{port}")
    assert refusal.message == f"cannot reach http://127.0.0.1:{port}: Connection refused"


async def test_through_kasd_the_502_names_the_cause(nursery: trio.Nursery, tmp_path: Path) -> None:
    sock = trio.socket.socket()  # bound, never listening: refused, and no other test can take the port
    await sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    async with running_kasd() as kasd:
        config = agent_config(tmp_path, kasd.agent_url, agent_id="1")
        config.token_file.write_text(AGENT1_TOKEN + "\n")
        async with running_agent(nursery, config, KubeTarget(scheme="http", host="127.0.0.1", port=port)) as agent:
            with trio.fail_after(5):
                await wait_sessions(kasd, 1, 1)
                reply = await http_request(kasd.port("kubernetes_api"), "GET", "/api/v1/pods", [bearer(CI_TOKEN)])
            assert reply.status == 502
            message = json.loads(reply.body)["message"]
            assert message.endswith(f"cannot reach http://127.0.0.1:{port}: Connection refused"), message
            agent.stop()
    sock.close()


async def test_a_name_that_does_not_resolve_is_named(nursery: trio.Nursery, tmp_path: Path) -> None:
    refusal = await _refusal(nursery, tmp_path, "https://kube-api.invalid:6443")
    assert refusal.message.startswith("cannot reach https://kube-api.invalid:6443: cannot resolve kube-api.invalid (")


async def test_a_tls_failure_is_named(nursery: trio.Nursery, tmp_path: Path) -> None:
    # An API server whose certificate agentd does not trust
    other_ca, our_ca = trustme.CA(), trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    other_ca.issue_cert("127.0.0.1").configure_cert(server_context)

    async def tls_server(stream: trio.SocketStream) -> None:
        tls = trio.SSLStream(stream, server_context, server_side=True)
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError:
            pass

    port = await _serve(nursery, tls_server)
    client_context = ssl.create_default_context()
    our_ca.configure_trust(client_context)
    target = KubeTarget(scheme="https", host="127.0.0.1", port=port, ssl_context=client_context)
    refusal = await _refusal(nursery, tmp_path, f"https://127.0.0.1:{port}", target=target)
    assert refusal.message == (f"cannot reach https://127.0.0.1:{port}: TLS error: [SSL: CERTIFICATE_VERIFY_FAILED] "
                               "certificate verify failed: unable to get local issuer certificate")
    assert "_ssl.c" not in refusal.message


async def test_a_connect_that_times_out_is_named() -> None:
    # An API server that takes the TCP connection and never answers the TLS handshake
    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, silent)
        target = KubeTarget(scheme="https", host="127.0.0.1", port=port, ssl_context=ssl.create_default_context())
        pool = UpstreamPool(target, connect_timeout=0.3)
        with pytest.raises(UpstreamUnreachable) as info, trio.fail_after(5):
            async with pool.request(head("GET", "/api"), None):
                pass
        assert str(info.value) == f"cannot reach https://127.0.0.1:{port}: connect timed out after 0.3s"
        nursery.cancel_scope.cancel()
