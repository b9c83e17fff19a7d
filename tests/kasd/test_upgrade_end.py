"""An upgraded stream (exec, attach, port-forward) ends when its client goes away, however the client
closes: a clean TLS close_notify (what nginx sends when its own client was killed), a TCP FIN, or
an RST. The far end gets the half-close and ``netio.relay.CLIENT_END_GRACE`` to finish, then the
stream is reset, and its metric and principal slot are released."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
import trustme

import netio.relay
from kasd.server import Runtime, serve_kasd
from tests.kasd.helpers import CI_TOKEN, accept, fake_agent, make_config, read_all, running_kasd
from tests.kasd.replicas_helpers import replica_config, running_replicas
from tests.routing.standins import MemoryWorld
from tunnelhttp.head import RequestHead, ResponseHead, TunnelCode
from wire.session import MuxStream, Session, StreamResetError

pytestmark = pytest.mark.timeout(20)

GRACE = 0.5
_EXEC = (b"GET /api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true HTTP/1.1\r\nhost: kasd\r\n"
         b"authorization: Bearer " + CI_TOKEN.encode() + b"\r\nconnection: Upgrade\r\nupgrade: websocket\r\n"
         b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n"
         b"sec-websocket-protocol: v5.channel.k8s.io\r\n\r\n")


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[trustme.CA, dict[str, str]]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_path, key_path = tmp_path / "kasd.crt", tmp_path / "kasd.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    return ca, {"cert": str(cert_path), "key": str(key_path)}


class _AccessLines(logging.Handler):
    """Sets ``ended`` as the access line of a request is written: the request is over, everything
    it held released (the line is written after)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.ended = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self.ended.set()


