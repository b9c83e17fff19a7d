"""kasd among replicas, in one Trio run: two or three real runtimes (real sockets, the real private
listener, peer sessions over HTTP/2) sharing an in-memory membership and directory. A request that
lands on a replica without the agent's tunnel crosses one hop to the replica that holds one."""

from __future__ import annotations

import json
import logging
import ssl
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
import trio.testing
import trustme

from kasd.replicas import MTLS_TOKEN
from kasd.server import Runtime
from routing.errors import PeerUnreachable
from routing.peers import PEER_PATH, PeerForwarder, forward_metadata
from tests.kasd.helpers import (
    CI_TOKEN,
    H1Client,
    accept,
    bearer,
    fake_agent,
    http_request,
    json_handler,
    reply,
)
from tests.kasd.replicas_helpers import PEER_SECRET, name_of, replica_config, running_replicas
from tests.routing.standins import Member, MemoryWorld
from tunnelhttp.head import RequestHead, ResponseHead, TunnelCode
from wire.carrier import TunnelRejectedError
from wire.h2carrier import open_h2_session
from wire.session import MuxStream, Session, StreamRefusedError

pytestmark = pytest.mark.timeout(20)


def _metric(runtime: Runtime, line_start: str) -> float:
    for line in runtime.metrics.render().decode().splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {line_start!r}")