@pytest.fixture
def access_lines() -> Iterator[_AccessLines]:
    handler = _AccessLines()
    logger = logging.getLogger("kasd.access")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _active_streams(runtime: Runtime) -> float:
    for line in runtime.metrics.render().decode().splitlines():
        if line.startswith("kasd_proxy_active_streams "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no kasd_proxy_active_streams")


async def _upgraded(stream: trio.abc.Stream) -> None:
    await stream.send_all(_EXEC)
    head = b""
    while b"\r\n\r\n" not in head:
        data = await stream.receive_some(4096)
        assert data, head
        head += data
    assert head.startswith(b"HTTP/1.1 101"), head


@pytest.mark.parametrize("close", ["tls-close-notify", "fin"])
async def test_an_upgraded_stream_ends_at_the_agent_within_the_grace_when_its_client_closes(
        close: str, tls_files: tuple[trustme.CA, dict[str, str]], access_lines: _AccessLines,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's side is an API server that never learns of the client's end by itself (as over
    TLS, which has no half-close): the stream is still reset within the grace."""
    monkeypatch.setattr(netio.relay, "CLIENT_END_GRACE", GRACE)
    ca, files = tls_files
    half_closed = trio.Event()
    ended: list[tuple[float, BaseException]] = []
    reset_seen = trio.Event()

    async def exec_that_never_ends(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await accept(stream, ResponseHead(status=101, headers=(("connection", "Upgrade"), ("upgrade", "websocket"))))
        assert await read_all(stream) == b"\x81\x00"  # the client's end came through, as a half-close
        half_closed.set()
        error = await stream.wait_broken()
        ended.append((trio.current_time(), error))
        reset_seen.set()

    config = make_config(tls=files, max_requests_per_principal=1) if close.startswith("tls") else \
        make_config(max_requests_per_principal=1)
    with trio.fail_after(10):
        async with running_kasd(config) as kasd, fake_agent(kasd, exec_that_never_ends):
            tcp = await trio.open_tcp_stream("127.0.0.1", kasd.port("kubernetes_api"))
            client: trio.abc.Stream = tcp
            if close.startswith("tls"):
                ctx = ssl.create_default_context()
                ca.configure_trust(ctx)
                client = trio.SSLStream(tcp, ctx, server_hostname="127.0.0.1")
            await _upgraded(client)
            await client.send_all(b"\x81\x00")
            assert _active_streams(kasd) == 1
            if close.startswith("tls"):
                await client.aclose()  # close_notify, then the socket: what nginx does
            else:
                await tcp.send_eof()  # FIN, still listening
            await half_closed.wait()
            closed_at = trio.current_time()
            if close == "fin":
                assert await tcp.receive_some(4096) == b""  # kasd closed the connection too
            await reset_seen.wait()
            await access_lines.ended.wait()
            at, error = ended[0]
            assert isinstance(error, StreamResetError) and error.code == TunnelCode.CLIENT_GONE
            assert at - closed_at < GRACE + 1.0
            assert _active_streams(kasd) == 0
            assert kasd.proxy.pipeline.principal_requests.principals == 0  # the slot is free again
            assert "outcome=client-gone" in access_lines.lines[-1]
            if close == "fin":
                await tcp.aclose()



async def test_a_client_that_closes_ends_the_agents_stream_through_the_hop_too(
        tmp_path: Path, access_lines: _AccessLines, monkeypatch: pytest.MonkeyPatch) -> None:
    """kubectl on replica b, the agent's tunnel on replica a: the half-close crosses the hop, and the
    reset that follows the grace reaches the agent's stream; b holds nothing of it any more."""
    monkeypatch.setattr(netio.relay, "CLIENT_END_GRACE", GRACE)
    world = MemoryWorld()
    ended: list[BaseException] = []
    reset_seen = trio.Event()

    async def exec_that_never_ends(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await accept(stream, ResponseHead(status=101, headers=(("connection", "Upgrade"), ("upgrade", "websocket"))))
        assert await read_all(stream) == b""  # the client's end, passed on over the hop
        ended.append(await stream.wait_broken())
        reset_seen.set()

    with trio.fail_after(10):
        async with running_replicas(world, [replica_config(tmp_path)] * 2) as (a, b), \
                fake_agent(a, exec_that_never_ends):
            client = await trio.open_tcp_stream("127.0.0.1", b.port("kubernetes_api"))
            await _upgraded(client)
            await client.send_eof()
            assert await client.receive_some(4096) == b""  # b closed the connection after the grace
            await reset_seen.wait()
            await access_lines.ended.wait()
            assert isinstance(ended[0], StreamResetError) and ended[0].code == TunnelCode.CLIENT_GONE
            assert _active_streams(b) == 0 and b.proxy.pipeline.principal_requests.principals == 0
            await client.aclose()


_CLOSE_FRAME = b"\x88\x02\x03\xe8"  # the far end's WebSocket close 1000: an exec's last bytes


async def test_a_draining_holder_delivers_an_execs_last_bytes_through_the_hop(tmp_path: Path) -> None:
    """kubectl on replica b, the agent's tunnel on replica a, and a drains: the close frame the agent
    sends as the exec ends is queued on a's peer session as the stream finishes, while that
    session's writes are held up (here by the test; in life by a busy socket or a writer not yet
    run). a's drain must not finish, and close the session, before it is written."""
    world = MemoryWorld()
    client_done = trio.Event()

    async def exec_(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await accept(stream, ResponseHead(status=101, headers=(("connection", "Upgrade"), ("upgrade", "websocket"))))
        assert await read_all(stream) == b"\x88\x00"  # kubectl's close frame, then its end
        client_done.set()
        await session.wait_goaway()  # the holder drains; the exec ends meanwhile
        await stream.send_all(_CLOSE_FRAME)
        await stream.send_eof()

    config = replica_config(tmp_path)
    a_stopped = trio.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def run(task_status: trio.TaskStatus[Runtime]) -> None:
                try:
                    await serve_kasd(config, replication=world.join, task_status=task_status)
                finally:
                    a_stopped.set()

            a: Runtime = await nursery.start(run)
            async with running_replicas(world, [config]) as (b,), fake_agent(a, exec_):
                client = await trio.open_tcp_stream("127.0.0.1", b.port("kubernetes_api"))
                await _upgraded(client)
                assert a.forwarder is not None and len(a.forwarder.sessions) == 1
                (peer_session,) = a.forwarder.sessions
                held = trio.Event()
                send_all = peer_session.transport.send_all

                async def held_send_all(data: bytes | bytearray | memoryview) -> None:
                    await held.wait()
                    await send_all(data)

                await client.send_all(b"\x88\x00")
                await client.send_eof()
                await client_done.wait()
                peer_session.transport.send_all = held_send_all  # type: ignore[method-assign]
                a.request_shutdown()
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                assert not a_stopped.is_set()  # the close frame is not written yet: a is still draining
                held.set()
                got = b""
                while data := await client.receive_some(4096):
                    got += data
                assert got == _CLOSE_FRAME
                await a_stopped.wait()
                await client.aclose()


async def test_a_draining_holder_never_cuts_an_upgraded_stream_whose_target_says_follow(tmp_path: Path) -> None:
    """Event boundaries are for watches and followed logs: an upgraded stream whose target carries
    ``follow=true`` (or ``watch=true``) is frames, not lines, and runs to its own end through a
    draining holder, its last bytes included."""
    world = MemoryWorld()

    async def exec_(stream: MuxStream, head: RequestHead, session: Session) -> None:
        await accept(stream, ResponseHead(status=101, headers=(("connection", "Upgrade"), ("upgrade", "websocket"))))
        await session.wait_goaway()  # the holder drains
        await stream.send_all(_CLOSE_FRAME)
        await stream.send_eof()
        await read_all(stream)

    with trio.fail_after(10):
        async with running_replicas(world, [replica_config(tmp_path)] * 2) as (a, b), fake_agent(a, exec_):
            client = await trio.open_tcp_stream("127.0.0.1", b.port("kubernetes_api"))
            await client.send_all(_EXEC.replace(b"stdin=true", b"stdin=true&follow=true"))
            head = b""
            while b"\r\n\r\n" not in head:
                head += await client.receive_some(4096)
            assert head.startswith(b"HTTP/1.1 101"), head
            a.request_shutdown()
            got = head.split(b"\r\n\r\n", 1)[1]
            while data := await client.receive_some(4096):
                got += data
            assert got == _CLOSE_FRAME
            await client.aclose()