async def test_a_request_on_the_other_replica_crosses_one_hop(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    world = MemoryWorld()
    with trio.fail_after(10):
        async with running_replicas(world, [replica_config(tmp_path)] * 2) as (a, b), fake_agent(a) as agent:
            reply_ = await http_request(b.port("kubernetes_api"), "GET", "/api/v1/pods?x=1",
                                        [bearer(CI_TOKEN), ("X-Request-Id", "hop-1")])
            assert reply_.status == 200, reply_.body
            assert reply_.json()["target"] == "/api/v1/pods?x=1"
            # The agent sees the request as any other: the hop's key was taken off on the way.
            assert "forward" not in agent.metadata[0]
            assert agent.heads[0].target == "/api/v1/pods?x=1"
            # One id, which the client chose: answered, logged by both replicas, given to the agent.
            assert reply_.headers["x-request-id"] == "hop-1" and agent.heads[0].request_id == "hop-1"
            lines = {r.name: r.getMessage() for r in caplog.records if "request_id=hop-1" in r.getMessage()}
            assert lines["kasd.access"].startswith("request request_id=hop-1 method=GET")
            assert "forwarded request request_id=hop-1 agent_id=" in lines["routing.peers"]
            assert "status=200 outcome=ok" in lines["routing.peers"]
            assert _metric(b, 'kasd_forwarded_requests_total{direction="out"}') == 1
            assert _metric(a, 'kasd_forwarded_requests_total{direction="in"}') == 1
            assert _metric(b, 'kasd_peer_sessions{direction="out"}') == 1
            # The same request on the holder goes straight to the tunnel.
            direct = await http_request(a.port("kubernetes_api"), "GET", "/api/v1/pods", [bearer(CI_TOKEN)])
            assert direct.status == 200
            assert _metric(a, 'kasd_forwarded_requests_total{direction="out"}') == 0


class _Spawned(trio.abc.Instrument):
    """The names of the tasks spawned while it is installed."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.names.append(task.name)


async def test_the_hop_is_a_splice_one_task_on_the_holder_for_a_small_get(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The holder splices a forwarded request's stream to the agent's: a small GET is answered as
    over no hop (status, body, one request id in both replicas' logs) and costs the holder one
    task, the stream's own (it took five: a relay task each way and a reset watcher each way)."""
    caplog.set_level("INFO")
    world = MemoryWorld()
    with trio.fail_after(10):
        async with running_replicas(world, [replica_config(tmp_path)] * 2) as (a, b), fake_agent(a):
            warm = await http_request(b.port("kubernetes_api"), "GET", "/api/v1/pods", [bearer(CI_TOKEN)])
            assert warm.status == 200  # the peer session is up
            spawned = _Spawned()
            trio.lowlevel.add_instrument(spawned)
            try:
                reply_ = await http_request(b.port("kubernetes_api"), "GET", "/api/v1/pods?limit=1",
                                            [bearer(CI_TOKEN), ("X-Request-Id", "splice-1")])
            finally:
                trio.lowlevel.remove_instrument(spawned)
    assert reply_.status == 200 and reply_.json()["target"] == "/api/v1/pods?limit=1"
    assert reply_.headers["x-request-id"] == "splice-1"
    lines = {r.name: r.getMessage() for r in caplog.records if "request_id=splice-1" in r.getMessage()}
    assert lines["kasd.access"].startswith("request request_id=splice-1 method=GET")
    assert "status=200 outcome=ok" in lines["routing.peers"]
    assert [name for name in spawned.names if name.startswith("routing.peers")] == \
        ["routing.peers.PeerForwarder._serve"], spawned.names


async def test_a_peer_that_sends_its_end_after_the_open_is_served_as_before(tmp_path: Path) -> None:
    """The splice changes no frame on the hop: a peer session dialled as any kasd does (an older one
    included) whose forwarded GET ends in a later write than its OPEN gets the answer, the end
    passed on once it comes."""
    world = MemoryWorld()
    opened = trio.Event()

    async def handler(stream: MuxStream, head: RequestHead, session: Session) -> None:
        opened.set()
        await json_handler(stream, head, session)

    with trio.fail_after(10):
        async with running_replicas(world, [replica_config(tmp_path)] * 2) as (a, _), \
                fake_agent(a, handler) as agent:
            head = RequestHead(method="GET", target="/api/v1/pods", headers=(), impersonate=None, request_id="old-1")
            async with open_h2_session(f"http://{a.addresses['private']}{PEER_PATH}", token=PEER_SECRET) as session:
                stream = await session.open_stream(forward_metadata(head.to_metadata(), agent_id=1, origin="older"))
                await opened.wait()  # the OPEN alone reached the agent through the holder
                await stream.send_eof()
                accepted = await stream.wait_accepted()
                body = b""
                while chunk := await stream.receive_some():
                    body += chunk
    assert accepted["status"] == 200 and json.loads(body)["target"] == "/api/v1/pods"
    assert agent.heads[0].request_id == "old-1" and "forward" not in agent.metadata[0]


async def test_the_directory_hears_the_first_and_last_session_of_an_agent(tmp_path: Path) -> None:
    world = MemoryWorld()
    async with running_replicas(world, [replica_config(tmp_path)]) as (a,):
        assert a.replication is not None
        calls = a.replication.directory.calls  # type: ignore[attr-defined]
        async with fake_agent(a), fake_agent(a, hello={"pod_name": "agentd-1"}):
            assert calls == [(1, "+")]  # 0 -> 1 only
        with trio.fail_after(5):
            while calls != [(1, "+"), (1, "-")]:
                await a.registry.wait_changed()


async def test_bodies_stream_across_the_hop_never_whole(tmp_path: Path) -> None:
    """The agent reads the first part of the body while the client has not sent the rest."""
    world = MemoryWorld()
    first_part = trio.Event()

    async def handler(stream: MuxStream, head: RequestHead, session: Session) -> None:
        got = 0
        while chunk := await stream.receive_some():
            got += len(chunk)
            if got >= 1024:
                first_part.set()
        await reply(stream, 200, json.dumps({"body_bytes": got}).encode())

    size = 5 * 1024 * 1024
    with trio.fail_after(15):
        async with running_replicas(world, [replica_config(tmp_path)] * 2) as (a, b), fake_agent(a, handler):
            client = await H1Client.connect(b.port("kubernetes_api"))
            await client.send(h11.Request(method="PUT", target="/api/v1/namespaces/x/configmaps/big",
                                          headers=[("host", "k"), bearer(CI_TOKEN), ("content-length", str(size))]))
            await client.send(h11.Data(data=b"x" * 1024))
            await first_part.wait()  # before the other 5 MiB left the client
            block = b"y" * (256 * 1024)
            sent = 1024
            while sent < size:
                piece = block[: size - sent]
                await client.send(h11.Data(data=piece))
                sent += len(piece)
            await client.send(h11.EndOfMessage())
            response = await client.response()
            assert response.status_code == 200
            assert json.loads(await client.body()) == {"body_bytes": size}
            await client.aclose()


async def test_the_clients_disconnect_resets_the_agents_stream(tmp_path: Path) -> None:
    world = MemoryWorld()
    broken: list[BaseException] = []
    answered = trio.Event()
    gone = trio.Event()

    async def watch(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await accept(stream, ResponseHead(status=200, headers=(("content-type", "application/json"),)))
        await stream.send_all(b'{"type":"ADDED"}\n')
        answered.set()
        broken.append(await stream.wait_broken())
        gone.set()

    with trio.fail_after(10):
        async with running_replicas(world, [replica_config(tmp_path)] * 2) as (a, b), fake_agent(a, watch):
            client = await H1Client.connect(b.port("kubernetes_api"))
            await client.request("GET", "/api/v1/pods?watch=true", [bearer(CI_TOKEN)], None)
            assert (await client.response()).status_code == 200
            assert await client.chunk() == b'{"type":"ADDED"}\n'
            await answered.wait()
            await client.aclose()
            await gone.wait()
    assert getattr(broken[0], "code", None) == TunnelCode.CLIENT_GONE, broken


async def test_a_forwarded_watch_ends_at_an_event_boundary_when_the_holder_drains(tmp_path: Path) -> None:
    """The splice keeps the drain's cut: a watch whose holder begins to drain mid-event gets the
    rest of that event, then a clean end (no reset), and the agent's stream is closed."""
    world = MemoryWorld()
    half_sent, go = trio.Event(), trio.Event()
    closed: list[BaseException] = []
    ended = trio.Event()

    async def watch(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await accept(stream, ResponseHead(status=200, headers=(("content-type", "application/json"),)))
        await stream.send_all(b'{"type":"ADDED"')
        half_sent.set()
        await go.wait()
        await stream.send_all(b"}\n")
        closed.append(await stream.wait_broken())
        ended.set()

    with trio.fail_after(10):
        async with running_replicas(world, [replica_config(tmp_path)] * 2) as (a, b), fake_agent(a, watch):
            client = await H1Client.connect(b.port("kubernetes_api"))
            await client.request("GET", "/api/v1/pods?watch=true", [bearer(CI_TOKEN)], None)
            assert (await client.response()).status_code == 200
            await half_sent.wait()
            assert a.forwarder is not None
            a.forwarder.drain.begin()
            go.set()
            assert await client.body() == b'{"type":"ADDED"}\n'  # the whole event, then the end
            await ended.wait()
    assert closed


async def test_an_upgraded_stream_is_one_pipe_across_the_hop(tmp_path: Path) -> None:
    """exec/attach/port-forward: a 101, then bytes both ways (and the client's half-close)."""
    world = MemoryWorld()

    async def echo(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await accept(stream, ResponseHead(status=101, headers=(("connection", "Upgrade"), ("upgrade", "SPDY/3.1"))))
        while data := await stream.receive_some():
            await stream.send_all(data.upper())
        await stream.send_eof()

    with trio.fail_after(10):
        async with running_replicas(world, [replica_config(tmp_path)] * 2) as (a, b), fake_agent(a, echo):
            stream = await trio.open_tcp_stream("127.0.0.1", b.port("kubernetes_api"))
            await stream.send_all(
                b"POST /api/v1/namespaces/d/pods/p/exec?command=sh&stdin=true HTTP/1.1\r\nhost: k\r\n"
                b"authorization: Bearer " + CI_TOKEN.encode() + b"\r\nconnection: Upgrade\r\nupgrade: SPDY/3.1\r\n"
                b"content-length: 0\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive_some(4096)
            assert head.startswith(b"HTTP/1.1 101"), head
            rest = head.split(b"\r\n\r\n", 1)[1]
            await stream.send_all(b"hello over the hop")
            while len(rest) < len(b"HELLO OVER THE HOP"):
                rest += await stream.receive_some(4096)
            assert rest == b"HELLO OVER THE HOP"
            await stream.aclose()


async def test_a_waiting_request_is_served_when_a_tunnel_appears_on_another_replica(tmp_path: Path) -> None:
    world = MemoryWorld()
    with trio.fail_after(10):
        async with running_replicas(world, [replica_config(tmp_path)] * 2) as (a, b):
            result: list[int] = []
            done = trio.Event()

            async def ask() -> None:
                reply_ = await http_request(b.port("kubernetes_api"), "GET", "/api/v1/pods", [bearer(CI_TOKEN)])
                result.append(reply_.status)
                done.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask)
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)  # the request is waiting on B
                assert 1 in world._agent_events and not result
                async with fake_agent(a):
                    await done.wait()
            assert result == [200]


async def test_a_forwarded_request_is_never_forwarded_again(tmp_path: Path) -> None:
    """B holds no tunnel; A does. A stream that came over a hop to B is refused by B, not passed to A."""
    world = MemoryWorld()
    with trio.fail_after(10):
        async with running_replicas(world, [replica_config(tmp_path, agent_wait_timeout=0.5)] * 2) as (a, b), \
                fake_agent(a) as agent:
            head = RequestHead(method="GET", target="/api/v1/pods", headers=(), impersonate=None, request_id="r1")
            url = f"http://{b.addresses['private']}{PEER_PATH}"
            async with open_h2_session(url, token=PEER_SECRET) as session:
                stream = await session.open_stream(forward_metadata(head.to_metadata(), agent_id=1, origin="test"))
                await stream.send_eof()
                with pytest.raises(StreamRefusedError) as refused:
                    await stream.wait_accepted()
            assert "no" in refused.value.message or "not connected" in refused.value.message
            assert agent.opens == 0
            assert _metric(b, 'kasd_forwarded_requests_total{direction="out"}') == 0


async def test_the_private_port_wants_the_shared_secret(tmp_path: Path) -> None:
    world = MemoryWorld()
    async with running_replicas(world, [replica_config(tmp_path)]) as (a,):
        url = f"http://{a.addresses['private']}{PEER_PATH}"
        with pytest.raises(TunnelRejectedError) as rejected:
            async with open_h2_session(url, token="not-the-secret-but-long-enough-0123456789"):
                pass
        assert rejected.value.status == 401
        with pytest.raises(TunnelRejectedError) as rejected:
            async with open_h2_session(f"http://{a.addresses['agent']}/tunnel", token=PEER_SECRET):
                pass  # and the agent port does not take it either
        assert rejected.value.status == 401


async def _closed_port() -> int:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port: int = listener.socket.getsockname()[1]
    await listener.aclose()
    return port


async def test_a_dead_holder_is_passed_over_at_once(tmp_path: Path) -> None:
    """The directory names a holder that refuses connections first in ring order, then A: the
    request goes to A without waiting (its wait would end in 503 after 5 s; the cap is 3 s)."""
    world = MemoryWorld()
    ghost = Member(name="127.0.0.1:1", private_url=f"http://127.0.0.1:{await _closed_port()}")
    with trio.fail_after(3):
        async with running_replicas(world, [replica_config(tmp_path)] * 2) as (a, b), fake_agent(a):
            world.add_member(ghost)
            world.add_holder(1, ghost.name)
            world.order = [ghost.name, name_of(a), name_of(b)]
            reply_ = await http_request(b.port("kubernetes_api"), "GET", "/api/v1/pods", [bearer(CI_TOKEN)])
            assert reply_.status == 200


async def test_the_only_holder_unreachable_is_a_502(tmp_path: Path) -> None:
    world = MemoryWorld()
    ghost = Member(name="127.0.0.1:1", private_url=f"http://127.0.0.1:{await _closed_port()}")
    with trio.fail_after(5):
        async with running_replicas(world, [replica_config(tmp_path, agent_wait_timeout=0.3)]) as (b,):
            world.add_member(ghost)
            world.add_holder(1, ghost.name)
            reply_ = await http_request(b.port("kubernetes_api"), "GET", "/api/v1/pods", [bearer(CI_TOKEN)])
            assert reply_.status == PeerUnreachable.status == 502
            assert "127.0.0.1:1" in reply_.json()["message"]


async def test_the_peer_secret_is_never_sent_in_clear_to_another_host(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A member's URL comes from Redis: an http:// one on another host (192.0.2.1, TEST-NET) is
    not dialled at all, since the bearer token would be the peer secret in clear. (Tests reach
    only loopback: a dial is caught here before any socket, should the check ever let one through.)"""
    dialled: list[str] = []

    async def caught(url: str, **kwargs: object) -> None:
        dialled.append(url)
        raise OSError("this test dials nothing")

    monkeypatch.setattr("routing.peers.dial_h2_tunnel", caught)
    world = MemoryWorld()
    ghost = Member(name="192.0.2.1:8154", private_url="http://192.0.2.1:8155")
    with trio.fail_after(5):
        async with running_replicas(world, [replica_config(tmp_path, agent_wait_timeout=0.3)]) as (b,):
            world.add_member(ghost)
            world.add_holder(1, ghost.name)
            reply_ = await http_request(b.port("kubernetes_api"), "GET", "/api/v1/pods", [bearer(CI_TOKEN)])
            assert reply_.status == 502
            message = reply_.json()["message"]
            assert "refusing to send the peer secret to http://192.0.2.1:8155/peer in clear" in message, message
            assert PEER_SECRET not in message
    assert dialled == []


async def test_the_peer_secret_goes_over_https_only_to_a_peer_the_replicas_ca_vouches_for(tmp_path: Path) -> None:
    """An https:// member URL from Redis, on a replica without routing.peer_ca_file (the loopback demo's
    setup): not dialled, since the system's CAs would hand the secret to any public certificate's holder."""
    world = MemoryWorld()
    ghost = Member(name="127.0.0.1:1", private_url="https://127.0.0.1:1")
    with trio.fail_after(5):
        async with running_replicas(world, [replica_config(tmp_path, agent_wait_timeout=0.3)]) as (b,):
            world.add_member(ghost)
            world.add_holder(1, ghost.name)
            reply_ = await http_request(b.port("kubernetes_api"), "GET", "/api/v1/pods", [bearer(CI_TOKEN)])
            assert reply_.status == 502
            message = reply_.json()["message"]
            assert "refusing to send the peer secret to https://127.0.0.1:1/peer: no CA is configured" in message, \
                message


async def test_a_peer_secret_in_clear_on_purpose_is_a_warning_at_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    world = MemoryWorld()
    config = replica_config(tmp_path, private={"insecure_plaintext": True},
                            routing={"private_url": "http://10.0.0.5:8155"})
    with trio.fail_after(5):
        async with running_replicas(world, [config]):
            pass
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name == "kasd"]
    assert any("the peer secret crosses the network in clear" in w and "insecure_plaintext" in w for w in warnings), \
        warnings
    assert not any(PEER_SECRET in r.getMessage() for r in caplog.records)

async def test_readiness_is_degraded_but_200_while_redis_is_away(tmp_path: Path) -> None:
    world = MemoryWorld()
    async with running_replicas(world, [replica_config(tmp_path)]) as (a,), fake_agent(a):
        assert a.health.readiness() == (200, b"ready\n")
        world.set_healthy(False)
        status, body = a.health.readiness()
        assert status == 200 and body.startswith(b"degraded: redis unreachable")
        assert _metric(a, "kasd_redis_up") == 0
        # and the local agent is still served
        reply_ = await http_request(a.port("kubernetes_api"), "GET", "/api/v1/pods", [bearer(CI_TOKEN)])
        assert reply_.status == 200
        world.set_healthy(True)
        assert a.health.readiness() == (200, b"ready\n")
        assert _metric(a, "kasd_redis_up") == 1


async def test_a_forwarded_request_that_fails_unexpectedly_is_reset_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    async def broken(self: PeerForwarder, peer: MuxStream, agent: MuxStream, metadata: object, fate: object) -> None:
        raise RuntimeError(f"bug while relaying {metadata}")

    async def unanswered(stream: MuxStream, head: RequestHead, session: Session) -> None:
        return  # the holder never relays: nothing to answer

    monkeypatch.setattr(PeerForwarder, "_relay", broken)
    world = MemoryWorld()
    with trio.fail_after(10):
        async with running_replicas(world, [replica_config(tmp_path)] * 2) as (a, b), fake_agent(a, unanswered):
            for i in range(3):
                reply_ = await http_request(b.port("kubernetes_api"), "GET", f"/api/v1/secret-{i}", [bearer(CI_TOKEN)])
                assert reply_.status == 502, reply_.body
            assert _metric(a, 'kasd_internal_errors_total{port="private"}') == 3
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and not errors[0].exc_info and "RuntimeError" in errors[0].getMessage()
    assert "secret-" not in " ".join(r.getMessage() for r in errors)


def _mutual_tls(tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    """A CA, and the private-port settings of replicas that authenticate each other by it alone."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    leaf = ca.issue_cert("127.0.0.1")
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "private.crt"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "private.key"))
    return ca, {"tls": {"cert": str(tmp_path / "private.crt"), "key": str(tmp_path / "private.key")},
                "client_ca": str(tmp_path / "ca.pem")}


async def test_replicas_under_mutual_tls_forward_and_a_peer_without_a_client_certificate_is_refused(
        tmp_path: Path) -> None:
    world = MemoryWorld()
    ca, private = _mutual_tls(tmp_path)
    config = replica_config(tmp_path, private=private, routing={"peer_secret_file": None})
    with trio.fail_after(10):
        async with running_replicas(world, [config] * 2) as (a, b), fake_agent(a):
            reply_ = await http_request(b.port("kubernetes_api"), "GET", "/api/v1/pods", [bearer(CI_TOKEN)])
            assert reply_.status == 200, reply_.body
            assert _metric(a, 'kasd_forwarded_requests_total{direction="in"}') == 1
            # The CA's trust but no certificate of its own: the private port ends the handshake.
            anonymous = ssl.create_default_context()
            ca.configure_trust(anonymous)
            with pytest.raises(TunnelRejectedError, match="CERTIFICATE_REQUIRED"):
                async with open_h2_session(f"https://{a.addresses['private']}{PEER_PATH}", token=MTLS_TOKEN,
                                           ssl_context=anonymous):
                    pass
